"""A GE dump tree (torchair graph mode) read as records: the "ge" source.

CANN lays the files out as ``[worldsize{W}_global_rank{R}/]{YYYYMMDDHHMMSS}/{device}/{model}/
{modelId}/{step}/{OpType}.{OpName}.{task}.{stream}.{ts}`` (torch_npu up to 7.1.0 has no
world-size level). torchair writes the graph it compiled beside the dump as
``dynamo_original_graph_*.txt``; when found, each dumped model is matched to the graph file
whose op names it shares most, records are ordered by graph position, and the graphs go
into ``Dump.topology`` for the GE pairings.

Records: ``RecordKey(name=op name, io, position=str(i), step, call_index)`` (``call_index``
counts repeats of one op within a step; with several graphs the name is prefixed
``graph{k}/``), ``op_type`` = GE op type, device ``npu:{device}``, rank from the world-size
level (else the device), data as byte ranges of the dump file (a loader for FRACTAL_NZ and
NC1HWC0, converted back to ``original_shape``).

A file among the dump files whose name is not a dump file name, and a folder link (never
entered), are named in a warning saying they were not read.
"""

from __future__ import annotations

import logging
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from llmcheck.plugin_api import (
    IO_INPUT,
    IO_OUTPUT,
    Dump,
    DumpNotFoundError,
    RecordKey,
    TensorRecord,
    TopologyNode,
    inside_dump,
    warn_passed_over,
)
from llmcheck.plugins.torchair_ge import SOURCE_NAME
from llmcheck.plugins.torchair_ge.ge_dtypes import PLAIN_FORMATS
from llmcheck.plugins.torchair_ge.ge_dump import (
    GeDumpFile,
    GeDumpFileName,
    dump_files_under,
    parse_dump_file_name,
    read_ge_dump,
)
from llmcheck.plugins.torchair_ge.ge_graph_text import GeGraph, GraphFileName, parse_graph_file_name, read_ge_graph

GRAPH_SEARCH_LEVELS_UP = 8
GRAPH_SEARCH_LEVELS_DOWN = 6

log = logging.getLogger("llmcheck.ge")

T = TypeVar("T")
_RANK_FOLDER = re.compile(r"^worldsize(\d+)_global_rank(\d+)$")
_TIME_FOLDER = re.compile(r"^\d{14}$")


@dataclass(frozen=True, slots=True)
class DumpPlacement:
    """Where a dump file sits in the CANN tree: step, model, device, run (time folder), rank."""

    step: int
    model: str  # "{model name}/{model id}", or the folder name when the tree is partial
    device: str | None
    run: str | None
    rank: int | None
    world_size: int | None


def placement_of(file_path: Path) -> DumpPlacement:
    """Return what the folders above a dump file say about it (missing levels stay ``None``)."""
    levels = list(reversed(file_path.parent.parts))

    def level(i: int) -> str:
        return levels[i] if i < len(levels) else ""

    if not level(0).isdigit():
        return DumpPlacement(0, level(0), None, None, None, None)
    step = int(level(0))
    if not level(1).isdigit():
        return DumpPlacement(step, level(1), None, None, None, None)
    model = f"{level(2)}/{level(1)}"
    device = level(3) if level(3).isdigit() else None
    run = level(4) if device is not None and _TIME_FOLDER.match(level(4)) else None
    rank_match = _RANK_FOLDER.match(level(5)) if run is not None else None
    rank = int(rank_match[2]) if rank_match else None
    world_size = int(rank_match[1]) if rank_match else None
    return DumpPlacement(step, model, device, run, rank, world_size)


