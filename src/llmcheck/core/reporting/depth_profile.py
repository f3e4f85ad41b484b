"""The error along the model's depth: the headline chart's points and the module heat map of a compare.

A user looks for where the error starts. Two views answer that at a glance:

* the *depth profile*: the error measure of each decoder layer's output and of the named
  modules around the layers (embedding, final norm, head), in execution order, with the
  expected-noise envelope of each point and the introduced divergence marked;
* the *module heat map*: decoder layers down, submodule kinds across (``input_layernorm``,
  ``self_attn.q_proj``, ..., ``mlp.down_proj``), each cell one submodule's output, coloured by
  what the verdict held it against: its error over the expected error the verdict used
  (:func:`expected_used`). Error grows with depth, so the error alone paints every layer after
  a defect as hot as the defect; against its expectation an inherited error is about 1x, and
  only the rows the verdict says add error (introduced, amplified) are hot.

Rows carry ``structure`` and ``layer_index`` from the verdict; older results without them
get the same from the record name here (the first all-digit path part is the layer index).
Only one step is drawn: the introduced divergence's, else the first divergence's, else the first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmcheck.core.judging.divergence import (
    AMPLIFIED,
    EXACT_INPUTS_METRIC,
    INTRODUCED,
    OUTLIER_FACTOR,
    TWIN_DIFFERENCE_METRIC,
    TWIN_FAIL_FACTOR,
    WEIGHTS_METRIC,
)
from llmcheck.core.judging.row_table import golden_order, row_field, rows_at
from llmcheck.core.records import IO_OUTPUT, ROOT_MODULE, ComparisonRow, MetricSpec, lies_inside

_INDEX_PART = re.compile(r"(?<![^./])(\d+)(?=[./]|$)")
#: Heat map columns beyond this many submodule kinds are left out (op-level dumps have hundreds).
MAX_HEATMAP_KINDS = 40
#: Attributions by which the verdict says a row adds error itself: the heat map's hot cells.
ADDS_ERROR = frozenset({INTRODUCED, AMPLIFIED})
#: Deciding metrics by which the verdict expected no difference at all: exact inputs, the twin's own bits, the weights.
EXPECTS_EXACT = frozenset({EXACT_INPUTS_METRIC, TWIN_DIFFERENCE_METRIC, WEIGHTS_METRIC})
#: What the expected error was, and how many times it a row may reach before the verdict fails it.
EXPECTED_BY_TWIN, EXPECTED_BY_REPEATS, EXPECTED_EXACT = "noise twin", "repeats", "exact"
FAIL_FACTOR = {EXPECTED_BY_TWIN: TWIN_FAIL_FACTOR, EXPECTED_BY_REPEATS: OUTLIER_FACTOR}


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a record sits in the repeated structure: the name with the index abstracted, the index, the block."""

    structure: str
    layer_index: int | None
    block: str  # the repeated block's own name (``model.layers.3``), "" outside any
    kind: str  # the part after the block (``mlp.down_proj``), "" for the block itself or outside


def placement(row: ComparisonRow) -> Placement:
    """Return the row's place in the repeated structure (from the verdict's fields, else from its name)."""
    name = row.golden.key.name
    match = _INDEX_PART.search(name)
    structure, index = row.structure, row.layer_index
    if not structure:
        structure = name if match is None else f"{name[: match.start()]}{{i}}{name[match.end() :]}"
        index = None if match is None else int(match.group(1))
    if index is None or match is None:
        return Placement(structure, None, "", "")
    block = name[: match.end()]
    return Placement(structure, index, block, name[match.end() :].lstrip("./"))


def row_error(row: ComparisonRow, measure: MetricSpec | None) -> float | None:
    """Return the row's value of the error measure (the verdict's ``error``, else the measured metric)."""
    if row.error is not None:
        return row.error
    result = row.metrics.get(measure.name) if measure is not None else None
    return result.value if result is not None else None


def expected_used(row: ComparisonRow) -> tuple[float | None, str]:
    """Return the expected error the verdict held the row against, and where it came from (``""``: none).

    The noise twin's error where a twin covers the row, else the error its repeats predict
    (``expected_error``); 0 where the verdict expected no difference at all (bit-exact inputs,
    the twin's own bits, weights).
    """
    if row.deciding_metric in EXPECTS_EXACT:
        return 0.0, EXPECTED_EXACT
    if row.noise_error is not None:
        return row.noise_error, EXPECTED_BY_TWIN
    if row.expected_error is not None:
        return row.expected_error, EXPECTED_BY_REPEATS
    return None, ""


