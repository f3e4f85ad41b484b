"""Many small pairs of one size as 2-D arrays (a row per pair), with the per-row reductions metrics share.

A ``generate()`` dump holds tens of thousands of pairs of a few KB each; folding them one by
one through :class:`~llmcheck.core.measuring.pair_chunk.PairChunk` and nine accumulator objects costs
more in Python than the arithmetic does. Here a block of equal-sized pairs -- each a single
chunk -- is one 2-D array per side, every shared reduction is one numpy call along the rows,
and a metric that knows how (``results_of_block`` on its accumulator class) turns the per-row
reductions into its value for every row at once.

Every per-row value is the one the streaming path computes, bit for bit: numpy reduces each
row of a C-ordered block in one inner loop, exactly as it reduces that row alone, and
:func:`row_dots` takes each row's dot product with the BLAS function
:func:`~llmcheck.core.measuring.pair_chunk.dot` calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np


def row_dots(a: np.ndarray, b: np.ndarray) -> list[float]:
    """Return ``dot(a[i], b[i])`` for every row, bit for bit what ``dot`` gives for that row alone.

    A stacked matmul of a row by a column calls BLAS ``ddot`` once per row, as
    :func:`~llmcheck.core.measuring.pair_chunk.dot` does for one pair (on one thread:
    :func:`~llmcheck.core.measuring.pair_chunk.single_threaded_blas`).
    """
    return cast(list[float], stacked_row_dots(a, b).tolist())


def stacked_row_dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return ``dot(a[..., i, :], b[..., i, :])`` for every row of stacked blocks, shaped ``a.shape[:-1]``.

    As :func:`row_dots`: one BLAS ``ddot`` per row, so a stack of blocks gives each row what
    that row alone gives (``b`` may be broadcast against ``a``).
    """
    return cast(np.ndarray, np.matmul(a[..., None, :], b[..., :, None])[..., 0, 0])


class PairBlock:
    """``rows`` pairs of ``size`` finite float64 values each, one row per pair, and their shared values.

    The element-wise arrays are views into buffers the metric engine reuses from block to
    block: read them, never keep them. Reductions are lists of Python floats, one per row.
    """

    def __init__(
        self,
        golden: np.ndarray,
        my: np.ndarray,
        shared: dict[str, Any],
        scratch: Callable[[str, int, Any], np.ndarray],
        *,
        golden_float32: np.ndarray | None = None,
        my_float32: np.ndarray | None = None,
    ) -> None:
        self.golden, self.my = golden, my
        #: ``golden`` / ``my`` as the float32 numbers every row was decoded from, when they all were (else None):
        #: float32 arithmetic on them is float64 arithmetic rounded to float32, and half the bytes
        self.golden_float32, self.my_float32 = golden_float32, my_float32
        self.rows, self.size = golden.shape
        self._cache = dict(shared)
        self._scratch = scratch

    def subset(self, rows: list[int]) -> PairBlock:
        """Return a block of only these rows (copied), with the reductions already computed for them."""
        shared = {
            name: (value[rows] if isinstance(value, np.ndarray) else [value[row] for row in rows])
            for name, value in self._cache.items()
        }
        return PairBlock(
            self.golden[rows],
            self.my[rows],
            shared,
            self._scratch,
            golden_float32=None if self.golden_float32 is None else self.golden_float32[rows],
            my_float32=None if self.my_float32 is None else self.my_float32[rows],
        )

    def _cached(self, name: str, compute: Callable[[], list[float]]) -> list[float]:
        value: list[float] | None = self._cache.get(name)
        if value is None:
            value = self._cache[name] = compute()
        return value

    def scratch(self, name: str, dtype: Any = np.float64) -> np.ndarray:
        """Return a reusable 2-D buffer of the block's shape for a metric's own temporaries."""
        return self._scratch("block:" + name, self.rows * self.size, np.dtype(dtype)).reshape(self.rows, self.size)

    # --- element-wise arrays (computed for the whole group by the engine) ---

    def diff(self) -> np.ndarray:
        """Return ``my - golden``."""
        return cast(np.ndarray, self._cache["diff"])

    def softmax_weights(self) -> tuple[np.ndarray, list[float]]:
        """Return ``w = exp(golden - max golden)`` per row (exponentials in float32, held as float64) and ``sum w``."""
        return self._cache["softmax_weights"], self._cache["weight_sum"]

    # --- per-row reductions ---

    def reduction(self, name: str) -> list[Any]:
        """Return a reduction the engine computed for every row (``golden_max``, ``sum_abs_diff``, ...)."""
        return cast(list[Any], self._cache[name])

    def sum_sq_golden(self) -> list[float]:
        """Return ``sum golden**2`` per row."""
        return self._cached("sum_sq_golden", lambda: row_dots(self.golden, self.golden))

    def sum_sq_my(self) -> list[float]:
        """Return ``sum my**2`` per row."""
        return self._cached("sum_sq_my", lambda: row_dots(self.my, self.my))

    def dot_golden_my(self) -> list[float]:
        """Return ``sum golden * my`` per row."""
        return self._cached("dot_golden_my", lambda: row_dots(self.golden, self.my))

    def sum_sq_diff(self) -> list[float]:
        """Return ``sum (my - golden)**2`` per row."""
        return self._cached("sum_sq_diff", lambda: row_dots(self.diff(), self.diff()))
