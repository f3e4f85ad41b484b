"""An ATB dump folder read as records: the tensor tree, op parameters, topology and profiling.

Roots a reader recognises (every era of the tool): ``msit_dump_{TS}/``, ``msit_dump/``,
``ait_dump/``, ``atb_temp/`` and msprobe's ``atb_dump_data/{data,info}``. Inside::

    tensors/{device}_{pid}/{executeCount}/{id}_{OpType}/[{childId}_{ChildType}/...]
        before/intensor{i}.bin  after/outtensor{i}.bin  (and the other -time combinations)
        op_param.json
    layer/{pid}/{opName}.json    model/{pid}/{model}.json         (topology)
    operation_io_tensors/{pid}/operation_tensors_{n}.csv            (op CSV)
    cpu_profiling/{pid}/operation_statistic_{n}.{txt,csv}

Each tensor file is one :class:`~llmcheck.core.records.TensorRecord`: key name = op id
(``3_1``), ``io`` from the file name, ``position`` = its index, ``step`` = the execute
count, ``moment`` = the ``before``/``after`` folder. Records come in execution order:
by execute count, then depth first through the op tree with an op's ``before`` tensors
ahead of its children and its ``after`` tensors behind them. Only headers are read here;
the data stays on disk behind lazy handles. One ``{device}_{pid}`` folder per device is a
multi-rank run, read as one run whose records carry the device as their rank.

Nothing in the tensor tree is passed over without a word: a file in a ``before``/``after``
folder (or a ``.bin`` beside ``op_param.json``) whose name is not a tensor file name, a
folder whose name is not an execute count or ``{id}_{OpType}``, and a folder link (never
entered) are each named in a warning saying why their tensors were not read.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import (
    IO_INPUT,
    IO_OUTPUT,
    LAYOUT_TENSOR_FILES,
    MOMENT_AFTER,
    MOMENT_BEFORE,
    Dump,
    DumpNotFoundError,
    RecordKey,
    TensorRecord,
    TopologyNode,
    folder_link_reason,
    inside_dump,
    merge_rank_dumps,
    only_behind_folder_links,
    parse_dump_json,
    read_dump_file,
    warn_passed_over,
)
from llmcheck.plugins.atb import SOURCE_NAME
from llmcheck.plugins.atb.acl_dtypes import NZ_FORMATS
from llmcheck.plugins.atb.bin_format import BinHeader, no_data_reason, read_bin_header, tensor_data, tensor_shape
from llmcheck.plugins.atb.cpu_profiling import parse_cpu_profiling_text, read_cpu_profiling_csv
from llmcheck.plugins.atb.op_csv import OP_CSV_COLUMNS, SEPARATOR, read_op_csv
from llmcheck.plugins.atb.op_names import op_id_key, split_op_folder
from llmcheck.plugins.atb.topology import read_topology, to_topology_node

log = logging.getLogger("llmcheck.atb")

#: The key name of a lone tensor file's record (shared with the other single-file sources).
SINGLE_TENSOR_NAME = "tensor"
ROOT_PREFIXES = ("msit_dump", "ait_dump", "atb_temp")
MSPROBE_ROOT = "atb_dump_data"
#: How far up from the given path a dump root is looked for.
MAX_ROOT_SEARCH_DEPTH = 16
_RUN_FOLDER = re.compile(r"^(-?\d+)_(\d+)$")
_TENSOR_FILE = re.compile(r"^(?P<io>in|out)tensor(?P<index>\d+)(?:_(?P<ir>.+))?\.bin$", re.IGNORECASE)
_STATISTIC_NAME = re.compile(r"^operation_statistic_(\d+)\.(txt|csv)$")
_OP_CSV_NAME = re.compile(r"^operation_tensors_(\d+)\.csv$")
_TOPOLOGY_COUNTER = re.compile(r"_(\d+)$")
_NOT_A_TENSOR_NAME = "not read: the name is not intensor{i}.bin or outtensor{i}.bin (optionally _{name} before .bin)"


@dataclass(frozen=True, slots=True)
class DumpLayout:
    """Where one dump root keeps its parts (msit/ait layout or msprobe's ``atb_dump_data``)."""

    root: Path
    kind: str  # "msit" or "msprobe"

    @property
    def tensors_dir(self) -> Path:
        """Return the folder holding the ``{device}_{pid}`` run folders."""
        return self.root / ("data" if self.kind == "msprobe" else "tensors")

    def topology_dir(self, kind: str, device: int, pid: int) -> Path:
        """Return the folder of ``layer`` or ``model`` topology JSON for one run."""
        if self.kind == "msprobe":
            return self.root / "info" / kind / f"{device}_{pid}"
        return self.root / kind / str(pid)


def is_dump_root(path: Path) -> bool:
    """Return whether ``path`` is an ATB dump root folder of any era."""
    if not path.is_dir():
        return False
    if path.name == MSPROBE_ROOT:
        return (path / "data").is_dir() or (path / "info").is_dir()
    if path.name.startswith(ROOT_PREFIXES):
        return any(
            (path / part).is_dir()
            for part in ("tensors", "layer", "model", "operation_io_tensors", "kernel_io_tensors", "cpu_profiling")
        )
    return False


def _has_run_folders(folder: Path) -> bool:
    return folder.is_dir() and any(_RUN_FOLDER.match(child.name) and child.is_dir() for child in folder.iterdir())


def layout_of(root: Path) -> DumpLayout:
    """Return the layout of a dump root folder."""
    return DumpLayout(root, "msprobe" if root.name == MSPROBE_ROOT else "msit")


def locate_dump(path: Path) -> DumpLayout | None:
    """Return the ATB dump ``path`` belongs to (itself, an ancestor, or its one dump child), or ``None``.

    A folder holding several dumps is an error that lists them.
    """
    path = Path(path).absolute()
    for candidate in [path, *path.parents][:MAX_ROOT_SEARCH_DEPTH]:
        if is_dump_root(candidate):
            return layout_of(candidate)
        renamed_msit = candidate.name == "tensors"
        renamed_msprobe = candidate.name == "data" and (candidate.parent / "info").is_dir()
        if (renamed_msit or renamed_msprobe) and _has_run_folders(candidate):
            # A root copied or moved under another name: the tensor tree's parent is the root.
            return DumpLayout(candidate.parent, "msprobe" if renamed_msprobe else "msit")
    if not path.is_dir():
        return None
    roots = sorted(child for child in path.iterdir() if is_dump_root(child))
    if not roots and _has_run_folders(path / "tensors"):
        return DumpLayout(path, "msit")
    if len(roots) > 1:
        listing = ", ".join(root.name for root in roots)
        raise DumpNotFoundError(
            f"holds {len(roots)} ATB dumps: {listing}", where=path, hint="pass one of them as the path"
        )
    return layout_of(roots[0]) if roots else None


def _run_folders(layout: DumpLayout) -> tuple[list[Path], list[Path]]:
    """Return the ``{device}_{pid}`` run folders by device, and those that are links (never entered)."""
    folder = layout.tensors_dir
    if not folder.is_dir():
        return [], []
    runs = [child for child in folder.iterdir() if child.is_dir() and _RUN_FOLDER.match(child.name)]
    links = sorted(run for run in runs if run.is_symlink())
    return sorted(
        (run for run in runs if not run.is_symlink()),
        key=lambda child: tuple(int(part) for part in _RUN_FOLDER.match(child.name).groups()),  # type: ignore[union-attr]
    ), links


def _other_run_level_folders(layout: DumpLayout) -> list[Path]:
    """Return the folders beside the ``{device}_{pid}`` run folders whose names are not one (not read)."""
    folder = layout.tensors_dir
    if not folder.is_dir():
        return []
    return sorted(child for child in folder.iterdir() if child.is_dir() and not _RUN_FOLDER.match(child.name))


def _overlaps(folder: Path, scope: Path | None) -> bool:
    """Return whether a folder holds part of the scope (or the scope holds it)."""
    return scope is None or folder.is_relative_to(scope) or scope.is_relative_to(folder)


def _read_op_param(op_dir: Path, dump_root: Path) -> dict[str, Any] | None:
    param_path = op_dir / "op_param.json"
    if not os.path.lexists(param_path):
        return None
    try:
        text = read_dump_file(param_path, dump_root)
    except FileNotFoundError:
        return None
    value = parse_dump_json(text or b"{}", param_path)
    if value in ("", None):  # graph operations have no params of their own
        return {}
    return value if isinstance(value, dict) else {"param": value}


@dataclass
class _Walk:
    """State of one walk over a run's tensor tree."""

    layout: DumpLayout
    run: Path
    device: int
    scope: Path | None
    records: list[TensorRecord]
    csv_params: dict[tuple[int, str], dict[str, Any]] | None = None
    #: Files and folders of the tree that were not read, each with why.
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def skip(self, path: Path, why: str) -> None:
        """Note a file or folder of the tree that is not read (reported once the walk is done)."""
        if self.scope is None or path.is_relative_to(self.scope):
            self.skipped.append((path, why))

    def skip_folder_link(self, link: Path) -> None:
        """Note a folder link: never entered, so its tensors are not read."""
        self.skip(link, folder_link_reason(link, self.layout.root))

    @property
    def root_prefix_chars(self) -> int:
        """Return how many characters of a file path name the dump root and its separator."""
        return len(str(self.layout.root)) + 1

    def op_param_from_csv(self, step: int, op_name: str) -> dict[str, Any] | None:
        """Return an op's params from the op CSV of its execute count (op_param.json is missing)."""
        if self.csv_params is None:
            self.csv_params = {}
            pid = self.run.name.split("_", 1)[1]
            folder = self.layout.root / "operation_io_tensors" / pid
            if folder.is_dir():
                for csv_path in folder.iterdir():
                    match = _OP_CSV_NAME.match(csv_path.name)
                    if match:
                        for row in read_op_csv(csv_path, self.layout.root):
                            self.csv_params.setdefault((int(match.group(1)), row.op_name), dict(row.op_param))
        return self.csv_params.get((step, op_name))


def _tensor_files(folder: Path, walk: _Walk, *, moment_folder: bool) -> list[tuple[str, int, str | None, Path]]:
    """Return ``(io, index, ir name, path)`` of the tensor files in a folder, inputs first, by index.

    A ``before``/``after`` folder (``moment_folder``) holds tensor files only, so any other
    file in it is noted as skipped; in an op folder only a ``.bin`` file is (``op_param.json``
    lives there).
    """
    found = []
    try:
        entries = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    with entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                continue  # anything else named like a tensor file (a link, a FIFO) is judged by inside_dump
            match = _TENSOR_FILE.match(entry.name)
            if match:
                io = IO_INPUT if match.group("io").lower() == "in" else IO_OUTPUT
                found.append((io, int(match.group("index")), match.group("ir"), Path(entry.path)))
            elif not entry.name.startswith(".") and (moment_folder or entry.name.lower().endswith(".bin")):
                walk.skip(Path(entry.path), _NOT_A_TENSOR_NAME)
    return sorted(found, key=lambda item: (item[0] != IO_INPUT, item[1], item[2] or ""))


def _record(
    walk: _Walk,
    path: Path,
    header: BinHeader,
    *,
    op_id: str,
    op_type: str,
    parent: str | None,
    step: int,
    io: str,
    index: int,
    moment: str,
    ir_name: str | None,
    op_path: str,
    op_param: dict[str, Any] | None,
) -> TensorRecord:
    acl = header.acl_dtype
    attrs: dict[str, Any] = {"op_name": f"{op_type}_{op_id}", "op_path": op_path, "format": header.format}
    if op_param is not None:
        attrs["op_param"] = op_param
    if ir_name:
        attrs["ir_name"] = ir_name
    if header.format_code in NZ_FORMATS:
        attrs["storage_dims"] = list(header.dims)
    reason = no_data_reason(header)
    if reason:
        attrs["no_data"] = reason
    if header.data_reference:
        attrs["data_reference"] = header.data_reference
    return TensorRecord(
        key=RecordKey(name=op_id, io=io, position=str(index), step=step, moment=moment),
        dtype=acl.torch_name or acl.atb_name,
        shape=tensor_shape(header),
        order=len(walk.records),
        device=f"npu:{walk.device}",
        rank=max(walk.device, 0),
        op_type=op_type,
        parent=parent,
        stats=header.stats,
        data=tensor_data(header, walk.layout.root),
        source_path=str(path)[walk.root_prefix_chars :].replace(os.sep, "/"),
        attrs=attrs,
    )


def _visit_op(walk: _Walk, op_dir: Path, step: int, ids: tuple[int, ...], names: tuple[str, ...], op_type: str) -> None:
    op_id = "_".join(str(i) for i in ids)
    parent = "_".join(str(i) for i in ids[:-1]) or None
    op_param = _read_op_param(op_dir, walk.layout.root)
    if op_param is None:
        op_param = walk.op_param_from_csv(step, f"{op_type}_{op_id}")
    op_path = "/".join(names)

    def emit(files: list[tuple[str, int, str | None, Path]], moment: str) -> None:
        for io, index, ir_name, path in files:
            if walk.scope is not None and not path.is_relative_to(walk.scope):
                continue
            header = read_bin_header(inside_dump(path, walk.layout.root))
            walk.records.append(
                _record(
                    walk,
                    path,
                    header,
                    io=io,
                    index=index,
                    moment=moment,
                    ir_name=ir_name,
                    op_id=op_id,
                    op_type=op_type,
                    parent=parent,
                    step=step,
                    op_path=op_path,
                    op_param=op_param,
                )
            )

    loose = _tensor_files(op_dir, walk, moment_folder=False)  # tensors next to op_param.json (no before/after)
    before = _tensor_files(op_dir / MOMENT_BEFORE, walk, moment_folder=True)
    emit(before + [item for item in loose if item[0] == IO_INPUT], MOMENT_BEFORE)
    for index, child_type, child in _op_folders(op_dir, walk):
        if _overlaps(child, walk.scope):
            _visit_op(walk, child, step, (*ids, index), (*names, child.name), child_type)
    after = _tensor_files(op_dir / MOMENT_AFTER, walk, moment_folder=True)
    emit(after + [item for item in loose if item[0] == IO_OUTPUT], MOMENT_AFTER)


def _op_folders(folder: Path, walk: _Walk) -> Iterator[tuple[int, str, Path]]:
    """Yield ``(index, op type, folder)`` of the op folders in a folder, by index.

    Folder links (never entered) and folders that are not ``{index}_{OpType}`` are noted as skipped.
    """
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name in (MOMENT_BEFORE, MOMENT_AFTER) or not entry.is_dir():
                continue
            if entry.is_symlink():
                walk.skip_folder_link(Path(entry.path))
                continue
            parsed = split_op_folder(entry.name)
            if parsed is None:
                walk.skip(Path(entry.path), "not read: the folder name is not {index}_{OpType}")
            else:
                found.append((parsed[0], parsed[1], Path(entry.path)))
    yield from sorted(found, key=lambda item: (item[0], item[1]))


def _step_folders(run: Path, walk: _Walk) -> list[tuple[int, Path]]:
    """Return ``(execute count, folder)`` of a run's execute-count folders; other folders are noted as skipped."""
    steps = []
    for child in run.iterdir():
        if not child.is_dir():
            continue
        if child.is_symlink():
            walk.skip_folder_link(child)
        elif child.name.isdigit():
            steps.append((int(child.name), child))
        else:
            walk.skip(child, "not read: the folder name is not an execute count")
    return sorted(steps)


def _topology(layout: DumpLayout, device: int, pid: int) -> tuple[TopologyNode | None, list[Path]]:
    """Return the run's topology tree (model JSON, else layer JSON) and the files it came from."""
    models = sorted(layout.topology_dir("model", device, pid).glob("*.json"))
    layers = sorted(layout.topology_dir("layer", device, pid).glob("*.json"))
    files = models or layers
    if not files:
        return None, []
    graphs = [read_topology(path, layout.root) for path in files]

    def first_counter(graph: Any) -> tuple[int, str]:
        name = graph.children[0].op_name if graph.is_model and graph.children else graph.op_name
        match = _TOPOLOGY_COUNTER.search(name)
        return (int(match.group(1)) if match else -1, graph.op_name)

    graphs.sort(key=first_counter)  # the prefill model (lower layer counters) first
    nodes = tuple(to_topology_node(graph) for graph in graphs)
    if len(nodes) == 1:
        return nodes[0], files
    return TopologyNode(
        name=layout.root.name, op_type="AtbRun", children=nodes, attrs={"topology_files": [path.name for path in files]}
    ), files


def _topology_from_records(run_name: str, records: list[TensorRecord]) -> TopologyNode | None:
    """Return the op tree the tensor folders show (first execute count), for dumps without topology JSON."""
    if not records:
        return None
    first_step = records[0].key.step
    types: dict[str, str] = {}
    for record in records:
        if record.key.step != first_step:
            continue
        path_parts = record.attrs.get("op_path", "").split("/")
        ids: list[str] = []
        for part in path_parts:
            parsed = split_op_folder(part)
            if parsed is None:
                break
            ids.append(str(parsed[0]))
            types.setdefault("_".join(ids), parsed[1])

    children: dict[str, list[str]] = {}
    for op_id in types:
        children.setdefault(op_id.rpartition("_")[0], []).append(op_id)

    def build(op_id: str) -> TopologyNode:
        below = sorted(children.get(op_id, []), key=op_id_key)
        return TopologyNode(
            name=op_id,
            op_type=types[op_id],
            children=tuple(build(child) for child in below),
            attrs={"op_name": f"{types[op_id]}_{op_id}"},
        )

    tops = sorted(children.get("", []), key=op_id_key)
    return TopologyNode(name=run_name, op_type="AtbRun", children=tuple(build(op_id) for op_id in tops))


def _cpu_profiling(layout: DumpLayout, pid: int) -> tuple[dict[tuple[int, str], dict[str, Any]], list[Path]]:
    """Return per ``(execute count, op name)`` cpu profiling values and the files read."""
    folder = layout.root / "cpu_profiling"
    if not folder.is_dir():
        return {}, []
    if (folder / str(pid)).is_dir():
        folder = folder / str(pid)
    chosen: dict[int, Path] = {}
    for path in sorted(folder.rglob("operation_statistic_*")):
        match = _STATISTIC_NAME.match(path.name)
        if match and (match.group(2) == "csv" or int(match.group(1)) not in chosen):
            chosen[int(match.group(1))] = path  # a converted CSV wins over its text file
    values: dict[tuple[int, str], dict[str, Any]] = {}
    for step, path in chosen.items():
        table: Mapping[str, Mapping[str, Any]] = (
            read_cpu_profiling_csv(path, layout.root)
            if path.suffix == ".csv"
            else parse_cpu_profiling_text(path, layout.root)
        )
        for op_name, columns in table.items():
            values[(step, op_name)] = {name: _number(value) for name, value in columns.items()}
    return values, list(chosen.values())


def _number(value: Any) -> Any:
    """Return a profiling cell as a number (µs or a count) when it is one, else as it is."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _single_file_dump(path: Path) -> Dump:
    """Return a lone ``.bin`` file as a one-record dump keyed ``tensor`` (as every single-file source is, so
    ``llmcheck compare -gp a.npy -mp b.bin`` pairs the two)."""
    header = read_bin_header(path)
    attrs: dict[str, Any] = {"format": header.format}
    match = _TENSOR_FILE.match(path.name)
    if match:
        attrs["file_role"] = f"{match.group('io').lower()}tensor{match.group('index')}"
    reason = no_data_reason(header)
    if reason:
        attrs["no_data"] = reason
    acl = header.acl_dtype
    record = TensorRecord(
        key=RecordKey(name=SINGLE_TENSOR_NAME),
        dtype=acl.torch_name or acl.atb_name,
        shape=tensor_shape(header),
        order=0,
        stats=header.stats,
        data=tensor_data(header, path.parent),
        source_path=path.name,
        attrs=attrs,
    )
    return Dump(
        source=SOURCE_NAME,
        root=path.parent,
        records=[record],
        manifest={"format": "atb", "layout": LAYOUT_TENSOR_FILES, "file": path.name},
    )


def _op_csv_dump(path: Path) -> Dump:
    """Return an op or kernel CSV as description-only records: each op's tensors with dtype, shape and params.

    ``llmcheck opcheck -c operation_tensors_N.csv`` reads op parameters from it when a dump
    has no ``op_param.json``; the execute count is the ``N`` of the file name.
    """
    match = re.match(r"^(?:operation|kernel)_tensors_(\d+)\.csv$", path.name)
    step = int(match.group(1)) if match else 0
    records: list[TensorRecord] = []
    for row in read_op_csv(path):
        op_id = row.op_id if row.op_id is not None else str(row.case_num)
        for io, tensors in ((IO_INPUT, row.inputs), (IO_OUTPUT, row.outputs)):
            for index, tensor in enumerate(tensors):
                records.append(
                    TensorRecord(
                        key=RecordKey(name=op_id, io=io, position=str(index), step=step),
                        dtype=tensor.dtype or tensor.atb_dtype,
                        shape=tensor.shape,
                        order=len(records),
                        op_type=row.op_type,
                        source_path=path.name,
                        attrs={
                            "op_name": row.op_name,
                            "op_param": dict(row.op_param),
                            "format": tensor.format,
                            "no_data": "the op CSV describes tensors, it holds no data",
                        },
                    )
                )
    return Dump(
        source=SOURCE_NAME,
        root=path.parent,
        records=records,
        manifest={"format": "atb", "layout": "op_csv", "file": path.name},
    )


def looks_like_op_csv(path: Path) -> bool:
    """Return whether a file starts with the 21-column header of ATB's op and kernel CSVs."""
    if path.suffix != ".csv" or not path.is_file():
        return False
    with open(path, "rb") as handle:
        first_line = handle.readline(4096).decode("utf-8", "replace").rstrip("\r\n")
    return tuple(first_line.split(SEPARATOR)) == OP_CSV_COLUMNS


def looks_like_bin(path: Path) -> bool:
    """Return whether a file starts like an ATB tensor file (a ``name=value`` header line)."""
    if path.suffix != ".bin" or not path.is_file():
        return False
    with open(path, "rb") as handle:
        start = handle.read(64)
    return start.startswith((b"$Version=", b"dtype=", b"format=", b"dims=", b"$Object"))


def load_atb_dump(path: Path) -> Dump | None:
    """Return the records of the ATB dump at ``path`` (a root, a folder in it or above it, a file), or ``None``."""
    path = Path(path)
    layout = locate_dump(path)
    if layout is None:
        if looks_like_op_csv(path):
            return _op_csv_dump(path)
        return _single_file_dump(path) if looks_like_bin(path) else None
    absolute = path.absolute()
    scope = absolute if absolute.is_relative_to(layout.tensors_dir) and absolute != layout.tensors_dir else None
    runs, links = _run_folders(layout)
    if scope is not None:
        runs = [run for run in runs if scope.is_relative_to(run)]
    else:
        for folder in _other_run_level_folders(layout):
            log.warning("%s: not read: the folder name is not {device}_{pid}", folder)
        if links and not runs:
            raise only_behind_folder_links(layout.root, links)
        warn_passed_over(log, layout.tensors_dir, [(link, folder_link_reason(link, layout.root)) for link in links])
    if not runs:
        raise DumpNotFoundError(
            "ATB dump holds no tensors",
            where=path,
            hint="dump with --type tensor (the topology and CSV files alone cannot be compared)",
        )
    devices = [int(_RUN_FOLDER.match(run.name).group(1)) for run in runs]  # type: ignore[union-attr]
    if len(set(devices)) < len(devices):  # two processes on one device: two runs, not the ranks of one
        listing = ", ".join(run.relative_to(layout.root).as_posix() for run in runs)
        raise DumpNotFoundError(
            f"ATB dump holds {len(runs)} runs (device_pid folders): {listing}",
            where=path,
            hint="pass one of them as the path; one folder per device is read as one multi-rank run",
        )
    if len(runs) > 1:
        return merge_rank_dumps(
            [_run_dump(layout, run, scope) for run in runs], [max(d, 0) for d in devices], layout.root
        )
    return _run_dump(layout, runs[0], scope)


def _run_dump(layout: DumpLayout, run: Path, scope: Path | None) -> Dump:
    """Return the records of one ``{device}_{pid}`` folder of an ATB dump."""
    device, pid = (int(part) for part in _RUN_FOLDER.match(run.name).groups())  # type: ignore[union-attr]
    walk = _Walk(layout=layout, run=run, device=device, scope=scope, records=[])
    steps = _step_folders(run, walk)
    for step, step_dir in steps:
        if not _overlaps(step_dir, scope):
            continue
        for index, op_type, op_dir in _op_folders(step_dir, walk):
            if _overlaps(op_dir, scope):
                _visit_op(walk, op_dir, step, (index,), (op_dir.name,), op_type)
    warn_passed_over(log, walk.run, walk.skipped)
    records = walk.records
    profiling, profiling_files = _cpu_profiling(layout, pid)
    if profiling:
        records = [
            record.with_changes(attrs={**record.attrs, "cpu_profiling": profiling[key]})
            if (key := (record.key.step, record.attrs["op_name"])) in profiling
            else record
            for record in records
        ]
    topology, topology_files = _topology(layout, device, pid)
    if topology is None:
        topology = _topology_from_records(run.name, records)
    manifest = {
        "format": "atb",
        "layout": layout.kind,
        "run": run.name,
        "device": device,
        "pid": pid,
        "execute_counts": [step for step, _ in steps],
        "topology_files": [file.relative_to(layout.root).as_posix() for file in topology_files],
        "cpu_profiling_files": [file.relative_to(layout.root).as_posix() for file in profiling_files],
        "scope": scope.relative_to(layout.root).as_posix() if scope is not None else None,
    }
    log.info("%s: %d ATB tensor files, %d execute counts", layout.root, len(records), len(steps))
    return Dump(source=SOURCE_NAME, root=layout.root, records=records, topology=topology, manifest=manifest)
