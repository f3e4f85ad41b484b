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
    for name, kind in names_and_kinds:
        candidates = _candidates(name)
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


def _theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Return (slope >= 0, intercept >= 0) of a robust line through (x, y): the median of pairwise slopes."""
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 != x1]
    slope = max(median(slopes), 0.0) if slopes else 0.0
    if not slopes:  # every sibling received the same error: the growth is their ratio
        ratios = [y / x for x, y in points if x > 0]
        slope = median(ratios) if ratios else 0.0
    intercept = median([y - slope * x for x, y in points])
    if intercept < 0:  # the line says this place adds nothing: keep the growth, through the origin
        intercept = 0.0
        ratios = [y / x for x, y in points if x > 0]
        slope = median(ratios) if ratios else slope
    return slope, intercept


def sibling_baseline(siblings: Sequence[tuple[float, float]], floor: float = 0.0) -> Baseline | None:
    """Return the baseline of a place from its siblings' (feeder error, error) pairs, or None without siblings.

    ``floor`` (the rounding floor of the judged dtype) regularises the siblings' scatter:
    ``log((y + floor) / (expected + floor))``.

    One sibling cannot separate growth from added error: its own error, or its growth applied
    to this row's input, whichever is larger, is the expectation (``slope`` from its growth,
    ``added`` its error).
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
        slope = (error / feeder) ** 2 if feeder > 0 else 0.0
        return Baseline(1, low, high, slope, error * error, saw_received_error=saw)
    slope, added_squared = _theil_sen([(feeder * feeder, error * error) for feeder, error in siblings])
    # Scatter far below the rounding floor is noise on noise: the floor keeps it from widening the bar.
    residuals = []
    for feeder, error in siblings:
        if error + floor > 0:
            expected = math.sqrt(slope * feeder * feeder + added_squared)  # Baseline.expected, inlined
            if expected + floor > 0:
                residuals.append(math.log((error + floor) / (expected + floor)))
    if len(residuals) < 3:
        return Baseline(len(siblings), low, high, slope, added_squared, saw_received_error=saw)
    centre = median(residuals)
    spread = 1.4826 * median(abs(residual - centre) for residual in residuals)
    return Baseline(len(siblings), low, high, slope, added_squared, log_spread=spread, saw_received_error=saw)


def sibling_groups(places: Sequence[Place | None], slots: Sequence[Hashable]) -> dict[int, list[int]]:
    """Return, for each row index with a place, the indexes of its siblings (same place and slot, other index)."""
    members: dict[tuple[str, Hashable], list[int]] = defaultdict(list)
    for row_index, (place, slot) in enumerate(zip(places, slots)):
        if place is not None:
            members[(place.structure, slot)].append(row_index)
    siblings: dict[int, list[int]] = {}
    for group in members.values():
        if len(group) < 2:
            continue
        for row_index in group:
            own = places[row_index].index  # type: ignore[union-attr]
            siblings[row_index] = [other for other in group if places[other].index != own]  # type: ignore[union-attr]
    return siblings
