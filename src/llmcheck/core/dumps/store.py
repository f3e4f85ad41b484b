"""llmcheck's own dump format: a directory any tool can read, written at disk speed, crash-consistent.

Layout of one dump (see ``docs/dump-format.md``)::

    llmcheck_dump_{YYYYmmdd_HHMMSS}_{pid}[_{suffix}]/
        manifest.json          format version, backend, torch version, command line, config, times, rank
        index.jsonl            one JSON object per record, appended batch by batch
        shard_00000.safetensors  tensor data, one shard per batch, closed at a size bound

Why this shape: safetensors and JSON Lines are open and memory-mappable; shards written in
one sequential pass make the dump run near disk speed; and the write order -- shard to a
temporary name, rename, *then* append the index lines that point into it -- means a writer
killed at any instant leaves a dump whose index only names complete shards. The reader
returns every record flushed before a kill and reports the cut instead of failing.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from math import prod
from operator import attrgetter
from pathlib import Path
from sys import intern
from typing import TYPE_CHECKING, Any

import msgspec

from llmcheck.core.dtypes import DTYPE_ITEMSIZE
from llmcheck.core.dumps.atomic_files import TEMPORARY_SUFFIX, atomic_write_text, remove_quietly, write_failed
from llmcheck.core.dumps.dump_paths import (
    METADATA_LIMIT_BYTES,
    dump_file_lines,
    inside_dump,
    plain_file_names,
    read_dump_file,
)
from llmcheck.core.dumps.dump_schema import (
    IndexLine,
    ManifestJson,
    ReadIndexLine,
    ShardEntry,
    StatsJson,
    TopologyJson,
    convert,
    decode,
    decoder,
)
from llmcheck.core.dumps.record_rows import RecordRows, StatsValues
from llmcheck.core.errors import DumpFormatError, DumpNotFoundError, LlmcheckError, UsageError, WriteFailedError
from llmcheck.core.gc_pause import paused_cyclic_gc
from llmcheck.core.records import (
    BatchLayout,
    Dump,
    RecordKey,
    TensorData,
    TensorRecord,
    TensorStats,
    TopologyNode,
    build_record,
    build_stats,
    number_from_json,
    slot_builder,
)

log = logging.getLogger("llmcheck.store")

if TYPE_CHECKING:  # pragma: no cover
    import torch

FORMAT_NAME = "llmcheck-dump"
#: The source name a dump of this format is read under (``--golden-source llmcheck``).
NATIVE_SOURCE = "llmcheck"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
INDEX_NAME = "index.jsonl"
TOPOLOGY_NAME = "topology.json"
#: A serving engine's per-step batch bookkeeping, one :class:`~llmcheck.core.records.BatchLayout` JSON per line.
BATCHES_NAME = "batches.jsonl"
#: The shards a writer was killed while writing: renamed only once whole, before any index line names them.
UNFINISHED_SHARDS = "shard_*.safetensors.tmp"
DUMP_DIR_PREFIX = "llmcheck_dump_"
#: The manifest field of a dump whose capture ran the program cast to another dtype (torch: ``--as-dtype``):
#: ``{"to": dtype, "from": {dtype: count of floating parameters and buffers}, "outputs_returned_as": dtype}``.
AS_DTYPE_FIELD = "as_dtype"
#: The manifest field a capture may add: how many of the model's floating parameters run in each dtype
#: (``{"bfloat16": 272}``), the precision of a run even when its dump holds only float32 logits.
MODEL_DTYPES_FIELD = "model_dtypes"
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024
#: A batch of statistics-only records is flushed after this many records, bounding what a kill loses.
MAX_RECORDS_PER_BATCH = 4096

#: safetensors dtype codes; dtypes missing here are stored as raw ``U8`` bytes (true dtype in the index).
SAFETENSORS_DTYPE: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "complex64": "C64",
}


# --- record <-> JSON --------------------------------------------------------------------


def record_to_json(record: TensorRecord) -> dict[str, Any]:
    """Return a record as one index line's JSON object (data location excluded)."""
    key = record.key
    return index_line(
        (key.name, key.io, key.position, key.step, key.call_index, key.moment),
        record.dtype,
        record.shape,
        record.order,
        record.device,
        record.rank,
        record.op_type,
        record.parent,
        None if record.stats is None else record.stats.as_json(),
        record.attrs,
    )


#: A record key's fields but its rank, in :class:`RecordKey`'s order: name, io, position, step, call_index, moment.
KeyFields = tuple[str, str, str, int, int, str]


def index_line(
    key: KeyFields,
    dtype: str,
    shape: tuple[int, ...],
    order: int,
    device: str,
    rank: int,
    op_type: str | None,
    parent: str | None,
    stats: Mapping[str, Any] | None,
    attrs: Mapping[str, Any],
) -> dict[str, Any]:
    """Return one index line's JSON object from a record's parts (``stats`` as :meth:`TensorStats.as_json` gives it).

    A capture builds its lines with this directly (:meth:`DumpWriter.add_prepared`): thousands
    of records a step, where building a :class:`TensorRecord` first costs as much as the rest.
    """
    name, io, position, step, call_index, moment = key
    line: dict[str, Any] = {
        "name": name,
        "io": io,
        "position": position,
        "step": step,
        "call_index": call_index,
        "moment": moment,
        "dtype": dtype,
        "shape": list(shape),
        "order": order,
        "device": device,
        "rank": rank,
    }
    if op_type is not None:
        line["op_type"] = op_type
    if parent is not None:
        line["parent"] = parent
    if stats is not None:
        line["stats"] = stats
    if attrs:
        line["attrs"] = dict(attrs)
    return line


#: The attrs of every record whose index line has none: one empty mapping, which no reader changes.
NO_ATTRS: Mapping[str, Any] = {}


