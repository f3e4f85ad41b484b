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
from llmcheck.core.judging.row_table import golden_order, row_field, rows_at
from llmcheck.core.records import ROOT_MODULE, VERDICT_FAIL, ComparisonRow, TensorRecord, lies_inside

#: Attributions of a failing row that fails with another row's error rather than for a reason of its own.
CARRYING = frozenset({INHERITED, ENCLOSES})


def carried_origins(rows: Sequence[ComparisonRow]) -> dict[int, ComparisonRow]:
    """Return, by row index, the row whose failure each carrying failing row carries on (rows carrying none are left out).

    The origin is itself a failing row that carries nothing: introduced, amplified, or
    failing with no feeder to blame. The rows are followed by position through the fields
    this needs, read as columns: only the origins found are made as rows.
    """
    golden, verdicts = row_field(rows, "golden"), row_field(rows, "verdict")
    attributions, fed_by, indexes = row_field(rows, "attribution"), row_field(rows, "fed_by"), row_field(rows, "index")
    ordered = golden_order(rows)
    by_label = {golden[position].key.label(): position for position in ordered}
    introduced_by_step: dict[int, list[int]] = {}
    for position in ordered:
        if verdicts[position] == VERDICT_FAIL and attributions[position] == INTRODUCED:
            introduced_by_step.setdefault(golden[position].key.step, []).append(position)
    origins: dict[int, int | None] = {}

    def origin(position: int, seen: frozenset[int]) -> int | None:
        if indexes[position] in origins:
            return origins[indexes[position]]
        found = None
        for label in fed_by[position]:
            feeder = by_label.get(label)
            if feeder is None or verdicts[feeder] != VERDICT_FAIL or indexes[feeder] in seen:
                continue
            candidate = origin(feeder, seen | {indexes[feeder]}) if attributions[feeder] in CARRYING else feeder
            if candidate is None:
                continue
            if found is None or (attributions[candidate] == INTRODUCED and attributions[found] != INTRODUCED):
                found = candidate  # of several failing feeders, an introduced origin names the defect
        if found is None:
            step_introduced = introduced_by_step.get(golden[position].key.step, [])
            found = _named_by_the_verdict(position, step_introduced, golden, attributions)
        origins[indexes[position]] = found
        return found

    carried: dict[int, int] = {}
    for position in ordered:
        if verdicts[position] == VERDICT_FAIL and attributions[position] in CARRYING:
            found = origin(position, frozenset({indexes[position]}))
            if found is not None:
                carried[indexes[position]] = found
    distinct = sorted(set(carried.values()))
    made = dict(zip(distinct, rows_at(rows, distinct)))
    return {index: made[position] for index, position in carried.items()}


def _named_by_the_verdict(
    position: int, introduced: Sequence[int], golden: Sequence[TensorRecord], attributions: Sequence[str]
) -> int | None:
    """Return the introduced row the verdict blames when the feeders name none: the one inside, else the first before."""
    name = golden[position].key.name
    if attributions[position] == ENCLOSES:
        inside = (inner for inner in introduced if name == ROOT_MODULE or lies_inside(golden[inner].key.name, name))
        return next(inside, None)
    return next((earlier for earlier in introduced if golden[earlier].order < golden[position].order), None)
