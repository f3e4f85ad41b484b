"""The keyword fields SGLang's dumper writes into each file name, and the llmcheck key they make.

The dumper names a file by joining ``key=value`` fields with ``___``: the step, the rank, a
running ``dump_index``, the ``name`` given to ``dumper.dump`` and every other keyword of the
call or of the context (``layer_id``, ...). Fields are read by name, never by place, so the
order and the fields a dumper version adds or drops do not matter. The step field has been
called ``forward_pass_id`` (the first dumpers), ``curr_step`` and ``step`` (today's).

The key a file gets:

* a name the dumper's module hooks wrote (``non_intrusive__model.layers.0.mlp.output``) keeps
  its module path (``model.layers.0.mlp``), input or output, and position;
* any other name is ``layers.{layer_id}.{name}`` when the call carried a ``layer_id``, else
  ``{name}``, an output at position ``0``;
* keyword fields that are not bookkeeping (``arg=100``) follow the position, comma-separated
  (``0,arg=100``), so two dumps that differ only in them never share a key.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmcheck.plugin_api import IO_INPUT, IO_OUTPUT, ROOT_MODULE

#: The names the step field has had, newest first.
STEP_FIELDS = ("step", "forward_pass_id", "curr_step")
RANK_FIELD = "rank"
NAME_FIELD = "name"
DUMP_INDEX_FIELD = "dump_index"
LAYER_FIELD = "layer_id"
RECOMPUTE_FIELD = "recompute_status"
#: The value of ``recompute_status`` outside activation recomputation (not part of the key).
NOT_RECOMPUTED = "disabled"
#: Fields that say where a file came from, never what it holds (the rank tags of
#: ``include_parallel_rank_in_filename`` repeat the rank).
_PLACE_FIELDS = frozenset(
    {*STEP_FIELDS, RANK_FIELD, NAME_FIELD, DUMP_INDEX_FIELD, LAYER_FIELD, "pp_rank", "tp_rank", "cp_rank", "ep_rank"}
    | {"etp_rank"}
)
#: The prefix of the names the dumper's module hooks (its "non-intrusive" mode) give.
MODULE_HOOK_PREFIX = "non_intrusive__"
#: The module hooks' names end ``{module}.inputs.{i or keyword}[.{part}]`` or ``{module}.output[.{part}]``.
_HOOK_IO = {"inputs": IO_INPUT, "output": IO_OUTPUT}
_HOOK_SUFFIX_PARTS = 3
FIELD_SEPARATOR = "___"
SUFFIX = ".pt"


@dataclass(frozen=True, slots=True)
class DumperFileName:
    """The fields of one dumper file's name."""

    fields: dict[str, str]
    step: int
    rank: int
    dump_index: int
    name: str


def parse_file_name(file_name: str) -> DumperFileName | None:
    """Return the fields of a dumper file name, or None when the name is not one (no name, step or integer fields)."""
    if not file_name.endswith(SUFFIX):
        return None
    fields: dict[str, str] = {}
    for part in file_name[: -len(SUFFIX)].split(FIELD_SEPARATOR):
        field, equals, value = part.partition("=")
        if not equals or not field:
            return None
        fields[field] = value
    step_field = next((field for field in STEP_FIELDS if field in fields), None)
    if step_field is None or NAME_FIELD not in fields:
        return None
    try:
        step = int(fields[step_field])
        rank = int(fields.get(RANK_FIELD, "0"))
        dump_index = int(fields.get(DUMP_INDEX_FIELD, "0"))
    except ValueError:
        return None
    return DumperFileName(fields, step, rank, dump_index, fields[NAME_FIELD])


@dataclass(frozen=True, slots=True)
class KeyParts:
    """The name, io and position a dumper file's tensor is keyed by (before its call index)."""

    name: str
    io: str
    position: str


def key_parts(file_name: DumperFileName) -> KeyParts:
    """Return the llmcheck key parts of a dumper file (see the module docstring)."""
    extras = [
        f"{field}={value}"
        for field, value in sorted(file_name.fields.items())
        if field not in _PLACE_FIELDS and not (field == RECOMPUTE_FIELD and value == NOT_RECOMPUTED)
    ]
    name, io, position = file_name.name, IO_OUTPUT, "0"
    hooked = _module_hook_parts(file_name.name)
    if hooked is not None:
        name, io, position = hooked
    elif LAYER_FIELD in file_name.fields:
        name = f"layers.{file_name.fields[LAYER_FIELD]}.{name}"
    return KeyParts(name, io, ",".join([position, *extras]))


def _module_hook_parts(name: str) -> tuple[str, str, str] | None:
    """Return (module path, io, position) of a name the dumper's module hooks gave, or None for a free name."""
    if not name.startswith(MODULE_HOOK_PREFIX):
        return None
    parts = name[len(MODULE_HOOK_PREFIX) :].split(".")
    # the rightmost "inputs"/"output" among the last parts: a module may itself be called "output"
    for index in range(len(parts) - 1, max(len(parts) - 1 - _HOOK_SUFFIX_PARTS, -1), -1):
        if parts[index] in _HOOK_IO:
            module = ".".join(parts[:index]) or ROOT_MODULE
            return module, _HOOK_IO[parts[index]], ".".join(parts[index + 1 :]) or "0"
    return None
