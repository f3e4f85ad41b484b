"""torchair FX dumps (``.npy`` per node input and output) read as records: the "fx" source.

torchair's FX dumper (and llmcheck's :mod:`.fx_backend`) writes, for every ATen call of a
compiled graph, ``{node}-{target}.INPUT.{i}[.{j}].{ts}.npy`` and ``{node}-{target}.OUTPUT.{i}.{ts}.npy``
(``j`` indexes a list argument; ``ts`` is ``%Y%m%d%H%M%S%f``, one per call). Layouts:

* ``[worldsize{W}_global_rank{R}/]gm_{ts}_dump/{step}/`` -- step = folder number;
* ``data_dump/{n}/gm_{ts}_dump/`` (torch_npu up to 7.1.0) -- step = ``n - 1``, the folder
  counting from 1.

Records: ``RecordKey(name=FX node name, io, position="i" or "i.j", step)``; with several
graphs (several ``gm_*_dump`` folders: graph breaks) the names of every graph after the
first are prefixed ``graph{k}/`` -- the first graph's names stay plain, so a run with a
graph break pairs its first graph with a run without one, and the names are those the FX
capture's llmcheck layout writes (it cannot know of a second graph while writing the first). ``op_type`` is the
ATen target, ``attrs`` carry ``fx_node``, ``fx_target``, ``graph_index`` and the timestamp.
Data are byte ranges of the ``.npy`` files. Text arrays (numpy kinds ``U`` and ``S``: what
torchair saves for a non-tensor argument, its ``str``) are counted in the manifest, not
compared; any other array that is not numbers (object, void, structured dtypes: a corrupt
header) is a :class:`DumpFormatError` naming the file, never silently dropped. Where llmcheck's own
capture left ``llmcheck_saved_dtypes.json`` beside the files, a tensor saved as float32
because numpy lacks its dtype (bfloat16, float8) is read back in that dtype -- exactly, since
its values are that dtype's.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmcheck.plugin_api import (
    IO_INPUT,
    IO_OUTPUT,
    Dump,
    DumpFormatError,
    DumpNotFoundError,
    NpyHeader,
    RecordKey,
    TensorData,
    TensorRecord,
    TopologyNode,
    inside_dump,
    parse_dump_json,
    read_dump_file,
    read_npy_header,
    walk_files,
    warn_passed_over,
)
from llmcheck.plugins.torchair_fx import SOURCE_NAME

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger("llmcheck.fx")

SAVED_DTYPES_FILE = "llmcheck_saved_dtypes.json"
#: dtypes numpy lacks, saved as float32 and named in SAVED_DTYPES_FILE
_TRUE_DTYPES = frozenset(
    {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"}
)
_FILE_NAME = re.compile(
    r"^(?P<node>[^-]+)-(?P<target>.+)\.(?P<io>INPUT|OUTPUT)\.(?P<position>\d+(?:\.\d+)?)"
    r"\.(?P<ts>\d+)\.npy$"
)
#: numpy kinds of the arrays torchair saves for non-tensor arguments (``np.array(str(value))``)
_ARGUMENT_TEXT_KINDS = frozenset({"U", "S"})
_GRAPH_FOLDER = re.compile(r"^gm_\d+_dump$")
_RANK_FOLDER = re.compile(r"^worldsize(\d+)_global_rank(\d+)$")

#: numpy (kind, itemsize) -> canonical dtype name
_NUMPY_DTYPES = {
    ("f", 2): "float16",
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("i", 1): "int8",
    ("i", 2): "int16",
    ("i", 4): "int32",
    ("i", 8): "int64",
    ("u", 1): "uint8",
    ("u", 2): "uint16",
    ("u", 4): "uint32",
    ("u", 8): "uint64",
    ("b", 1): "bool",
    ("c", 8): "complex64",
    ("c", 16): "complex128",
}


@dataclass(frozen=True, slots=True)
class FxDumpFileName:
    """What an FX dump file's name says: node, ATen target, input or output, position, timestamp."""

    node: str
    target: str
    io: str
    position: str
    timestamp: int


