"""Reading a run of SGLang's dumper: one folder of ``.pt`` files, every rank's side by side.

The dumper (``sglang.srt.debug_utils.dumper``; Megatron runs import the same file) writes
each ``dumper.dump(name, value, **fields)`` call to
``{DUMPER_DIR}/{exp_name}/{field=value joined by ___}.pt`` (:mod:`.file_tags`), the value
alone (first dumpers, folder ``sglang_dump_{time}``) or as ``{"value", "meta"}`` (today's,
folder ``dump_{time}``). A path names a run as that folder, one file in it, or the dumper's
base folder when it holds exactly one run.

Every file of a run folder must be a dumper file: anything else there (a file of another
name, a corrupt or non-``weights_only`` file, a folder) is one error naming it, never a
skipped file. The batch fields the dumper writes under their bare names fill
``Dump.batches`` (:mod:`.batch_rows`); a value that is no tensor (a string, a list of ids)
is named in a warning. The batch bookkeeping itself (positions, sequence lengths, ...) is
no record: each engine keeps its own, so it is never compared.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import (
    IO_INPUT,
    MOMENT_AFTER,
    MOMENT_BEFORE,
    BatchLayout,
    Dump,
    DumpFormatError,
    DumpNotFoundError,
    RecordKey,
    TensorData,
    TensorRecord,
    inside_dump,
    is_real_folder,
    merge_rank_dumps,
)
from llmcheck.plugins.sglang import MEGATRON_SOURCE, SGLANG_SOURCE
from llmcheck.plugins.sglang.batch_rows import (
    BOOKKEEPING_FIELDS,
    MEGATRON_POSITIONS,
    MEGATRON_QUERY_STARTS,
    SGLANG_POSITIONS,
    SGLANG_REQUEST_IDS,
    SGLANG_SEQ_LENS,
    batch_layout,
)
from llmcheck.plugins.sglang.file_tags import DumperFileName, key_parts, parse_file_name
from llmcheck.plugins.sglang.saved_values import item_loader, load_saved, split_value_and_meta, tensor_items

#: The batch fields read into ``Dump.batches`` (by their bare dumper names).
BATCH_FIELDS = frozenset(
    {SGLANG_POSITIONS, SGLANG_SEQ_LENS, SGLANG_REQUEST_IDS, MEGATRON_POSITIONS, MEGATRON_QUERY_STARTS}
)
#: What only a Megatron run of the dumper writes: its framework plugin's meta and batch fields.
_MEGATRON_META = "megatron_parallel_info"
_MEGATRON_FIELDS = frozenset({MEGATRON_POSITIONS, MEGATRON_QUERY_STARTS, "cu_seqlens_kv", "qkv_format"})
#: How many non-tensor values the warning about them names.
_NAMED = 5
_FOREIGN_HINT = "a dumper run folder holds only the dumper's step=...___name=....pt files; move this out, or pass the run's own folder"

log = logging.getLogger("llmcheck.sglang")


def is_dumper_file(path: Path) -> bool:
    """Return whether a path is named as SGLang's dumper names its files."""
    return parse_file_name(path.name) is not None


def _holds_dumper_files(folder: Path) -> bool:
    try:
        return any(is_dumper_file(Path(entry.name)) for entry in os.scandir(folder) if not entry.is_dir())
    except OSError:
        return False


def find_run_folder(path: Path) -> Path | None:
    """Return the dumper run folder ``path`` names (the folder, a file in it, the base folder of one run), or None."""
    if path.is_file() or (os.path.lexists(path) and not path.is_dir()):
        return path.parent if is_dumper_file(path) else None
    if not path.is_dir():
        return None
    if _holds_dumper_files(path):
        return path
    runs = sorted(child for child in path.iterdir() if is_real_folder(child) and _holds_dumper_files(child))
    if len(runs) > 1:
        raise DumpNotFoundError(
            f"holds {len(runs)} dumper runs: {', '.join(run.name for run in runs)}",
            where=path,
            hint="pass one run's folder",
        )
    return runs[0] if runs else None


def load_dumper_run(path: Path, source: str | None) -> Dump | None:
    """Return the dumper run at ``path`` (every rank as one run), or None when ``path`` holds none."""
    folder = find_run_folder(path)
    if folder is None:
        return None
    files = _run_files(folder)
    reader = _RunReader(folder)
    for file_path, file_name in files:
        reader.read(file_path, file_name)
    return reader.dump(source)


