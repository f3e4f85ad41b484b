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
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import combinations
from operator import itemgetter
from typing import NamedTuple

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
    counts: dict[tuple[str, int], int] = {}
    seen: set[tuple[str, int]] = set()
    per_row = []
    known: dict[str, list[tuple[str, int]]] = {}  # a decode dump repeats each name once per step
    kind_numbers: dict[Hashable, int] = {}  # each kind hashed once per row, then known by its number
    for name, kind in names_and_kinds:
        candidates = known.get(name)
        if candidates is None:
            candidates = known[name] = _candidates(name)
        number = kind_numbers.setdefault(kind, len(kind_numbers))
        per_row.append((candidates, number))
        if (name, number) in seen:
            continue
        seen.add((name, number))
        for template, _ in candidates:
            counts[(template, number)] = counts.get((template, number), 0) + 1
    places: list[Place | None] = []
    made: dict[tuple[str, int], Place] = {}  # one Place per (template, index), shared by the rows there
    for candidates, number in per_row:
        best: tuple[str, int] | None = None
        best_count = 1
        for candidate in candidates:
            count = counts[(candidate[0], number)]
            if count > best_count:
                best, best_count = candidate, count
        if best is None:
            places.append(None)
        else:
            place = made.get(best)
            if place is None:
                place = made[best] = Place(*best)
            places.append(place)
    return places


def _median(values: list[float]) -> float:
    """Return :func:`statistics.median` of some values (the same float), without its generality.

    Asked a few times per row of a compare on lists of a few dozen floats: the middle value,
    or the mean ``(a + b) / 2`` of the two middle ones, exactly as ``statistics.median`` computes it.
    """
    values.sort()
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


class Baseline(NamedTuple):
    """What the siblings of a row say: the growth they show, and the line their squared errors follow.

    ``slope`` and ``added_squared`` fit ``y**2 = slope * x**2 + added_squared`` over the
    siblings' (feeder error ``x``, error ``y``): ``sqrt(slope)`` is how much this place grows
    the error it receives, ``sqrt(added_squared)`` what it adds by itself at this precision.
    :attr:`log_spread` is how far the siblings themselves scatter around that line.
    ``saw_received_error`` is False when no sibling received any error: they say what the
    place adds to exact inputs, nothing about how it grows an error it receives.
    ``siblings`` are the siblings' points and ``floor`` the rounding floor that regularises
    their scatter: :attr:`log_spread` is computed from them when asked. A named tuple, not a
    dataclass: one is made per row of a compare (10**5 in a decode dump).
    """

    sibling_count: int
    growth_low: float
    growth_high: float
    slope: float
    added_squared: float
    saw_received_error: bool = True
    siblings: Sequence[tuple[float, float]] = ()
    floor: float = 0.0

    def expected(self, feeder_error: float) -> float:
        """Return the error this place should show when it receives ``feeder_error``."""
        return math.sqrt(self.slope * feeder_error * feeder_error + self.added_squared)

    @property
    def log_spread(self) -> float:
        """Return how far the siblings scatter around their line: a robust standard deviation of ``log(y / expected)``.

        Trained models have layers that differ, and a place whose repeats scatter widely needs
        a larger excess before one of them stands out. The scatter is
        ``log((y + floor) / (expected + floor))``: scatter far below the rounding floor is
        noise on noise, and the floor keeps it from widening the bar. Fewer than three
        siblings give no scatter (0). Computed when asked: judging asks for it only for a row
        far above its expected error, a few in a compare of 10**5.
        """
        residuals = []
        floor = self.floor
        for feeder, error in self.siblings:
            if error + floor > 0:
                expected = self.expected(feeder)
                if expected + floor > 0:
                    ratio = (error + floor) / (expected + floor)
                    # a ratio past the float range (a sibling 1e-300 times another) is the difference of logs
                    fits = 0 < ratio < math.inf
                    residuals.append(math.log(ratio) if fits else math.log(error + floor) - math.log(expected + floor))
        if len(residuals) < 3:
            return 0.0
        centre = _median(list(residuals))
        return 1.4826 * _median([abs(residual - centre) for residual in residuals])

    @property
    def widest_sibling_excess(self) -> float:
        """Return how far above the line the farthest sibling lies: the largest ``(y + floor) / (expected + floor)``.

        The most a repeat of this place exceeds its prediction with nothing wrong in it (or
        1 where none exceeds it): a row beyond that by a clear margin stands out from honest
        variation, one within it does not.
        """
        widest = 1.0
        floor = self.floor
        for feeder, error in self.siblings:
            expected = self.expected(feeder) + floor
            if expected > 0 and math.isfinite(error):
                widest = max(widest, (error + floor) / expected)
        return widest


