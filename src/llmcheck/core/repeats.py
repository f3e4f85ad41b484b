"""Repeated structure: an LLM repeats one block N times, so the other repeats say what error a place should add.

:func:`structure_keys` abstracts the repeat index out of record names. It needs no knowledge
of a naming scheme: a name's digit runs (``model.layers.3.mlp``, ATB's ``0_3_5``, GE's
``layer_3/MatMul``) are each tried as the index, and the one that groups the most records
of the same type, shape and slot wins (ties: the leftmost run, the outer loop). A group of
two or more records is a repeated place; ``model.layers.{i}.mlp.down_proj`` output 0 is one.

:func:`sibling_baseline` then gives a row's *expected* error from its siblings. A place turns
the error it receives (its feeders' relative error ``x``) into the error it shows (``y``):
``y**2 = growth**2 * x**2 + added**2`` -- the received error grown (most maps keep a
relative error near 1x) plus the rounding this place adds at this precision. The siblings
give both by a robust line (Theil-Sen: the median of pairwise slopes) through their squared
errors; robust, because a defect upstream moves siblings along the line (it changes ``x``),
not off it, and a single defective sibling is outvoted. A row far above
``sqrt(growth**2 * x**2 + added**2)`` adds error no repeat of it adds.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from statistics import median

#: A digit run standing alone between separators (``.3.``, ``_12``, ``/0/``): a candidate repeat index.
_INDEX_RUN = re.compile(r"(?:(?<=^)|(?<=[._/:\-]))(\d+)(?=$|[._/:\-])")


@dataclass(frozen=True)
class Place:
    """Where a record sits in the repeated structure: the abstracted name and the repeat index."""

    structure: str
    index: int


def _candidates(name: str) -> list[tuple[str, int]]:
    """Return each (template, index) obtained by taking one digit run of ``name`` as the repeat index."""
    return [
        (name[: match.start()] + "{i}" + name[match.end() :], int(match.group(1)))
        for match in _INDEX_RUN.finditer(name)
    ]


def structure_keys(names_and_kinds: Sequence[tuple[str, Hashable]]) -> list[Place | None]:
    """Return the repeated place of each (record name, kind) -- ``None`` where the name repeats nowhere.

    ``kind`` is what siblings must share besides the template (the op type, shape and slot):
    ``model.layers.{i}`` output and input are different places.
    """
    counts: Counter[tuple[str, Hashable]] = Counter()
    seen: set[tuple[str, Hashable]] = set()
    per_name = []
    known: dict[str, list[tuple[str, int]]] = {}  # a decode dump repeats each name once per step
    for name, kind in names_and_kinds:
        candidates = known.get(name)
        if candidates is None:
            candidates = known[name] = _candidates(name)
        per_name.append(candidates)
        if (name, kind) in seen:
            continue
        seen.add((name, kind))
        for template, _ in candidates:
            counts[(template, kind)] += 1
    places: list[Place | None] = []
    for (_name, kind), candidates in zip(names_and_kinds, per_name):
        best: Place | None = None
        best_count = 1
        for template, index in candidates:
            count = counts[(template, kind)]
            if count > best_count:
                best, best_count = Place(template, index), count
        places.append(best)
    return places


@dataclass(frozen=True)
class Baseline:
    """What the siblings of a row say: the growth they show, and the line their squared errors follow.

    ``slope`` and ``added_squared`` fit ``y**2 = slope * x**2 + added_squared`` over the
    siblings' (feeder error ``x``, error ``y``): ``sqrt(slope)`` is how much this place grows
    the error it receives, ``sqrt(added_squared)`` what it adds by itself at this precision.
    ``log_spread`` is how far the siblings themselves scatter around that line (a robust
    standard deviation of ``log(y / expected)``): trained models have layers that differ, and
    a place whose repeats scatter widely needs a larger excess before one of them stands out.
    ``saw_received_error`` is False when no sibling received any error: they say what the
    place adds to exact inputs, nothing about how it grows an error it receives.
    """

    sibling_count: int
    growth_low: float
    growth_high: float
    slope: float
    added_squared: float
    log_spread: float = 0.0
    saw_received_error: bool = True

    def expected(self, feeder_error: float) -> float:
        """Return the error this place should show when it receives ``feeder_error``."""
        return math.sqrt(self.slope * feeder_error * feeder_error + self.added_squared)


def _theil_sen(points: Sequence[tuple[float, float]], median_slope: float | None = None) -> tuple[float, float]:
    """Return (slope >= 0, intercept >= 0) of a robust line through (x, y): the median of pairwise slopes.

    ``median_slope``, when the caller knows it (:class:`SiblingGroup`), is that median: the
    points then hold at least one pair with distinct ``x``.
    """
    if median_slope is None:
        slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 != x1]
        median_slope = median(slopes) if slopes else None
    if median_slope is None:  # every sibling received the same error: the growth is their ratio
        ratios = [y / x for x, y in points if x > 0]
        slope = median(ratios) if ratios else 0.0
    else:
        slope = max(median_slope, 0.0)
    intercept = median([y - slope * x for x, y in points])
    if intercept < 0:  # the line says this place adds nothing: keep the growth, through the origin
        intercept = 0.0
        ratios = [y / x for x, y in points if x > 0]
        slope = median(ratios) if ratios else slope
    return slope, intercept


def sibling_baseline(
    siblings: Sequence[tuple[float, float]], floor: float = 0.0, median_slope: float | None = None
) -> Baseline | None:
    """Return the baseline of a place from its siblings' (feeder error, error) pairs, or None without siblings.

    ``floor`` (the rounding floor of the judged dtype) regularises the siblings' scatter:
    ``log((y + floor) / (expected + floor))``.

    One sibling cannot separate growth from added error: its own error, or its growth applied
    to this row's input, whichever is larger, is the expectation (``slope`` from its growth,
    ``added`` its error). ``median_slope`` is the median of the siblings' pairwise slopes of
    squared errors where the caller has it already (:class:`SiblingGroup`).
    """
    if not siblings:
        return None
    # asked once per row of a compare (10**5 in a decode dump): one loop, no call per sibling
    growths = []
    saw = False
    for feeder, error in siblings:
        if feeder > 0:
            saw = True
            growths.append(error / feeder)
        elif error == 0:
            growths.append(1.0)
    low, high = min(growths, default=math.nan), max(growths, default=math.nan)
    if len(siblings) == 1:
        feeder, error = siblings[0]
        growth = error / feeder if feeder > 0 else 0.0
        slope = growth * growth  # not ** 2: a growth past 1e154 is an infinite slope, not an OverflowError
        return Baseline(1, low, high, slope, error * error, saw_received_error=saw)
    slope, added_squared = _theil_sen([(feeder * feeder, error * error) for feeder, error in siblings], median_slope)
    # Scatter far below the rounding floor is noise on noise: the floor keeps it from widening the bar.
    residuals = []
    for feeder, error in siblings:
        if error + floor > 0:
            expected = math.sqrt(slope * feeder * feeder + added_squared)  # Baseline.expected, inlined
            if expected + floor > 0:
                ratio = (error + floor) / (expected + floor)
                # a ratio past the float range (a sibling 1e-300 times another) is the difference of logs
                fits = 0 < ratio < math.inf
                residuals.append(math.log(ratio) if fits else math.log(error + floor) - math.log(expected + floor))
    if len(residuals) < 3:
        return Baseline(len(siblings), low, high, slope, added_squared, saw_received_error=saw)
    centre = median(residuals)
    spread = 1.4826 * median(abs(residual - centre) for residual in residuals)
    return Baseline(len(siblings), low, high, slope, added_squared, log_spread=spread, saw_received_error=saw)


def sibling_groups(places: Sequence[Place | None], slots: Sequence[Hashable]) -> list[list[int]]:
    """Return the groups of row indexes that are siblings: same place and slot, two or more of them, in row order."""
    members: dict[tuple[str, Hashable], list[int]] = defaultdict(list)
    for row_index, (place, slot) in enumerate(zip(places, slots)):
        if place is not None:
            members[(place.structure, slot)].append(row_index)
    return [group for group in members.values() if len(group) >= 2]


class SiblingGroup:
    """One group of siblings, giving each member the baseline of the others (leave one out), in linear time.

    Each member's baseline is :func:`sibling_baseline` of the other members' (feeder error,
    error) points. Its Theil-Sen slope is the median of the pairwise slopes of the others:
    ``n**2 / 2`` slopes per member, ``n**3 / 2`` per group -- 15 000 per row of a 32-layer
    model, the larger part of judging a decode dump. Here the group's pairwise slopes are
    computed and sorted once, and each member's median is found by skipping the ``n - 1``
    slopes that involve it: the same multiset, so the very same median, bit for bit. A group
    holding a non-finite point (where sorting is not a total order) or a member sharing its
    repeat index with another (a duplicated record) is left to the direct computation.
    """

    def __init__(self, indexes: Sequence[int], points: Sequence[tuple[float, float] | None]) -> None:
        self.indexes = list(indexes)
        self.points = list(points)
        valid = [member for member, point in enumerate(points) if point is not None]
        self._fast = len(set(self.indexes)) == len(self.indexes) and all(
            math.isfinite(value)
            for member in valid
            for value in points[member]  # type: ignore[union-attr]
        )
        self._slopes: list[float] = []
        self._skipped: dict[int, list[int]] = {member: [] for member in valid}
        if not self._fast:
            return
        squared = {member: (point[0] * point[0], point[1] * point[1]) for member in valid if (point := points[member])}
        slopes = []
        for i, first in enumerate(valid):
            x1, y1 = squared[first]
            for second in valid[i + 1 :]:
                x2, y2 = squared[second]
                if x2 != x1:
                    slopes.append(((y2 - y1) / (x2 - x1), first, second))
        slopes.sort(key=lambda slope: slope[0])
        self._slopes = [slope for slope, _, _ in slopes]
        for position, (_, first, second) in enumerate(slopes):
            self._skipped[first].append(position)
            self._skipped[second].append(position)

    def siblings_of(self, member: int) -> list[tuple[float, float]]:
        """Return the (feeder error, error) points of the other members (other repeat index), in group order."""
        own = self.indexes[member]
        return [point for other, point in enumerate(self.points) if point is not None and self.indexes[other] != own]

    def baseline(self, member: int, floor: float = 0.0) -> Baseline | None:
        """Return :func:`sibling_baseline` of the other members' points, with ``floor`` as there."""
        siblings = self.siblings_of(member)
        if len(siblings) < 2 or not self._fast:
            return sibling_baseline(siblings, floor)
        skipped = self._skipped.get(member, [])
        remaining = len(self._slopes) - len(skipped)
        if remaining == 0:  # every other sibling received the same error: the direct path takes the ratio
            return sibling_baseline(siblings, floor)
        middle = remaining // 2
        median_slope = self._remaining(middle, skipped)
        if remaining % 2 == 0:  # statistics.median: the mean of the two middle values, (a + b) / 2
            median_slope = (self._remaining(middle - 1, skipped) + median_slope) / 2
        return sibling_baseline(siblings, floor, median_slope)

    def _remaining(self, rank: int, skipped: Sequence[int]) -> float:
        """Return the sorted slope of this rank once the ``skipped`` positions (ascending) are left out."""
        position = rank
        for skipped_position in skipped:
            if skipped_position > position:
                break
            position += 1
        return self._slopes[position]