def record_from_index_line(
    line: ReadIndexLine,
    attrs: Mapping[str, Any],
    data: TensorData | None,
    source_path: str,
    rows: RecordRows | None = None,
) -> TensorRecord:
    """Build a record from a validated index line, its attrs (decoded from the line's text) and its data handle.

    ``rows`` makes the record and its statistics as rows of columns its dump's records share
    (:mod:`~llmcheck.core.dumps.record_rows`); without it they are objects of their own.

    The text fields repeat across a dump's lines (every step repeats every name; io, dtype,
    device repeat throughout): they are interned, so 10**5 records hold one copy of each
    (about a third of a decode dump's records in memory) -- and the shape tuple, as decoded,
    is shared with the data handle. io and moment are already: msgspec gives a ``Literal``
    field's own string. A line without ``attrs`` shares one empty mapping, not a dict of its
    own (64 bytes a record); lines of the same attrs text share one mapping (``attrs``, decoded
    by :func:`_index_records` once per text).

    The fields are passed by position, in the classes' field order, as the names beside
    them say: by keyword, matching the names cost 0.2 us a line -- as much as the check for a
    repeated record key in :func:`_index_records` costs, which this pays for.
    """
    key = _build_key(
        intern(line.name),  # name
        line.io,  # io
        intern(line.position),  # position
        line.step,  # step
        line.call_index,  # call_index
        line.moment,  # moment
    )
    shared = _SHARED_KEYS.get()
    if shared is not None:
        key = shared.setdefault(key, key)
    return (build_record if rows is None else rows)(
        key,  # key
        intern(line.dtype),  # dtype
        line.shape,  # shape
        line.order,  # order
        intern(line.device),  # device
        line.rank,  # rank
        None if line.op_type is None else intern(line.op_type),  # op_type
        None if line.parent is None else intern(line.parent),  # parent
        None if line.stats is None else _stats_from_json(line.stats, _stats_maker(rows)),  # stats
        data,  # data
        source_path,  # source_path
        attrs,  # attrs
        None,  # digest
    )


#: While set (:func:`sharing_record_keys`), the record keys read so far: an equal key is read as the same object.
_SHARED_KEYS: contextvars.ContextVar[dict[RecordKey, RecordKey] | None] = contextvars.ContextVar(
    "llmcheck_shared_record_keys", default=None
)


@contextlib.contextmanager
def sharing_record_keys() -> Iterator[None]:
    """Read the dumps loaded inside this block with one key object for equal keys: the runs of a compare share theirs.

    Why: the golden and my dumps of a compare name the same tensors; each record's key (88 bytes)
    was held twice, once per dump -- 9 % of what a statistics-only compare holds a pair. A key is
    frozen and equal keys are interchangeable. The keys are let go when the block ends.
    """
    token = _SHARED_KEYS.set({})
    try:
        yield
    finally:
        _SHARED_KEYS.reset(token)


# The objects of each of a decode dump's 10**5 records, built through their slots
# (:func:`~llmcheck.core.records.slot_builder`): their frozen __init__ was half of loading a
# dump (the index reader makes the records themselves as rows, :class:`RecordRows`).
# TensorData's __post_init__, skipped so, refuses a handle with neither a path nor a
# loader; every handle the reader makes has a path.
_build_key = slot_builder(RecordKey)
_build_data = slot_builder(TensorData, skip_post_init=True)


def _stats_maker(rows: RecordRows | None) -> Callable[..., TensorStats | StatsValues]:
    """Return what makes a record's statistics: objects of their own, or the values its row takes into its block's columns."""
    return build_stats if rows is None else rows.stats


def _stats_from_json(stats: StatsJson, make: Callable[..., TensorStats | StatsValues]) -> TensorStats | StatsValues:
    """Return an index line's statistics as :meth:`TensorStats.from_json` reads them (a non-finite one's text as its float)."""
    return make(
        min=number_from_json(stats.min),
        max=number_from_json(stats.max),
        mean=number_from_json(stats.mean),
        l2norm=number_from_json(stats.l2norm),
        nan_count=stats.nan_count,
        inf_count=stats.inf_count,
    )


def topology_to_json(node: TopologyNode) -> dict[str, Any]:
    """Return a topology tree as nested JSON (``name``, ``type``, ``children``, ...)."""
    out: dict[str, Any] = {"name": node.name, "type": node.op_type}
    if node.inputs:
        out["inputs"] = list(node.inputs)
    if node.outputs:
        out["outputs"] = list(node.outputs)
    if node.attrs:
        out["attrs"] = dict(node.attrs)
    out["children"] = [topology_to_json(child) for child in node.children]
    return out


def topology_from_json(tree: TopologyJson) -> TopologyNode:
    """Build a topology tree from a validated ``topology.json`` node."""
    return TopologyNode(
        name=tree.name,
        op_type=tree.type,
        children=tuple(topology_from_json(child) for child in tree.children),
        inputs=tuple(tree.inputs),
        outputs=tuple(tree.outputs),
        attrs=tree.attrs,
    )


# --- writer -----------------------------------------------------------------------------


def new_dump_dir(output_dir: Path, suffix: str = "") -> Path:
    """Create and return a fresh ``llmcheck_dump_{timestamp}_{pid}[_suffix]`` folder; never reuse one."""
    output_dir = Path(output_dir)
    check_output_folder(output_dir, "new dumps")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LlmcheckError(f"cannot create the output folder: {exc.strerror}", where=output_dir) from exc
    stamp = time.strftime("%Y%m%d_%H%M%S")
    base = f"{DUMP_DIR_PREFIX}{stamp}_{os.getpid()}" + (f"_{suffix}" if suffix else "")
    for attempt in range(1000):
        candidate = output_dir / (base if attempt == 0 else f"{base}.{attempt}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise LlmcheckError("could not find a free dump folder name", where=output_dir)


def _atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=False) + "\n")


#: Index lines and the topology are encoded by msgspec: ten times faster than ``json.dumps``
#: (a capture writes one line per recorded tensor, and its writer thread shares the GIL with the run).
_JSON_ENCODER = msgspec.json.Encoder()


