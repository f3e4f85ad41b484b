"""Which failing row's error each carrying row fails with: one defect, one failure to read.

A defect makes one row *introduced* and every row after it that carries its error fail too
(``inherited``; a module around it, ``encloses``) -- 72 failing rows for one wrong RMSNorm
epsilon in SmolLM2. A reader wants the one defect with the rows it drags along listed under
it. :func:`carried_origins` follows each carrying row's feeders (``fed_by``) back to a row
that fails for a reason of its own -- an introduced or amplified row, a row without feeders --
and falls back on what the verdict itself says where the feeders do not lead there: an
enclosing module carries the introduced row inside it, and an inherited row whose feeders
pass (it fails the dtype table alone) carries the first introduced row of its step before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmcheck.core.judging.divergence import ENCLOSES, INHERITED, INTRODUCED
from llmcheck.core.records import ROOT_MODULE, VERDICT_FAIL, ComparisonRow, lies_inside

#: Attributions of a failing row that fails with another row's error rather than for a reason of its own.
CARRYING = frozenset({INHERITED, ENCLOSES})


def carried_origins(rows: Sequence[ComparisonRow]) -> dict[int, ComparisonRow]:
    """Return, by row index, the row whose failure each carrying failing row carries on (rows carrying none are left out).

    The origin is itself a failing row that carries nothing: introduced, amplified, or
    failing with no feeder to blame.
    """
    ordered = sorted(rows, key=lambda row: row.golden.order)
    by_label = {row.golden.key.label(): row for row in ordered}
    introduced_by_step: dict[int, list[ComparisonRow]] = {}
    for row in ordered:
        if row.verdict == VERDICT_FAIL and row.attribution == INTRODUCED:
            introduced_by_step.setdefault(row.golden.key.step, []).append(row)
    origins: dict[int, ComparisonRow | None] = {}

    def origin(row: ComparisonRow, seen: frozenset[int]) -> ComparisonRow | None:
        if row.index in origins:
            return origins[row.index]
        found = None
        for label in row.fed_by:
            feeder = by_label.get(label)
            if feeder is None or feeder.verdict != VERDICT_FAIL or feeder.index in seen:
                continue
            candidate = origin(feeder, seen | {feeder.index}) if feeder.attribution in CARRYING else feeder
            if candidate is None:
                continue
            if found is None or (candidate.attribution == INTRODUCED and found.attribution != INTRODUCED):
                found = candidate  # of several failing feeders, an introduced origin names the defect
        if found is None:
            found = _named_by_the_verdict(row, introduced_by_step.get(row.golden.key.step, []))
        origins[row.index] = found
        return found

    carried = {}
    for row in ordered:
        if row.verdict == VERDICT_FAIL and row.attribution in CARRYING:
            found = origin(row, frozenset({row.index}))
            if found is not None:
                carried[row.index] = found
    return carried


def _named_by_the_verdict(row: ComparisonRow, introduced: Sequence[ComparisonRow]) -> ComparisonRow | None:
    """Return the introduced row the verdict blames when the feeders name none: the one inside, else the first before."""
    name = row.golden.key.name
    if row.attribution == ENCLOSES:
        inside = (inner for inner in introduced if name == ROOT_MODULE or lies_inside(inner.golden.key.name, name))
        return next(inside, None)
    return next((earlier for earlier in introduced if earlier.golden.order < row.golden.order), None)
