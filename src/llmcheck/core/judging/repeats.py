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
from collections import defaultdict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from llmcheck.core.judging.sibling_lines import Line, groups_per_pass, leave_one_out_lines

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


def structure_keys(
    names_and_kinds: Sequence[tuple[str, Hashable]], known: dict[str, list[tuple[str, int]]] | None = None
) -> list[Place | None]:
    """Return the repeated place of each (record name, kind) -- ``None`` where the name repeats nowhere.

    ``kind`` is what siblings must share besides the template (the op type, shape and slot):
    ``model.layers.{i}`` output and input are different places. ``known`` holds each name's
    candidate templates, found once: a decode dump repeats each name once per step, and the
    steps, judged one at a time, share it.
    """
    counts: dict[tuple[str, int], int] = {}
    seen: set[tuple[str, int]] = set()
    per_row = []
    known = {} if known is None else known
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


def _theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Return (slope >= 0, intercept >= 0) of a robust line through (x, y): the median of pairwise slopes."""
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 != x1]
    if not slopes:  # every sibling received the same error: the growth is their ratio
        ratios = [y / x for x, y in points if x > 0]
        slope = _median(ratios) if ratios else 0.0
    else:
        slope = max(_median(slopes), 0.0)
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


def sibling_baseline(siblings: Sequence[tuple[float, float]], floor: float = 0.0) -> Baseline | None:
    """Return the baseline of a place from its siblings' (feeder error, error) pairs, or None without siblings.

    ``floor`` (the rounding floor of the judged dtype) regularises the siblings' scatter
    (:attr:`Baseline.log_spread`).

    One sibling cannot separate growth from added error: its own error, or its growth applied
    to this row's input, whichever is larger, is the expectation (``slope`` from its growth,
    ``added`` its error). This is the definition :class:`SiblingGroup` gives each member, by
    another way where it can (:mod:`llmcheck.core.judging.sibling_lines`).
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
    slope, added_squared = _theil_sen([(feeder * feeder, error * error) for feeder, error in siblings])
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
    """One group of siblings, giving each member the baseline of the others (leave one out).

    Each member's baseline is :func:`sibling_baseline` of the other members' (feeder error,
    error) points. Its Theil-Sen slope is the median of the pairwise slopes of the others:
    ``n**2 / 2`` slopes per member, ``n**3 / 2`` per group -- 15 000 per row of a 32-layer
    model, the larger part of judging a decode dump. The members' lines are computed for the
    whole group at once, and for the next groups of its size with it
    (:class:`SiblingLines`, :func:`~llmcheck.core.judging.sibling_lines.leave_one_out_lines`):
    the same values, bit for bit. A group of fewer than three points, one holding a
    non-finite point (where sorting is not a total order) or a member sharing its repeat
    index with another (a duplicated record), a member without a point of its own and a
    line that numpy pass leaves open are computed directly (:func:`sibling_baseline`).

    The lines are made when the first member asks for its baseline and let go once every
    member has asked (a judge asks once per member, in one step): held for every group of a
    compare at once, they would cost memory for every row. A member asking again has them
    made again, to the same values.
    """

    def __init__(
        self,
        indexes: Sequence[int],
        points: Sequence[tuple[float, float] | None],
        lines: SiblingLines | None = None,
    ) -> None:
        self.indexes = list(indexes)
        self.points = list(points)
        valid = [member for member, point in enumerate(points) if point is not None]
        # each valid member's number among the valid points: the other members' are a slice either side of it
        self._number = {member: number for number, member in enumerate(valid)}
        self.valid_points = [point for point in self.points if point is not None]
        fast = (
            len(self.valid_points) >= MIN_LINE_POINTS
            and len(set(self.indexes)) == len(self.indexes)
            and all(math.isfinite(feeder) and math.isfinite(error) for feeder, error in self.valid_points)
        )
        self._unasked = set(range(len(self.indexes)))  # the members yet to ask for their baseline
        #: each valid member's line, while made (None: not made, or let go)
        self.lines: list[Line | None] | None = None
        self._source = (lines or SiblingLines()) if fast else None
        if self._source is not None:
            self._source.register(self)

    @property
    def waiting(self) -> bool:
        """Return whether a member has yet to ask and the lines are not made: a group worth making them for."""
        return self.lines is None and bool(self._unasked)

    def siblings_of(self, member: int) -> list[tuple[float, float]]:
        """Return the (feeder error, error) points of the other members (other repeat index), in group order."""
        own = self.indexes[member]
        return [point for other, point in enumerate(self.points) if point is not None and self.indexes[other] != own]

    def baseline(self, member: int, floor: float = 0.0) -> Baseline | None:
        """Return :func:`sibling_baseline` of the other members' points, with ``floor`` as there."""
        number = self._number.get(member)
        line: Line | None = None
        if number is not None and self._source is not None:
            lines = self.lines if self.lines is not None else self._source.make(self)
            line = lines[number]
        self._unasked.discard(member)
        if not self._unasked:
            self.lines = None
        if line is None or number is None:
            return sibling_baseline(self.siblings_of(member), floor)
        siblings = self.valid_points[:number] + self.valid_points[number + 1 :]
        return Baseline(len(siblings), *line, siblings, floor)


#: A group needs this many points for its lines to be made together: fewer leave each member one sibling or none.
MIN_LINE_POINTS = 3


class SiblingLines:
    """Makes the lines of the sibling groups of one judging pass, a group that asks first together with the next ones of its size.

    Why: one numpy pass costs tens of microseconds whatever it holds; a pass per group of
    ten costs more than the Python it replaces. The groups register in the order they are
    made (their first member's, the order judging asks in); a group that asks has the
    groups of its size that registered earliest and are still waiting made with it, up to
    :func:`~llmcheck.core.judging.sibling_lines.groups_per_pass` of them: what one pass holds
    stays a few MB, and the lines made ahead are asked for soon after.
    """

    def __init__(self) -> None:
        self._waiting: dict[int, deque[SiblingGroup]] = defaultdict(deque)

    def register(self, group: SiblingGroup) -> None:
        """Queue a group whose lines are made in a pass (finite points, three or more, distinct repeat indexes)."""
        self._waiting[len(group.valid_points)].append(group)

    def make(self, group: SiblingGroup) -> list[Line | None]:
        """Make the lines of ``group`` and of the earliest waiting groups of its size; return those of ``group``."""
        size = len(group.valid_points)
        waiting, limit = self._waiting[size], groups_per_pass(size)
        batch = [group]
        while waiting and len(batch) < limit:
            other = waiting.popleft()
            if other is not group and other.waiting:
                batch.append(other)
        made = leave_one_out_lines([other.valid_points for other in batch])
        for member_group, lines in zip(batch, made):
            member_group.lines = lines
        return made[0]