def topology_text(tree: dict[str, Any]) -> str:
    """Return a topology tree as JSON with one node a line, indented by its depth.

    As readable as indented JSON -- a module's line holds its name, type and id, its children
    follow one level in -- at a third of its size: a 30-layer model's tree is 40 KB, not 110 KB,
    and every dump of it, however narrow its selection, holds one.
    """
    lines: list[str] = []

    def visit(node: dict[str, Any], depth: int, last: bool) -> None:
        indent = " " * depth
        own = {key: value for key, value in node.items() if key != "children"}
        head = _JSON_ENCODER.encode(own).decode()[:-1]  # without its closing brace
        comma = "" if last else ","
        children = node.get("children") or []
        if not children:
            lines.append(f'{indent}{head},"children":[]}}{comma}')
            return
        lines.append(f'{indent}{head},"children":[')
        for index, child in enumerate(children):
            visit(child, depth + 1, index == len(children) - 1)
        lines.append(f"{indent}]}}{comma}")

    visit(tree, 0, True)
    return "\n".join(lines) + "\n"


@dataclass
class _Batch:
    """Records waiting to be written, with the CPU tensors of those that carry data."""

    records: list[TensorRecord | dict[str, Any]] = field(default_factory=list)  # a dict: an index line already
    tensors: list[torch.Tensor | None] = field(default_factory=list)
    tensor_bytes: int = 0
    #: ids of the tensor objects already in this batch: one given for several records is stored once
    tensor_ids: set[int] = field(default_factory=set)
    #: gives the batch's index lines and tensors in the writer thread (:meth:`DumpWriter.add_prepared`)
    prepare: Callable[[], tuple[list[dict[str, Any]], list[torch.Tensor | None]]] | None = None
    #: builds the tree to write as ``topology.json`` in the writer thread (:meth:`DumpWriter.write_topology_later`)
    topology: Callable[[], TopologyNode] | None = None

    def append(self, record: TensorRecord | dict[str, Any], tensor: torch.Tensor | None) -> None:
        """Add a record and its CPU tensor (or ``None``); a tensor given again is counted once."""
        self.records.append(record)
        self.tensors.append(tensor)
        if tensor is not None and id(tensor) not in self.tensor_ids:
            if tensor.device.type != "cpu":
                raise ValueError("DumpWriter needs CPU tensors; copy them off the device first")
            self.tensor_ids.add(id(tensor))
            self.tensor_bytes += tensor.numel() * tensor.element_size()

    def full(self, shard_bytes: int) -> bool:
        """Return whether the batch should be written now (a shard's worth of bytes or of records)."""
        return self.tensor_bytes >= shard_bytes or len(self.records) >= MAX_RECORDS_PER_BATCH


