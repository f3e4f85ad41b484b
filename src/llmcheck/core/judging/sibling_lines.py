"""Leave-one-out sibling lines of many groups in one numpy pass: each member's line through the other members' points.

Why: judging asks every row of a compare for the baseline its repeats in the other layers
give (:func:`llmcheck.core.judging.repeats.sibling_baseline` of the other members' points).
Computed member by member in Python that was a quarter of judging a decode dump: a Theil-Sen
slope (the median of pairwise slopes), an intercept (a median of residuals) and the growth
range, for 10**5 members of groups of ten or thirty. Here the groups of one size are stacked
and every member of every group gets its line from a few array operations.

Each value is the one the direct computation gives, bit for bit: numpy's ``*``, ``-`` and
``/`` on float64 round as Python's floats do; a stable sort orders equal values (``0.0``
and ``-0.0``) as ``list.sort`` does, so a median picks the very same float; the smallest
(largest) growth is the first such value in group order, as ``min`` (``max``) takes it. A
member whose line this cannot settle that way -- a group with a point whose square is not
finite, others' slopes or residuals that are not all finite (where sorting is no longer a
total order), others that all received the same error (no slope) -- is left to the direct
computation (``None``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: A member's line, as :func:`llmcheck.core.judging.repeats.sibling_baseline` gives it from the others:
#: lowest and highest growth, slope, added squared error, whether any of them received error.
Line = tuple[float, float, float, float, bool]

#: Array elements (groups x members x members) one pass holds at most: a few MB while it runs, whatever
#: the group size -- judging's peak memory is a few hundred bytes a row, and a pass must not add to it -- and
#: hundreds of groups of ten, so numpy's cost per call is spread over thousands of members.
PASS_ELEMENTS = 1 << 18
#: Members one pass gives lines to at most: their lines, made ahead of being asked for, are held until then.
PASS_MEMBERS = 4096


def groups_per_pass(size: int) -> int:
    """Return how many groups of ``size`` members one pass of :func:`leave_one_out_lines` takes (at least one)."""
    return max(1, min(PASS_ELEMENTS // (size * size or 1), PASS_MEMBERS // max(size, 1)))


def leave_one_out_lines(groups: Sequence[Sequence[tuple[float, float]]]) -> list[list[Line | None]]:
    """Return, for each group of (feeder error, error) points, each member's line through the others' points.

    Every group holds the same number of points, three or more, all finite (two or fewer
    points make no line of the others; a non-finite one no total order). ``None`` marks a
    member left to the direct computation.
    """
    values = np.array(groups, dtype=np.float64)
    count, size = values.shape[0], values.shape[1]
    feeders, errors = values[:, :, 0], values[:, :, 1]
    members = np.arange(size)
    with np.errstate(all="ignore"):  # overflows and 0/0 are found below, and left to the direct computation
        x, y = feeders * feeders, errors * errors
        slope, intercept, settled = _theil_sen_lines(x, y)
        finite_squares = np.logical_and(np.isfinite(x), np.isfinite(y)).all(axis=1, keepdims=True)
        settled &= finite_squares
        growing = feeders > 0
        growths = np.where(growing, errors / np.where(growing, feeders, 1.0), 1.0)
    known = growing | (errors == 0)  # exact in, exact out: a growth of 1
    low_at = _first_other(growths, ~known, members)
    high_at = _first_other(-growths, ~known, members)
    others_known = (known.sum(axis=1)[:, None] - known) > 0
    rows = np.arange(count)[:, None]
    nan = np.full((count, size), math.nan)
    low = np.where(others_known, growths[rows, low_at], nan)
    high = np.where(others_known, growths[rows, high_at], nan)
    saw = (growing.sum(axis=1)[:, None] - growing) > 0
    return [
        [
            (line_low, line_high, line_slope, added, line_saw) if line_settled else None
            for line_settled, line_low, line_high, line_slope, added, line_saw in zip(*columns)
        ]
        for columns in zip(
            settled.tolist(), low.tolist(), high.tolist(), slope.tolist(), intercept.tolist(), saw.tolist()
        )
    ]


def _theil_sen_lines(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return each member's (slope, intercept) through the others' squared points, and where that is settled.

    As :func:`llmcheck.core.judging.repeats._theil_sen`: the median of the others' pairwise
    slopes (pairs of equal ``x`` left out), kept at 0 or above; the median of their residuals
    ``y - slope * x`` as the intercept; a negative intercept makes the line go through the
    origin with the median of the others' ratios ``y / x`` (``x > 0``) as its slope.
    """
    count, size = x.shape
    first, second = np.triu_indices(size, 1)  # the pairs, in the order itertools.combinations makes them
    distinct = x[:, first] != x[:, second]
    slopes = (y[:, second] - y[:, first]) / (x[:, second] - x[:, first])
    upper, lower, remaining = _leave_one_out_order_statistics(slopes, distinct, size)
    median_slope = np.where(remaining % 2 == 1, upper, (lower + upper) / 2)
    slope = np.where(median_slope < 0.0, 0.0, median_slope)  # max(median, 0.0): -0.0 kept, as max keeps it
    others = ~np.eye(size, dtype=bool)
    residuals = (y[:, None, :] - slope[:, :, None] * x[:, None, :])[:, others].reshape(count, size, size - 1)
    settled = (remaining > 0) & np.isfinite(residuals).all(axis=2)
    intercept = _sorted_median(residuals, size - 1)
    through_origin = intercept < 0  # the line says the place adds nothing: keep the growth, through the origin
    if through_origin.any():
        positive = x > 0
        ratios = np.where(positive, y / np.where(positive, x, 1.0), math.nan)  # never NaN where x > 0
        others_ratios = np.broadcast_to(ratios[:, None, :], (count, size, size))[:, others].reshape(count, size, -1)
        with_ratio = np.count_nonzero(~np.isnan(others_ratios), axis=2)
        others_ratios.sort(axis=2, kind="stable")  # the NaN of a point without a ratio sort last
        ratio_median = _median_of_first(others_ratios, with_ratio)
        slope = np.where(through_origin & (with_ratio > 0), ratio_median, slope)
        intercept = np.where(through_origin, 0.0, intercept)
    return slope, intercept, settled