def _theil_sen(points: Sequence[tuple[float, float]], median_slope: float | None = None) -> tuple[float, float]:
    """Return (slope >= 0, intercept >= 0) of a robust line through (x, y): the median of pairwise slopes.

    ``median_slope``, when the caller knows it (:class:`SiblingGroup`), is that median: the
    points then hold at least one pair with distinct ``x``.
    """
    if median_slope is None:
        slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 != x1]
        median_slope = _median(slopes) if slopes else None
    if median_slope is None:  # every sibling received the same error: the growth is their ratio
        ratios = [y / x for x, y in points if x > 0]
        slope = _median(ratios) if ratios else 0.0
    else:
        slope = max(median_slope, 0.0)
    intercept = _median([y - slope * x for x, y in points])
    if intercept < 0:  # the line says this place adds nothing: keep the growth, through the origin
        intercept = 0.0
        ratios = [y / x for x, y in points if x > 0]
        slope = _median(ratios) if ratios else slope
    return slope, intercept


def _growth(feeder: float, error: float) -> float | None:
    """Return how much a sibling grew the error it received (1 for exact in, exact out), None where unknown."""
    if feeder > 0:
        return error / feeder
    return 1.0 if error == 0 else None


def sibling_baseline(
    siblings: Sequence[tuple[float, float]], floor: float = 0.0, median_slope: float | None = None
) -> Baseline | None:
    """Return the baseline of a place from its siblings' (feeder error, error) pairs, or None without siblings.

    ``floor`` (the rounding floor of the judged dtype) regularises the siblings' scatter
    (:attr:`Baseline.log_spread`).

    One sibling cannot separate growth from added error: its own error, or its growth applied
    to this row's input, whichever is larger, is the expectation (``slope`` from its growth,
    ``added`` its error). ``median_slope`` is the median of the siblings' pairwise slopes of
    squared errors where the caller has it already (:class:`SiblingGroup`).
    """
    if not siblings:
        return None
    growths = [growth for feeder, error in siblings if (growth := _growth(feeder, error)) is not None]
    saw = any(feeder > 0 for feeder, _ in siblings)
    if len(siblings) == 1:
        feeder, error = siblings[0]
        growth = error / feeder if feeder > 0 else 0.0
        slope = growth * growth  # not ** 2: a growth past 1e154 is an infinite slope, not an OverflowError
        low, high = min(growths, default=math.nan), max(growths, default=math.nan)
        return Baseline(1, low, high, slope, error * error, saw_received_error=saw)
    squared = [(feeder * feeder, error * error) for feeder, error in siblings]
    return _line_baseline(siblings, squared, growths, saw, floor, median_slope)


