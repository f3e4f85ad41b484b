"""Worker processes for measuring, started before the dumps are loaded so their start-up overlaps the loading.

Why: a spawned worker starts a Python, imports numpy and the metric code, and unpickles the
metric specs -- 0.3-0.8 s on the 2-core development machine, a sixth of a 4.6 GB compare's
measuring. Started when the pairs are known, the workers began that work just as the
measuring should have; the loading before it runs in one process and leaves the other cores
idle. A pool started before the loading is ready when the first pairs are.

It is started only where it will be used: more than one worker, and inputs large enough to be
measured in workers at all (:data:`~llmcheck.core.measuring.metric_engine.PARALLEL_MIN_BYTES`) --
otherwise starting it would cost a small compare (and a test suite of them) its start-up for nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import TracebackType

from llmcheck.core.records import MetricSpec


class WorkerPool:
    """Processes for ``workers``-way measuring (this one and ``workers - 1`` spawned now); measured with once, then shut down."""

    def __init__(self, workers: int, specs: Sequence[MetricSpec], chunk_values: int) -> None:
        from llmcheck.core.measuring.metric_engine import spawned_workers, start_executor

        self.workers, self.specs, self.chunk_values = workers, list(specs), chunk_values
        self._executor: ProcessPoolExecutor | None = start_executor(spawned_workers(workers), self.specs, chunk_values)
        for _ in range(spawned_workers(workers)):  # a task each starts the processes now, not at the first batch
            self._executor.submit(os.getpid)

    def take(self, specs: Sequence[MetricSpec], chunk_values: int) -> tuple[ProcessPoolExecutor, int] | None:
        """Hand over the running executor and its worker count for a measuring with these specs, once; else None."""
        if self._executor is None or list(specs) != self.specs or chunk_values != self.chunk_values:
            return None
        executor, self._executor = self._executor, None
        return executor, self.workers

    def close(self) -> None:
        """Shut the workers down if nothing took them."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def early_pool(workers: int | None, specs: Sequence[MetricSpec], inputs: Iterable[Path | None]) -> WorkerPool | None:
    """Return a pool started now when the compare of ``inputs`` will measure in workers; None otherwise."""
    from llmcheck.core.measuring.metric_engine import PARALLEL_MIN_BYTES, default_workers, picklable
    from llmcheck.core.measuring.pair_measure import DEFAULT_CHUNK_VALUES

    workers = workers or default_workers()
    if workers < 2 or not files_reach([path for path in inputs if path is not None], PARALLEL_MIN_BYTES):
        return None
    if not picklable(specs):  # a metric the workers cannot import: measured in this process (metric_engine says so)
        return None
    return WorkerPool(workers, specs, DEFAULT_CHUNK_VALUES)


def files_reach(paths: Sequence[Path], limit: int) -> bool:
    """Return whether the files under ``paths`` (files or folders) hold ``limit`` bytes; stops counting there.

    A path that cannot be read counts nothing: loading it will say what is wrong.
    """
    total = 0
    folders: list[str] = []
    for path in paths:
        try:
            if path.is_dir():
                folders.append(str(path))
            else:
                total += path.stat().st_size
        except OSError:
            continue
    while folders and total < limit:
        try:
            entries = list(os.scandir(folders.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
                elif entry.is_file():
                    total += entry.stat().st_size
            except OSError:
                continue
            if total >= limit:
                break
    return total >= limit
