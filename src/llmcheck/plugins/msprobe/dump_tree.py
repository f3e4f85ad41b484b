"""Reading an msprobe PyTorch dump: its ``step{N}/rank{R}`` tree and the files of each rank folder.

msprobe writes, per step and rank (``proc{PID}`` when the run was not distributed)::

    step{N}/rank{R}/
      dump.json            per API or module call: input_args, input_kwargs, parameters, output
      construct.json       each entry's parent entry (the module tree)
      stack.json           the Python stack of each call
      dump_tensor_data/    {entry}.{input|output|kwargs|parameters}.{i}.pt  (task "tensor" only)

Every tensor item of ``dump.json`` (an item whose ``type`` names a tensor, or an older
item without a type that has a ``dtype`` and a ``shape``) becomes one
:class:`~llmcheck.core.records.TensorRecord`: keyed as :mod:`.entry_names` says, with the
statistics msprobe recorded (``Max``/``Min``/``Mean``/``Norm``), the checksum of its md5
mode as the record's ``digest``, and, in tensor mode, a lazy handle to its ``.pt`` file.
Records are in ``dump.json`` order (msprobe writes a call when it finishes, so a module's
entry follows its children's), steps in turn.

msprobe writes every tensor item with its ``dtype`` and ``shape``: an item without one is
refused (never dropped), and so is a tensor file whose dtype or shape is not the one its
item states (the dump disagrees with itself).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import (
    IO_INPUT,
    IO_OUTPUT,
    MOMENT_AFTER,
    MOMENT_BEFORE,
    Dump,
    DumpFormatError,
    DumpNotFoundError,
    RecordKey,
    TensorData,
    TensorRecord,
    TensorStats,
    folder_link_reason,
    inside_dump,
    merge_rank_dumps,
    parse_dump_json,
    read_dump_file,
    warn_passed_over,
)
from llmcheck.plugins.msprobe import SOURCE_NAME
from llmcheck.plugins.msprobe.entry_names import parent_name, parse_entry_name
from llmcheck.plugins.msprobe.tensor_files import TENSOR_SUFFIXES, saved_tensor_description, tensor_loader

DUMP_JSON = "dump.json"
CONSTRUCT_JSON = "construct.json"
STACK_JSON = "stack.json"
TENSOR_FOLDER = "dump_tensor_data"
_STEP_FOLDER = re.compile(r"step(\d+)\Z")
_RANK_FOLDER = re.compile(r"(rank|proc)(\d*)\Z")
#: msprobe's statistic names and the TensorStats fields they fill.
_STATISTICS = {"Max": "max", "Min": "min", "Mean": "mean", "Norm": "l2norm"}
#: The ``type`` of the dump.json items that describe a tensor (msprobe's tensor, DTensor, fake
#: and async-collective tensor types, numpy arrays, MindSpore tensors).
TENSOR_ITEM_TYPES = frozenset(
    {
        "torch.Tensor",
        "torch.distributed.tensor.DTensor",
        "torch._subclasses.fake_tensor.FakeTensor",
        "torch.distributed._functional_collectives.AsyncCollectiveTensor",
        "numpy.ndarray",
        "mindspore.Tensor",
    }
)
#: The fields msprobe writes in every tensor item; an item lacking one is refused.
REQUIRED_TENSOR_FIELDS = ("dtype", "shape")
#: Dtypes msprobe casts to float32 before saving the tensor file (its dump.json keeps the
#: tensor's own dtype): the 8-bit floats of torch and torch_npu.
_SAVED_AS_FLOAT32_PREFIXES = ("float8", "hifloat8")
#: How many absent tensor files the warning about them names.
_MISSING_FILES_NAMED = 5
_REDUMP_HINT = "the dump disagrees with itself: a file was replaced or edited; re-run the msprobe dump"
#: How many bytes of a dump.json are read to recognise it (its header keys come first).
_SNIFF_BYTES = 4096

log = logging.getLogger("llmcheck.msprobe")


@dataclass(frozen=True, slots=True)
class RankFolder:
    """One ``dump.json`` folder of an msprobe tree, with the step and rank its path names."""

    path: Path
    step: int
    rank: int


def looks_like_dump_json(path: Path) -> bool:
    """Return whether a file is an msprobe ``dump.json`` (its header names a task and a framework or level)."""
    if path.name != DUMP_JSON or not os.path.lexists(path):
        return False
    if not path.is_file():
        return True  # a FIFO, a loop, a link to nothing in its place: the reader names what it is
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SNIFF_BYTES)
    except OSError:
        return False
    return b'"task"' in head and (b'"framework"' in head or b'"level"' in head)


def find_rank_folders(path: Path) -> list[RankFolder]:
    """Return the msprobe rank folders at or below ``path`` (a dump.json, a rank, step or dump root folder)."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    if not path.is_dir():
        return []
    candidates = [path / DUMP_JSON, *sorted(path.glob(f"*/{DUMP_JSON}")), *sorted(path.glob(f"*/*/{DUMP_JSON}"))]
    folders = []
    links: dict[Path, str] = {}
    for dump_json in candidates:
        link = _folder_link_between(path, dump_json.parent)
        if link is not None:  # a step or rank folder that is a link: named, never entered
            links.setdefault(link, folder_link_reason(link, path))
        elif looks_like_dump_json(dump_json):
            folders.append(_rank_folder(dump_json.parent))
            if dump_json.parent == path:
                break  # the user named one rank folder: its own dump only
    if folders:
        warn_passed_over(log, path, sorted(links.items()))
    return sorted(folders, key=lambda folder: (folder.rank, folder.step))