def _run_files(folder: Path) -> list[tuple[Path, DumperFileName]]:
    """Return the run's files in execution order; a file or folder that is not the dumper's is an error naming it."""
    files = []
    for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
        file_path = Path(entry.path)
        file_name = parse_file_name(entry.name)
        if file_name is None or entry.is_dir():
            kind = "folder" if entry.is_dir() else "file"
            raise DumpFormatError(
                f"a {kind} that is not SGLang's dumper's, inside its run", where=file_path, hint=_FOREIGN_HINT
            )
        files.append((inside_dump(file_path, folder), file_name))
    # the dumper counts its calls per process: dump_index is each rank's execution order
    return sorted(files, key=lambda item: (item[1].rank, item[1].dump_index, item[1].step))


class _RunReader:
    """Collects a run's records rank by rank, its batch fields step by step, and what it passed over."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.records: dict[int, list[TensorRecord]] = defaultdict(list)
        self.calls: dict[tuple[int, int, str, str, str], int] = defaultdict(int)
        self.batch_fields: dict[tuple[int, int], dict[str, Any]] = defaultdict(dict)
        self.batch_files: dict[tuple[int, int], Path] = {}
        self.not_tensors: list[str] = []
        self.megatron = False

    def read(self, path: Path, file_name: DumperFileName) -> None:
        value, meta = split_value_and_meta(load_saved(path))
        self.megatron = self.megatron or _MEGATRON_META in meta or file_name.name in _MEGATRON_FIELDS
        if file_name.name in BATCH_FIELDS:
            self._batch_field(path, file_name, value)
        if file_name.name in BOOKKEEPING_FIELDS:
            return
        items = tensor_items(value)
        if items is None:
            self.not_tensors.append(path.name)
            return
        parts = key_parts(file_name)
        attrs: dict[str, Any] = {"dumper_fields": dict(file_name.fields)}
        if isinstance(meta.get("dims"), str):
            attrs["dims"] = meta["dims"]
        rank_records = self.records[file_name.rank]
        for item_path, dtype, shape in items:
            position = ".".join([parts.position, *map(str, item_path)]) if item_path else parts.position
            call = (file_name.step, file_name.rank, parts.name, parts.io, position)
            key = RecordKey(
                name=parts.name,
                io=parts.io,
                position=position,
                step=file_name.step,
                call_index=self.calls[call],
                moment=MOMENT_BEFORE if parts.io == IO_INPUT else MOMENT_AFTER,
            )
            self.calls[call] += 1
            data = TensorData(dtype=dtype, shape=shape, path=path, loader=item_loader(path, item_path, True))
            rank_records.append(
                TensorRecord(
                    key=key,
                    dtype=dtype,
                    shape=shape,
                    order=len(rank_records),
                    rank=file_name.rank,
                    data=data,
                    source_path=str(path),
                    attrs=attrs,
                )
            )

    def _batch_field(self, path: Path, file_name: DumperFileName, value: object) -> None:
        import torch

        if isinstance(value, torch.Tensor):
            value = value.flatten().tolist()
        if not isinstance(value, list | tuple):
            raise DumpFormatError(
                f"batch field {file_name.name} holds a {type(value).__name__}, not a list of rows",
                where=path,
                hint="the file was edited or comes from another program; dump the step again",
            )
        step_key = (file_name.rank, file_name.step)
        self.batch_fields[step_key][file_name.name] = value
        self.batch_files.setdefault(step_key, path)

    def dump(self, source: str | None) -> Dump:
        if self.not_tensors:
            named = ", ".join(self.not_tensors[:_NAMED]) + (", ..." if len(self.not_tensors) > _NAMED else "")
            log.warning(
                "%s: %d dumped values are no tensors and are not compared (%s)",
                self.folder,
                len(self.not_tensors),
                named,
            )
        detected = MEGATRON_SOURCE if self.megatron else SGLANG_SOURCE
        batches = self._batches()
        manifest: Mapping[str, Any] = {"format": "sglang_dumper", "framework": detected}
        ranks = sorted(self.records) or [0]
        rank_dumps = [
            Dump(
                source=source or detected,
                root=self.folder,
                records=self.records.get(rank, []),
                manifest=manifest,
                # keyed as the rank's own records are (rank 0) until the ranks are merged
                batches={(0, step): layout for (of_rank, step), layout in batches.items() if of_rank == rank},
            )
            for rank in ranks
        ]
        if len(rank_dumps) == 1:
            return rank_dumps[0]
        return merge_rank_dumps(rank_dumps, ranks, self.folder)

    def _batches(self) -> dict[tuple[int, int], BatchLayout]:
        layouts = {}
        for (rank, step), fields in sorted(self.batch_fields.items()):
            layout = batch_layout(step, rank, fields, self.batch_files[(rank, step)])
            if layout is not None:
                layouts[(rank, step)] = layout
        return layouts
