"""torchair's GE graph text (``dynamo_original_graph_*.txt``): a protobuf text-format parser and writer.

With ``config.debug.graph_dump.type = "txt"`` torchair writes each graph it hands to GE as
a ``ge.proto.GraphDef`` in protobuf text format::

    name: "graph_1"
    op {
      name: "MatMul_3"
      type: "MatMulV2"
      input: "Data_0:0"
      input: "Const_1:0"
      output_desc {
        name: "y"
        dtype: DT_FLOAT
        attr {
          key: "_fx_tensor_name"
          value { s: "mm-aten.mm.default.OUTPUT.0" }
        }
      }
    }

The ``_fx_tensor_name`` of each output names the FX node (and output index) the op was
converted from -- the bridge between a GE dump and an FX dump. This parser reads the text
format properly (strings with escapes, nested messages, any line breaking), unlike the
line-based one of the tool it replaces.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Union

from llmcheck.plugin_api import DumpFormatError, read_dump_file

GRAPH_FILE_PREFIX = "dynamo_original_graph"
FX_TENSOR_NAME_ATTR = "_fx_tensor_name"

TextValue = Union[str, int, float, "TextMessage"]


@dataclass(frozen=True, slots=True)
class TextMessage:
    """A parsed text-format message: its fields in file order (repeated fields appear repeatedly)."""

    fields: tuple[tuple[str, TextValue], ...]

    def all(self, name: str) -> list[TextValue]:
        """Return every value of field ``name``, in order."""
        return [value for key, value in self.fields if key == name]

    def first(self, name: str, default: TextValue | None = None) -> TextValue | None:
        """Return the first value of field ``name``, or ``default``."""
        for key, value in self.fields:
            if key == name:
                return value
        return default

    def messages(self, name: str) -> list[TextMessage]:
        """Return the sub-messages of field ``name``."""
        return [value for value in self.all(name) if isinstance(value, TextMessage)]


# --- tokenizer and parser --------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\n\f\v]+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>-?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[fF]?)
  | (?P<ident>-?[A-Za-z_][A-Za-z0-9_.]*|\[[A-Za-z0-9_./]+\])
  | (?P<punct>[{}<>:\[\],;])
""",
    re.VERBOSE,
)

_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "a": 7, "b": 8, "f": 12, "v": 11, "\\": 92, "'": 39, '"': 34, "?": 63}


def _unescape(body: str) -> str:
    out = bytearray()
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            out += char.encode("utf-8")
            index += 1
            continue
        escape = body[index + 1]
        if escape in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[escape])
            index += 2
        elif escape in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[index + 1 : index + 4])[0]  # type: ignore[index]
            out.append(int(digits, 8) & 0xFF)
            index += 1 + len(digits)
        elif escape in "xX" and re.match(r"[0-9a-fA-F]", body[index + 2 : index + 3]):
            digits = re.match(r"[0-9a-fA-F]{1,2}", body[index + 2 : index + 4])[0]  # type: ignore[index]
            out.append(int(digits, 16))
            index += 2 + len(digits)
        else:
            out += ("\\" + escape).encode("utf-8")
            index += 2
    return out.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    at: int


class _Parser:
    def __init__(self, text: str, where: Path) -> None:
        self.text = text
        self.where = where
        self.tokens = list(self._tokenize())
        self.index = 0

    def error(self, what: str, at: int) -> DumpFormatError:
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        return DumpFormatError(
            f"{what} at line {line} column {column}", where=self.where, hint="not a protobuf text-format GE graph"
        )

    def _tokenize(self) -> Iterator[_Token]:
        position = 0
        while position < len(self.text):
            match = _TOKEN.match(self.text, position)
            if match is None:
                raise self.error(f"unexpected character {self.text[position]!r}", position)
            kind = match.lastgroup or ""
            if kind != "space":
                yield _Token(kind, match.group(), position)
            position = match.end()

    def peek(self) -> _Token | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> _Token:
        token = self.peek()
        if token is None:
            raise self.error("unexpected end of file", len(self.text))
        self.index += 1
        return token

    def message(self, closing: str | None) -> TextMessage:
        fields: list[tuple[str, TextValue]] = []
        while True:
            token = self.peek()
            if token is None:
                if closing is not None:
                    raise self.error(f"missing {closing!r}", len(self.text))
                return TextMessage(tuple(fields))
            if closing is not None and token.text == closing:
                self.index += 1
                return TextMessage(tuple(fields))
            name = self.take()
            if name.kind != "ident":
                raise self.error(f"expected a field name, found {name.text!r}", name.at)
            separator = self.peek()
            if separator is not None and separator.text == ":":
                self.index += 1
                separator = self.peek()
            if separator is not None and separator.text in ("{", "<"):
                self.index += 1
                fields.append((name.text, self.message("}" if separator.text == "{" else ">")))
            elif separator is not None and separator.text == "[":
                self.index += 1
                while True:
                    fields.append((name.text, self.scalar()))
                    end = self.take()
                    if end.text == "]":
                        break
                    if end.text != ",":
                        raise self.error(f"expected ',' or ']', found {end.text!r}", end.at)
            else:
                fields.append((name.text, self.scalar()))
            following = self.peek()
            if following is not None and following.text in (",", ";"):
                self.index += 1

    def scalar(self) -> TextValue:
        token = self.take()
        if token.kind == "string":
            parts = [_unescape(token.text[1:-1])]
            while (following := self.peek()) is not None and following.kind == "string":
                parts.append(_unescape(self.take().text[1:-1]))  # adjacent strings concatenate
            return "".join(parts)
        if token.kind == "number":
            text = token.text.rstrip("fF") if not token.text.lower().startswith(("0x", "-0x")) else token.text
            try:
                return int(text, 0)
            except ValueError:
                return float(text)
        if token.kind == "ident":
            return token.text  # enum value, true/false, inf, nan
        raise self.error(f"expected a value, found {token.text!r}", token.at)