class DumpWriter:
    """Writes one dump: records are batched, each batch written as one shard then indexed.

    ``add`` takes ownership of the tensor it is given (the caller passes a copy, so later
    in-place ops cannot change what is saved). Shards are written by a background thread;
    at most two batches are held in memory, so memory stays near ``2 * shard_bytes``.
    A failed write raises :class:`WriteFailedError` naming the file; :meth:`close_cut`
    then ends the dump at its last complete record. ``extra_fields`` are a backend's own
    manifest fields, written with the format's (which they cannot replace).
    """

    def __init__(
        self,
        output_dir: Path,
        backend: str,
        *,
        config: Mapping[str, Any] | None = None,
        command_line: list[str] | None = None,
        rank: int = 0,
        device: str = "cpu",
        dir_suffix: str = "",
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        background: bool = True,
        extra_fields: Mapping[str, Any] | None = None,
    ) -> None:
        import sys

        try:
            self.path = new_dump_dir(Path(output_dir), dir_suffix)
        except OSError as exc:  # a full disk refuses even the folder
            raise write_failed(output_dir, exc, "cannot create the dump folder") from exc
        self.shard_bytes = shard_bytes
        self.records_written = 0
        self.bytes_written = 0
        self._batch = _Batch()
        self._shard_count = 0
        self._closed = False
        self._finished = False  # the closing manifest is written (complete or cut)
        self._index_bytes = 0  # bytes of index.jsonl that hold complete, indexed records
        self._error: BaseException | None = None
        torch_version = None
        if "torch" in sys.modules:
            torch_version = sys.modules["torch"].__version__
        self.manifest: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "backend": backend,
            "torch_version": torch_version,
            "command_line": command_line if command_line is not None else sys.argv,
            "config": dict(config or {}),
            "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "rank": rank,
            "device": device,
            "pid": os.getpid(),
        }
        # a backend's own fields (the torch capture's "as_dtype") never replace the format's
        self.manifest.update({key: value for key, value in (extra_fields or {}).items() if key not in self.manifest})
        try:
            _atomic_write_json(self.path / MANIFEST_NAME, self.manifest)
            self._index = open(self.path / INDEX_NAME, "a", encoding="utf-8")  # noqa: SIM115 -- open for the writer's life, closed by close()
        except (OSError, WriteFailedError) as exc:
            self._remove_unstarted_folder()  # a dump that never started leaves no empty folder behind
            if isinstance(exc, WriteFailedError):
                raise
            raise write_failed(self.path / INDEX_NAME, exc) from exc
        self._queue: queue.Queue[_Batch | None] | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._queue = queue.Queue(maxsize=1)
            self._thread = threading.Thread(target=self._drain, name="llmcheck-dump-writer", daemon=True)
            self._thread.start()

    def _remove_unstarted_folder(self) -> None:
        """Remove the dump folder of a writer whose start failed, with whatever its start left in it."""
        with contextlib.suppress(OSError):  # the folder is this writer's own: new_dump_dir never reuses one
            for leftover in list(self.path.iterdir()):
                remove_quietly(leftover)
            self.path.rmdir()

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add(self, record: TensorRecord, tensor: torch.Tensor | None = None) -> None:
        """Queue one record; ``tensor`` (a CPU tensor, owned from now on) is its data or ``None``.

        Passing the same tensor object for several records (a module's output that is the
        next module's input) stores its bytes once; every record points at them.
        """
        self._raise_writer_error()
        if self._closed:
            raise LlmcheckError("the dump is closed", where=self.path)
        self._batch.append(record, tensor)
        if self._batch.full(self.shard_bytes):
            self.flush()

    def add_prepared(
        self,
        prepare: Callable[[], tuple[list[dict[str, Any]], list[torch.Tensor | None]]],
        topology: Callable[[], TopologyNode] | None = None,
    ) -> None:
        """Queue records that ``prepare`` gives the writer thread as :func:`index_line` objects and CPU tensors.

        Why: a capture hands over a step of records whose statistics are still to be
        measured (and, from an accelerator, whose bytes are still in flight). Done in the
        writer thread, that work leaves the captured program's forward; the queue's bound
        is its back-pressure. ``prepare``'s exception is a failed write, raised here next.
        Records keep their order: the pending batch is handed over first. ``topology``, if
        given, builds the tree written after the records (one hand-over, not two: a second
        would wait for the writer to take the first).
        """
        self._raise_writer_error()
        if self._closed:
            raise LlmcheckError("the dump is closed", where=self.path)
        self.flush()
        self._hand_to_writer(_Batch(prepare=prepare, topology=topology))

    def add_batch_layout(self, layout: BatchLayout) -> None:
        """Append one step's batch bookkeeping to ``batches.jsonl`` (written at once: a line per engine step)."""
        self._raise_writer_error()
        if self._closed:
            raise LlmcheckError("the dump is closed", where=self.path)
        path = self.path / BATCHES_NAME
        try:
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(layout.as_json(), separators=(",", ":")) + "\n")
        except OSError as exc:
            raise write_failed(path, exc) from exc

    def write_topology(self, topology: TopologyNode) -> None:
        """Write the run's module/op tree once, as ``topology.json``."""
        atomic_write_text(self.path / TOPOLOGY_NAME, topology_text(topology_to_json(topology)))

    def write_topology_later(self, build: Callable[[], TopologyNode]) -> None:
        """Have the writer thread build the tree with ``build`` and write it, after the records queued so far.

        A capture's module tree of thousands of nodes is then built outside the forward.
        """
        self._raise_writer_error()
        self.flush()
        self._hand_to_writer(_Batch(topology=build))

    def flush(self) -> None:
        """Hand the current batch to the writer (a capture calls this at the end of each step)."""
        batch, self._batch = self._batch, _Batch()
        if batch.records:
            self._hand_to_writer(batch)

    def _hand_to_writer(self, batch: _Batch) -> None:
        if self._queue is None:
            self._write_batch(batch)
        else:
            self._queue.put(batch)  # waits while the writer is a batch behind: back-pressure, never loss
        self._raise_writer_error()

    def close(self) -> None:
        """Write everything still pending, stop the writer thread and mark the dump complete."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._stop_thread()
            self._index.close()
        self._raise_writer_error()
        self._write_closing_manifest(None)

    def close_cut(self, reason: str) -> str | None:
        """Close the dump after a failure: keep every complete record, drop the rest, say why in the manifest.

        Never raises: it runs while the captured program goes on. The pending batch is
        dropped, a partial index line is cut off, temporary files are removed (which also
        frees the space a full disk needs for the small closing manifest). If even the
        manifest cannot be written (a folder made read-only), the dump reads as one its
        writer did not close, and the returned text says why; ``None``: the manifest says cut.
        """
        if self._finished:
            return None
        self._closed = True
        self._batch = _Batch()
        self._stop_thread()
        self._error = None
        with contextlib.suppress(OSError):  # its buffered tail is what the truncation below drops anyway
            self._index.close()
        with contextlib.suppress(OSError):
            os.truncate(self.path / INDEX_NAME, self._index_bytes)
        for leftover in self.path.glob("*" + TEMPORARY_SUFFIX):
            remove_quietly(leftover)
        try:
            self._write_closing_manifest(reason)
        except WriteFailedError as exc:  # a cut dump stays readable without its closing manifest
            return exc.reason or exc.what
        return None

    def _stop_thread(self) -> None:
        if self._queue is not None and self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _write_closing_manifest(self, cut: str | None) -> None:
        self.manifest["end_time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.manifest["records"] = self.records_written
        self.manifest["shards"] = len(list(self.path.glob("shard_*.safetensors")))
        self.manifest["tensor_bytes"] = self.bytes_written
        if cut is not None:
            self.manifest["cut"] = cut
        _atomic_write_json(self.path / MANIFEST_NAME, self.manifest)
        self._finished = True

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, LlmcheckError):
                raise error
            raise write_failed(self.path, error, "writing the dump failed") from error

    def _drain(self) -> None:
        assert self._queue is not None
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            if self._error is None:
                try:
                    self._write_batch(batch)
                except BaseException as exc:  # reported to the capturing thread on its next call
                    self._error = exc

    def _write_batch(self, batch: _Batch) -> None:
        if batch.prepare is not None:
            lines, tensors = batch.prepare()
            part = _Batch()
            for line, tensor in zip(lines, tensors):
                part.append(line, tensor)
                if part.full(self.shard_bytes):
                    self._write_part(part)
                    part = _Batch()
            if part.records:
                self._write_part(part)
        elif batch.records:
            self._write_part(batch)
        if batch.topology is not None:
            self.write_topology(batch.topology())

    def _write_part(self, batch: _Batch) -> None:
        shard_name = None
        entries: list[tuple[int, str]] = []
        if batch.tensor_bytes or any(t is not None for t in batch.tensors):
            shard_name = f"shard_{self._shard_count:05d}.safetensors"
            self._shard_count += 1
            entries = self._write_shard(shard_name, batch)
        tensor_names = dict(entries)
        lines = []
        for position, record in enumerate(batch.records):
            line = record if isinstance(record, dict) else record_to_json(record)
            if position in tensor_names:
                line["shard"] = shard_name
                line["tensor"] = tensor_names[position]
            lines.append(line)
        # The shard is complete and renamed before any line that points into it exists.
        text = _JSON_ENCODER.encode_lines(lines).decode()
        try:
            self._index.write(text)
            self._index.flush()
        except OSError as exc:
            if shard_name is not None:
                remove_quietly(self.path / shard_name)  # no complete line points into it
            raise write_failed(self.path / INDEX_NAME, exc, "writing the dump failed") from exc
        self._index_bytes += len(text.encode())
        self.records_written += len(lines)

    def _write_shard(self, shard_name: str, batch: _Batch) -> list[tuple[int, str]]:
        from llmcheck.core.dumps.tensor_io import dtype_name, tensor_bytes

        # Largest item size first: every tensor then starts at an offset aligned to its item size.
        order = sorted(
            (i for i, t in enumerate(batch.tensors) if t is not None),
            key=lambda i: -batch.tensors[i].element_size(),  # type: ignore[union-attr]
        )
        header: dict[str, Any] = {}
        true_dtypes: dict[str, str] = {}
        offset = 0
        names: list[tuple[int, str]] = []
        stored: dict[int, str] = {}  # id of a tensor object -> its name in this shard
        unique_order: list[int] = []
        for i in order:
            tensor = batch.tensors[i]
            assert tensor is not None
            if id(tensor) in stored:
                names.append((i, stored[id(tensor)]))
                continue
            name = f"t{self.records_written + i}"
            stored[id(tensor)] = name
            unique_order.append(i)
            dtype = dtype_name(tensor.dtype)
            nbytes = tensor.numel() * tensor.element_size()
            code = SAFETENSORS_DTYPE.get(dtype)
            shape = list(tensor.shape)
            if code is None:  # a dtype safetensors cannot name: raw bytes, true dtype kept in metadata
                code, shape = "U8", [nbytes]
                true_dtypes[name] = dtype
            header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            names.append((i, name))
        if true_dtypes:
            header["__metadata__"] = {"llmcheck_raw_dtypes": json.dumps(true_dtypes)}
        header_bytes = json.dumps(header, separators=(",", ":")).encode()
        header_bytes += b" " * (-len(header_bytes) % 8)
        final_path = self.path / shard_name
        temporary = final_path.with_name(shard_name + ".tmp")
        try:
            with open(temporary, "wb", buffering=0) as shard:
                _write_all(shard, len(header_bytes).to_bytes(8, "little") + header_bytes)
                for i in unique_order:
                    _write_all(shard, tensor_bytes(batch.tensors[i]))  # type: ignore[arg-type]
            os.replace(temporary, final_path)
        except OSError as exc:
            remove_quietly(temporary)
            raise write_failed(final_path, exc, "writing the dump failed") from exc
        self.bytes_written += offset
        return names


def _write_all(handle: Any, data: Any) -> None:
    """Write every byte of ``data`` to an unbuffered file; a short write (a file size limit) becomes the OSError."""
    view = memoryview(data).cast("B")
    while view:
        written = handle.write(view)
        if not written:
            raise OSError(28, os.strerror(28))
        view = view[written:]


# --- reader -----------------------------------------------------------------------------


def is_dump_dir(path: Path) -> bool:
    """Return whether ``path`` is an llmcheck dump folder (it holds a manifest of this format).

    A manifest that is not JSON beside an ``index.jsonl`` still marks a dump -- a damaged
    one, which the reader then reports as such instead of "not a dump".
    """
    manifest = Path(path) / MANIFEST_NAME
    if not os.path.lexists(manifest):
        return False
    try:
        document = json.loads(read_dump_file(manifest, path))
    except (OSError, ValueError, RecursionError, LlmcheckError):
        return os.path.lexists(Path(path) / INDEX_NAME)
    return isinstance(document, dict) and document.get("format") == FORMAT_NAME


def refuse_output_inside_dump(output: Path, what: str = "reports") -> None:
    """Raise a usage error when ``output`` is an llmcheck dump or lies inside one: dumps are never written into."""
    resolved = Path(output).resolve()
    for folder in (resolved, *resolved.parents):
        if is_dump_dir(folder):
            raise UsageError(
                f"is inside the dump {folder}; {what} are never written into a dump",
                where=output,
                hint="pass another folder with -o",
            )


def check_output_folder(output: Path, what: str = "reports") -> None:
    """Raise a usage error for an output folder that is a file, or is (inside) an llmcheck dump."""
    if Path(output).exists() and not Path(output).is_dir():
        raise UsageError("exists and is not a folder", where=output, hint="pass a folder with -o")
    refuse_output_inside_dump(output, what)


def closing_state(path: Path) -> tuple[int | None, str | None]:
    """Return a dump's record count and why it is cut (``None``: complete), from its manifest alone (cheap)."""
    try:
        manifest = json.loads((Path(path) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None, "its manifest.json cannot be read"
    if not isinstance(manifest, dict):
        return None, "its manifest.json is not a JSON object"
    records = manifest.get("records") if isinstance(manifest.get("records"), int) else None
    if manifest.get("cut"):
        return records, str(manifest["cut"])
    if "end_time" not in manifest:
        return records, "the capture did not close it (the program was killed or did not exit normally)"
    return records, None


def mark_cut(path: Path, reason: str) -> None:
    """Mark a dump cut in its manifest, after its writer is gone; a dump cut already keeps its own reason first.

    Why: a program stopped by Ctrl-C closes its dump as complete -- its capture cannot tell
    an interrupted run from a finished one -- but only ``llmcheck dump``, which got the
    signal, knows the run ended early. A manifest that cannot be read raises a
    :class:`DumpFormatError`, one that cannot be written a :class:`WriteFailedError`.
    """
    manifest_path, manifest = _manifest_to_amend(path, "mark the dump cut")
    earlier = manifest.get("cut")
    manifest["cut"] = f"{earlier}; {reason}" if earlier else reason
    _atomic_write_json(manifest_path, manifest)


def _manifest_to_amend(path: Path, what: str) -> tuple[Path, dict[str, Any]]:
    """Return a dump's manifest path and content, for a process other than its writer to amend; one error line else."""
    manifest_path = Path(path) / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DumpFormatError(f"cannot read the manifest to {what}", where=manifest_path) from exc
    if not isinstance(manifest, dict):
        raise DumpFormatError(f"is not a JSON object; cannot {what}", where=manifest_path)
    return manifest_path, manifest


def close_from_outside(path: Path, records: int, note: str) -> None:
    """Write the closing manifest of a dump whose writer was killed, holding ``records`` whole records.

    Why: a server's shutdown may kill the process that captured (vLLM force-kills its model
    worker) after the last step was written whole; the process that ran the program knows
    that, and closes the dump as its writer would have, saying who closed it (``closed_by``).
    A manifest that cannot be read raises a :class:`DumpFormatError`, one that cannot be
    written a :class:`WriteFailedError`.
    """
    manifest_path, manifest = _manifest_to_amend(path, "close the dump")
    manifest.update(end_time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), records=records, closed_by=note)
    _atomic_write_json(manifest_path, manifest)


def find_dumps(path: Path) -> list[Path]:
    """Return the dump folders at ``path``: itself, or its direct children that are dumps."""
    path = Path(path)
    if is_dump_dir(path):
        return [path]
    if path.is_file() and path.name in (MANIFEST_NAME, INDEX_NAME) and is_dump_dir(path.parent):
        return [path.parent]
    if not path.is_dir():
        return []
    return sorted(child for child in path.iterdir() if child.is_dir() and is_dump_dir(child))


def _read_shard_header(shard: Path) -> tuple[bytes, int]:
    """Return a shard's safetensors header text and the byte offset where its data starts."""
    try:
        with open(shard, "rb") as handle:
            size_bytes = handle.read(8)
            if len(size_bytes) < 8:
                raise DumpFormatError("shard is shorter than its 8-byte header length", where=shard, offset=0)
            header_size = int.from_bytes(size_bytes, "little")
            file_size = os.fstat(handle.fileno()).st_size
            if header_size > file_size - 8:
                raise DumpFormatError(f"header length {header_size} exceeds the file", where=shard, offset=0)
            header_bytes = handle.read(header_size)
    except FileNotFoundError as exc:
        raise DumpFormatError("shard named by the index is missing", where=shard) from exc
    except OSError as exc:
        raise DumpFormatError(f"cannot read the shard: {exc.strerror}", where=shard) from exc
    return header_bytes, 8 + header_size


def _read_bytes(path: Path, root: Path, when_missing: LlmcheckError, limit_bytes: int | None) -> bytes:
    """Return the bytes of a dump's own file (a regular file inside the dump); a missing file raises ``when_missing``."""
    try:
        return read_dump_file(path, root, limit_bytes=limit_bytes)
    except FileNotFoundError as exc:
        raise when_missing from exc


@paused_cyclic_gc()
def read_dump(path: Path) -> Dump:
    """Return the records of one llmcheck dump folder, reporting (not failing on) a cut-short dump.

    The cyclic collector is paused while the records are built (a decode dump's 10**5 records
    are 3 objects each, and no cycle among them): with it running, reading took 1.7 times as
    long. ``compare`` pauses it already; other commands reading a dump get the same.
    """
    root = Path(path)
    plain_names = plain_file_names(root)
    manifest_path = _dump_file(root, MANIFEST_NAME, plain_names)
    manifest_bytes = _read_bytes(
        manifest_path,
        root,
        DumpNotFoundError("not an llmcheck dump (no manifest.json)", where=root),
        METADATA_LIMIT_BYTES,
    )
    manifest = decode(manifest_bytes, dict[str, Any], manifest_path)
    declared = convert(manifest, ManifestJson, manifest_path)
    if declared.format_version > FORMAT_VERSION:
        raise DumpFormatError(
            f"dump format version {declared.format_version} is newer than this llmcheck reads ({FORMAT_VERSION})",
            where=root,
            hint="upgrade llmcheck",
        )
    if declared.end_time is not None and declared.records is None:
        # Without the count, an index that lost lines would read as a whole dump.
        raise DumpFormatError(
            "field $.records: missing, though end_time says the writer closed the dump",
            where=manifest_path,
            hint="a closing manifest always counts its records: restore the dump's manifest.json, "
            "or remove end_time to read the dump as one its writer did not close",
        )
    index_path = _dump_file(root, INDEX_NAME, plain_names)
    cuts: list[str] = []
    records = _index_records(root, _index_lines(index_path, root), str(index_path), cuts, plain_names)
    expected_records = declared.records
    if isinstance(expected_records, int) and len(records) < expected_records and not cuts:
        cuts.append(
            f"index.jsonl holds {len(records)} of the {expected_records} records the closed manifest counts "
            "(lines were lost after the dump was written)"
        )
    elif isinstance(expected_records, int) and len(records) > expected_records:
        # nothing is cut: every record is read, and the dump said to hold more than it counts
        log.warning(
            "%s: index.jsonl holds %d records, %d more than the %d the closed manifest counts "
            "(lines were added after the dump was written)",
            root,
            len(records),
            len(records) - expected_records,
            expected_records,
        )
    for leftover in sorted(root.glob(UNFINISHED_SHARDS)):
        cuts.append(f"unfinished shard {leftover.name} was discarded")
    if declared.end_time is None:
        cuts.append("the writer did not close the dump (killed or still running)")
    if declared.cut:
        cuts.insert(0, f"capture stopped early: {declared.cut}")
    topology = None
    topology_path = _dump_file(root, TOPOLOGY_NAME, plain_names)  # optional; a link to nothing is an error
    if os.path.lexists(topology_path):
        topology_bytes = _read_bytes(
            topology_path,
            root,
            DumpFormatError("topology.json vanished while read", where=topology_path),
            METADATA_LIMIT_BYTES,
        )
        topology = topology_from_json(decode(topology_bytes, TopologyJson, topology_path))
    batches = _batch_layouts(root, plain_names, int(manifest.get("rank") or 0))
    cut = None
    if cuts:
        cut = "; ".join(cuts) + f"; {len(records)} records were flushed before the cut"
    return Dump(
        source=NATIVE_SOURCE,
        root=root,
        records=records,
        topology=topology,
        manifest=manifest,
        cut=cut,
        batches=batches,
    )


def _batch_layouts(root: Path, plain_names: frozenset[str], rank: int) -> dict[tuple[int, int], BatchLayout]:
    """Return the dump's ``batches.jsonl`` by ``(rank, step)`` (empty when the capture wrote none).

    A line that is not a layout is a format error naming the file and line: pairing a
    serving engine's rows by broken bookkeeping would compare other tokens without a word.
    A last line cut short by a kill is dropped, as the index's is.
    """
    path = _dump_file(root, BATCHES_NAME, plain_names)
    if not os.path.lexists(path):
        return {}
    raw = _read_bytes(path, root, DumpFormatError("batches.jsonl vanished while read", where=path), None)
    lines = raw.split(b"\n")
    layouts: dict[tuple[int, int], BatchLayout] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            layout = BatchLayout.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines) and not raw.endswith(b"\n"):
                break  # the writer was killed mid-line
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise DumpFormatError(f"line {number} is not a batch layout: {detail}", where=path) from exc
        layouts[(rank, layout.step)] = BatchLayout(
            layout.step, layout.request_ids, layout.query_start_loc, layout.positions, rank
        )
    return layouts


