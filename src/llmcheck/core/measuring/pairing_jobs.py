"""The pairing's pairs as measuring jobs: which can be measured, one job per distinct pair of byte ranges, run here or on an executor.

A capture stores a tensor once however many records see it (a module's output is the next
one's input), so pairs over the same bytes on both sides are measured once and every one of
them is handed that measurement.
"""

from __future__ import annotations

import dataclasses
import functools
from array import array
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from llmcheck.core.pairing.merge import Pairing
from llmcheck.core.records import (
    MetricSpec,
    TensorData,
    TensorRecord,
)

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.core.measuring.measured_columns import MeasuredColumns
    from llmcheck.core.measuring.metric_engine import HeldWorkers


def shape_text(shape: Sequence[int]) -> str:
    """Return a shape as reasons print it: ``[1, 4, 64]``."""
    return str(list(shape))


def incomparable_reason(golden: TensorRecord, my: TensorRecord) -> str | None:
    """Return why two paired records cannot be measured element by element, or None when they can.

    A mismatch of dtype or shape is named before missing data: a statistics-only pair is
    judged on its statistics unless its shapes differ, and then the shapes are why.
    """
    problem = _dtype_problem(golden.dtype, my.dtype) or shape_problem(golden, my)
    if problem is not None:
        return problem
    if golden.data is None:
        return _NO_DATA["golden"]
    if my.data is None:
        return _NO_DATA["my"]
    return None


#: Why a side's record cannot be measured: one text per side, held by every such pair (10**6 of a statistics-only compare).
_NO_DATA = {side: f"{side} has no tensor data (a statistics-only dump)" for side in ("golden", "my")}


@functools.cache
def _dtype_problem(golden_dtype: str, my_dtype: str) -> str | None:
    """Return why tensors of these two dtypes cannot be measured together, or None (asked once per pair of dtypes)."""
    from llmcheck.core.dumps.tensor_chunks import streamable

    for side, dtype in (("golden", golden_dtype), ("my", my_dtype)):
        if not streamable(dtype):
            return f"{side} dtype {dtype} cannot be compared"
    if golden_dtype.startswith("complex") != my_dtype.startswith("complex"):
        return f"dtype mismatch: golden {golden_dtype} vs my {my_dtype} (complex against real)"
    return None


def shape_problem(golden: TensorRecord, my: TensorRecord) -> str | None:
    """Return why two shapes cannot be compared element by element (size-1 dims aside), or None."""
    if golden.shape != my.shape and tuple(golden.shape) != tuple(my.shape):
        squeezed = [tuple(size for size in shape if size != 1) for shape in (golden.shape, my.shape)]
        if squeezed[0] != squeezed[1]:
            return f"shape mismatch: golden {shape_text(golden.shape)} vs my {shape_text(my.shape)}"
    return None


def has_recorded_stats(record: TensorRecord) -> bool:
    """Return whether the source recorded the record's statistics: a measuring then need not compute them."""
    return record.stats is not None and record.stats.max is not None


class PairProblems(MutableMapping[int, str]):
    """Why each pair that was not measured was not, by pair index: a code a pair into the distinct reasons.

    Why not a dict: every pair of a statistics-only compare has a reason (it has no data), and
    a dict entry and its index's int were 100 bytes a pair, held through the measuring. The
    reasons are few (one per side with no data, one per pair of mismatched shapes): here a
    pair is four bytes.
    """

    __slots__ = ("_code_of", "_codes", "_count", "_reasons")

    def __init__(self, pairs: int) -> None:
        self._codes = array("I", bytes(4 * pairs))  # 0: no reason
        self._reasons: list[str] = [""]
        self._code_of: dict[str, int] = {}
        self._count = 0

    def __getitem__(self, index: int) -> str:
        code = self._codes[index] if 0 <= index < len(self._codes) else 0
        if not code:
            raise KeyError(index)
        return self._reasons[code]

    def get(self, index: int, default: Any = None) -> Any:
        """Return the reason of the pair at ``index``, or ``default`` where it has none (read once per unmeasured pair)."""
        code = self._codes[index] if 0 <= index < len(self._codes) else 0
        return self._reasons[code] if code else default

    def __setitem__(self, index: int, reason: str) -> None:
        code = self._code_of.get(reason)
        if code is None:
            code = self._code_of[reason] = len(self._reasons)
            self._reasons.append(reason)
        self._count += not self._codes[index]
        self._codes[index] = code

    def __delitem__(self, index: int) -> None:
        self[index]  # a KeyError for a pair with no reason, as a dict gives
        self._codes[index] = 0
        self._count -= 1

    def __iter__(self) -> Iterator[int]:
        return (index for index, code in enumerate(self._codes) if code)

    def __len__(self) -> int:
        return self._count