def _folder_link_between(top: Path, folder: Path) -> Path | None:
    """Return the first folder link on the way from ``top`` down to ``folder`` (``None``: none)."""
    for below in reversed(folder.relative_to(top).parents[:-1]):
        if (top / below).is_symlink():
            return top / below
    return folder if folder != top and folder.is_symlink() else None


def _rank_folder(path: Path) -> RankFolder:
    rank_match = _RANK_FOLDER.match(path.name)
    rank = int(rank_match.group(2)) if rank_match and rank_match.group(1) == "rank" and rank_match.group(2) else 0
    step_match = _STEP_FOLDER.match(path.parent.name)
    return RankFolder(path, int(step_match.group(1)) if step_match else 0, rank)


def load_msprobe_dump(path: Path) -> Dump | None:
    """Return the msprobe dump at ``path`` (every step; several ranks as one run), or None when it holds none."""
    folders = find_rank_folders(path)
    if not folders:
        return None
    ranks = sorted({folder.rank for folder in folders})
    if len(set(folder.path.name for folder in folders if folder.step == folders[0].step)) > len(ranks):
        listing = ", ".join(str(folder.path) for folder in folders if folder.step == folders[0].step)
        raise DumpNotFoundError(
            f"holds the msprobe dumps of several processes of one rank: {listing}",
            where=path,
            hint="pass one step*/proc* folder",
        )
    root = folders[0].path if len(folders) == 1 else Path(path)
    rank_dumps = [_rank_dump([folder for folder in folders if folder.rank == rank], root) for rank in ranks]
    if len(rank_dumps) == 1:
        return rank_dumps[0]
    return merge_rank_dumps(rank_dumps, ranks, root)  # the ranks of one distributed run, read as one run


def _rank_dump(folders: list[RankFolder], root: Path) -> Dump:
    """Return every step of one rank as a dump."""
    records: list[TensorRecord] = []
    headers = []
    for folder in sorted(folders, key=lambda folder: folder.step):
        header, entries = _read_dump_json(folder.path / DUMP_JSON, folder.path)
        headers.append(header)
        parents = _read_optional_json(folder.path / CONSTRUCT_JSON, folder.path)
        stacks = _stacks(_read_optional_json(folder.path / STACK_JSON, folder.path))
        records.extend(_entry_records(folder, entries, parents, stacks, first_order=len(records)))
    missing = [record.source_path for record in records if record.attrs.get("data_missing")]
    if missing:
        named = ", ".join(missing[:_MISSING_FILES_NAMED]) + (", ..." if len(missing) > _MISSING_FILES_NAMED else "")
        log.warning(
            "%s: %d tensor files named in dump.json are absent (%s); those records are judged on statistics",
            root,
            len(missing),
            named,
        )
    manifest = {
        "format": "msprobe",
        "task": headers[0].get("task"),
        "level": headers[0].get("level"),
        "framework": headers[0].get("framework"),
        "rank": folders[0].rank,
        "steps": sorted({folder.step for folder in folders}),
    }
    return Dump(source=SOURCE_NAME, root=root, records=records, manifest=manifest)


def _read_dump_json(path: Path, rank_folder: Path) -> tuple[dict[str, Any], Mapping[str, Any]]:
    try:
        # dump.json grows with the entries, like an index: no size limit, only the file rules
        content = read_dump_file(path, rank_folder, limit_bytes=None)
    except FileNotFoundError as exc:
        raise DumpFormatError("is missing", where=path, hint=_REDUMP_HINT) from exc
    document = _parsed(content, path)
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, dict):
        raise DumpFormatError(
            "has no 'data' object of entries",
            where=path,
            hint="an msprobe dump.json holds {task, level, framework, data: {entry: ...}}",
        )
    return {key: value for key, value in document.items() if key != "data"}, entries