def _dump_file(root: Path, name: str, plain_names: frozenset[str]) -> Path:
    """Return the path of one of the dump's own files (``manifest.json``, ...); a link leading outside the dump is refused.

    The same rule as for the shards (:func:`~llmcheck.core.dumps.dump_paths.inside_dump`): a dump
    whose index or manifest is another run's, through a link, would be compared as this one.
    """
    path = root / name
    return path if name in plain_names else inside_dump(path, root)


def _index_lines(index_path: Path, root: Path) -> Iterator[bytes]:
    """Return the index's lines, read as they are asked for, a line a lone CR ends split off as :meth:`bytes.splitlines` does.

    The index grows with the records (10**7 lines are gigabytes): no size limit, only the
    file rules, and never held whole. A missing index is the one-line error that says so.
    """
    try:
        lines = dump_file_lines(index_path, root)
    except FileNotFoundError:
        raise DumpFormatError("index.jsonl is missing", where=index_path) from None
    return _split_lone_returns(lines)


def _split_lone_returns(lines: Iterable[bytes]) -> Iterator[bytes]:
    for line in lines:
        if b"\r" in line:  # a line ends at LF; a blank line a lone CR ends is passed over as a blank
            yield from line.splitlines(keepends=True)
        else:
            yield line


def _index_records(
    root: Path, lines: Iterable[bytes], index_where: str, cuts: list[str], plain_names: frozenset[str]
) -> list[TensorRecord]:
    """Return the records of an index's complete lines in execution order; a partial last line is noted in ``cuts``.

    A blank line (whitespace only, as a hand edit leaves at the end) holds no record and is
    passed over; it cannot hide one: a record's line emptied leaves the closed manifest
    counting more records than are read, which :func:`read_dump` reports. A record key that
    two lines give is an error naming both lines.

    A decode dump's index has 10**5 lines, so what one line costs is what loading costs:
    the loop decodes each line with the bare decoder and checks it with a dictionary look-up
    or two; a shard's header is read and checked once for all the lines that name it; an
    error's text is built only for the line that has one, the decoder's refusal decoded again
    by :func:`decode` for its message. (Decoding all the lines in one call is no faster: the
    10**5 decoded lines then held at once cost in cache misses what the calls save.)
    """
    decode_line = decoder(ReadIndexLine).decode
    decode_attrs = decoder(dict[str, Any]).decode
    attrs_of_text: dict[bytes, Mapping[str, Any]] = {}  # each distinct attrs text decoded once, its records share it
    shards = _Shards(root, index_where, plain_names)
    root_name = root.name
    records: list[TensorRecord] = []
    rows = RecordRows()  # the records and their statistics, as rows of columns
    blank_lines: list[int] = []  # their numbers, for the line numbers of a repeated key's error
    offset = 0  # where the line starts, named in its error
    # Values most lines repeat, held once: a shape (a tuple and its ints, 90 bytes), a step past
    # Python's small ints (28); a statistics-only record's source path is made from its key name.
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
    steps: dict[int, int] = {}
    index_path = rows.key_named_path(f"{root_name}/{INDEX_NAME}:")
    for line_number, raw_line in enumerate(lines, start=1):
        line_start, offset = offset, offset + len(raw_line)
        if not raw_line.endswith(b"\n"):
            if raw_line.isspace():  # a blank line ended by a lone CR, or blanks after the last line
                blank_lines.append(line_number)
                continue
            cuts.append(f"index.jsonl ends in a partial line at byte {line_start}")
            break
        try:
            line = decode_line(raw_line)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            if raw_line.isspace():  # looked for only here, off the path of the lines that decode
                blank_lines.append(line_number)
                continue
            decode(raw_line, IndexLine, index_where, line=line_number, offset=line_start)
            raise
        line.shape = shapes.setdefault(line.shape, line.shape)
        line.step = steps.setdefault(line.step, line.step)
        attrs = NO_ATTRS
        if line.attrs:
            attrs_text = bytes(line.attrs)
            found = attrs_of_text.get(attrs_text)
            if found is None:
                try:
                    found = attrs_of_text[attrs_text] = decode_attrs(attrs_text) or NO_ATTRS
                except msgspec.ValidationError:  # not an object: read as the line it is, for the error naming its field
                    decode(raw_line, IndexLine, index_where, line=line_number, offset=line_start)
                    raise
            attrs = found
        itemsize = DTYPE_ITEMSIZE.get(line.dtype)
        if itemsize is None:
            raise DumpFormatError(f"field $.dtype: unknown dtype {line.dtype!r}", where=f"{index_where}:{line_number}")
        shard_name, tensor_name = line.shard, line.tensor
        if shard_name is None and tensor_name is None:  # its path is where its line is: the index and its name
            records.append(record_from_index_line(line, attrs, None, index_path, rows))
            continue
        if shard_name is None or tensor_name is None:
            raise DumpFormatError(
                "fields $.shard and $.tensor: give both (the record has data) or neither",
                where=f"{index_where}:{line_number}",
            )
        data = shards.data(line, shard_name, tensor_name, itemsize, line_number)
        records.append(record_from_index_line(line, attrs, data, f"{root_name}/{shard_name}:{tensor_name}", rows))
    rows.close()
    if _may_repeat_a_key(records) and len(set(map(_KEY, records))) != len(records):
        _raise_on_repeated_key(records, blank_lines, index_where)
    return _in_execution_order(records)