class PairExecutor(Protocol):
    """Measures pairs somewhere other than this machine's worker processes (``compare --executor``)."""

    def __call__(
        self, jobs: Sequence[Any], specs: Sequence[MetricSpec], on_measured: Callable[[Any], None] | None
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Return the measurements by pair index, and why each pair it could not measure failed."""


def measure_pairing(
    pairing: Pairing,
    specs: Sequence[MetricSpec],
    run_dtypes: tuple[str | None, str | None],
    workers: int | None,
    executor: PairExecutor | None,
    on_pairs_known: Callable[[int, int], None] | None,
    on_measured: Callable[[int], None] | None,
    pool: HeldWorkers | None,
    measured: Callable[[int, Any], None],
    measured_columns: Callable[[MeasuredColumns], None] | None = None,
) -> tuple[Mapping[int, str], int]:
    """Measure every pair, handing each measurement to ``measured(index, measurement)`` as it arrives.

    ``measured_columns``, when given, is handed the small pairs measured in this machine's
    processes block by block, as columns a batch at a time (their ``index`` the pairs'),
    instead of one ``measured`` call each: the judge takes a column at a time.

    Return why each pair that was not measured was not, and the tensor bytes read. A pair
    over the same bytes as an earlier one is handed that pair's measurement. Nothing keeps
    the measurements here: the caller makes each one's row (a third of a measurement's
    memory) as it arrives, so 10^5 of them are never held at once, and the rows cost no
    time after the last one. The jobs (one per distinct pair of byte ranges) live only here.
    """
    from llmcheck.core.measuring.metric_engine import measure_pairs
    from llmcheck.core.measuring.pair_measure import PairJob, build_job

    jobs: dict[tuple[Any, ...], PairJob] = {}
    same_data: dict[int, list[int]] = {}  # a measured pair's index -> the later pairs over its bytes
    problems = PairProblems(len(pairing.pairs))
    for index, pair in enumerate(pairing.pairs):
        assert pair.golden is not None and pair.my is not None
        problem = incomparable_reason(pair.golden, pair.my)
        if problem is not None:
            problems[index] = problem
            continue
        job = build_job(
            index=index,
            golden=pair.golden.data,  # pairs without data were set aside above
            my=pair.my.data,
            golden_needs_stats=not has_recorded_stats(pair.golden),
            my_needs_stats=not has_recorded_stats(pair.my),
            golden_run_dtype=run_dtypes[0],
            my_run_dtype=run_dtypes[1],
        )
        # A capture stores a tensor once however many records see it (a module's output is the
        # next one's input): pairs over the same bytes on both sides are measured once.
        identity = _data_identity(job.golden, job.my)
        first = jobs.get(identity)
        if first is None:
            jobs[identity] = job
        else:
            same_data.setdefault(first.index, []).append(index)
            jobs[identity] = dataclasses.replace(
                first,
                golden_needs_stats=first.golden_needs_stats or job.golden_needs_stats,
                my_needs_stats=first.my_needs_stats or job.my_needs_stats,
            )
    unique_jobs = sorted(jobs.values(), key=lambda job: job.index)
    jobs.clear()  # its keys, a tuple and a path per pair, are not held through the measuring
    if on_pairs_known is not None:
        on_pairs_known(len(unique_jobs), sum(job.nbytes for job in unique_jobs))
    bytes_read = 0

    def arrived(measurement: Any) -> None:
        nonlocal bytes_read
        bytes_read += measurement.bytes_read
        for index in (measurement.index, *same_data.get(measurement.index, ())):
            measured(index, measurement)
        if on_measured is not None:
            on_measured(measurement.bytes_read)

    def arrived_columns(columns: MeasuredColumns) -> None:
        nonlocal bytes_read
        bytes_read += sum(columns.bytes_read)
        assert measured_columns is not None
        measured_columns(columns.fanned_out(same_data) if same_data else columns)
        if on_measured is not None:
            for pair_bytes_read in columns.bytes_read:  # pair by pair, as a progress bar counts
                on_measured(pair_bytes_read)

    if executor is None:
        measure_pairs(
            unique_jobs,
            specs,
            workers=workers,
            on_measured=arrived,
            pool=pool,
            keep=False,
            on_columns=arrived_columns if measured_columns is not None else None,
        )
    else:
        handed: set[int] = set()

        def handed_on(measurement: Any) -> None:
            handed.add(measurement.index)
            arrived(measurement)

        found, failures = executor(unique_jobs, specs, on_measured=handed_on)
        for measurement in found.values():  # an executor that returned some without handing them on
            if measurement.index not in handed:
                arrived(measurement)
        problems.update(failures)
        later = ((first, index) for first, indices in same_data.items() for index in indices)
        problems.update({index: failures[first] for first, index in later if first in failures})
    return problems, bytes_read


def _data_identity(golden: TensorData, my: TensorData) -> tuple[Any, ...]:
    """Return what identifies the bytes a pair reads (unique for data reached through a loader)."""
    return golden.identity() + my.identity()
