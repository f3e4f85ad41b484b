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

A tensor wider than most of its run's (an fp32 softmax input of an fp16 run) holds that run's
sentinel where it received it: near the run dtype's largest magnitude, not far beyond it. Far
beyond it (:data:`RUN_CEILING_FACTOR`), its values are ordinary numbers the run's dtype could
never have held: the squares of a real model's massive activations in an RMSNorm upcast to
fp32 reach 426 409 in an fp16 run, and they are measured, not masked.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

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


#: A run's sentinel received by a wider tensor stays within this many times the run dtype's largest
#: magnitude: ``finfo.min`` itself, a score added to it, or a causal and a padding mask added
#: in the wider dtype (twice it). Past it, the wider tensor's values are ordinary numbers.
RUN_CEILING_FACTOR = 2.0


class SentinelRange(NamedTuple):
    """The magnitudes at which a value of one tensor, in its run, stands for infinity.

    A value is a sentinel from ``own`` (its own dtype's limit), or between ``low`` and
    ``run_ceiling`` (its run's sentinel, received from a narrower dtype). ``low`` is the
    smallest magnitude that may be one: the necessary condition fast paths test. Where the
    tensor is no wider than its run's dtype, ``low == own`` and ``run_ceiling`` is infinite.
    """

    low: float
    run_ceiling: float
    own: float

    def holds(self, magnitude: float) -> bool:
        """Return whether a value of this ``magnitude`` (``abs``; infinity included) is a sentinel."""
        return magnitude >= self.own or self.low <= magnitude <= self.run_ceiling


@functools.cache
def sentinel_range_in_run(dtype: str, run_dtype: str | None) -> SentinelRange:
    """Return the magnitudes at which a ``dtype`` tensor of a run whose tensors are mostly ``run_dtype`` holds sentinels.

    Found once per pair of dtypes: asked twice per pair measured or judged on its statistics.
    """
    own = sentinel_limit(dtype)
    run = sentinel_limit(run_dtype) if run_dtype else math.inf
    if run >= own:
        return SentinelRange(own, math.inf, own)
    return SentinelRange(run, RUN_CEILING_FACTOR * _LARGEST[run_dtype], own)  # type: ignore[index]  # finite: known


def may_hold_sentinels(sum_of_squares: float, limit: float) -> bool:
    """Return whether a chunk whose squares sum to ``sum_of_squares`` can hold a value at or past ``limit``.

    A necessary condition that costs nothing (the sum is computed for the metrics anyway):
    only chunks that pass it are searched position by position.
    """
    return not math.isfinite(sum_of_squares) or sum_of_squares >= limit * limit


def classify(values: np.ndarray, sentinels: SentinelRange) -> np.ndarray:
    """Return per position: 0 an ordinary finite value, 1 NaN, 2 plus sentinel (+Inf too), 3 minus sentinel."""
    kinds = np.zeros(values.shape, dtype=np.int8)
    if sentinels.run_ceiling >= sentinels.own:
        kinds[values >= sentinels.low] = 2
        kinds[values <= -sentinels.low] = 3
    else:
        magnitude = np.abs(values)
        sentinel = (magnitude >= sentinels.own) | ((magnitude >= sentinels.low) & (magnitude <= sentinels.run_ceiling))
        kinds[sentinel & (values > 0)] = 2
        kinds[sentinel & (values < 0)] = 3
    kinds[np.isnan(values)] = 1
    return kinds


def is_sentinel(value: float | None, sentinels: SentinelRange) -> bool:
    """Return whether one recorded value (a statistic such as a tensor's min) is a sentinel of its side."""
    return value is not None and sentinels.holds(abs(value))


def sentinel_limit_in_run(dtype: str, run_dtype: str | None) -> float:
    """Return the smallest magnitude a ``dtype`` tensor's sentinel may have in a run whose tensors are mostly ``run_dtype``.

    The tighter of the two: an fp32 tensor of an fp16 run (a softmax input upcast from fp16)
    holds the fp16 mask value -65504, which is that run's minus infinity. Below it no value is
    a sentinel; at and past it :func:`sentinel_range_in_run` says which are.
    """
    return sentinel_range_in_run(dtype, run_dtype).low
