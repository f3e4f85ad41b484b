"""One chunk of a pair as float64 arrays, with the values several metrics share computed once.

A metric accumulator may define ``update_chunk(chunk: PairChunk)`` instead of (or besides)
``update(golden, my)``; the metric engine then hands it this object. Nine metrics over one
chunk would otherwise each subtract the two sides, take absolute values and form the same
dot products; here the first metric that asks computes the value and the others reuse it,
which is what lets a compare run near memory speed. Every array is a view into a buffer the
engine reuses from chunk to chunk: read it, never keep it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

#: Golden magnitudes at or below this are too close to zero for a relative error (float32 eps, as the seed tool).
RELATIVE_FLOOR = float(np.finfo(np.float32).eps)

#: What a :class:`PairChunk` derived value is (an array or a number), kept through its cache.
_Value = TypeVar("_Value")


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """Return the dot product of two flat float64 arrays: BLAS ``ddot``, on one thread while measuring.

    A dot split over threads sums in another order (the last digits of a metric would depend
    on ``-j``), and waking threads for every chunk costs more than the arithmetic on a busy
    machine. Worker processes start with one BLAS thread (OPENBLAS_NUM_THREADS=1 before numpy
    is imported); any other process measures inside :func:`single_threaded_blas`.
    """
    return float(np.dot(a, b))


_blas_depth = 0
_blas_controller: Any = None


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run the block with numpy's BLAS on one thread, so :func:`dot` sums as in a worker process.

    Re-entrant and cheap when nested: only the outermost entry sets and restores the thread count.
    """
    global _blas_depth, _blas_controller
    if _blas_depth:
        _blas_depth += 1
        try:
            yield
        finally:
            _blas_depth -= 1
        return
    if _blas_controller is None:
        from threadpoolctl import ThreadpoolController

        _blas_controller = ThreadpoolController()
    _blas_depth += 1
    try:
        with _blas_controller.limit(limits=1, user_api="blas"):
            yield
    finally:
        _blas_depth -= 1


