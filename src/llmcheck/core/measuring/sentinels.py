"""Mask sentinels: the dtype's "minus infinity" in an additive attention mask is not a number to measure.

Many architectures fill an additive attention mask with ``finfo(dtype).min`` rather than
``-inf``: -3.4e38 in fp32, -65504 in fp16, about -3.39e38 in bf16. Compared as numbers, an
fp16 mask against its fp32 golden is 100 % wrong at every masked position, and the mask
would be named the culprit of every fp16 port. Here a value at or beyond
:data:`SENTINEL_FRACTION` of its own dtype's largest magnitude (or an infinity) is a
*sentinel*: positions where both sides hold a sentinel of the same sign agree and are left
out of the metrics (counted, like matching NaN/Inf). A finite sentinel on one side only is
measured as the number it is (fp16's 65504 against an fp32 65504 agrees; an fp32 mask value
against an fp16 -10, a lost mask, is a huge error); an infinity or NaN on one side only is a
mismatch. fp8 has no sentinels: its scaled values routinely sit near its small maximum.
"""

from __future__ import annotations

import math

import numpy as np

#: A value this close to its dtype's largest finite magnitude (or beyond it) stands for infinity.
SENTINEL_FRACTION = 0.9
_LARGEST: dict[str, float] = {
    "float64": float(np.finfo(np.float64).max),
    "float32": float(np.finfo(np.float32).max),
    "float16": float(np.finfo(np.float16).max),
    "bfloat16": 3.3895313892515355e38,
    "complex128": float(np.finfo(np.float64).max),
    "complex64": float(np.finfo(np.float32).max),
}


def sentinel_limit(dtype: str) -> float:
    """Return the magnitude from which a value of ``dtype`` is a sentinel (infinity where the dtype has none)."""
    largest = _LARGEST.get(dtype)
    return SENTINEL_FRACTION * largest if largest is not None else math.inf


def may_hold_sentinels(sum_of_squares: float, limit: float) -> bool:
    """Return whether a chunk whose squares sum to ``sum_of_squares`` can hold a value at or past ``limit``.

    A necessary condition that costs nothing (the sum is computed for the metrics anyway):
    only chunks that pass it are searched position by position.
    """
    return not math.isfinite(sum_of_squares) or sum_of_squares >= limit * limit


def classify(values: np.ndarray, limit: float) -> np.ndarray:
    """Return per position: 0 an ordinary finite value, 1 NaN, 2 plus sentinel (+Inf too), 3 minus sentinel."""
    kinds = np.zeros(values.shape, dtype=np.int8)
    kinds[values >= limit] = 2
    kinds[values <= -limit] = 3
    kinds[np.isnan(values)] = 1
    return kinds


def is_sentinel(value: float | None, limit: float) -> bool:
    """Return whether one recorded value (a statistic such as a tensor's min) is a sentinel, given its side's limit."""
    return value is not None and (math.isinf(value) or abs(value) >= limit)


def sentinel_limit_in_run(dtype: str, run_dtype: str | None) -> float:
    """Return the sentinel limit of a ``dtype`` tensor in a run whose tensors are mostly ``run_dtype``.

    The tighter of the two: an fp32 tensor of an fp16 run (a softmax input upcast from fp16)
    holds the fp16 mask value -65504, which is that run's minus infinity.
    """
    return min(sentinel_limit(dtype), sentinel_limit(run_dtype) if run_dtype else math.inf)
