"""Measure pairs: stream both tensors in chunks through every metric, in parallel worker processes.

Each pair is read chunk by chunk (:mod:`llmcheck.core.dumps.tensor_chunks`) into float64 buffers
reused for the whole run, so a worker holds a few chunk buffers, never a tensor. NaN and
Inf are counted, never skipped silently: positions where both sides hold the same
non-finite value agree; positions where only one side is non-finite (or they differ) are
counted as a mismatch; the metrics are computed over the positions finite on both sides.

Pairs whose data is a plain byte range are measured in batches by this process and
``spawn``-ed worker processes side by side; those reached through a loader function (which
cannot cross a process boundary) are measured in this process. Small compares run
in-process alone: starting workers would cost more than it saves.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import TYPE_CHECKING

import numpy as np

from llmcheck.core.dumps.tensor_chunks import ChunkReader
from llmcheck.core.errors import LlmcheckError
from llmcheck.core.gc_pause import paused_cyclic_gc
from llmcheck.core.judging.sentinels import classify, may_hold_sentinels, sentinel_limit_in_run
from llmcheck.core.measuring.heap import return_free_memory
from llmcheck.core.measuring.pair_chunk import PairChunk, Workspace, single_threaded_blas
from llmcheck.core.records import DTYPE_ITEMSIZE, MetricSpec, TensorData, TensorStats, slot_builder

if TYPE_CHECKING:
    from llmcheck.core.measuring.pair_transfer import PackedJobs, PackedMeasurements
    from llmcheck.core.measuring.small_pairs import BlockRows
    from llmcheck.core.measuring.worker_pool import WorkerPool

log = logging.getLogger("llmcheck.compare")

#: float64 values per chunk: 512 KiB per buffer keeps a chunk's working set in the CPU caches.
DEFAULT_CHUNK_VALUES = 1 << 16
#: Below this many tensor bytes in total, worker processes cost more than they save.
PARALLEL_MIN_BYTES = 64 * 1024 * 1024
#: Batches sent to a worker aim at this many tensor bytes (small pairs travel together).
BATCH_TARGET_BYTES = 64 * 1024 * 1024
#: Pairs measured in this process are handed to :func:`measure_jobs` this many at a time.
LOCAL_BATCH_PAIRS = 4096


@dataclass(frozen=True, slots=True)
class PairJob:
    """One pair to measure: both data handles, and whether each side's statistics must be computed.

    ``golden_run_dtype`` / ``my_run_dtype`` name the dtype most tensors of each run have: an
    fp16 run's mask keeps the value -65504 when an fp32 softmax receives it, and it is still
    that run's "minus infinity" (:func:`llmcheck.core.judging.sentinels.sentinel_limit_in_run`).
    """

    index: int
    golden: TensorData
    my: TensorData
    golden_needs_stats: bool = True
    my_needs_stats: bool = True
    golden_run_dtype: str | None = None
    my_run_dtype: str | None = None

    @property
    def nbytes(self) -> int:
        """Return the tensor bytes both sides hold."""
        return _data_bytes(self.golden) + _data_bytes(self.my)

    @property
    def crosses_processes(self) -> bool:
        """Return whether both sides are byte ranges, which a worker process can open by path."""
        return self.golden.loader is None and self.my.loader is None


#: Builds a :class:`PairJob` as the class does, faster (a compare makes one per pair: 10^5 for a decode dump).
build_job = slot_builder(PairJob)


def _data_bytes(data: TensorData) -> int:
    return data.nbytes if data.loader is None else data.numel * DTYPE_ITEMSIZE.get(data.dtype, 0)


@dataclass
class SideStats:
    """Running min, max, sum and NaN/Inf counts of one side's values."""

    wanted: bool
    low: float = math.inf
    high: float = -math.inf
    total: float = 0.0
    finite: int = 0
    nan: int = 0
    inf: int = 0

    squares: float = 0.0

    def add_finite(self, values: np.ndarray, sum_of_squares: float | None = None) -> None:
        """Fold in finite values (``sum_of_squares`` when the caller already has it)."""
        if self.wanted and values.size:
            self.low = min(self.low, float(values.min()))
            self.high = max(self.high, float(values.max()))
            self.total += float(values.sum())
            self.finite += values.size
            self.squares += float(np.dot(values, values)) if sum_of_squares is None else sum_of_squares

    def add_chunk(self, chunk: PairChunk, side: str) -> None:
        """Fold in one chunk's side (all finite) from the reductions the chunk shares."""
        if self.wanted and chunk.size:
            if side == "golden":
                low, high, total, squares = (
                    chunk.golden_min(),
                    chunk.golden_max(),
                    chunk.golden_sum(),
                    chunk.sum_sq_golden(),
                )
            else:
                low, high, total, squares = chunk.my_min(), chunk.my_max(), chunk.my_sum(), chunk.sum_sq_my()
            self.low = min(self.low, low)
            self.high = max(self.high, high)
            self.total += total
            self.finite += chunk.size
            self.squares += squares

    @classmethod
    def of_one_chunk(cls, wanted: bool, low: float, high: float, total: float, count: int, squares: float) -> SideStats:
        """Return the state :meth:`add_chunk` leaves after one chunk (all finite) with these reductions."""
        if not wanted or not count:
            return cls(wanted)
        return cls(
            wanted,
            low=min(math.inf, low),
            high=max(-math.inf, high),
            total=0.0 + total,
            finite=count,
            squares=0.0 + squares,
        )

    def result(self) -> TensorStats:
        l2_squared = self.squares
        if not self.wanted:
            return TensorStats(nan_count=self.nan, inf_count=self.inf)
        defined = self.finite > 0
        return TensorStats(
            min=self.low if defined else None,
            max=self.high if defined else None,
            mean=self.total / self.finite if defined else None,
            l2norm=math.sqrt(l2_squared) if defined else None,
            nan_count=self.nan,
            inf_count=self.inf,
        )