def _leave_one_out_order_statistics(
    slopes: np.ndarray, distinct: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return, per member, the middle two of the others' pairwise slopes (upper, lower) and how many there are.

    The others' slopes are the pairs with an unequal ``x`` (``distinct``) that do not hold the
    member, in the order a stable sort of them gives. Why not mask each member's pairs out of
    every pair and count along (``n**3 / 2`` elements a group): all distinct slopes are sorted
    once, and the ``r``-th of a member's others is the ``r + j``-th of them all, ``j`` being how
    many of the member's own pairs lie so early that fewer than ``r + 1`` others precede them
    (``n**2`` elements a group). The same element, so the very same float, as counting gives.
    """
    count, pairs = slopes.shape
    by_slope = np.argsort(slopes, axis=1, kind="stable")
    # the distinct pairs first, in slope order (a stable sort keeps them in the order sorting all of them gives)
    order = np.take_along_axis(
        by_slope, np.argsort(~np.take_along_axis(distinct, by_slope, axis=1), axis=1, kind="stable"), axis=1
    )
    ordered_slopes = np.take_along_axis(slopes, order, axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(pairs), (count, pairs)), axis=1)
    first, second = np.triu_indices(size, 1)
    own_pairs = np.array([np.flatnonzero((first == member) | (second == member)) for member in range(size)])
    own_distinct = distinct[:, own_pairs]  # (groups, members, size - 1)
    beyond = pairs + size  # past every rank: an own pair with an equal x is no slope, among the others or not
    own_ranks = np.where(own_distinct, rank[:, own_pairs], beyond)
    own_ranks.sort(axis=2)
    # how many others precede the member's j-th own slope: its rank less the j own ones before it
    others_before = own_ranks - np.arange(size - 1)
    remaining = distinct.sum(axis=1)[:, None] - own_distinct.sum(axis=2)
    middle = remaining // 2

    def others_at(position: np.ndarray) -> np.ndarray:
        skipped = (others_before <= position[:, :, None]).sum(axis=2)
        at = np.clip(position + skipped, 0, pairs - 1)  # a member with no others reads any slope: left unsettled
        values: np.ndarray = np.take_along_axis(ordered_slopes, at, axis=1)
        return values

    return others_at(middle), others_at(middle - 1), remaining


def _sorted_median(values: np.ndarray, length: int) -> np.ndarray:
    """Return the median along the last axis of ``length`` values, sorting them in place as ``list.sort`` would."""
    values.sort(axis=2, kind="stable")
    half = length // 2
    upper: np.ndarray = values[:, :, half]
    return upper if length % 2 else (values[:, :, half - 1] + upper) / 2


def _median_of_first(ordered: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Return the median of the first ``lengths`` values along the last axis (sorted); any value where a length is 0."""
    half = lengths // 2
    upper = np.take_along_axis(ordered, np.minimum(half, ordered.shape[2] - 1)[:, :, None], axis=2)[:, :, 0]
    lower = np.take_along_axis(ordered, np.maximum(half - 1, 0)[:, :, None], axis=2)[:, :, 0]
    return np.where(lengths % 2 == 1, upper, (lower + upper) / 2)


def _first_other(keys: np.ndarray, unknown: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Return, per member, the position of the smallest known key among the other members: the first in group order of equal ones.

    Sorted stably by key, then stably by whether the key is unknown, the known keys come
    first, ascending, equal ones in group order: the first is what ``min`` takes; the
    member's own, if first, gives way to the second.
    """
    by_key = np.argsort(keys, axis=1, kind="stable")
    order = np.take_along_axis(
        by_key, np.argsort(np.take_along_axis(unknown, by_key, axis=1), axis=1, kind="stable"), 1
    )
    first, second = order[:, :1], order[:, 1:2]
    return np.where(first != members[None, :], first, second)