def _line_baseline(
    siblings: Sequence[tuple[float, float]],
    squared: Sequence[tuple[float, float]],
    growths: Sequence[float],
    saw: bool,
    floor: float,
    median_slope: float | None,
) -> Baseline:
    """Return the baseline of two or more siblings, given their squared points, growths and whether one received error."""
    slope, added_squared = _theil_sen(squared, median_slope)
    low, high = (min(growths), max(growths)) if growths else (math.nan, math.nan)
    return Baseline(len(siblings), low, high, slope, added_squared, saw, siblings, floor)


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
    slopes that involve it: the same multiset, so the very same median, bit for bit. The
    members' squared points and growths are computed once too. A group holding a non-finite
    point (where sorting is not a total order) or a member sharing its repeat index with
    another (a duplicated record) is left to the direct computation.

    The sorted slopes are made when the first member asks for its baseline and let go once
    every member has asked (a judge asks once per member, in one step): held for every group
    of a compare at once, they cost ``n`` slopes and positions per row, 2 KB a row of a
    50-layer model -- the largest part of judging's memory. A member asking again has them
    made again, to the same values.
    """

    def __init__(self, indexes: Sequence[int], points: Sequence[tuple[float, float] | None]) -> None:
        self.indexes = list(indexes)
        self.points = list(points)
        valid = [member for member, point in enumerate(points) if point is not None]
        # what each valid member holds, in group order: the other members' are a slice either side of it
        self._number = {member: number for number, member in enumerate(valid)}
        self._valid_points = [point for point in self.points if point is not None]
        self._fast = len(set(self.indexes)) == len(self.indexes) and all(
            math.isfinite(feeder) and math.isfinite(error) for feeder, error in self._valid_points
        )
        self._unasked = set(range(len(self.indexes)))  # the members yet to ask for their baseline
        self._prepared = False
        self._slopes: list[float] = []
        self._skipped: dict[int, list[int]] = {}
        self._squared: list[tuple[float, float]] = []
        self._growths: list[float | None] = []
        self._received: list[bool] = []

    def _prepare(self) -> None:
        """Make the sorted pairwise slopes, which slopes each member skips, and the squared points and growths."""
        self._prepared = True
        valid = list(self._number)
        self._skipped = {member: [] for member in valid}
        if not self._fast:
            return
        self._squared = [(feeder * feeder, error * error) for feeder, error in self._valid_points]
        self._growths = [_growth(feeder, error) for feeder, error in self._valid_points]
        self._received = [feeder > 0 for feeder, _ in self._valid_points]
        slopes = [
            ((y2 - y1) / (x2 - x1), first, second)
            for (first, (x1, y1)), (second, (x2, y2)) in combinations(zip(valid, self._squared), 2)
            if x2 != x1
        ]
        slopes.sort(key=itemgetter(0))
        self._slopes = [slope for slope, _, _ in slopes]
        for position, (_, first, second) in enumerate(slopes):
            self._skipped[first].append(position)
            self._skipped[second].append(position)

    def siblings_of(self, member: int) -> list[tuple[float, float]]:
        """Return the (feeder error, error) points of the other members (other repeat index), in group order."""
        own = self.indexes[member]
        return [point for other, point in enumerate(self.points) if point is not None and self.indexes[other] != own]

    def _release(self) -> None:
        """Let go of what :meth:`_prepare` made."""
        self._prepared = False
        self._slopes, self._skipped, self._squared, self._growths, self._received = [], {}, [], [], []

    def baseline(self, member: int, floor: float = 0.0) -> Baseline | None:
        """Return :func:`sibling_baseline` of the other members' points, with ``floor`` as there."""
        if not self._prepared:
            self._prepare()
        found = self._baseline(member, floor)
        self._unasked.discard(member)
        if not self._unasked:
            self._release()
        return found

    def _baseline(self, member: int, floor: float) -> Baseline | None:
        number = self._number.get(member)
        sibling_count = len(self._valid_points) - (number is not None)
        if not self._fast or sibling_count < 2:
            return sibling_baseline(self.siblings_of(member), floor)
        skipped = self._skipped.get(member, [])
        remaining = len(self._slopes) - len(skipped)
        if remaining == 0:  # every other sibling received the same error: the direct path takes the ratio
            return sibling_baseline(self.siblings_of(member), floor)
        middle = remaining // 2
        median_slope = self._remaining(middle, skipped)
        if remaining % 2 == 0:  # statistics.median: the mean of the two middle values, (a + b) / 2
            median_slope = (self._remaining(middle - 1, skipped) + median_slope) / 2
        # the other members' points, squared points and growths, in group order, as sibling_baseline builds them
        if number is None:
            siblings, squared, growths, received = self._valid_points, self._squared, self._growths, self._received
        else:
            after = number + 1
            siblings = self._valid_points[:number] + self._valid_points[after:]
            squared = self._squared[:number] + self._squared[after:]
            growths = self._growths[:number] + self._growths[after:]
            received = self._received[:number] + self._received[after:]
        known = [growth for growth in growths if growth is not None] if None in growths else growths
        return _line_baseline(siblings, squared, known, any(received), floor, median_slope)  # type: ignore[arg-type]

    def _remaining(self, rank: int, skipped: Sequence[int]) -> float:
        """Return the sorted slope of this rank once the ``skipped`` positions (ascending) are left out."""
        position = rank
        for skipped_position in skipped:
            if skipped_position > position:
                break
            position += 1
        return self._slopes[position]