def _read_optional_json(path: Path, rank_folder: Path) -> Any:
    """Return a rank folder's construct.json or stack.json parsed (``{}`` when absent); read under the dump's file rules."""
    if not os.path.lexists(path):
        return {}
    try:
        return _parsed(read_dump_file(path, rank_folder), path)
    except FileNotFoundError:
        return {}


def _parsed(content: bytes, path: Path) -> Any:
    try:
        return parse_dump_json(content, path)
    except DumpFormatError as exc:
        raise DumpFormatError(
            exc.what, where=path, hint="the dump was cut short or edited; re-run the msprobe dump"
        ) from None


def _stacks(document: Any) -> dict[str, tuple[str, ...]]:
    """Return each entry's stack lines, from either stack.json layout msprobe has written."""
    stacks: dict[str, tuple[str, ...]] = {}
    if not isinstance(document, dict):
        return stacks
    for key, value in document.items():
        # newer msprobe: {"0": [[entry names], [stack lines]]}; older: {entry name: [stack lines]}
        if isinstance(value, list) and len(value) == 2 and isinstance(value[0], list) and isinstance(value[1], list):
            for entry in value[0]:
                stacks[str(entry)] = tuple(str(line) for line in value[1])
        elif isinstance(value, list):
            stacks[key] = tuple(str(line) for line in value)
    return stacks


def _io_of(section: str) -> tuple[str, str]:
    """Return the io and the position prefix of a section of an entry (``input_kwargs``, ``parameters``, ...)."""
    if section in ("input_args", "input"):
        return IO_INPUT, ""
    if section == "input_kwargs":
        return IO_INPUT, ""
    if section == "output":
        return IO_OUTPUT, ""
    if section == "parameters":
        return IO_INPUT, "parameters."
    return IO_OUTPUT, f"{section}."


def _section_rank(section: str) -> int:
    """Return where a section's records go in execution order: inputs, then parameters, then outputs."""
    return 0 if section.startswith("input") else 1 if section == "parameters" else 2


def is_tensor_entry(item: Any) -> bool:
    """Return whether a dump.json item describes a tensor: its type names one, or it has a dtype and a shape.

    A keyword-argument mapping that happens to hold ``dtype`` and ``shape`` keywords (items
    themselves) is a container, not a tensor item.
    """
    if not isinstance(item, dict):
        return False
    if isinstance(item.get("type"), str) and item["type"] in TENSOR_ITEM_TYPES:
        return True
    return "dtype" in item and "shape" in item and not isinstance(item["dtype"], dict)