class Workspace:
    """Float64 buffers reused from chunk to chunk, so streaming a pair allocates nothing per chunk."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._buffers: dict[str, np.ndarray] = {}

    def release(self) -> None:
        """Free every buffer (a later :meth:`buffer` call allocates again)."""
        self._buffers.clear()

    def buffer(self, name: str, size: int, dtype: Any = np.float64) -> np.ndarray:
        """Return the first ``size`` elements of the named buffer (grown if a chunk is larger)."""
        dtype = np.dtype(dtype)
        held = self._buffers.get(name)
        if held is None or held.size < size or held.dtype != dtype:
            held = np.empty(max(size, self.capacity), dtype=dtype)
            self._buffers[name] = held
        return held[:size]


class PairChunk:
    """Both sides of one chunk (flattened, float64, finite, equal length) and their shared derived values."""

    __slots__ = ("_cache", "_workspace", "golden", "golden_float32", "my", "size")

    def __init__(
        self, golden: np.ndarray, my: np.ndarray, workspace: Workspace, golden_float32: np.ndarray | None = None
    ) -> None:
        self.golden = golden
        self.my = my
        self.size = int(golden.size)
        self._workspace = workspace
        self._cache: dict[str, Any] = {}
        #: ``golden`` as the float32 values it was decoded from, when it was (the engine knows; None otherwise)
        self.golden_float32 = golden_float32

    def _cached(self, name: str, compute: Callable[[], _Value]) -> _Value:
        value: _Value | None = self._cache.get(name)
        if value is None:
            value = compute()
            self._cache[name] = value
        return value

    def share(self, name: str, value: Any) -> None:
        """Set a derived value computed elsewhere (a view into an array computed for many pairs at once)."""
        self._cache[name] = value

    def scratch(self, name: str, dtype: Any = np.float64) -> np.ndarray:
        """Return a reusable buffer of the chunk's length for a metric's own temporaries."""
        return self._workspace.buffer("scratch:" + name, self.size, dtype)

    # --- element-wise arrays ---

    def diff(self) -> np.ndarray:
        """Return ``my - golden``."""
        return self._cached("diff", lambda: np.subtract(self.my, self.golden, out=self.scratch("_diff")))

    def abs_diff(self) -> np.ndarray:
        """Return ``|my - golden|``."""
        return self._cached("abs_diff", lambda: np.abs(self.diff(), out=self.scratch("_abs_diff")))

    def abs_golden(self) -> np.ndarray:
        """Return ``|golden|``."""
        return self._cached("abs_golden", lambda: np.abs(self.golden, out=self.scratch("_abs_golden")))

    def relative_error(self) -> np.ndarray:
        """Return ``|my - golden| / |golden|`` where ``|golden| > RELATIVE_FLOOR``, 0 elsewhere."""

        def compute() -> np.ndarray:
            magnitude = self.abs_golden()
            ratio = self.scratch("_relative")
            with np.errstate(divide="ignore", invalid="ignore"):
                np.divide(self.abs_diff(), magnitude, out=ratio)
            undefined_count = 0
            if self.size and float(magnitude.min()) <= RELATIVE_FLOOR:  # rare: only then pay for the mask
                undefined = np.less_equal(magnitude, RELATIVE_FLOOR, out=self.scratch("_undefined", np.bool_))
                undefined_count = int(np.count_nonzero(undefined))
                ratio[undefined] = 0.0
            self._cache["relative_defined_count"] = self.size - undefined_count
            return ratio

        return self._cached("relative_error", compute)

    def relative_defined_count(self) -> int:
        """Return how many positions have a defined relative error (``|golden| > RELATIVE_FLOOR``)."""
        self.relative_error()
        return int(self._cache["relative_defined_count"])

    # --- reductions ---

    def golden_min(self) -> float:
        """Return ``min golden`` (the chunk is not empty)."""
        return self._cached("golden_min", lambda: float(self.golden.min()))

    def golden_max(self) -> float:
        """Return ``max golden`` (the chunk is not empty)."""
        return self._cached("golden_max", lambda: float(self.golden.max()))

    def golden_sum(self) -> float:
        """Return ``sum golden``."""
        return self._cached("golden_sum", lambda: float(self.golden.sum()))

    def my_min(self) -> float:
        """Return ``min my`` (the chunk is not empty)."""
        return self._cached("my_min", lambda: float(self.my.min()))

    def my_max(self) -> float:
        """Return ``max my`` (the chunk is not empty)."""
        return self._cached("my_max", lambda: float(self.my.max()))

    def my_sum(self) -> float:
        """Return ``sum my``."""
        return self._cached("my_sum", lambda: float(self.my.sum()))

    def max_relative_error(self) -> float:
        """Return the largest relative error of the chunk (not empty)."""
        return self._cached("max_relative_error", lambda: float(self.relative_error().max()))

    def sum_relative_error(self) -> float:
        """Return the sum of the relative errors of the chunk (0 where undefined)."""
        return self._cached("sum_relative_error", lambda: float(self.relative_error().sum()))

    def softmax_weights(self, shift: float) -> tuple[np.ndarray, float]:
        """Return ``w = exp(golden - shift)`` (exponentials in float32, held as float64) and ``sum w``."""
        held = self._cache.get("softmax_weights")
        if held is not None and held[0] == shift:
            return held[1], held[2]
        single = self.scratch("_softmax_f32", np.float32)
        source = self.golden_float32
        if source is not None and float(np.float32(shift)) == shift:
            # float32 arithmetic on the stored values gives exactly float32(float64 difference):
            # rounding to 53 bits then 24 is rounding to 24 once, as 53 >= 2 * 24 + 2 (Figueroa)
            np.subtract(source, np.float32(shift), out=single)
        else:
            np.subtract(self.golden, shift, out=single, casting="same_kind")
        np.exp(single, out=single)
        weights = self.scratch("_softmax_weights")
        np.copyto(weights, single)
        weight_sum = float(weights.sum())
        self._cache["softmax_weights"] = (shift, weights, weight_sum)
        return weights, weight_sum

    def max_abs_diff(self) -> float:
        """Return ``max |my - golden|`` (0 for an empty chunk)."""
        return self._cached("max_abs_diff", lambda: float(self.abs_diff().max(initial=0.0)))

    def sum_abs_diff(self) -> float:
        """Return ``sum |my - golden|``."""
        return self._cached("sum_abs_diff", lambda: float(self.abs_diff().sum()))

    def sum_sq_golden(self) -> float:
        """Return ``sum golden**2``."""
        return self._cached("sum_sq_golden", lambda: float(dot(self.golden, self.golden)))

    def sum_sq_my(self) -> float:
        """Return ``sum my**2``."""
        return self._cached("sum_sq_my", lambda: float(dot(self.my, self.my)))

    def dot_golden_my(self) -> float:
        """Return ``sum golden * my``."""
        return self._cached("dot_golden_my", lambda: float(dot(self.golden, self.my)))

    def sum_sq_diff(self) -> float:
        """Return ``sum (my - golden)**2``."""
        return self._cached("sum_sq_diff", lambda: float(dot(self.diff(), self.diff())))
