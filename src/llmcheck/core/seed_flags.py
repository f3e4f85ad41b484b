"""Parsing and validation of the seed tool's flag values (``-er 3,5,7,7``, ``-ids 2,3_1``, ...).

The original ``ait llm`` flags are kept so users' scripts keep working; their values are
checked here once, so every backend receives already-valid, typed options and a wrong value
is one clear usage error naming the flag.
"""

from __future__ import annotations

import logging
import re
import shlex
from typing import Sequence

from llmcheck.core.errors import UsageError

DUMP_TYPES = ("model", "layer", "op", "kernel", "tensor", "cpu_profiling", "onnx", "stats")
LOG_LEVELS = ("debug", "info", "warning", "warn", "error", "fatal", "critical")
log = logging.getLogger("llmcheck.cli")

#: Shell operators: inside ``--exec`` they reach the program as plain arguments (no shell runs it).
SHELL_OPERATORS = frozenset({">", ">>", "<", "2>", "2>>", "&>", "2>&1", "|", "|&", "||", "&&", ";", "&"})
_OP_ID = re.compile(r"^\d+(_\d+)*$")
_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


def parse_execute_range(value: str, flag: str = "-er/--execute-range") -> list[tuple[int, int]] | None:
    """Return the inclusive ``(low, high)`` step ranges of ``"1,3"`` / ``"3,5,7,7"``; ``None`` for ``"all"``."""
    text = value.strip()
    if text.lower() == "all":
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or len(parts) % 2 or not all(part.isdigit() for part in parts):
        raise UsageError(f"invalid value {value!r}", where=flag,
                         hint="give pairs of inclusive bounds, e.g. -er 0,0 or -er 3,5,7,7, or 'all'")
    numbers = [int(part) for part in parts]
    ranges = list(zip(numbers[::2], numbers[1::2]))
    for low, high in ranges:
        if low > high:
            raise UsageError(f"range {low},{high} is empty (low > high)", where=flag)
    return ranges


def parse_operation_ids(value: str, flag: str = "-ids/--save-operation-ids") -> list[str]:
    """Return the op ids of ``"2,3_1"`` (each ``N`` or ``N_N...``); empty text gives ``[]``."""
    ids = [part.strip() for part in value.split(",") if part.strip()]
    for op_id in ids:
        if not _OP_ID.match(op_id):
            raise UsageError(f"invalid operation id {op_id!r}", where=flag,
                             hint="ids are numbers joined by '_', e.g. 24_1,2_3_5")
    return ids


def parse_names(value: str) -> list[str]:
    """Return the comma-separated names of ``"self,linear"``, lower-cased and stripped."""
    return [part.strip().lower() for part in value.split(",") if part.strip()]


def parse_bool(value: str | bool, flag: str) -> bool:
    """Return the truth of a seed-style boolean flag value (``True``, ``false``, ``1``, ...)."""
    if isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise UsageError(f"invalid boolean {value!r}", where=flag, hint="use True or False")


def parse_choice_int(value: int, choices: Sequence[int], flag: str) -> int:
    """Return ``value`` if it is one of ``choices``, else raise a usage error naming the flag."""
    if value not in choices:
        raise UsageError(f"invalid value {value}", where=flag, hint=f"choose one of {', '.join(map(str, choices))}")
    return value


def split_command(exec_text: str | None, trailing: Sequence[str]) -> list[str]:
    """Return the user's program as argv: ``--exec "..."`` split like a shell would, or the args after ``--``.

    The command is never run through a shell, so quotes work and nothing is injected.
    """
    if exec_text and trailing:
        raise UsageError("give the command either with --exec or after '--', not both", where="--exec")
    if trailing:
        return list(trailing)
    if not exec_text:
        raise UsageError("no command to run", where="--exec",
                         hint='use --exec "python infer.py" or put the command after --')
    try:
        argv = shlex.split(exec_text)
    except ValueError as exc:
        raise UsageError(f"cannot split the command: {exc}", where="--exec") from exc
    if not argv:
        raise UsageError("the command is empty", where="--exec")
    operators = [arg for arg in argv if arg in SHELL_OPERATORS]
    if operators:
        named = list(dict.fromkeys(operators))
        what = f"{named[0]!r} reaches the program as a plain argument" if len(named) == 1 else \
            f"{', '.join(map(repr, named))} reach the program as plain arguments"
        log.warning("--exec: %s: the command runs without a shell (write the command, redirections included, into "
                    "a shell script and pass --exec \"bash run.sh\")", what)
    return argv


def expand_multi_value_options(args: Sequence[str], names: Sequence[str]) -> list[str]:
    """Rewrite ``--type a b c`` into ``--type a --type b --type c`` (the seed's space-separated lists).

    Stops at the next token that starts with ``-`` and never looks past a ``--`` separator,
    so the user's own command line is left untouched.
    """
    out: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        out.append(token)
        index += 1
        if token == "--":
            out.extend(args[index:])
            break
        if token in names:
            values = []
            while index < len(args) and not args[index].startswith("-"):
                values.append(args[index])
                index += 1
            if values:
                out.append(values[0])
                for value in values[1:]:
                    out.extend([token, value])
    return out