@dataclass
class PairMeasurement:
    """What measuring one pair gave: each metric's value, both sides' statistics, the NaN/Inf story."""

    index: int
    values: dict[str, float]
    golden_stats: TensorStats
    my_stats: TensorStats
    nonfinite_mismatch: int = 0
    matching_nonfinite: int = 0
    masked: int = 0
    bytes_read: int = 0
    notes: list[str] = field(default_factory=list)


class PairFold:
    """The running state of one pair: its metric accumulators, both sides' statistics, the NaN/Inf counts.

    Both ways of measuring fold chunks through it -- streaming a large pair chunk by chunk
    (:func:`measure_pair`) and measuring many small pairs in one pass
    (:mod:`llmcheck.core.measuring.small_pairs`) -- so their values are the same by construction.
    """

    __slots__ = (
        "accumulators",
        "chunk_updates",
        "golden_limit",
        "golden_side",
        "job",
        "masked",
        "matching_nonfinite",
        "mismatch",
        "my_limit",
        "my_side",
    )

    def __init__(self, job: PairJob, specs: Sequence[MetricSpec]) -> None:
        self.job = job
        self.accumulators = [spec.make_accumulator() for spec in specs]
        self.chunk_updates = [getattr(acc, "update_chunk", None) for acc in self.accumulators]
        self.golden_side = SideStats(job.golden_needs_stats)
        self.my_side = SideStats(job.my_needs_stats)
        self.golden_limit = sentinel_limit_in_run(job.golden.dtype, job.golden_run_dtype)
        self.my_limit = sentinel_limit_in_run(job.my.dtype, job.my_run_dtype)
        self.mismatch = self.matching_nonfinite = self.masked = 0

    def fold(self, chunk: PairChunk, workspace: Workspace) -> None:
        """Fold one chunk of both sides (float64, equal length) into every accumulator."""
        if may_hold_sentinels(chunk.sum_sq_golden(), self.golden_limit) or may_hold_sentinels(
            chunk.sum_sq_my(), self.my_limit
        ):
            chunk, agreement = _ordinary_part(
                chunk.golden, chunk.my, self.golden_limit, self.my_limit, self.golden_side, self.my_side, workspace
            )
            self.mismatch += agreement.mismatch
            self.matching_nonfinite += agreement.matching_nonfinite
            self.masked += agreement.masked
        else:
            self.golden_side.add_chunk(chunk, "golden")
            self.my_side.add_chunk(chunk, "my")
        for accumulator, update_chunk in zip(self.accumulators, self.chunk_updates):
            if update_chunk is not None:
                update_chunk(chunk)
            else:
                accumulator.update(chunk.golden, chunk.my)

    def measurement(self, specs: Sequence[MetricSpec]) -> PairMeasurement:
        """Return what the folded chunks gave."""
        values = {spec.name: float(acc.result()) for spec, acc in zip(specs, self.accumulators)}
        exact = exact_integer_max_difference(self.job)
        if exact is not None and EXACT_INTEGER_METRIC in values:
            values[EXACT_INTEGER_METRIC] = float(exact)  # never 0 for a difference the float64 buffers rounded away
        return PairMeasurement(
            index=self.job.index,
            values=values,
            golden_stats=self.golden_side.result(),
            my_stats=self.my_side.result(),
            nonfinite_mismatch=self.mismatch,
            matching_nonfinite=self.matching_nonfinite,
            masked=self.masked,
            bytes_read=self.job.nbytes,
        )


