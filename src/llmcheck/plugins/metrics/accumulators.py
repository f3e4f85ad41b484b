"""Streaming accumulators of the built-in metrics: float64 sums over chunks, never a full float64 copy.

Each accumulator folds one :class:`~llmcheck.core.measuring.pair_chunk.PairChunk` at a time
(``update_chunk``) and also accepts plain arrays (``update``) like any third-party metric.
The seed tool's defects are fixed here:

* absolute errors count every position, including those where golden is zero (the seed
  masked them, hiding a large value where golden is 0);
* a mean is over the positions it is defined on (the seed divided masked sums by all
  elements);
* an all-zero side gets a defined value: cosine 1 when both sides are zero, 0 when one is;
  relative euclidean distance 0 when both are zero, infinity when only golden is;
* KL divergence is computed without overflow by an online log-sum-exp (see
  :class:`KlDivergence`).

Each class also has ``results_of_block(block)``: its value for every row of a
:class:`~llmcheck.core.measuring.pair_block.PairBlock` (many small pairs of one chunk each), which is
what a fresh accumulator given that row's chunk returns -- the same state arithmetic, run
over per-row reductions instead of one object per pair. ``None`` for a row means: fold that
row the ordinary way.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

from llmcheck.plugin_api import PairBlock, PairChunk, Workspace, dot, row_dots


class _ChunkAccumulator(ABC):
    """Base: ``update(golden, my)`` wraps the arrays in a chunk so both entry points share one code path."""

    def update(self, golden: np.ndarray, my: np.ndarray) -> None:
        """Fold in one chunk of both tensors, flattened, as float64 arrays of equal length."""
        self.update_chunk(PairChunk(golden, my, Workspace(golden.size)))

    @abstractmethod
    def update_chunk(self, chunk: PairChunk) -> None:
        """Fold in one chunk, reading the values several metrics share from it."""


class CosineSimilarity(_ChunkAccumulator):
    """cos(golden, my) over the flattened tensors: 1 when both are all zero, 0 when exactly one is."""

    def __init__(self) -> None:
        self.dot = self.golden_sq = self.my_sq = 0.0

    def update_chunk(self, chunk: PairChunk) -> None:
        self.dot += chunk.dot_golden_my()
        self.golden_sq += chunk.sum_sq_golden()
        self.my_sq += chunk.sum_sq_my()

    def result(self) -> float:
        return self._value(self.dot, self.golden_sq, self.my_sq)

    @staticmethod
    def _value(dot: float, golden_sq: float, my_sq: float) -> float:
        if golden_sq == 0.0 and my_sq == 0.0:
            return 1.0
        if golden_sq == 0.0 or my_sq == 0.0:
            return 0.0
        product = golden_sq * my_sq  # one sqrt, so identical sides give exactly 1.0
        norms = math.sqrt(product) if math.isfinite(product) else math.sqrt(golden_sq) * math.sqrt(my_sq)
        return max(-1.0, min(1.0, dot / norms))

    @classmethod
    def results_of_block(cls, block: PairBlock) -> list[float | None]:
        return [
            cls._value(0.0 + d, 0.0 + g, 0.0 + m)
            for d, g, m in zip(block.dot_golden_my(), block.sum_sq_golden(), block.sum_sq_my())
        ]


def _mean(total: float, count: int) -> float:
    return total / count if count else 0.0


class _RunningMax(_ChunkAccumulator):
    """Base of the metrics that keep the largest per-chunk value (0 before any chunk)."""

    def __init__(self) -> None:
        self.worst = 0.0

    def result(self) -> float:
        return self.worst


class _RunningMean(_ChunkAccumulator):
    """Base of the metrics that average a per-position value: a running total over a running count."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def result(self) -> float:
        return _mean(self.total, self.count)


class MaxRelativeError(_RunningMax):
    """max |my - golden| / |golden| over positions where |golden| > float32 eps (0 if there are none)."""

    def update_chunk(self, chunk: PairChunk) -> None:
        if chunk.size:
            self.worst = max(self.worst, chunk.max_relative_error())

    @classmethod
    def results_of_block(cls, block: PairBlock) -> list[float | None]:
        return [max(0.0, value) for value in block.reduction("max_relative_error")]


