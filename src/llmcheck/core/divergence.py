"""First divergence and attribution: where the error shows first, and where it is introduced.

The *first divergence* is the first failing row in golden execution order. That is often
not where the defect is -- everything downstream of a defect fails too -- so each failing
row is compared with the rows that fed it:

* the call's own input records (same name, step and call index), when the capture kept them;
* otherwise the nearest earlier record of the same step that is neither part of this call
  nor inside this module (the tensor most likely to have been its input).

A failing row is *introduced* when every feeder passes or only warns (its inputs agree and
its output does not); *inherited* when a feeder already fails; *amplified* when a feeder
fails but this row's relative euclidean distance is more than ten times the feeder's (the
error grows here); *unknown* when nothing fed it. Module outputs are recorded after their
children's, so the first *introduced* row in execution order is the deepest module whose
inputs agree and whose output does not -- not its parent, whose output fails later.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from llmcheck.core.records import (
    IO_INPUT,
    IO_OUTPUT,
    VERDICT_ERROR,
    VERDICT_FAIL,
    ComparisonRow,
)
from llmcheck.core.verdicts import NONFINITE_METRIC

INTRODUCED = "introduced"
INHERITED = "inherited"
AMPLIFIED = "amplified"
UNKNOWN = "unknown"
#: A failing row whose error exceeds its failing feeders' by this factor is labelled amplified.
AMPLIFICATION_FACTOR = 10.0
#: The scale-free error measure compared between a row and its feeders.
ERROR_METRIC = "relative_euclidean_distance"


def _call(row: ComparisonRow) -> tuple[str, int, int]:
    key = row.golden.key
    return key.name, key.step, key.call_index


def _inside(name: str, module: str, parents: dict[str, str]) -> bool:
    """Return whether record name ``name`` lies inside module ``module`` (by parent links or by path)."""
    if name.startswith((module + ".", module + "/")):
        return True
    seen: set[str] = set()
    current = parents.get(name)
    while current is not None and current not in seen:  # a malformed dump may hold a cycle
        if current == module:
            return True
        seen.add(current)
        current = parents.get(current)
    return False


def _error(row: ComparisonRow) -> float | None:
    result = row.metrics.get(ERROR_METRIC)
    return result.value if result is not None and math.isfinite(result.value) else None


def _feeders(position: int, ordered: Sequence[ComparisonRow], inputs_of: dict[tuple[str, int, int], list[ComparisonRow]],
             parents: dict[str, str]) -> list[ComparisonRow]:
    row = ordered[position]
    if row.golden.key.io == IO_OUTPUT:
        own_inputs = [r for r in inputs_of.get(_call(row), []) if r.golden.order < row.golden.order]
        if own_inputs:
            return own_inputs
    name, step, _ = _call(row)
    for earlier_position in range(position - 1, -1, -1):
        earlier = ordered[earlier_position]
        if earlier.golden.key.step != step:
            break
        if _call(earlier) == _call(row) or _inside(earlier.golden.key.name, name, parents):
            continue
        return [earlier]
    return []


def _label(row: ComparisonRow, feeders: Sequence[ComparisonRow]) -> str:
    if not feeders:
        return UNKNOWN
    failing = [feeder for feeder in feeders if feeder.verdict == VERDICT_FAIL]
    if not failing:
        return UNKNOWN if any(feeder.verdict == VERDICT_ERROR for feeder in feeders) else INTRODUCED
    own = _error(row)
    inherited = [_error(feeder) for feeder in failing]
    finite = own is not None and None not in inherited and not any(r.nonfinite_mismatch for r in (row, *failing))
    if finite and own > AMPLIFICATION_FACTOR * max(inherited):  # type: ignore[operator,type-var]
        return AMPLIFIED
    return INHERITED


def attribute(rows: Sequence[ComparisonRow]) -> list[ComparisonRow]:
    """Return the rows (in the same order) with ``attribution`` and ``fed_by`` set on every failing row."""
    ordered = sorted(rows, key=lambda row: row.golden.order)
    inputs_of: dict[tuple[str, int, int], list[ComparisonRow]] = {}
    parents: dict[str, str] = {}
    for row in ordered:
        if row.golden.key.io == IO_INPUT:
            inputs_of.setdefault(_call(row), []).append(row)
        if row.golden.parent:
            parents.setdefault(row.golden.key.name, row.golden.parent)
    attributed: dict[int, ComparisonRow] = {}
    for position, row in enumerate(ordered):
        if row.verdict != VERDICT_FAIL:
            continue
        feeders = _feeders(position, ordered, inputs_of, parents)
        attributed[id(row)] = row.with_changes(attribution=_label(row, feeders),
                                               fed_by=tuple(feeder.golden.key.label() for feeder in feeders))
    return [attributed.get(id(row), row) for row in rows]


def first_divergence(rows: Sequence[ComparisonRow]) -> ComparisonRow | None:
    """Return the first failing row in golden execution order, or None when nothing fails."""
    return min((row for row in rows if row.verdict == VERDICT_FAIL), key=lambda row: row.golden.order, default=None)


def first_introduced(rows: Sequence[ComparisonRow]) -> ComparisonRow | None:
    """Return the first row whose error is introduced here (the deepest such module), or None."""
    return min((row for row in rows if row.attribution == INTRODUCED), key=lambda row: row.golden.order, default=None)


def describe_row(row: ComparisonRow | None) -> dict[str, Any] | None:
    """Return a failing row as summary.json shows it: where, which metric, by how much, against what."""
    if row is None:
        return None
    key = row.golden.key
    described: dict[str, Any] = {
        "data_id": row.index, "name": key.name, "step": key.step, "io": key.io, "position": key.position,
        "call_index": key.call_index, "op_type": row.golden.op_type, "my_name": row.my.key.name,
        "verdict": row.verdict, "metric": row.deciding_metric, "value": None, "threshold": None,
        "warn_threshold": None, "attribution": row.attribution, "fed_by": list(row.fed_by), "reason": row.reason,
    }
    if row.deciding_metric == NONFINITE_METRIC:
        described.update(value=row.nonfinite_mismatch, threshold=0, warn_threshold=0)
    elif row.deciding_metric in row.metrics:
        result = row.metrics[row.deciding_metric]
        described.update(value=result.value, threshold=result.fail_threshold, warn_threshold=result.warn_threshold)
    return described