def measure_pair(
    job: PairJob, specs: Sequence[MetricSpec], workspace: Workspace, chunk_values: int = DEFAULT_CHUNK_VALUES
) -> PairMeasurement:
    """Return every metric of one pair, streaming both tensors chunk by chunk through ``workspace``."""
    fold = PairFold(job, specs)
    with single_threaded_blas(), ChunkReader(job.golden) as golden_reader, ChunkReader(job.my) as my_reader:
        if golden_reader.size != my_reader.size:
            raise ValueError(f"pair {job.index}: {golden_reader.size} golden values against {my_reader.size}")
        total = golden_reader.size
        for start in range(0, total, chunk_values):
            count = min(chunk_values, total - start)
            golden = golden_reader.read(start, workspace.buffer("golden", count), workspace.buffer)
            my = my_reader.read(start, workspace.buffer("my", count), workspace.buffer)
            # no name keeps the float32 view of the mapped file: the reader could not unmap it
            fold.fold(PairChunk(golden, my, workspace, golden_reader.float32_source(start, count)), workspace)
    return fold.measurement(specs)


#: 64-bit integers: float64 buffers hold them exactly only up to 2**53, so they are also compared as integers.
WIDE_INTEGER_DTYPES = frozenset({"int64", "uint64"})
#: The metric that carries the exact integer difference (its "int" thresholds fail any difference).
EXACT_INTEGER_METRIC = "max_absolute_error"


def _integers(data: TensorData) -> np.ndarray:
    """Return a 64-bit integer tensor's values, flattened; a byte range is read with numpy (no torch import)."""
    if data.loader is not None:
        return data.load().reshape(-1).numpy()
    assert data.path is not None  # a handle without a loader points at a byte range of a file
    return np.fromfile(
        data.path,
        dtype="<i8" if data.dtype == "int64" else "<u8",
        count=data.numel,
        offset=data.offset,
    )


def exact_integer_max_difference(job: PairJob) -> int | None:
    """Return the exact largest ``|golden - my|`` of two tensors of one 64-bit integer dtype, else ``None``."""
    if job.golden.dtype != job.my.dtype or job.golden.dtype not in WIDE_INTEGER_DTYPES:
        return None
    golden, my = _integers(job.golden), _integers(job.my)
    if golden.size == 0:
        return 0
    # the difference of the larger minus the smaller, in unsigned arithmetic: exact over the whole range
    unsigned = np.dtype(np.uint64)
    difference = np.where(
        golden >= my, golden.astype(unsigned) - my.astype(unsigned), my.astype(unsigned) - golden.astype(unsigned)
    )
    return int(difference.max())


