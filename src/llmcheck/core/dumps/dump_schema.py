"""The declared schemas of llmcheck's own JSON files, checked by ``msgspec`` as they are decoded.

Why a schema library rather than checks by hand: every field of ``index.jsonl``,
``manifest.json``, ``topology.json`` and the safetensors shard headers is declared once,
here, with its type and range, and a value of the wrong kind (``"rank": null``, a shape
``[-1]``, ``data_offsets: [0]``, a topology child that is a string) is refused with the
path of the field (``$.stats.max``) before any code uses it -- instead of surfacing later
as a ``TypeError`` deep inside llmcheck. ``msgspec`` decodes and validates one index line
faster than ``json.loads`` alone.

:func:`decode` and :func:`convert` raise :class:`~llmcheck.core.errors.DumpFormatError`
naming the file, the line when there is one, and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from llmcheck.core.errors import DumpFormatError

Count = Annotated[int, msgspec.Meta(ge=0)]
#: a statistic: a number, or the text JSON carries for a non-finite one
Statistic = float | Literal["nan", "inf", "-inf"] | None

Schema = TypeVar("Schema")


class StatsJson(msgspec.Struct):
    """``stats`` of an index line (see :class:`~llmcheck.core.records.TensorStats`)."""

    min: Statistic = None
    max: Statistic = None
    mean: Statistic = None
    l2norm: Statistic = None
    nan_count: Count | None = None
    inf_count: Count | None = None


class IndexLine(msgspec.Struct):
    """One line of ``index.jsonl``: a record, and where its data is (``shard`` and ``tensor``, both or neither).

    Every field of the record key, and the device and rank, are required: the writer always
    writes them, and a default would read a line that lost one as another record (a line
    without ``position`` as position ``"0"``) -- silently, or as a repeat of a real one.
    """

    name: str
    dtype: str
    shape: tuple[Count, ...]  # a tuple as decoded: the record and its data handle share it as it is
    order: int
    io: Literal["input", "output"]
    position: str
    step: Count
    call_index: int
    moment: Literal["before", "after"]
    device: str
    rank: Count
    op_type: str | None = None
    parent: str | None = None
    stats: StatsJson | None = None
    attrs: dict[str, Any] = {}
    shard: str | None = None
    tensor: str | None = None


class ReadIndexLine(IndexLine):
    """An :class:`IndexLine` as the dump reader decodes it: its ``attrs`` kept as their JSON text, to decode once per text.

    Why: an op-level record's attrs (its call's arguments, ``{"args": [{"tensor": "0"}, 2],
    "kwargs": {}}``) repeat on every tensor of the call and in every step: decoded line by
    line, each record held a nest of dicts, lists and texts of its own, about 700 bytes a
    record -- three quarters of what an op-level statistics dump holds. A line whose text is
    not a JSON object is read again as an :class:`IndexLine`, for the error naming its field.
    """

    attrs: msgspec.Raw = msgspec.Raw()  # type: ignore[assignment]


class AsDtypeJson(msgspec.Struct):
    """``manifest.json``'s ``as_dtype``: the capture ran the program cast to ``to`` (torch: ``dump --as-dtype``)."""

    to: str
    #: how many floating parameters and buffers each dtype had before the cast
    cast_from: dict[str, Count] = msgspec.field(default_factory=dict, name="from")
    #: the dtype the program got the model's floating results back in
    outputs_returned_as: str | None = None


class ManifestJson(msgspec.Struct):
    """``manifest.json``: the fields llmcheck reads (others are kept, unread)."""

    format: str
    format_version: int = 1
    backend: str | None = None
    command_line: list[str] | None = None
    config: dict[str, Any] = {}
    rank: Count = 0
    device: str = "cpu"
    end_time: str | None = None
    records: Count | None = None
    shards: Count | None = None
    tensor_bytes: Count | None = None
    cut: str | None = None
    as_dtype: AsDtypeJson | None = None


class TopologyJson(msgspec.Struct):
    """``topology.json``: a node of the module or op tree, its children nested."""

    name: str
    type: str = ""
    children: list[TopologyJson] = []
    inputs: list[str] = []
    outputs: list[str] = []
    attrs: dict[str, Any] = {}


class ShardEntry(msgspec.Struct):
    """One tensor of a safetensors shard header."""

    dtype: str
    shape: list[Count]
    data_offsets: tuple[Count, Count]


def _where(path: Path | str, line: int | None) -> str:
    return f"{path}:{line}" if line is not None else str(path)


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def decoder(schema: type[Schema]) -> msgspec.json.Decoder[Schema]:
    """Return the reusable decoder of a schema.

    An index of 10**5 lines decodes each with it, called directly in the reader's loop; a
    line it refuses is passed to :func:`decode` again for the error naming line and field.
    """
    found = _decoders.get(schema)
    if found is None:
        found = _decoders[schema] = msgspec.json.Decoder(schema)
    return found


def decode(
    text: bytes | str,
    schema: type[Schema],
    path: Path | str,
    *,
    line: int | None = None,
    offset: int | None = None,
    what: str = "",
) -> Schema:
    """Return ``text`` decoded as JSON of ``schema``, or raise a format error naming file, line and field.

    ``offset`` is the byte where ``text`` starts in the file (named in the error).
    """
    try:
        return decoder(schema).decode(text)
    except msgspec.ValidationError as exc:
        raise DumpFormatError(f"{what}{_field_message(exc)}", where=_where(path, line), offset=offset) from None
    except msgspec.DecodeError as exc:
        raise DumpFormatError(f"{what}not valid JSON: {exc}", where=_where(path, line), offset=offset) from None
    except UnicodeDecodeError as exc:
        raise DumpFormatError(
            f"{what}not valid UTF-8: byte {exc.object[exc.start : exc.start + 1]!r} at position {exc.start}",
            where=_where(path, line),
            offset=offset,
        ) from None
    except RecursionError:
        raise DumpFormatError(f"{what}nested too deeply", where=_where(path, line), offset=offset) from None


def convert(value: Any, schema: type[Schema], path: Path | str, *, line: int | None = None, what: str = "") -> Schema:
    """Return an already decoded JSON value checked against ``schema`` (same errors as :func:`decode`)."""
    try:
        return msgspec.convert(value, type=schema)
    except msgspec.ValidationError as exc:
        raise DumpFormatError(f"{what}{_field_message(exc)}", where=_where(path, line)) from None
    except RecursionError:
        raise DumpFormatError(f"{what}nested too deeply", where=_where(path, line)) from None


def _field_message(exc: msgspec.ValidationError) -> str:
    """Return msgspec's message as ``field $.rank: expected `int`, got `null```."""
    text = str(exc)
    message, _, field = text.rpartition(" - at `")
    if not message:
        return text[0].lower() + text[1:] if text else "does not match its schema"
    return f"field {field.rstrip('`')}: {message[0].lower()}{message[1:]}"