def parse_fx_file_name(name: str) -> FxDumpFileName | None:
    """Return the parts of an FX dump file name, or ``None`` when the name is not one."""
    match = _FILE_NAME.match(name)
    if match is None:
        return None
    io = IO_INPUT if match["io"] == "INPUT" else IO_OUTPUT
    return FxDumpFileName(match["node"], match["target"], io, match["position"], int(match["ts"]))


@dataclass(frozen=True, slots=True)
class FxPlacement:
    """Where an FX dump file sits: step, its graph folder, and the rank folder above (if any)."""

    step: int
    graph_folder: str
    rank: int | None


def placement_of(file_path: Path) -> FxPlacement:
    """Return the step, graph folder and rank of an FX dump file from the folders above it."""
    parent, grandparent = file_path.parent, file_path.parent.parent
    if parent.name.isdigit() and _GRAPH_FOLDER.match(grandparent.name):
        rank_match = _RANK_FOLDER.match(grandparent.parent.name)
        return FxPlacement(int(parent.name), grandparent.name, int(rank_match[2]) if rank_match else None)
    if _GRAPH_FOLDER.match(parent.name) and grandparent.name.isdigit():
        return FxPlacement(max(int(grandparent.name) - 1, 0), parent.name, None)
    return FxPlacement(0, parent.name, None)


@dataclass(frozen=True, slots=True)
class NpyArrayLoader:
    """Loads an ``.npy`` array that is not a plain little-endian C-order byte range (Fortran order, big-endian)."""

    path: Path

    def __call__(self) -> torch.Tensor:
        import numpy as np
        import torch

        array = np.load(self.path, mmap_mode="r", allow_pickle=False)
        return torch.from_numpy(np.ascontiguousarray(array).astype(array.dtype.newbyteorder("=")))


@dataclass(frozen=True, slots=True)
class SavedAsFloat32Loader:
    """Loads a float32 ``.npy`` payload holding the values of a narrower dtype, in that dtype."""

    path: Path
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str

    def __call__(self) -> torch.Tensor:
        from llmcheck.plugin_api import tensor_from_byte_range, torch_dtype

        saved = tensor_from_byte_range(self.path, self.offset, self.nbytes, "float32", self.shape)
        return saved.to(torch_dtype(self.dtype))


def read_saved_dtypes(step_folder: Path, dump_root: Path) -> dict[str, str]:
    """Return ``{file name: true dtype}`` from a step folder's ``llmcheck_saved_dtypes.json`` (empty when absent)."""
    path = step_folder / SAVED_DTYPES_FILE
    if not os.path.lexists(path):
        return {}
    saved = parse_dump_json(read_dump_file(path, dump_root), path)
    if not isinstance(saved, dict) or not all(isinstance(v, str) and v in _TRUE_DTYPES for v in saved.values()):
        raise DumpFormatError("expected {file name: dtype} with bfloat16/float8 dtypes", where=path)
    return saved


def _tensor_data(path: Path, header: NpyHeader, dtype: str, true_dtype: str | None) -> TensorData:
    nbytes = math.prod(header.shape) * header.dtype.itemsize
    row_major = not header.fortran_order or len(header.shape) <= 1
    plain = row_major and header.dtype.byteorder in ("<", "=", "|")
    if true_dtype is not None and dtype == "float32" and plain:
        return TensorData(
            dtype=true_dtype,
            shape=header.shape,
            loader=SavedAsFloat32Loader(path, header.data_offset, nbytes, header.shape, true_dtype),
        )
    if plain:
        return TensorData(dtype=dtype, shape=header.shape, path=path, offset=header.data_offset, nbytes=nbytes)
    return TensorData(dtype=dtype, shape=header.shape, loader=NpyArrayLoader(path))


def _position_key(position: str) -> tuple[int, ...]:
    return tuple(int(part) for part in position.split("."))


def fx_files_under(path: Path) -> list[tuple[Path, FxDumpFileName]]:
    """Return every FX dump file at or below ``path`` with its parsed name."""
    if path.is_file():
        parsed = parse_fx_file_name(path.name)
        return [(path, parsed)] if parsed is not None else []
    found = []
    folder_links: list[tuple[Path, str]] = []
    for directory, file_names in walk_files(path, folder_links):
        for file_name in file_names:
            parsed = parse_fx_file_name(file_name)
            if parsed is not None:
                found.append((inside_dump(directory / file_name, path), parsed))
    if found:  # an FX dump: what it holds behind links is not read, and said so
        warn_passed_over(log, path, folder_links)
    return found