@dataclass
class _Agreement:
    """How the non-ordinary positions of a chunk agree: one-sided, matching NaN/Inf, matching mask sentinels."""

    mismatch: int = 0
    matching_nonfinite: int = 0
    masked: int = 0


def _ordinary_part(
    golden: np.ndarray,
    my: np.ndarray,
    golden_limit: float,
    my_limit: float,
    golden_side: SideStats,
    my_side: SideStats,
    workspace: Workspace,
) -> tuple[PairChunk, _Agreement]:
    """Return the chunk of positions ordinary on both sides, and how the other positions agree.

    NaN and Inf are counted on each side; positions where both sides hold the same NaN, Inf
    or mask sentinel (:mod:`llmcheck.core.judging.sentinels`) agree and are left out of the metrics,
    any other non-ordinary position is a mismatch.
    """
    golden_kind = classify(golden, golden_limit)
    my_kind = classify(my, my_limit)
    for side, values in ((golden_side, golden), (my_side, my)):
        finite = np.isfinite(values)
        nan = int(np.count_nonzero(np.isnan(values)))
        side.nan += nan
        side.inf += int(values.size - np.count_nonzero(finite)) - nan
        side.add_finite(values if finite.all() else values[finite])
    golden_finite_sentinel = (golden_kind >= 2) & np.isfinite(golden)
    my_finite_sentinel = (my_kind >= 2) & np.isfinite(my)
    agree = (golden_kind == my_kind) & (golden_kind != 0)
    # A finite sentinel facing an ordinary value is measured as the number it is.
    ordinary = ~agree & (((golden_kind == 0) | golden_finite_sentinel) & ((my_kind == 0) | my_finite_sentinel))
    infinite = np.isinf(golden) & np.isinf(my)
    agreement = _Agreement()
    agreement.matching_nonfinite = int(np.count_nonzero(agree & (infinite | (golden_kind == 1))))
    agreement.masked = int(np.count_nonzero(agree)) - agreement.matching_nonfinite
    kept = int(np.count_nonzero(ordinary))
    agreement.mismatch = int(golden.size) - kept - agreement.matching_nonfinite - agreement.masked
    golden_kept = workspace.buffer("golden_finite", kept)
    my_kept = workspace.buffer("my_finite", kept)
    np.compress(ordinary, golden, out=golden_kept)
    np.compress(ordinary, my, out=my_kept)
    return PairChunk(golden_kept, my_kept, workspace), agreement


# --- running many pairs ------------------------------------------------------------------


_worker_state: dict[str, object] = {}


def _init_worker(specs: list[MetricSpec], chunk_values: int) -> None:
    _worker_state["specs"] = specs
    _worker_state["workspace"] = Workspace(chunk_values)
    _worker_state["chunk_values"] = chunk_values


def _measure_batch(packed_jobs: PackedJobs) -> PackedMeasurements:
    from llmcheck.core.measuring.pair_transfer import pack_measurements, unpack_jobs

    specs: list[MetricSpec] = _worker_state["specs"]  # type: ignore[assignment]
    workspace: Workspace = _worker_state["workspace"]  # type: ignore[assignment]
    chunk_values: int = _worker_state["chunk_values"]  # type: ignore[assignment]
    with paused_cyclic_gc():
        measurements, rows = _measure_jobs_as_rows(unpack_jobs(packed_jobs), specs, workspace, chunk_values)
        packed = pack_measurements(measurements, [spec.name for spec in specs], rows)
    many_objects = len(rows) > 0  # small pairs measured by block: their freed memory, kept by the heap, goes back
    del measurements, rows
    if many_objects:
        return_free_memory()  # a few ms, which a batch of large tensors (few objects) would pay for nothing
    return packed


def measure_jobs(
    jobs: Sequence[PairJob], specs: Sequence[MetricSpec], workspace: Workspace, chunk_values: int = DEFAULT_CHUNK_VALUES
) -> list[PairMeasurement]:
    """Return the measurement of each job: small pairs together in groups, the others streamed one by one."""
    measurements, rows = _measure_jobs_as_rows(jobs, specs, workspace, chunk_values)
    return measurements + rows.measurements([spec.name for spec in specs])