def _may_repeat_a_key(records: list[TensorRecord]) -> bool:
    """Return whether two records' keys hash alike: only then may a key repeat (a set of the keys then tells).

    Why not the set at once: a set of 10**6 keys is 32 MB more while the other dump is held,
    the high of loading; the hashes are 8 bytes a record. One pass in C but for each key's
    hash (RecordKey's ``__hash__``, 0.2 us), as the set's.
    """
    import numpy as np

    hashes = np.fromiter(map(hash, map(_KEY, records)), dtype=np.int64, count=len(records))
    hashes.sort()
    return bool((hashes[1:] == hashes[:-1]).any())


def _in_execution_order(records: list[TensorRecord]) -> list[TensorRecord]:
    """Return ``records`` sorted by ``order``, records of one order kept in turn (a stable sort, as ``list.sort``).

    A writer keeps execution order, so the records are found in order, and are given back as
    they are; ``list.sort`` by key would still hold an int object a record (36 bytes) while it
    looked. The orders are 8 bytes a record here.
    """
    import numpy as np

    try:
        orders = np.fromiter(map(_ORDER, records), dtype=np.int64, count=len(records))
    except OverflowError:  # an order beyond 64 bits
        records.sort(key=_ORDER)
        return records
    if (orders[1:] < orders[:-1]).any():
        records[:] = [records[given] for given in np.argsort(orders, kind="stable").tolist()]
    return records