def parse_text_message(text: str, where: Path) -> TextMessage:
    """Return the top-level message of a protobuf text-format document."""
    return _Parser(text, where).message(None)


# --- GE graph ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GeGraphOp:
    """One op of a GE graph: name, type, data inputs (``"src:index"``) and the FX tensor of each output.

    ``fx_tensor_names[k]`` is output k's ``_fx_tensor_name`` (``"mm-aten.mm.default.OUTPUT.0"``)
    or ``None`` for an output torchair did not name (ops created inside one conversion).
    """

    name: str
    op_type: str
    inputs: tuple[str, ...] = ()
    fx_tensor_names: tuple[str | None, ...] = ()
    position: int = 0

    def input_sources(self) -> list[str]:
        """Return the names of the ops feeding each data input, in input order."""
        return [source.rsplit(":", 1)[0] for source in self.inputs]


@dataclass(frozen=True)
class GeGraph:
    """A GE graph read from a ``dynamo_original_graph_*.txt`` file: its ops in file (topological) order."""

    name: str
    path: Path | None
    ops: tuple[GeGraphOp, ...]

    @cached_property
    def _by_dumped_name(self) -> dict[str, GeGraphOp]:
        return {dumped_op_name(op.name): op for op in self.ops}

    @cached_property
    def _name_lengths(self) -> list[int]:
        return sorted({len(name) for name in self._by_dumped_name if name}, reverse=True)  # "" would never advance

    def op_by_name(self) -> dict[str, GeGraphOp]:
        """Return the ops indexed by name as dump files write it (``/`` as ``_``); do not modify it."""
        return self._by_dumped_name

    def constituents(self, dumped_name: str) -> list[GeGraphOp]:
        """Return the graph ops a dumped op name is made of, or ``[]`` when it splits into none.

        A fused op (``AutomaticBufferFusionOp``) is named by concatenating its ops' names;
        the split prefers the longest first name and backtracks when the rest cannot be
        split, so ``Add_1`` + ``Add_12`` is never misread through ``Add_1`` + ``2...``.
        """
        by_name, lengths = self._by_dumped_name, self._name_lengths
        failed: set[int] = set()

        def split(start: int) -> list[GeGraphOp] | None:
            if start == len(dumped_name):
                return []
            if start in failed:
                return None
            for length in lengths:
                op = by_name.get(dumped_name[start : start + length])
                if op is not None:
                    rest = split(start + length)
                    if rest is not None:
                        return [op, *rest]
            failed.add(start)
            return None

        return split(0) or []


def dumped_op_name(graph_op_name: str) -> str:
    """Return an op name as GE dump file names write it (``/`` replaced by ``_``)."""
    return graph_op_name.replace("/", "_")


def _fx_tensor_name(output_desc: TextMessage) -> str | None:
    for attr in output_desc.messages("attr"):
        if attr.first("key") == FX_TENSOR_NAME_ATTR:
            value = attr.first("value")
            if isinstance(value, TextMessage):
                name = value.first("s")
                return name if isinstance(name, str) else None
    return None