def _measure_jobs_as_rows(
    jobs: Sequence[PairJob], specs: Sequence[MetricSpec], workspace: Workspace, chunk_values: int
) -> tuple[list[PairMeasurement], BlockRows]:
    """Return :func:`measure_jobs` as measurements and the unwrapped rows of small pairs' blocks."""
    from llmcheck.core.measuring.small_pairs import BlockRows, measure_small_pairs, small_sizes

    sizes = small_sizes(jobs, chunk_values)
    with single_threaded_blas():
        if all(sizes):
            return measure_small_pairs(jobs, specs, workspace, chunk_values, sizes)
        small = [(job, size) for job, size in zip(jobs, sizes) if size]
        measurements, rows = (
            measure_small_pairs([job for job, _ in small], specs, workspace, chunk_values, [size for _, size in small])
            if small
            else ([], BlockRows(len(specs)))
        )
        measurements += [
            measure_pair(job, specs, workspace, chunk_values) for job, size in zip(jobs, sizes) if not size
        ]
        return measurements, rows


@contextmanager
def _single_threaded_children() -> Iterator[None]:
    """Start worker processes with one BLAS/OpenMP thread each: the workers are the parallelism."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: "1" for name in names})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _batches(jobs: Sequence[PairJob], workers: int) -> list[list[PairJob]]:
    """Group jobs in execution order into batches of about BATCH_TARGET_BYTES (fewer for few jobs)."""
    total = sum(job.nbytes for job in jobs)
    return split_by_bytes(jobs, max(1, min(BATCH_TARGET_BYTES, total // (workers * 4) or 1)))


def split_by_bytes(jobs: Sequence[PairJob], target_bytes: int) -> list[list[PairJob]]:
    """Return the jobs, in order, cut into runs that each reach ``target_bytes`` of tensor data (the last may not)."""
    batches: list[list[PairJob]] = []
    current: list[PairJob] = []
    current_bytes = 0
    for job in jobs:
        current.append(job)
        current_bytes += job.nbytes
        if current_bytes >= target_bytes:
            batches.append(current)
            current, current_bytes = [], 0
    if current:
        batches.append(current)
    return batches


def default_workers() -> int:
    """Return the measuring processes (this one included) used when the user gives none: the CPUs it may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def measure_pairs(
    jobs: Sequence[PairJob],
    specs: Sequence[MetricSpec],
    *,
    workers: int | None = None,
    chunk_values: int = DEFAULT_CHUNK_VALUES,
    on_measured: Callable[[PairMeasurement], None] | None = None,
    pool: WorkerPool | None = None,
    keep: bool = True,
) -> dict[int, PairMeasurement]:
    """Return the measurement of every job by index, using worker processes when that pays off.

    ``on_measured`` is handed each measurement as it arrives; with ``keep=False`` that is the
    only place it goes (the dict returned is empty), so a caller that consumes them one by one
    never holds them all. ``pool`` holds workers started ahead of need
    (:mod:`llmcheck.core.measuring.worker_pool`); they measure here if they were set up with these
    specs, and are shut down afterwards.
    """
    workers = workers or default_workers()
    remote = [job for job in jobs if job.crosses_processes]
    local = [job for job in jobs if not job.crosses_processes]
    remote_bytes = sum(job.nbytes for job in remote)
    if workers > 1 and remote_bytes >= PARALLEL_MIN_BYTES and not picklable(specs):
        log.info(
            "a metric cannot be sent to worker processes (its accumulator is not importable by name); "
            "measuring in this process"
        )
        workers = 1
    if workers <= 1 or remote_bytes < PARALLEL_MIN_BYTES:
        local, remote = list(jobs), []
    results: dict[int, PairMeasurement] = {}

    def done(measurement: PairMeasurement) -> None:
        if keep:
            results[measurement.index] = measurement
        if on_measured is not None:
            on_measured(measurement)

    with paused_cyclic_gc():
        if remote:
            started = pool.take(specs, chunk_values) if pool is not None else None
            _measure_in_workers(remote, list(specs), workers, chunk_values, done, started)
        workspace = Workspace(chunk_values)
        for start in range(0, len(local), LOCAL_BATCH_PAIRS):  # in batches, so progress advances while measuring
            for measurement in measure_jobs(local[start : start + LOCAL_BATCH_PAIRS], specs, workspace, chunk_values):
                done(measurement)
    del workspace
    return_free_memory()  # the measuring's buffers and transient objects, before the rows are made
    return results