def excess(row: ComparisonRow, measure: MetricSpec | None) -> float | None:
    """Return the row's error over the expected error the verdict used (inf: an error where none was expected)."""
    error = row_error(row, measure)
    expected, _ = expected_used(row)
    if error is None or expected is None or math.isnan(error):
        return None
    if expected > 0:
        return error / expected
    return math.inf if error > 0 else 0.0


def drawn_step(
    rows: Sequence[ComparisonRow], introduced: ComparisonRow | None, first: ComparisonRow | None
) -> int | None:
    """Return the step the depth views show."""
    for row in (introduced, first):
        if row is not None:
            return row.golden.key.step
    return min((record.key.step for record in row_field(rows, "golden")), default=None)


def _main_outputs(rows: Sequence[ComparisonRow], step: int) -> list[ComparisonRow]:
    """Return the first output tensor of each call's first run in ``step`` (one row per module), in execution order."""
    golden = row_field(rows, "golden")
    chosen: dict[str, int] = {}
    for position in golden_order(rows):
        key = golden[position].key
        if key.step == step and key.io == IO_OUTPUT and key.call_index == 0 and key.name not in chosen:
            chosen[key.name] = position
    return rows_at(rows, list(chosen.values()))


def _point_label(name: str, place: Placement) -> str:
    """Return a point's axis label: ``layers.3``, ``norm``, or for an op ``norm/pow`` (not its overload, ``Tensor_Scalar``)."""
    if place.block == name:
        return ".".join(name.split(".")[-2:])  # layers.3
    module, slash, op = name.partition("/")
    if slash:  # an op record: module/aten.pow.Tensor_Scalar
        parts = op.split(".")
        return f"{module.rsplit('.', 1)[-1]}/{parts[1] if len(parts) > 2 else parts[-1]}"
    return name.rsplit(".", 1)[-1]


def depth_points(rows: Sequence[ComparisonRow], step: int, measure: MetricSpec | None) -> list[dict[str, Any]]:
    """Return the headline chart's points: each decoder layer's output and each named module around the layers."""
    outputs = _main_outputs(rows, step)
    places = {row.golden.key.name: placement(row) for row in outputs}
    blocks = {place.block for place in places.values() if place.block}
    points = []
    for row in outputs:
        name = row.golden.key.name
        place = places[name]
        if blocks:
            inside_block = place.block and place.block != name
            holds_blocks = any(lies_inside(block, name) for block in blocks) or name == ROOT_MODULE
            if inside_block or holds_blocks:
                continue
        deciding = row.metrics.get(measure.name) if measure is not None else None
        expected, basis = expected_used(row)
        points.append(
            {
                "id": row.index,
                "name": name,
                "label": _point_label(name, place),
                "layer": place.layer_index,
                "error": row_error(row, measure),
                "expected": expected,
                "basis": basis,
                "verdict": row.verdict,
                "fail": deciding.fail_threshold if deciding is not None else None,
            }
        )
    return points


def introduced_point(points: Sequence[dict[str, Any]], introduced: ComparisonRow | None) -> int | None:
    """Return the index of the point holding the introduced divergence (the point itself or the layer around it)."""
    if introduced is None:
        return None
    name = introduced.golden.key.name
    for index, point in enumerate(points):
        if name == point["name"] or lies_inside(name, point["name"]):
            return index
    return None


def heatmap(rows: Sequence[ComparisonRow], step: int, measure: MetricSpec | None) -> dict[str, Any] | None:
    """Return the module heat map (layers down, submodule kinds across), or ``None`` without repeated blocks."""
    cells: dict[tuple[int, str], ComparisonRow] = {}
    kinds: dict[str, int] = {}
    for row in _main_outputs(rows, step):
        place = placement(row)
        if place.layer_index is None or not place.kind:
            continue
        kinds[place.kind] = kinds.get(place.kind, 0) + 1
        cells.setdefault((place.layer_index, place.kind), row)
    if not cells:
        return None
    kept = [kind for kind, _ in sorted(kinds.items(), key=lambda item: -item[1])[:MAX_HEATMAP_KINDS]]
    kept_set = set(kept)
    columns = [kind for kind in kinds if kind in kept_set]  # first-run order
    layers = sorted({layer for layer, _ in cells})

    def cell(row: ComparisonRow | None) -> dict[str, Any] | None:
        if row is None:
            return None
        expected, basis = expected_used(row)
        return {
            "id": row.index,
            "error": row_error(row, measure),
            "expected": expected,
            "basis": basis,
            "excess": excess(row, measure),
            "fail_factor": FAIL_FACTOR.get(basis),
            "hot": row.attribution in ADDS_ERROR,
            "verdict": row.verdict,
            "attribution": row.attribution,
        }

    return {
        "layers": layers,
        "kinds": columns,
        "cells": [[cell(cells.get((layer, kind))) for kind in columns] for layer in layers],
    }