def load_fx_dump(path: Path) -> Dump | None:
    """Return the records of the FX dump at ``path`` (a dump folder, a folder in it, or one file).

    Returns ``None`` when ``path`` holds no FX dump file; raises
    :class:`~llmcheck.core.errors.DumpNotFoundError` when it holds several ranks.
    """
    path = Path(path)
    files = fx_files_under(path)
    if not files:
        return None
    placements = {file_path: placement_of(file_path.resolve()) for file_path, _ in files}
    ranks = {p.rank for p in placements.values() if p.rank is not None}
    if len(ranks) > 1:
        raise DumpNotFoundError(
            f"holds FX dumps of several ranks ({', '.join(map(str, sorted(ranks)))})",
            where=path,
            hint="point --golden-path/--my-path at one worldsize*_global_rank* folder",
        )
    graph_folders = sorted({p.graph_folder for p in placements.values()})
    graph_index = {folder: index for index, folder in enumerate(graph_folders)}
    ordered = sorted(
        files,
        key=lambda item: (
            placements[item[0]].step,
            graph_index[placements[item[0]].graph_folder],
            item[1].timestamp,
            item[1].node,
            item[1].io != IO_INPUT,
            _position_key(item[1].position),
        ),
    )
    root = path if path.is_dir() else path.parent
    records: list[TensorRecord] = []
    non_numeric = 0
    nodes_by_graph: dict[int, dict[str, str]] = defaultdict(dict)
    saved_dtypes: dict[Path, dict[str, str]] = {}
    for file_path, parsed in ordered:
        placement = placements[file_path]
        header = read_npy_header(file_path)
        dtype = _NUMPY_DTYPES.get((header.dtype.kind, header.dtype.itemsize))
        if dtype is None and header.dtype.kind in _ARGUMENT_TEXT_KINDS and header.dtype.names is None:
            non_numeric += 1  # a non-tensor argument saved as its text: nothing to compare
            continue
        if dtype is None:
            raise DumpFormatError(
                f"holds numpy dtype {header.dtype.str!r}, neither a tensor nor the text of a non-tensor argument",
                where=file_path,
                hint="the file is corrupt; dump again or remove it",
            )
        if file_path.parent not in saved_dtypes:
            saved_dtypes[file_path.parent] = read_saved_dtypes(file_path.parent, root)
        data = _tensor_data(file_path, header, dtype, saved_dtypes[file_path.parent].get(file_path.name))
        index = graph_index[placement.graph_folder]
        nodes_by_graph[index].setdefault(parsed.node, parsed.target)
        name = f"graph{index}/{parsed.node}" if index else parsed.node
        records.append(
            TensorRecord(
                key=RecordKey(name=name, io=parsed.io, position=parsed.position, step=placement.step),
                dtype=data.dtype,
                shape=header.shape,
                order=len(records),
                device="unknown",
                rank=placement.rank or 0,
                op_type=parsed.target,
                data=data,
                source_path=str(file_path.relative_to(root)),
                attrs={
                    "fx_node": parsed.node,
                    "fx_target": parsed.target,
                    "graph_index": index,
                    "graph_folder": placement.graph_folder,
                    "timestamp": parsed.timestamp,
                },
            )
        )
    if non_numeric:
        log.info("%s: %d non-numeric argument files (strings of non-tensor arguments) not compared", path, non_numeric)
    topology = TopologyNode(
        name=root.name,
        op_type="FxDump",
        children=tuple(
            TopologyNode(
                name=graph_folders[index],
                op_type="GraphModule",
                attrs={"graph_index": index},
                children=tuple(TopologyNode(name=node, op_type=target) for node, target in nodes.items()),
            )
            for index, nodes in sorted(nodes_by_graph.items())
        ),
    )
    manifest = {
        "source": SOURCE_NAME,
        "files": len(files),
        "non_numeric_files": non_numeric,
        "graph_folders": graph_folders,
        "rank": next(iter(ranks), None),
    }
    return Dump(source=SOURCE_NAME, root=root, records=records, topology=topology, manifest=manifest)
