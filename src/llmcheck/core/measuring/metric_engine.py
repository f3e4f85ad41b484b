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
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing import get_context
from typing import TYPE_CHECKING, Protocol

from llmcheck.core.errors import LlmcheckError
from llmcheck.core.gc_pause import paused_cyclic_gc
from llmcheck.core.measuring.heap import return_free_memory
from llmcheck.core.measuring.pair_chunk import Workspace, single_threaded_blas
from llmcheck.core.measuring.pair_measure import (
    DEFAULT_CHUNK_VALUES,
    PairJob,
    PairMeasurement,
    measure_pair,
)
from llmcheck.core.records import MetricSpec

if TYPE_CHECKING:
    from llmcheck.core.measuring.measured_columns import MeasuredColumns
    from llmcheck.core.measuring.pair_transfer import PackedJobs, PackedMeasurements
    from llmcheck.core.measuring.small_pairs import BlockRows

log = logging.getLogger("llmcheck.compare")


class HeldWorkers(Protocol):
    """Worker processes started ahead of need (:class:`~llmcheck.core.measuring.worker_pool.WorkerPool`).

    Measuring needs only to take them over; the pool, which starts them, builds on this module.
    """

    def take(self, specs: Sequence[MetricSpec], chunk_values: int) -> tuple[ProcessPoolExecutor, int] | None:
        """Hand over the running executor and its worker count for a measuring with these specs, once; else None."""


#: Below this many tensor bytes in total, worker processes cost more than they save.
PARALLEL_MIN_BYTES = 64 * 1024 * 1024
#: Batches sent to a worker aim at this many tensor bytes (small pairs travel together).
BATCH_TARGET_BYTES = 64 * 1024 * 1024
#: Pairs measured in this process are handed to :func:`measure_jobs` this many at a time.
LOCAL_BATCH_PAIRS = 4096


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
        names = [spec.name for spec in specs]
        packed = pack_measurements(measurements, names, rows.columns(names) if rows else None)
    many_objects = len(rows) > 0  # small pairs measured by block: their freed memory, kept by the heap, goes back
    del measurements, rows
    if many_objects:
        return_free_memory()  # a few ms, which a batch of large tensors (few objects) would pay for nothing
    return packed


def measure_jobs(
    jobs: Sequence[PairJob], specs: Sequence[MetricSpec], workspace: Workspace, chunk_values: int = DEFAULT_CHUNK_VALUES
) -> list[PairMeasurement]:
    """Return the measurement of each job: small pairs together in groups, the others streamed one by one."""
    measurements, columns = measure_jobs_as_columns(jobs, specs, workspace, chunk_values)
    return measurements + columns.measurements()


def measure_jobs_as_columns(
    jobs: Sequence[PairJob], specs: Sequence[MetricSpec], workspace: Workspace, chunk_values: int
) -> tuple[list[PairMeasurement], MeasuredColumns]:
    """Return :func:`measure_jobs` as measurements and the small pairs measured from their blocks, as columns."""
    measurements, rows = _measure_jobs_as_rows(jobs, specs, workspace, chunk_values)
    return measurements, rows.columns([spec.name for spec in specs])


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
    pool: HeldWorkers | None = None,
    keep: bool = True,
    on_columns: Callable[[MeasuredColumns], None] | None = None,
) -> dict[int, PairMeasurement]:
    """Return the measurement of every job by index, using worker processes when that pays off.

    ``on_measured`` is handed each measurement as it arrives; with ``keep=False`` that is the
    only place it goes (the dict returned is empty), so a caller that consumes them one by one
    never holds them all. ``pool`` holds workers started ahead of need
    (:mod:`llmcheck.core.measuring.worker_pool`); they measure here if they were set up with these
    specs, and are shut down afterwards. ``on_columns``, when given, is handed the small pairs
    measured from their blocks as columns instead (:class:`~llmcheck.core.measuring.measured_columns.MeasuredColumns`,
    a batch at a time): those are neither handed to ``on_measured`` nor kept.
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

    def all_done(measurements: Sequence[PairMeasurement], columns: MeasuredColumns) -> None:
        for measurement in measurements:
            done(measurement)
        if not columns:
            return
        if on_columns is None:
            for measurement in columns.measurements():
                done(measurement)
        else:
            on_columns(columns)

    with paused_cyclic_gc():
        if remote:
            started = pool.take(specs, chunk_values) if pool is not None else None
            _measure_in_workers(remote, list(specs), workers, chunk_values, all_done, started)
        workspace = Workspace(chunk_values)
        for start in range(0, len(local), LOCAL_BATCH_PAIRS):  # in batches, so progress advances while measuring
            all_done(*measure_jobs_as_columns(local[start : start + LOCAL_BATCH_PAIRS], specs, workspace, chunk_values))
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
    done: Callable[[Sequence[PairMeasurement], MeasuredColumns], None],
    started: tuple[ProcessPoolExecutor, int] | None = None,
) -> None:
    """Measure the jobs with ``workers`` processes: this one and ``workers - 1`` spawned ones.

    ``done`` is handed each batch's measurements, and its small pairs measured from their blocks as columns.

    ``started`` is an executor already running and the measuring-process count it was made
    for; else the spawned processes are started here. The spawned ones take batches from the
    front of the queue, this process from the back, between collecting their results. So this
    process measures from the first moment, while the others are still starting (0.2-0.8 s on
    a 2-core machine, a sixth of a 4.6 GB compare), and nothing is pickled for its share.
    """
    from llmcheck.core.measuring.pair_transfer import pack_jobs, unpack_columns

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
                    measured = unpack_columns(future.result())
                except BrokenProcessPool as exc:
                    raise LlmcheckError(
                        "a worker process measuring pairs died (out of memory, killed, or -- from a Python script -- "
                        'the script has no `if __name__ == "__main__":` guard, so each worker ran it again)',
                        where="llmcheck compare",
                        hint="rerun with -j 1 (workers=1) to measure in one process",
                    ) from exc
                done(*measured)

        submit_from_front()
        while pending or queue:
            if queue:  # this process's share: the last batch not yet handed out
                done(*measure_jobs_as_columns(queue.pop(), specs, workspace, chunk_values))
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