class MeanRelativeError(_RunningMean):
    """Mean of |my - golden| / |golden| over the positions where it is defined (|golden| > float32 eps)."""

    def update_chunk(self, chunk: PairChunk) -> None:
        if chunk.size:
            self.total += chunk.sum_relative_error()
            self.count += chunk.relative_defined_count()

    @classmethod
    def results_of_block(cls, block: PairBlock) -> list[float | None]:
        return [
            _mean(0.0 + total, count)
            for total, count in zip(block.reduction("sum_relative_error"), block.reduction("relative_defined_count"))
        ]


class MaxAbsoluteError(_RunningMax):
    """max |my - golden| over every position."""

    def update_chunk(self, chunk: PairChunk) -> None:
        self.worst = max(self.worst, chunk.max_abs_diff())

    @classmethod
    def results_of_block(cls, block: PairBlock) -> list[float | None]:
        return [max(0.0, value) for value in block.reduction("max_abs_diff")]


class MeanAbsoluteError(_RunningMean):
    """Mean of |my - golden| over every position."""

    def update_chunk(self, chunk: PairChunk) -> None:
        self.total += chunk.sum_abs_diff()
        self.count += chunk.size

    @classmethod
    def results_of_block(cls, block: PairBlock) -> list[float | None]:
        return [_mean(0.0 + total, block.size) for total in block.reduction("sum_abs_diff")]


class _ErrorEnergy(_ChunkAccumulator):
    """Base of the metrics that compare the error's energy sum (my - golden)**2 with the golden's sum golden**2."""

    def __init__(self) -> None:
        self.diff_sq = self.golden_sq = 0.0

    def update_chunk(self, chunk: PairChunk) -> None:
        self.diff_sq += chunk.sum_sq_diff()
        self.golden_sq += chunk.sum_sq_golden()


class RelativeEuclideanDistance(_ErrorEnergy):
    """||my - golden|| / ||golden||: 0 when both are zero, infinity when only golden is."""

    def result(self) -> float:
        return self._value(self.diff_sq, self.golden_sq)

    @staticmethod
    def _value(diff_sq: float, golden_sq: float) -> float:
        if golden_sq == 0.0:
            return 0.0 if diff_sq == 0.0 else math.inf
        return math.sqrt(diff_sq) / math.sqrt(golden_sq)

    @classmethod
    def results_of_block(cls, block: PairBlock) -> list[float | None]:
        return [cls._value(0.0 + d, 0.0 + g) for d, g in zip(block.sum_sq_diff(), block.sum_sq_golden())]


class RootMeanSquareError(_RunningMean):
    """sqrt(mean((my - golden)**2)) over every position."""

    def update_chunk(self, chunk: PairChunk) -> None:
        self.total += chunk.sum_sq_diff()
        self.count += chunk.size

    def result(self) -> float:
        return math.sqrt(super().result())

    @classmethod
    def results_of_block(cls, block: PairBlock) -> list[float | None]:
        return [math.sqrt(_mean(0.0 + d, block.size)) for d in block.sum_sq_diff()]


class SignalToQuantizationNoise(_ErrorEnergy):
    """10 log10(sum golden**2 / sum (my - golden)**2) in dB: +inf when equal, -inf when golden is zero and my is not."""

    def result(self) -> float:
        return self._value(self.diff_sq, self.golden_sq)

    @staticmethod
    def _value(diff_sq: float, golden_sq: float) -> float:
        if diff_sq == 0.0:
            return math.inf
        if golden_sq == 0.0:
            return -math.inf
        return 10.0 * math.log10(golden_sq / diff_sq)

    @classmethod
    def results_of_block(cls, block: PairBlock) -> list[float | None]:
        return [cls._value(0.0 + d, 0.0 + g) for d, g in zip(block.sum_sq_diff(), block.sum_sq_golden())]


#: Chunks whose |my - golden| stays below this use the series e**x - 1 - x = x**2/2 + x**3/6
#: (truncation below 1e-7 relative); below the second limit the cubic term is below 4e-6 and is dropped.
_SERIES_LIMIT = 1e-3
_QUADRATIC_LIMIT = 1e-5