_ORDER = attrgetter("order")
_KEY = attrgetter("key")


def _raise_on_repeated_key(records: list[TensorRecord], blank_lines: list[int], index_where: str) -> None:
    """Raise an error naming the first index line whose record key an earlier line gave, and that line.

    ``records`` are in the index's line order, one for each line not in ``blank_lines``.
    Two records under one key would meet one record of the other dump: one of them would be
    left unmatched, or compared with a tensor it is not.
    """
    blank = set(blank_lines)
    record_lines = (number for number in itertools.count(1) if number not in blank)
    first_lines: dict[RecordKey, int] = {}
    for record, line_number in zip(records, record_lines):
        first_line = first_lines.setdefault(record.key, line_number)
        if first_line != line_number:
            raise DumpFormatError(
                f"record {record.key.label()} repeats line {first_line}",
                where=f"{index_where}:{line_number}",
                hint="each record appears once in the index; remove one of the two lines",
            )


#: a shard opened: its path, where its data starts, its tensor entries already checked, its whole header
_OpenShard = tuple[Path, int, dict[str, ShardEntry], dict[str, Any]]


#: Shards whose checked entries are held at once. A writer writes a shard's lines together, so
#: a few shards' entries are all the reader needs at a time; holding every shard's (15 MB for
#: a decode dump's 50 000 tensors) cost 5 % of the reading in cache misses. Lines that come
#: back to a shard let go of have its header read and checked again, to the same result.
_SHARDS_HELD = 4