def tensor_items(value: Any, position: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(position, item)`` for every tensor item inside an entry section, depth first."""
    if is_tensor_entry(value):
        yield position, value
    elif isinstance(value, dict):
        for name, inner in value.items():
            yield from tensor_items(inner, f"{position}.{name}" if position else str(name))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from tensor_items(inner, f"{position}.{index}" if position else str(index))


def _entry_records(
    folder: RankFolder, entries: Mapping[str, Any], parents: Any, stacks: dict[str, tuple[str, ...]], first_order: int
) -> list[TensorRecord]:
    data_folder = folder.path / TENSOR_FOLDER
    parent_of = parents if isinstance(parents, dict) else {}
    records: list[TensorRecord] = []
    for entry, sections in entries.items():
        if not isinstance(sections, dict):
            raise DumpFormatError(f"entry {entry!r} is not an object", where=folder.path / DUMP_JSON)
        name = parse_entry_name(entry)
        attrs_base: dict[str, Any] = {"msprobe_entry": entry}
        if entry in stacks:
            attrs_base["stack"] = stacks[entry]
        parent = parent_name(parent_of.get(entry))
        for section, value in sorted(sections.items(), key=lambda item: _section_rank(item[0])):
            io, prefix = _io_of(section)
            for position, item in tensor_items(value):
                label = f"{entry} {section}.{position}" if position else f"{entry} {section}"
                key = RecordKey(
                    name=name.record_name,
                    io=io,
                    position=prefix + position,
                    step=folder.step,
                    call_index=name.call_index,
                    moment=MOMENT_BEFORE if io == IO_INPUT else MOMENT_AFTER,
                )
                records.append(
                    _record(
                        key,
                        item,
                        label,
                        name.op_type,
                        parent,
                        folder,
                        data_folder,
                        first_order + len(records),
                        attrs_base,
                    )
                )
    return records


def _record(
    key: RecordKey,
    item: Mapping[str, Any],
    label: str,
    op_type: str,
    parent: str | None,
    folder: RankFolder,
    data_folder: Path,
    order: int,
    attrs_base: Mapping[str, Any],
) -> TensorRecord:
    where = folder.path / DUMP_JSON
    for field_name in REQUIRED_TENSOR_FIELDS:
        if item.get(field_name) is None:
            raise DumpFormatError(
                f"{label}: tensor item has no {field_name}",
                where=where,
                hint="msprobe writes every tensor item with a dtype and a shape; "
                "dump.json was edited or cut; re-run the msprobe dump",
            )
    dtype = str(item["dtype"]).removeprefix("torch.")
    try:
        shape = tuple(int(size) for size in item["shape"])
    except (TypeError, ValueError) as exc:
        raise DumpFormatError(f"{label}: shape {item['shape']!r} is not a list of integers", where=where) from exc
    attrs = dict(attrs_base)
    data = None
    source_path = str(where)
    data_name = item.get("data_name")
    if isinstance(data_name, str) and data_name not in ("", "-1"):
        tensor_path = data_folder / data_name
        source_path = str(tensor_path)
        if tensor_path.suffix not in TENSOR_SUFFIXES:
            raise DumpFormatError(
                f"{data_name}: tensor files of this kind are not read",
                where=where,
                hint=f"llmcheck reads {', '.join(TENSOR_SUFFIXES)} msprobe tensor files",
            )
        inside_dump(tensor_path, folder.path)  # a link out, a FIFO, a name too long: one error naming it
        if tensor_path.is_file():
            saved_dtype = _checked_tensor_file(tensor_path, dtype, shape, where, label)
            if saved_dtype != dtype:
                attrs["saved_dtype"] = saved_dtype
            data = TensorData(dtype=saved_dtype, shape=shape, path=tensor_path, loader=tensor_loader(tensor_path))
        else:
            attrs["data_missing"] = True
    digest = item.get("md5")
    return TensorRecord(
        key=key,
        dtype=dtype,
        shape=shape,
        order=order,
        device=str(item.get("device", "cpu")),
        rank=folder.rank,
        op_type=op_type,
        parent=parent,
        stats=_stats(item, where, label),
        data=data,
        source_path=source_path,
        attrs=attrs,
        digest=str(digest) if digest is not None else None,
    )


def _checked_tensor_file(tensor_path: Path, dtype: str, shape: tuple[int, ...], where: Path, label: str) -> str:
    """Return the dtype a tensor file holds, after checking it against its dump.json item (dtype, shape).

    Only the file's description is read (memory-mapped). msprobe saves 8-bit floats as
    float32, so that difference is the format's, not a broken dump. A ``.npy`` file (a
    MindSpore dump) is held to its shape only: MindSpore names dtypes its own way.
    """
    saved_dtype, saved_shape = saved_tensor_description(tensor_path)
    cast_on_save = saved_dtype == "float32" and dtype.rpartition(".")[2].startswith(_SAVED_AS_FLOAT32_PREFIXES)
    held = {"dtype": saved_dtype, "shape": str(list(saved_shape))}
    stated = {"dtype": dtype, "shape": str(list(shape))}
    differing = [
        part
        for part, differs in (
            ("dtype", tensor_path.suffix == ".pt" and saved_dtype != dtype and not cast_on_save),
            ("shape", saved_shape != shape),
        )
        if differs
    ]
    if differing:
        raise DumpFormatError(
            f"{' and '.join(differing)} mismatch: the file holds {' '.join(held[part] for part in differing)}, "
            f"{where} says {' '.join(stated[part] for part in differing)} for {label}",
            where=tensor_path,
            hint=_REDUMP_HINT,
        )
    return saved_dtype if tensor_path.suffix == ".pt" else dtype


def _stats(item: Mapping[str, Any], where: Path, label: str) -> TensorStats | None:
    values: dict[str, float | None] = {}
    for column, field_name in _STATISTICS.items():
        value = item.get(column)
        if value is None:
            values[field_name] = None
            continue
        try:
            values[field_name] = float(value)  # bools (a bool tensor's Max/Min) and "nan"/"inf" strings too
        except (TypeError, ValueError) as exc:
            raise DumpFormatError(f"{label}: statistic {column}={value!r} is not a number", where=where) from exc
    if all(value is None for value in values.values()):
        return None
    return TensorStats(min=values["min"], max=values["max"], mean=values["mean"], l2norm=values["l2norm"])
