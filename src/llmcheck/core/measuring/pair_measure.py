"""One pair measured: both tensors streamed chunk by chunk through every metric, NaN, Inf and mask sentinels told apart.

The nouns of measuring live here too -- a :class:`PairJob` (what to read) and a
:class:`PairMeasurement` (what was found) -- so that the modules that move them between
processes (``pair_transfer``) and measure many small ones at once (``small_pairs``) build on
this one, and ``metric_engine``, which runs them all in parallel, on those: none imports
one that imports it back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llmcheck.core.dtypes import DTYPE_ITEMSIZE
from llmcheck.core.dumps.tensor_chunks import ChunkReader
from llmcheck.core.measuring.pair_chunk import PairChunk, Workspace, single_threaded_blas
from llmcheck.core.measuring.sentinels import SentinelRange, classify, may_hold_sentinels, sentinel_range_in_run
from llmcheck.core.records import MetricSpec, TensorData, TensorStats, slot_builder

#: float64 values per chunk: 512 KiB per buffer keeps a chunk's working set in the CPU caches.
DEFAULT_CHUNK_VALUES = 1 << 16


@dataclass(frozen=True, slots=True)
class PairJob:
    """One pair to measure: both data handles, and whether each side's statistics must be computed.

    ``golden_run_dtype`` / ``my_run_dtype`` name the dtype most tensors of each run have: an
    fp16 run's mask keeps the value -65504 when an fp32 softmax receives it, and it is still
    that run's "minus infinity" (:func:`llmcheck.core.measuring.sentinels.sentinel_range_in_run`).
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
        "golden_sentinels",
        "golden_side",
        "job",
        "masked",
        "matching_nonfinite",
        "mismatch",
        "my_sentinels",
        "my_side",
    )

    def __init__(self, job: PairJob, specs: Sequence[MetricSpec]) -> None:
        self.job = job
        self.accumulators = [spec.make_accumulator() for spec in specs]
        self.chunk_updates = [getattr(acc, "update_chunk", None) for acc in self.accumulators]
        self.golden_side = SideStats(job.golden_needs_stats)
        self.my_side = SideStats(job.my_needs_stats)
        self.golden_sentinels = sentinel_range_in_run(job.golden.dtype, job.golden_run_dtype)
        self.my_sentinels = sentinel_range_in_run(job.my.dtype, job.my_run_dtype)
        self.mismatch = self.matching_nonfinite = self.masked = 0

    def fold(self, chunk: PairChunk, workspace: Workspace) -> None:
        """Fold one chunk of both sides (float64, equal length) into every accumulator."""
        if may_hold_sentinels(chunk.sum_sq_golden(), self.golden_sentinels.low) or may_hold_sentinels(
            chunk.sum_sq_my(), self.my_sentinels.low
        ):
            chunk, agreement = _ordinary_part(
                chunk.golden,
                chunk.my,
                self.golden_sentinels,
                self.my_sentinels,
                self.golden_side,
                self.my_side,
                workspace,
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
    golden_sentinels: SentinelRange,
    my_sentinels: SentinelRange,
    golden_side: SideStats,
    my_side: SideStats,
    workspace: Workspace,
) -> tuple[PairChunk, _Agreement]:
    """Return the chunk of positions ordinary on both sides, and how the other positions agree.

    NaN and Inf are counted on each side; positions where both sides hold the same NaN, Inf
    or mask sentinel (:mod:`llmcheck.core.measuring.sentinels`) agree and are left out of the metrics,
    any other non-ordinary position is a mismatch.
    """
    golden_kind = classify(golden, golden_sentinels)
    my_kind = classify(my, my_sentinels)
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
