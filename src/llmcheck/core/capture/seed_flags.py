"""The seed tool's dump flags (``-er 3,5,7,7``, ``-ids 2,3_1``, ...): their declaration and the parsing of their values.

The original ``ait llm`` flags are kept so users' scripts keep working. A backend that
honours them declares them with :func:`seed_dump_options` in its
``llmcheck_register_backend_options``; their values are checked here once, so the backend
receives already-valid, typed options and a wrong value is one clear usage error naming the flag.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Sequence

from llmcheck.core.capture.backend_options import BackendOption
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
        raise UsageError(
            f"invalid value {value!r}",
            where=flag,
            hint="give pairs of inclusive bounds, e.g. -er 0,0 or -er 3,5,7,7, or 'all'",
        )
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
            raise UsageError(
                f"invalid operation id {op_id!r}", where=flag, hint="ids are numbers joined by '_', e.g. 24_1,2_3_5"
            )
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
        raise UsageError(
            "no command to run", where="--exec", hint='use --exec "python infer.py" or put the command after --'
        )
    try:
        argv = shlex.split(exec_text)
    except ValueError as exc:
        raise UsageError(f"cannot split the command: {exc}", where="--exec") from exc
    if not argv:
        raise UsageError("the command is empty", where="--exec")
    operators = [arg for arg in argv if arg in SHELL_OPERATORS]
    if operators:
        named = list(dict.fromkeys(operators))
        what = (
            f"{named[0]!r} reaches the program as a plain argument"
            if len(named) == 1
            else f"{', '.join(map(repr, named))} reach the program as plain arguments"
        )
        log.warning(
            "--exec: %s: the command runs without a shell (write the command, redirections included, into "
            'a shell script and pass --exec "bash run.sh")',
            what,
        )
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


def _dump_types(values: Sequence[str], flag: str) -> list[str]:
    """Return the ``--type`` values without repeats; none given is ``tensor``."""
    return list(dict.fromkeys(values or ("tensor",)))


def _operation_names(value: str | None, flag: str) -> list[str]:
    return parse_names(value) if value else []


def _save_time(value: int, flag: str) -> int:
    return parse_choice_int(value, (0, 1, 2, 3), flag)


def _tensor_part(value: int, flag: str) -> int:
    return parse_choice_int(value, (0, 1, 2), flag)


def seed_dump_options(backend: str) -> list[BackendOption]:
    """Return the seed tool's ``dump`` flags as options of ``backend``, for a backend that honours them to register.

    They are the ``msit llm dump`` spellings users' scripts already pass; each value reaches
    ``CaptureRequest.options`` under the long name, parsed (``execute_range`` as inclusive
    ``(low, high)`` pairs or ``None`` for ``all``, ``save_operation_ids`` as a list, ...).
    """
    return [
        BackendOption(
            backend,
            "type",
            "What to dump; several allowed: --type model tensor. Default: tensor (plus model).",
            choices=DUMP_TYPES,
            multiple=True,
            parse=_dump_types,
        ),
        BackendOption(
            backend,
            "only_save_desc",
            "Save tensor descriptions only, no data.",
            type=bool,
            default=False,
            aliases=("-sd",),
        ),
        BackendOption(
            backend,
            "save_operation_ids",
            "Dump only these op ids, e.g. 2,3_1.",
            default="",
            aliases=("-ids",),
            parse=parse_operation_ids,
        ),
        BackendOption(
            backend,
            "execute_range",
            "Steps (tokens) to dump, as closed ranges LOW,HIGH: 0,4 is steps 0 to 4, "
            "3,5,7,7 is steps 3, 4, 5 and 7; or 'all'.",
            default="0,0",
            aliases=("-er",),
            parse=parse_execute_range,
        ),
        BackendOption(
            backend,
            "save_operation_child",
            "With -ids, also dump the children of the chosen ops (True/False).",
            default="True",
            aliases=("-child",),
            parse=parse_bool,
        ),
        BackendOption(
            backend,
            "save_time",
            "0 before, 1 after, 2 both, 3 inputs before and outputs after.",
            type=int,
            default=3,
            aliases=("-time",),
            parse=_save_time,
        ),
        BackendOption(
            backend,
            "operation_name",
            "Dump ops whose type starts with these names: self,linear.",
            aliases=("-opname",),
            parse=_operation_names,
        ),
        BackendOption(
            backend,
            "save_tensor_part",
            "0 inputs only, 1 outputs only, 2 both.",
            type=int,
            default=2,
            aliases=("-stp",),
            parse=_tensor_part,
        ),
        BackendOption(backend, "device_id", "Dump only this device id (comma list allowed).", aliases=("-device",)),
        BackendOption(backend, "seed", "Make the run deterministic with this seed.", type=int, aliases=("-seed",)),
    ]