def graph_from_message(message: TextMessage, path: Path | None) -> GeGraph:
    """Return the GE graph held by a parsed GraphDef (or the main graph of a ModelDef)."""
    graph_message = message
    if not message.messages("op") and message.messages("graph"):
        graph_message = message.messages("graph")[0]
    ops = []
    for position, op in enumerate(graph_message.messages("op")):
        name, op_type = op.first("name", ""), op.first("type", "")
        inputs = tuple(
            str(source)
            for source in op.all("input")
            if isinstance(source, str) and source and not source.endswith(":-1")
        )
        fx_names = tuple(_fx_tensor_name(desc) for desc in op.messages("output_desc"))
        ops.append(GeGraphOp(str(name), str(op_type), inputs, fx_names, position))
    return GeGraph(str(graph_message.first("name", "")), path, tuple(ops))


def read_ge_graph(path: Path) -> GeGraph:
    """Return the GE graph in a torchair graph text file; a malformed file is a one-line error."""
    path = Path(path)
    try:
        text = read_dump_file(path, None).decode("utf-8")  # found inside the dump, or named by the user
    except UnicodeDecodeError as exc:
        raise DumpFormatError("graph text is not UTF-8", where=path, offset=exc.start) from None
    except OSError as exc:
        raise DumpFormatError(f"cannot read the graph text: {exc.strerror}", where=path) from exc
    return graph_from_message(parse_text_message(text, path), path)


# --- graph file names ---------------------------------------------------------------------

_GRAPH_FILE = re.compile(
    rf"^{GRAPH_FILE_PREFIX}(?:_(?P<graph_id>\d+))??(?:_rank_(?P<rank>\d+))?"
    r"(?:_pid_(?P<pid>\d+))?(?:_ts)?_(?P<ts>\d+)\.txt$"
)


@dataclass(frozen=True, slots=True)
class GraphFileName:
    """What a ``dynamo_original_graph_*.txt`` name says: graph id, rank, pid, timestamp (each may be absent)."""

    graph_id: int | None
    rank: int | None
    pid: int | None
    timestamp: int


def parse_graph_file_name(name: str) -> GraphFileName | None:
    """Return the parts of a torchair original-graph file name, or ``None`` when it is not one.

    Any ``dynamo_original_graph_*.txt`` is one (the original tool's glob); names in none of
    torchair's own patterns (``..._17065969118878_test.txt``) give their first number as the
    timestamp and no graph id, rank or pid.
    """
    match = _GRAPH_FILE.match(name)
    if match is None:
        if not (name.startswith(f"{GRAPH_FILE_PREFIX}_") and name.endswith(".txt")):
            return None
        first_number = re.search(r"\d+", name[len(GRAPH_FILE_PREFIX) :])
        return GraphFileName(None, None, None, int(first_number[0]) if first_number else 0)

    def number(group: str) -> int | None:
        return int(match[group]) if match[group] is not None else None

    return GraphFileName(number("graph_id"), number("rank"), number("pid"), int(match["ts"]))


# --- writer ---------------------------------------------------------------------------------


def _quoted(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def format_ge_graph(graph_name: str, ops: Sequence[GeGraphOp]) -> str:
    """Return a GraphDef in protobuf text format, laid out as protobuf's own printer does."""
    lines = [f"name: {_quoted(graph_name)}"]
    for op in ops:
        lines += ["op {", f"  name: {_quoted(op.name)}", f"  type: {_quoted(op.op_type)}"]
        lines += [f"  input: {_quoted(source)}" for source in op.inputs]
        for index, _ in enumerate(op.inputs):
            lines += ["  input_desc {", f"    name: {_quoted(f'x{index}')}", '    layout: "ND"', "  }"]
        for index, fx_name in enumerate(op.fx_tensor_names):
            lines += ["  output_desc {", f"    name: {_quoted(f'y{index}')}", '    layout: "ND"']
            if fx_name is not None:
                lines += [
                    "    attr {",
                    f"      key: {_quoted(FX_TENSOR_NAME_ATTR)}",
                    "      value {",
                    f"        s: {_quoted(fx_name)}",
                    "      }",
                    "    }",
                ]
            lines.append("  }")
        lines.append("}")
    return "\n".join(lines) + "\n"


def write_ge_graph_text(
    folder: Path,
    graph_name: str,
    ops: Sequence[GeGraphOp],
    *,
    graph_id: int = 0,
    rank: int = 0,
    pid: int = 0,
    timestamp: str = "20240101000000000000",
) -> Path:
    """Write a torchair-named ``dynamo_original_graph_*.txt`` into ``folder`` and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{GRAPH_FILE_PREFIX}_{graph_id}_rank_{rank}_pid_{pid}_ts_{timestamp}.txt"
    with open(path, "x", encoding="utf-8") as stream:
        stream.write(format_ge_graph(graph_name, ops))
    return path
