"""``cmp_report.csv``: one row per pair, the seed tool's 24 columns first, then llmcheck's.

The first 24 columns are the seed tool's, in its order, so scripts written for
``msit llm compare`` keep working; llmcheck's columns follow, then any metric a plugin
added, then statistics columns. Cells a spreadsheet would run as a formula (starting
``= + - @``, not a number) are prefixed with ``'``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcheck.plugin_api import ComparisonRow, TensorStats, atomic_output, describe

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.plugin_api import CompareResult

#: The seed tool's seven metrics, in its column order.
SEED_METRICS = (
    "cosine_similarity",
    "max_relative_error",
    "mean_relative_error",
    "max_absolute_error",
    "mean_absolute_error",
    "kl_divergence",
    "relative_euclidean_distance",
)
#: The seed tool's CSV header (``CSV_GOLDEN_HEADER``), exactly.
SEED_COLUMNS = (
    "token_id",
    "data_id",
    "golden_data_path",
    "golden_op_type",
    "golden_dtype",
    "golden_shape",
    "golden_max_value",
    "golden_min_value",
    "golden_mean_value",
    "my_data_path",
    "my_op_type",
    "my_dtype",
    "my_shape",
    "my_max_value",
    "my_min_value",
    "my_mean_value",
    *SEED_METRICS,
    "cmp_fail_reason",
)
#: llmcheck's own columns after the seed's.
OWN_COLUMNS = (
    "name",
    "step",
    "io",
    "position",
    "call_index",
    "my_name",
    "verdict",
    "deciding_metric",
    "deciding_value",
    "warn_threshold",
    "fail_threshold",
    "judged_as",
    "pairing_rule",
    "attribution",
    "fed_by",
    "rmse",
    "sqnr",
    "golden_nan_count",
    "golden_inf_count",
    "my_nan_count",
    "my_inf_count",
    "nonfinite_mismatch",
    "error",
    "feeder_error",
    "growth",
    "structure",
    "sibling_growth",
    "expected_error",
    "noise_error",
    "evidence",
)
_FORMULA_STARTS = ("=", "+", "-", "@", "\uff1d", "\uff0b", "\uff0d", "\uff20", "\t", "\r")
_FORMULA_FIRST = frozenset(_FORMULA_STARTS)


def guard_cell(value: Any) -> Any:
    """Return a CSV cell that a spreadsheet will not execute: text starting like a formula gets a ``'``."""
    if not isinstance(value, str) or not value.startswith(_FORMULA_STARTS):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def _number(value: float | int | None) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return describe(value)
    return value


def _stats_cells(stats: TensorStats | None) -> list[Any]:
    if stats is None:
        return ["", "", ""]
    return [_number(stats.max), _number(stats.min), _number(stats.mean)]


def _count(stats: TensorStats | None, field: str) -> Any:
    value = getattr(stats, field, None) if stats is not None else None
    return "" if value is None else value


def csv_header(result: CompareResult) -> list[str]:
    """Return the CSV header: the seed's 24 columns, llmcheck's, any metric not named yet, then statistics columns."""
    from llmcheck.plugin_api import statistics_columns

    named = set(SEED_METRICS) | set(OWN_COLUMNS)
    return [
        *SEED_COLUMNS,
        *OWN_COLUMNS,
        *(spec.name for spec in result.metric_specs if spec.name not in named),
        *statistics_columns([row.metrics for row in result.rows]),
    ]


def csv_row(row: ComparisonRow, header: list[str]) -> list[Any]:
    """Return one report row's cells in header order."""
    golden, my = row.golden, row.my
    deciding = row.metrics.get(row.deciding_metric or "")
    cells: dict[str, Any] = {
        "token_id": golden.key.step,
        "data_id": golden.attrs.get("data_id", row.index),  # a manual mapping names it
        "golden_data_path": golden.source_path,
        "golden_op_type": golden.op_type or "",
        "golden_dtype": f"torch.{golden.dtype}",
        "golden_shape": str(list(golden.shape)),
        "my_data_path": my.source_path,
        "my_op_type": my.op_type or "",
        "my_dtype": f"torch.{my.dtype}",
        "my_shape": str(list(my.shape)),
        "cmp_fail_reason": row.reason,
        "name": golden.key.name,
        "step": golden.key.step,
        "io": golden.key.io,
        "position": golden.key.position,
        "call_index": golden.key.call_index,
        "my_name": my.key.name,
        "verdict": row.verdict,
        "deciding_metric": row.deciding_metric or "",
        "deciding_value": _number(deciding.value) if deciding else "",
        "warn_threshold": _number(deciding.warn_threshold) if deciding else "",
        "fail_threshold": _number(deciding.fail_threshold) if deciding else "",
        "judged_as": row.judged_as,
        "pairing_rule": row.rule,
        "attribution": row.attribution,
        "fed_by": " | ".join(row.fed_by),
        "golden_nan_count": _count(row.golden_stats, "nan_count"),
        "golden_inf_count": _count(row.golden_stats, "inf_count"),
        "my_nan_count": _count(row.my_stats, "nan_count"),
        "my_inf_count": _count(row.my_stats, "inf_count"),
        "nonfinite_mismatch": row.nonfinite_mismatch,
        "error": _number(row.error),
        "feeder_error": _number(row.feeder_error),
        "growth": _number(row.growth),
        "structure": row.structure,
        "sibling_growth": (
            f"{describe(row.sibling_growth[0])}-{describe(row.sibling_growth[1])}" if row.sibling_growth else ""
        ),
        "expected_error": _number(row.expected_error),
        "noise_error": _number(row.noise_error),
        "evidence": row.evidence,
    }
    for prefix, stats in (("golden", row.golden_stats), ("my", row.my_stats)):
        for column, value in zip(("max_value", "min_value", "mean_value"), _stats_cells(stats)):
            cells[f"{prefix}_{column}"] = value
    for name, result in row.metrics.items():
        cells.setdefault(name, _number(result.value))
    values = [cells.get(column, "") for column in header]
    # only text starting like a formula needs the guard: one set lookup per cell instead of a call
    return [guard_cell(value) if isinstance(value, str) and value[:1] in _FORMULA_FIRST else value for value in values]


def write_csv(result: CompareResult, path: Path) -> None:
    """Write cmp_report.csv: one row per pair, in golden execution order."""
    header = csv_header(result)
    with atomic_output(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in result.rows:
            writer.writerow(csv_row(row, header))