def picklable(specs: Sequence[MetricSpec]) -> bool:
    """Return whether the metric specs can be sent to worker processes (their accumulators importable by name)."""
    try:
        pickle.dumps(list(specs))
    except Exception:  # any pickling failure means: keep the work in this process
        return False
    return True


def start_executor(workers: int, specs: Sequence[MetricSpec], chunk_values: int) -> ProcessPoolExecutor:
    """Return a pool of ``workers`` spawned processes, each set up to measure with these metric specs.

    The processes start with the first task submitted (:class:`~llmcheck.core.measuring.worker_pool.WorkerPool`
    submits one each to start them early).
    """
    with _single_threaded_children():
        return ProcessPoolExecutor(
            max_workers=workers,
            mp_context=get_context("spawn"),
            initializer=_init_worker,
            initargs=(list(specs), chunk_values),
        )


def _measure_in_workers(
    jobs: list[PairJob],
    specs: list[MetricSpec],
    workers: int,
    chunk_values: int,
    done: Callable[[PairMeasurement], None],
    started: tuple[ProcessPoolExecutor, int] | None = None,
) -> None:
    """Measure the jobs with ``workers`` processes: this one and ``workers - 1`` spawned ones.

    ``started`` is an executor already running and the measuring-process count it was made
    for; else the spawned processes are started here. The spawned ones take batches from the
    front of the queue, this process from the back, between collecting their results. So this
    process measures from the first moment, while the others are still starting (0.2-0.8 s on
    a 2-core machine, a sixth of a 4.6 GB compare), and nothing is pickled for its share.
    """
    from llmcheck.core.measuring.pair_transfer import pack_jobs, unpack_measurements

    queue = collections.deque(_batches(jobs, workers))
    if started is None:
        workers = min(workers, len(queue))
        executor = start_executor(spawned_workers(workers), specs, chunk_values)
    else:
        executor, workers = started
    spawned = spawned_workers(workers)
    workspace = Workspace(chunk_values)
    with executor:
        pending: set[Future[PackedMeasurements]] = set()

        def submit_from_front() -> None:
            # Two batches per spawned worker in flight: enough to never idle, few enough to bound memory.
            with _single_threaded_children():
                while queue and len(pending) < 2 * spawned:
                    pending.add(executor.submit(_measure_batch, pack_jobs(queue.popleft())))

        def collect(finished: set[Future[PackedMeasurements]]) -> None:
            for future in finished:
                try:
                    measurements = unpack_measurements(future.result())
                except BrokenProcessPool as exc:
                    raise LlmcheckError(
                        "a worker process measuring pairs died (out of memory, killed, or -- from a Python script -- "
                        'the script has no `if __name__ == "__main__":` guard, so each worker ran it again)',
                        where="llmcheck compare",
                        hint="rerun with -j 1 (workers=1) to measure in one process",
                    ) from exc
                for measurement in measurements:
                    done(measurement)

        submit_from_front()
        while pending or queue:
            if queue:  # this process's share: the last batch not yet handed out
                for measurement in measure_jobs(queue.pop(), specs, workspace, chunk_values):
                    done(measurement)
                if not queue:  # its read windows are not held while the workers finish: the compare's peak
                    workspace.release()
                    return_free_memory()
                finished = {future for future in pending if future.done()}
            else:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            pending -= finished
            collect(finished)
            submit_from_front()


def spawned_workers(workers: int) -> int:
    """Return the processes to spawn for ``workers`` measuring processes: this process is one of them."""
    return max(1, workers - 1)
