"""Reading SGLang's forward-hook dumps (``--debug-tensor-dump-output-folder``): one dict per forward pass.

``sglang.srt.debug_utils.tensor_dump_forward_hook`` hooks every leaf module of the model
and the top-level module (``model``, or ``TENSOR_DUMP_TOP_LEVEL_MODULE_NAME``), and writes
per process ``{folder}/TP{tp}_PP{pp}_Rank{rank}_pid{pid}/Pass{id:05d}.pt``: a dict from
module path (``model.layers.0.self_attn.qkv_proj``) to that module's output (a tensor, or a
list of the tensors of a tuple), plus the step's ``ForwardBatch`` fields under
``{top}.forward_batch_info.{input_ids,seq_lens,positions}``.

The top-level module's hook writes the pass *before* adding its own output, so a pass file
holds the top-level module's output -- and the outputs of the leaves that run after it
(``logits_processor``) -- of the pass before it: llmcheck keys those by the pass they
belong to. Keys are read by name; every file of a rank folder must be a ``Pass*.pt`` dict
of tensors, anything else is one error naming it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import (
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
from llmcheck.plugins.sglang import FORWARD_HOOK_SOURCE
from llmcheck.plugins.sglang.batch_rows import SGLANG_POSITIONS, SGLANG_SEQ_LENS, batch_layout
from llmcheck.plugins.sglang.saved_values import item_loader, load_saved, tensor_items

_PASS_FILE = re.compile(r"Pass(\d+)\.pt\Z")
_RANK_FOLDER = re.compile(r"TP(\d+)_PP(\d+)_Rank(\d+)_pid(\d+)\Z")
#: The infix of the ForwardBatch fields the top-level module's hook adds.
BATCH_INFIX = ".forward_batch_info."
#: The top-level module the dumper hooks when its environment does not name another.
DEFAULT_TOP_MODULE = "model"
_FOREIGN_HINT = "a rank folder of --debug-tensor-dump-output-folder holds only Pass*.pt files; move this out"


def _is_pass_file(name: str) -> bool:
    return _PASS_FILE.match(name) is not None


def _rank_folders(path: Path) -> list[tuple[int, Path]]:
    """Return ``(rank, folder)`` of each rank folder ``path`` names (a Pass file, a rank folder, the dump folder)."""
    if _is_pass_file(path.name) and not path.is_dir():
        path = path.parent
    if not path.is_dir():
        return []
    names = os.listdir(path)
    if any(_is_pass_file(name) for name in names):
        match = _RANK_FOLDER.match(path.name)
        return [(int(match.group(3)) if match else 0, path)]
    folders = []
    for name in sorted(names):
        match = _RANK_FOLDER.match(name)
        if match and is_real_folder(path / name):
            folders.append((int(match.group(3)), path / name))
    ranks = [rank for rank, _ in folders]
    if len(set(ranks)) < len(ranks):
        raise DumpNotFoundError(
            f"holds the pass files of several processes of one rank: {', '.join(folder.name for _, folder in folders)}",
            where=path,
            hint="one run per folder: pass the rank folders of one run, or move the other run's folders out",
        )
    return folders


def load_forward_hook_dump(path: Path) -> Dump | None:
    """Return the forward-hook dump at ``path`` (every rank as one run), or None when ``path`` holds none."""
    folders = _rank_folders(path)
    if not folders:
        return None
    rank_dumps = [_rank_dump(folder, rank) for rank, folder in folders]
    if len(rank_dumps) == 1:
        return rank_dumps[0]
    return merge_rank_dumps(rank_dumps, [rank for rank, _ in folders], Path(path))


def _pass_files(folder: Path) -> list[tuple[int, Path]]:
    passes = []
    for name in sorted(os.listdir(folder)):
        match = _PASS_FILE.match(name)
        if match is None or (folder / name).is_dir():
            raise DumpFormatError(
                "not a Pass*.pt file of SGLang's forward-hook dump", where=folder / name, hint=_FOREIGN_HINT
            )
        passes.append((int(match.group(1)), inside_dump(folder / name, folder)))
    return sorted(passes)


def _rank_dump(folder: Path, rank: int) -> Dump:
    records: list[TensorRecord] = []
    batches: dict[tuple[int, int], BatchLayout] = {}
    for pass_id, path in _pass_files(folder):
        tensors = load_saved(path)
        if not isinstance(tensors, dict) or not all(isinstance(name, str) for name in tensors):
            raise DumpFormatError(
                f"holds a {type(tensors).__name__}, not a dict of module outputs", where=path, hint=_FOREIGN_HINT
            )
        top = _top_module(tensors)
        for name, value in tensors.items():
            items = tensor_items(value)
            if items is None:
                raise DumpFormatError(
                    f"{name!r} holds a {type(value).__name__}, not a tensor or a list of tensors",
                    where=path,
                    hint="the file was edited or comes from another program; dump again",
                )
            # the top-level module and what runs after it reach the next pass's file
            step = pass_id if name.startswith(top + ".") else pass_id - 1
            for item_path, dtype, shape in items:
                key = RecordKey(name=name, position=".".join(map(str, item_path)) or "0", step=step)
                records.append(
                    TensorRecord(
                        key=key,
                        dtype=dtype,
                        shape=shape,
                        order=len(records),
                        rank=rank,
                        data=TensorData(
                            dtype=dtype, shape=shape, path=path, loader=item_loader(path, (name, *item_path), False)
                        ),
                        source_path=str(path),
                    )
                )
        layout = batch_layout(pass_id, rank, _batch_fields(tensors, top), path)
        if layout is not None:
            batches[(0, pass_id)] = layout
    records.sort(key=lambda record: (record.key.step, record.order))
    records = [record.with_changes(order=order) for order, record in enumerate(records)]
    manifest = {"format": "sglang_forward_hook", "rank": rank}
    return Dump(source=FORWARD_HOOK_SOURCE, root=folder, records=records, manifest=manifest, batches=batches)


def _top_module(tensors: Mapping[str, Any]) -> str:
    """Return the top-level module's name: the prefix of the ForwardBatch fields, else the dumper's default."""
    for name in tensors:
        if BATCH_INFIX in name:
            return name.split(BATCH_INFIX, 1)[0]
    return DEFAULT_TOP_MODULE


def _batch_fields(tensors: Mapping[str, Any], top: str) -> dict[str, list[int]]:
    fields = {}
    for field in (SGLANG_POSITIONS, SGLANG_SEQ_LENS):
        value = tensors.get(f"{top}{BATCH_INFIX}{field}")
        if value is not None and hasattr(value, "flatten"):
            fields[field] = [int(item) for item in value.flatten().tolist()]
    return fields