def _natural_key(text: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _at_most_one(values: set[T], what: str, where: Path) -> T | None:
    """Return the one value (``None`` for none); several are a run the user must choose among."""
    if len(values) > 1:
        shown = ", ".join(sorted(str(v) for v in values))
        raise DumpNotFoundError(
            f"holds GE dumps of several {what} ({shown})",
            where=where,
            hint="point --golden-path/--my-path at one of them",
        )
    return next(iter(values)) if values else None


def find_graph_files(dump_root: Path, start: Path, rank: int | None) -> list[Path]:
    """Return the ``dynamo_original_graph_*.txt`` files of a GE dump, in graph order.

    Looked for below ``start`` (a few levels) and beside every folder above the dump root,
    where torchair writes them when the graph dump and data dump share a path. Files of
    another rank are skipped; files of several processes are refused (two runs mixed).
    """
    found: dict[Path, GraphFileName] = {}
    base_depth = len(start.parts)
    for directory, sub_folders, file_names in os.walk(start):  # folder links are not entered
        if len(Path(directory).parts) - base_depth >= GRAPH_SEARCH_LEVELS_DOWN:
            sub_folders[:] = []
        for file_name in file_names:
            parsed = parse_graph_file_name(file_name)
            if parsed is not None:
                found[inside_dump(Path(directory) / file_name, start)] = parsed
    folder = dump_root
    for _ in range(GRAPH_SEARCH_LEVELS_UP):
        if found or folder.parent == folder:
            break
        folder = folder.parent
        for entry in sorted(folder.iterdir()):
            parsed = parse_graph_file_name(entry.name)
            if parsed is not None and entry.is_file():
                found[inside_dump(entry, folder)] = parsed
    chosen = {
        path: parsed for path, parsed in found.items() if rank is None or parsed.rank is None or parsed.rank == rank
    }
    pids = {parsed.pid for parsed in chosen.values() if parsed.pid is not None}
    if len(pids) > 1:
        raise DumpNotFoundError(
            f"graph files of several processes (pids {', '.join(map(str, sorted(pids)))}) sit beside this GE dump",
            where=dump_root,
            hint="two runs were written to one folder; keep one run's graphs and dump per folder",
        )

    def graph_order(graph_path: Path) -> tuple[int, int, str]:
        parsed = chosen[graph_path]
        return (parsed.graph_id if parsed.graph_id is not None else -1, parsed.timestamp, str(graph_path))

    return sorted(chosen, key=graph_order)


def _match_graphs(names_by_model: dict[str, set[str]], graphs: list[GeGraph]) -> dict[str, GeGraph]:
    """Return, for each dumped model, the graph sharing most of its op names (index order breaks ties)."""
    matched: dict[str, GeGraph] = {}
    for index, model in enumerate(sorted(names_by_model, key=_natural_key)):
        best: tuple[int, int] | None = None
        for graph_index, graph in enumerate(graphs):
            known = graph.op_by_name()
            shared = sum(1 for name in names_by_model[model] if name in known or graph.constituents(name))
            score = (shared, -abs(graph_index - index))
            if shared and (best is None or score > best):
                best = score
                matched[model] = graph
    return matched


def load_ge_dump(path: Path) -> Dump | None:
    """Return the records of the GE dump at ``path`` (a dump tree, a folder in it, or one file).

    Returns ``None`` when ``path`` holds no GE dump file. Raises
    :class:`~llmcheck.core.errors.DumpNotFoundError` when it holds several runs, ranks or
    devices (point at one) and :class:`~llmcheck.core.errors.DumpFormatError` for a broken file.
    """
    path = Path(path)
    if path.is_file():
        parsed = parse_dump_file_name(path.name)
        files = [(path, parsed)] if parsed is not None else []
    else:
        skipped: list[tuple[Path, str]] = []
        files = dump_files_under(path, skipped)
        if files:
            warn_passed_over(log, path, skipped)
    if not files:
        return None
    resolved_root = path.resolve()  # once: the folder names above the given path count too
    placements = {
        file_path: placement_of(
            resolved_root.parent / file_path.name if path.is_file() else resolved_root / file_path.relative_to(path)
        )
        for file_path, _ in files
    }
    rank = _at_most_one({p.rank for p in placements.values() if p.rank is not None}, "ranks", path)
    _at_most_one({p.run for p in placements.values() if p.run is not None}, "runs, time folders", path)
    device = _at_most_one({p.device for p in placements.values() if p.device is not None}, "devices", path)
    dump_root = path if path.is_dir() else path.parent
    graph_files = find_graph_files(dump_root.resolve(), dump_root, rank)
    graphs = [read_ge_graph(graph_file) for graph_file in graph_files]

    names_by_model: dict[str, set[str]] = defaultdict(set)
    for file_path, parsed in files:
        names_by_model[placements[file_path].model].add(parsed.op_name)
    models = sorted(names_by_model, key=_natural_key)
    graph_of_model = _match_graphs(names_by_model, graphs)
    model_index = {model: index for index, model in enumerate(models)}
    prefixed = len(models) > 1

    def execution_order(item: tuple[Path, GeDumpFileName]) -> tuple[int, int, float, int, str]:
        """Step, graph, the op's place in its graph (unknown ops by time), then time."""
        file_path, parsed = item
        placement = placements[file_path]
        graph = graph_of_model.get(placement.model)
        constituents = graph.constituents(parsed.op_name) if graph is not None else []
        graph_position = constituents[0].position if constituents else float("inf")
        return placement.step, model_index[placement.model], graph_position, parsed.timestamp_us, str(file_path)

    records: list[TensorRecord] = []
    calls: dict[tuple[int, int, str], int] = defaultdict(int)
    for file_path, parsed in sorted(files, key=execution_order):
        placement = placements[file_path]
        step, graph_index = placement.step, model_index[placement.model]
        dump_file = read_ge_dump(file_path)
        call_key = (step, graph_index, parsed.op_name)
        call_index = calls[call_key]
        calls[call_key] += 1
        name = f"graph{graph_index}/{parsed.op_name}" if prefixed else parsed.op_name
        records.extend(
            _records_of_file(
                dump_file,
                parsed,
                placement,
                name,
                step,
                call_index,
                graph_index,
                len(records),
                _relative(file_path, dump_root),
            )
        )
    topology = _topology(dump_root, models, graph_of_model)
    manifest = {
        "source": SOURCE_NAME,
        "files": len(files),
        "rank": rank,
        "device": device,
        "world_size": next((p.world_size for p in placements.values() if p.world_size is not None), None),
        "graph_files": [str(p) for p in graph_files],
        "graph_of_model": {model: str(graph.path) for model, graph in graph_of_model.items()},
        "models": models,
    }
    return Dump(source=SOURCE_NAME, root=dump_root, records=records, topology=topology, manifest=manifest)


def _relative(file_path: Path, root: Path) -> str:
    try:
        return str(file_path.relative_to(root))
    except ValueError:
        return str(file_path)


def _records_of_file(
    dump_file: GeDumpFile,
    parsed: GeDumpFileName,
    placement: DumpPlacement,
    name: str,
    step: int,
    call_index: int,
    graph_index: int,
    first_order: int,
    source_path: str,
) -> list[TensorRecord]:
    device_number = placement.device
    rank = placement.rank if placement.rank is not None else int(device_number) if device_number else 0
    records: list[TensorRecord] = []
    for io, tensors in ((IO_INPUT, dump_file.inputs), (IO_OUTPUT, dump_file.outputs)):
        for position, tensor in enumerate(tensors):
            attrs: dict[str, object] = {
                "ge_op_name": parsed.op_name,
                "ge_op_type": parsed.op_type,
                "graph_index": graph_index,
                "format": tensor.format_name,
                "storage_shape": list(tensor.shape),
                "timestamp_us": parsed.timestamp_us,
                "task_id": parsed.task_id,
                "stream_id": parsed.stream_id,
                "model": placement.model,
                "file_form": "framed" if dump_file.framed else "bare",
            }
            if tensor.original_shape is not None:
                attrs["original_shape"] = list(tensor.original_shape)
            if tensor.format_code not in PLAIN_FORMATS and not tensor.converts_layout:
                attrs["note"] = f"{tensor.format_name} payload kept in its storage layout (not converted)"
            data = tensor.tensor_data(dump_file.path)
            if data is None:
                attrs["note"] = f"dtype {tensor.dtype} has no torch counterpart; not compared"
            records.append(
                TensorRecord(
                    key=RecordKey(name=name, io=io, position=str(position), step=step, call_index=call_index),
                    dtype=tensor.dtype,
                    shape=tensor.logical_shape,
                    order=first_order + len(records),
                    device=f"npu:{device_number}" if device_number else "npu",
                    rank=rank,
                    op_type=parsed.op_type,
                    data=data,
                    source_path=source_path,
                    attrs=attrs,
                )
            )
    return records


def _topology(root: Path, models: list[str], graph_of_model: dict[str, GeGraph]) -> TopologyNode | None:
    """Return root -> one node per dumped graph -> its ops (inputs ``src:i``, outputs ``name:k``)."""
    graph_nodes = []
    for graph_index, model in enumerate(models):
        graph = graph_of_model.get(model)
        if graph is None:
            continue
        ops = tuple(
            TopologyNode(
                name=op.name,
                op_type=op.op_type,
                inputs=op.inputs,
                outputs=tuple(f"{op.name}:{k}" for k in range(len(op.fx_tensor_names))),
                attrs={"fx_tensor_names": [fx or "" for fx in op.fx_tensor_names], "position": op.position},
            )
            for op in graph.ops
        )
        graph_nodes.append(
            TopologyNode(
                name=graph.name or f"graph{graph_index}",
                op_type="GraphDef",
                children=ops,
                attrs={"graph_index": graph_index, "graph_file": str(graph.path), "model": model},
            )
        )
    if not graph_nodes:
        return None
    return TopologyNode(name=root.name, op_type="GeDump", children=tuple(graph_nodes))