class _Shards:
    """The shards an index names, each opened and its header checked once while its lines come."""

    def __init__(self, root: Path, index_where: str, plain_names: frozenset[str]) -> None:
        self.root = root
        self.index_where = index_where
        self.opened: dict[str, _OpenShard] = {}
        self.plain_names = plain_names  # the dump folder's plain files: a shard among them is inside the dump

    def data(self, line: IndexLine, shard_name: str, tensor_name: str, itemsize: int, line_number: int) -> TensorData:
        """Return where an index line's tensor lies in its shard, checked against the shard's header."""
        opened = self.opened.get(shard_name)
        if opened is None:
            if len(self.opened) == _SHARDS_HELD:  # the oldest goes: its lines have come, as a writer writes them
                del self.opened[next(iter(self.opened))]
            opened = self.opened[shard_name] = self._open(shard_name, line_number)
        shard, data_start, entries, header = opened
        entry = entries.get(tensor_name)
        if entry is None:
            entry = _unchecked_entry(shard, header, tensor_name, f"{self.index_where}:{line_number}")
        begin, end = entry.data_offsets
        if begin > end:  # past the end of a cut file is found when the data is read
            raise DumpFormatError(f"tensor {tensor_name!r} has data_offsets [{begin}, {end}]", where=shard, offset=8)
        expected = itemsize * prod(line.shape)
        if end - begin != expected:
            raise DumpFormatError(
                f"tensor {tensor_name!r} holds {end - begin} bytes, its dtype and shape need {expected}",
                where=shard,
                offset=data_start + begin,
            )
        # by position (dtype, shape, path, offset, nbytes), as record_from_index_line builds its objects
        return _build_data(line.dtype, line.shape, shard, data_start + begin, end - begin)

    def _open(self, shard_name: str, line_number: int) -> _OpenShard:
        """Return a shard's path, where its data starts, its well-formed tensor entries and its header."""
        # A plain file name, checked without touching the file system per line.
        if shard_name in ("", ".", "..") or Path(shard_name).name != shard_name or "\x00" in shard_name:
            raise DumpFormatError(
                f"field $.shard: names a file outside the dump: {shard_name!r}",
                where=f"{self.index_where}:{line_number}",
            )
        shard = self.root / shard_name
        header_bytes, data_start = _read_shard_header(
            shard if shard_name in self.plain_names else inside_dump(shard, self.root)
        )
        try:  # one pass in C for a well-formed header, as llmcheck writes them
            entries = decoder(dict[str, ShardEntry]).decode(header_bytes)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            header = decode(header_bytes, dict[str, Any], shard, what="shard header: ")
            return shard, data_start, _checked_entries(header), header
        entries.pop("__metadata__", None)  # never a tensor, whatever it holds
        return shard, data_start, entries, entries


def _unchecked_entry(shard: Path, header: dict[str, Any], tensor_name: str, where: str) -> ShardEntry:
    """Return the header entry of a tensor that is not among its shard's checked entries, or raise why it is not."""
    if tensor_name == "__metadata__" or tensor_name not in header:
        raise DumpFormatError(f"tensor {tensor_name!r} named by {where} is not in the shard", where=shard)
    return convert(header[tensor_name], ShardEntry, shard, what=f"tensor {tensor_name!r}: ")


def _checked_entries(header: dict[str, Any]) -> dict[str, ShardEntry]:
    """Return every tensor entry of a shard header checked in one pass (empty when one is malformed).

    A shard of a decode dump holds thousands of tensors: checking its header once costs less
    than checking each entry as its index line comes; a malformed entry is then checked on its
    own, so its error names the tensor and the field.
    """
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    try:
        return msgspec.convert(tensors, dict[str, ShardEntry])
    except (msgspec.ValidationError, RecursionError):
        return {}