class KlDivergence(_ChunkAccumulator):
    """KL(softmax(golden) || softmax(my)) over the whole flattened tensor, as the seed tool defines it.

    With ``p = softmax(golden)`` and ``e = my - golden`` the divergence is
    ``KL = -sum p e + log sum p exp(e)``, a small difference of two terms when the runs
    agree. Chunks where every ``|e| < 1e-3`` contribute to ``B = sum p (exp(e) - 1 - e)``
    through its series, and KL is ``-A + log1p(A + B)`` with ``A = sum p e`` -- so fp32-close
    runs get a KL accurate to float64, not to the noise of two log-sum-exps. Other chunks
    add ``sum p exp(e) = sum exp(my - logsumexp(golden))`` directly, through an online
    log-sum-exp of ``my``, so nothing overflows however far apart the runs are. The weights
    ``exp(golden - running max)`` are rescaled when a later chunk raises the maximum.
    Exponentials are taken in float32 (4x faster): the weights carry a relative error of
    about 1e-6, which moves KL by about as much relative to its value, and chunks with large
    differences add about 1e-8 absolute.
    """

    def __init__(self) -> None:
        self.golden_max = -math.inf
        self.weight_sum = 0.0  # sum w, w = exp(golden - golden_max)
        self.weighted_diff = 0.0  # sum w e
        self.weighted_series = 0.0  # sum w (exp(e) - 1 - e) over series chunks
        self.direct_weight = 0.0  # sum w over direct chunks
        self.direct_weighted_diff = 0.0  # sum w e over direct chunks
        self.direct_my_max = -math.inf
        self.direct_my_sum = 0.0  # sum exp(my - direct_my_max) over direct chunks

    def _exp_sum(self, values: np.ndarray, shift: float, scratch: np.ndarray) -> np.ndarray:
        np.subtract(values, shift, out=scratch, casting="same_kind")
        return np.exp(scratch, out=scratch)

    def update_chunk(self, chunk: PairChunk) -> None:
        if chunk.size == 0:
            return
        chunk_max = chunk.golden_max()
        if chunk_max > self.golden_max:
            if self.weight_sum:
                scale = math.exp(self.golden_max - chunk_max)
                self.weight_sum *= scale
                self.weighted_diff *= scale
                self.weighted_series *= scale
                self.direct_weight *= scale
                self.direct_weighted_diff *= scale
            self.golden_max = chunk_max
        weights, weight_sum = chunk.softmax_weights(self.golden_max)
        diff = chunk.diff()
        weighted_diff = float(dot(weights, diff))
        self.weight_sum += weight_sum
        self.weighted_diff += weighted_diff
        largest = chunk.max_abs_diff()
        if largest >= _SERIES_LIMIT:
            self.direct_weight += weight_sum
            self.direct_weighted_diff += weighted_diff
            my_max = chunk.my_max()
            if my_max > self.direct_my_max:
                self.direct_my_sum *= math.exp(self.direct_my_max - my_max) if self.direct_my_sum else 0.0
                self.direct_my_max = my_max
            single = chunk.scratch("kl_f32", np.float32)
            self.direct_my_sum += float(self._exp_sum(chunk.my, self.direct_my_max, single).sum(dtype=np.float64))
            return
        weighted = chunk.scratch("kl_weighted")
        np.multiply(weights, diff, out=weighted)
        series = 0.5 * float(dot(weighted, diff))
        if largest >= _QUADRATIC_LIMIT:
            np.multiply(weighted, diff, out=weighted)
            series += float(dot(weighted, diff)) / 6.0
        self.weighted_series += series

    def result(self) -> float:
        if self.weight_sum == 0.0 or self.direct_weight == 0.0:
            return self._series_value(self.weight_sum, self.weighted_diff, self.weighted_series)
        mean_diff = self.weighted_diff / self.weight_sum
        series_part = (
            self.weight_sum - self.direct_weight + self.weighted_diff - self.direct_weighted_diff + self.weighted_series
        ) / self.weight_sum
        golden_log_sum = self.golden_max + math.log(self.weight_sum)
        direct_log = self.direct_my_max + math.log(self.direct_my_sum) - golden_log_sum
        series_log = math.log(series_part) if series_part > 0.0 else -math.inf
        value = -mean_diff + float(np.logaddexp(series_log, direct_log))
        return max(value, 0.0)

    @staticmethod
    def _series_value(weight_sum: float, weighted_diff: float, weighted_series: float) -> float:
        """Return KL when every chunk took the series: ``-A + log1p(A + B)``."""
        if weight_sum == 0.0:
            return 0.0
        mean_diff = weighted_diff / weight_sum
        return max(-mean_diff + math.log1p(mean_diff + weighted_series / weight_sum), 0.0)

    @classmethod
    def _direct_row(
        cls, golden_max: float, weight_sum: float, weighted_diff: float, my_max: float, my_sum: float
    ) -> float:
        """Return KL of a block's row whose differences reach the series limit: what one direct chunk leaves."""
        state = cls()
        state.golden_max = golden_max
        state.weight_sum, state.weighted_diff = 0.0 + weight_sum, 0.0 + weighted_diff
        state.direct_weight, state.direct_weighted_diff = 0.0 + weight_sum, 0.0 + weighted_diff
        state.direct_my_max = my_max
        state.direct_my_sum = 0.0 + my_sum
        return state.result()

    @classmethod
    def results_of_block(cls, block: PairBlock) -> list[float | None]:
        """Return KL of each row: by its series, or -- where a difference reaches the series limit -- directly.

        Each row pays only for its own way: the series terms are taken over the runs of
        consecutive series rows, the direct sums over the runs of direct rows.
        """
        weights, weight_sums = block.softmax_weights()
        diff = block.diff()
        weighted_diffs = row_dots(weights, diff)
        largest = block.reduction("max_abs_diff")
        results: list[float | None] = [None] * block.rows
        weighted = block.scratch("kl_weighted")
        for first, last in _runs([most < _SERIES_LIMIT for most in largest]):
            np.multiply(weights[first:last], diff[first:last], out=weighted[first:last])
            series = [0.5 * quadratic for quadratic in row_dots(weighted[first:last], diff[first:last])]
            for cubic_first, cubic_last in _runs([most >= _QUADRATIC_LIMIT for most in largest[first:last]]):
                cubic_first, cubic_last = first + cubic_first, first + cubic_last
                cubed = np.multiply(weighted[cubic_first:cubic_last], diff[cubic_first:cubic_last])
                for row, cubic in enumerate(row_dots(cubed, diff[cubic_first:cubic_last]), cubic_first - first):
                    series[row] += cubic / 6.0
            for row in range(first, last):
                results[row] = cls._series_value(
                    0.0 + weight_sums[row], 0.0 + weighted_diffs[row], 0.0 + series[row - first]
                )
        golden_max, my_max = block.reduction("golden_max"), block.reduction("my_max")
        single = block.scratch("kl_f32", np.float32)
        for first, last in _runs([most >= _SERIES_LIMIT for most in largest]):
            # exp(my - max my) in float32, as a direct chunk takes it (from the stored float32 numbers when there are)
            if block.my_float32 is not None:
                np.subtract(
                    block.my_float32[first:last],
                    np.array(my_max[first:last], np.float32)[:, None],
                    out=single[first:last],
                )
            else:
                np.subtract(
                    block.my[first:last],
                    np.array(my_max[first:last])[:, None],
                    out=single[first:last],
                    casting="same_kind",
                )
            np.exp(single[first:last], out=single[first:last])
            for row in range(first, last):
                my_sum = float(single[row].sum(dtype=np.float64))
                results[row] = cls._direct_row(
                    golden_max[row], weight_sums[row], weighted_diffs[row], my_max[row], my_sum
                )
        return results


def _runs(chosen: list[bool]) -> list[tuple[int, int]]:
    """Return the ``(first, last)`` bounds of each run of consecutive chosen rows."""
    runs: list[tuple[int, int]] = []
    first = None
    for row, wanted in enumerate(chosen):
        if wanted and first is None:
            first = row
        elif not wanted and first is not None:
            runs.append((first, row))
            first = None
    if first is not None:
        runs.append((first, len(chosen)))
    return runs
