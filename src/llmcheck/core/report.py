"""Compare reports: the ``cmp_report.csv`` and ``summary.json`` writers, the report file names, and the terminal summary.

The built-in ``reports`` plugin registers the writers as reporters (``core/reporters.py``);
the file names stay here because ``export model-explorer`` reads a compare folder by them.

The CSV's first 24 columns are the seed tool's, in its order, so scripts written for
``msit llm compare`` keep working; llmcheck's columns follow. Cells a spreadsheet would run
as a formula (starting ``= + - @``, not a number) are prefixed with ``'``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from llmcheck.core.atomic_files import atomic_output, atomic_write_text
from llmcheck.core.depth_profile import error_measure, row_error
from llmcheck.core.records import VERDICT_ERROR, VERDICT_FAIL, VERDICT_WARN, ComparisonRow, TensorStats

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from llmcheck.core.compare import CompareResult

CSV_NAME = "cmp_report.csv"
SUMMARY_NAME = "summary.json"
PAIRS_NAME = "pairs.json"
HTML_NAME = "report.html"

#: The seed tool's seven metrics, in its column order.
SEED_METRICS = ("cosine_similarity", "max_relative_error", "mean_relative_error", "max_absolute_error",
                "mean_absolute_error", "kl_divergence", "relative_euclidean_distance")
#: The seed tool's CSV header (``CSV_GOLDEN_HEADER``), exactly.
SEED_COLUMNS = (
    "token_id", "data_id", "golden_data_path", "golden_op_type", "golden_dtype", "golden_shape",
    "golden_max_value", "golden_min_value", "golden_mean_value", "my_data_path", "my_op_type", "my_dtype",
    "my_shape", "my_max_value", "my_min_value", "my_mean_value", *SEED_METRICS, "cmp_fail_reason",
)
#: llmcheck's own columns after the seed's.
OWN_COLUMNS = (
    "name", "step", "io", "position", "call_index", "my_name", "verdict", "deciding_metric", "deciding_value",
    "warn_threshold", "fail_threshold", "judged_as", "pairing_rule", "attribution", "fed_by", "rmse", "sqnr",
    "golden_nan_count", "golden_inf_count", "my_nan_count", "my_inf_count", "nonfinite_mismatch",
    "error", "feeder_error", "growth", "structure", "sibling_growth", "expected_error", "noise_error", "evidence",
)
def describe(value: Any) -> str:
    """Return a metric value as reports print it (``inf``, ``nan``, or 6 significant digits)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.6g}"
    return str(value)


_FORMULA_STARTS = ("=", "+", "-", "@", "\uff1d", "\uff0b", "\uff0d", "\uff20", "\t", "\r")


def guard_cell(value: Any) -> Any:
    """Return a CSV cell that a spreadsheet will not execute: text starting like a formula gets a ``'``."""
    if not isinstance(value, str) or not value.startswith(_FORMULA_STARTS):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


_JSON_SCALARS = frozenset({str, int, bool, type(None)})


def json_safe(value: Any) -> Any:
    """Return ``value`` with NaN and infinities as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON)."""
    kind = type(value)  # exact types first: a report holds millions of plain values
    if kind in _JSON_SCALARS:
        return value
    if kind is float:
        return value if math.isfinite(value) else describe(value)
    if kind is dict:
        return {str(k): json_safe(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return describe(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


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


def csv_header(result: "CompareResult") -> list[str]:
    """Return the CSV header: the seed's 24 columns, llmcheck's, any metric not named yet, then statistics columns."""
    from llmcheck.core.stats_compare import statistics_columns

    named = set(SEED_METRICS) | set(OWN_COLUMNS)
    return [*SEED_COLUMNS, *OWN_COLUMNS, *(spec.name for spec in result.metric_specs if spec.name not in named),
            *statistics_columns([row.metrics for row in result.rows])]


def csv_row(row: ComparisonRow, header: list[str]) -> list[Any]:
    """Return one report row's cells in header order."""
    golden, my = row.golden, row.my
    deciding = row.metrics.get(row.deciding_metric or "")
    cells: dict[str, Any] = {
        "token_id": golden.key.step, "data_id": golden.attrs.get("data_id", row.index),  # a manual mapping names it
        "golden_data_path": golden.source_path,
        "golden_op_type": golden.op_type or "", "golden_dtype": f"torch.{golden.dtype}",
        "golden_shape": str(list(golden.shape)), "my_data_path": my.source_path, "my_op_type": my.op_type or "",
        "my_dtype": f"torch.{my.dtype}", "my_shape": str(list(my.shape)), "cmp_fail_reason": row.reason,
        "name": golden.key.name, "step": golden.key.step, "io": golden.key.io, "position": golden.key.position,
        "call_index": golden.key.call_index, "my_name": my.key.name, "verdict": row.verdict,
        "deciding_metric": row.deciding_metric or "", "deciding_value": _number(deciding.value) if deciding else "",
        "warn_threshold": _number(deciding.warn_threshold) if deciding else "",
        "fail_threshold": _number(deciding.fail_threshold) if deciding else "",
        "judged_as": row.judged_as, "pairing_rule": row.rule,
        "attribution": row.attribution, "fed_by": " | ".join(row.fed_by),
        "golden_nan_count": _count(row.golden_stats, "nan_count"), "golden_inf_count": _count(row.golden_stats, "inf_count"),
        "my_nan_count": _count(row.my_stats, "nan_count"), "my_inf_count": _count(row.my_stats, "inf_count"),
        "nonfinite_mismatch": row.nonfinite_mismatch,
        "error": _number(row.error), "feeder_error": _number(row.feeder_error), "growth": _number(row.growth),
        "structure": row.structure,
        "sibling_growth": (f"{describe(row.sibling_growth[0])}-{describe(row.sibling_growth[1])}"
                           if row.sibling_growth else ""),
        "expected_error": _number(row.expected_error), "noise_error": _number(row.noise_error),
        "evidence": row.evidence,
    }
    for prefix, stats in (("golden", row.golden_stats), ("my", row.my_stats)):
        for column, value in zip(("max_value", "min_value", "mean_value"), _stats_cells(stats)):
            cells[f"{prefix}_{column}"] = value
    for name, result in row.metrics.items():
        cells.setdefault(name, _number(result.value))
    return [guard_cell(cells.get(column, "")) for column in header]


def write_csv(result: "CompareResult", path: Path) -> None:
    """Write cmp_report.csv: one row per pair, in golden execution order."""
    header = csv_header(result)
    with atomic_output(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in result.rows:
            writer.writerow(csv_row(row, header))


def write_summary(result: "CompareResult", path: Path) -> None:
    """Write summary.json (strict JSON: non-finite numbers as strings)."""
    atomic_write_text(path, json.dumps(json_safe(result.summary()), indent=2) + "\n")


# --- terminal ----------------------------------------------------------------------------------


_STYLE = {VERDICT_FAIL: "bold red", VERDICT_WARN: "yellow", VERDICT_ERROR: "magenta"}
_SEVERITY = {VERDICT_FAIL: 3, VERDICT_ERROR: 2, VERDICT_WARN: 1}


def worst_rows(result: "CompareResult", count: int = 10) -> list[ComparisonRow]:
    """Return up to ``count`` non-passing rows, worst first: verdict, NaN/Inf mismatch, then the error measure."""
    measure = error_measure(result.metric_specs)

    def badness(row: ComparisonRow) -> tuple[int, int, float]:
        error = row_error(row, measure)
        value = -1.0 if error is None or math.isnan(error) else error
        return _SEVERITY.get(row.verdict, 0), row.nonfinite_mismatch, value

    return sorted((row for row in result.rows if row.verdict in _SEVERITY), key=badness, reverse=True)[:count]


def measure_text(row: ComparisonRow) -> str:
    """Return the deciding metric against its fail threshold in the metric's own direction (``psnr 10 < 20``)."""
    deciding = row.metrics.get(row.deciding_metric or "")
    if deciding is None or deciding.fail_threshold is None:
        return row.reason or row.verdict
    if deciding.verdict == VERDICT_WARN and deciding.warn_threshold is not None:
        return (f"{deciding.name} {describe(deciding.value)} {deciding.comparison} "
                f"{describe(deciding.warn_threshold)} (warn threshold)")
    if deciding.verdict == VERDICT_FAIL or math.isnan(deciding.value):
        return f"{deciding.name} {describe(deciding.value)} {deciding.comparison} {describe(deciding.fail_threshold)}"
    within = "\u2265" if deciding.higher_is_better else "\u2264"  # a passing value is on the good side
    return f"{deciding.name} {describe(deciding.value)} {within} {describe(deciding.fail_threshold)}"


def divergence_line(row: ComparisonRow) -> str:
    """Return one line naming a failing row: where, which metric, its value against the threshold, attribution."""
    key = row.golden.key
    where = key.label()
    if row.my.key.name != key.name:
        where += f" (my: {row.my.key.name})"
    attribution = f", {row.attribution}" if row.attribution else ""
    return f"{where}: {measure_text(row)}{attribution}"


def print_summary(result: "CompareResult", console: "Console", written: Mapping[str, Path] | None = None) -> None:
    """Print counts, the first divergence, the first introduced divergence and the ten worst rows."""
    counts = result.counts()
    read = result.tensor_bytes_read
    size = f"{read / 1e9:.2f} GB" if read >= 1e9 else f"{read / 1e6:.1f} MB"
    speed = f", {read / 1e9 / result.elapsed_s:.2f} GB/s" if result.elapsed_s > 0 and read >= 1e8 else ""
    console.print(f"compared {counts['pairs']} pairs ({size} of tensors read) in {result.elapsed_s:.2f} s{speed}",
                  highlight=False)
    console.print(f"  [green]pass {counts['passes']}[/]  [yellow]warn {counts['warnings']}[/]  "
                  f"[bold red]fail {counts['failures']}[/]  [magenta]error {counts['errors']}[/]  "
                  f"unmatched golden {counts['unmatched_golden']}, my {counts['unmatched_my']}")
    first, introduced = result.first_divergence, result.first_introduced
    if not result.rows:
        console.print("[bold yellow]no pairs: no pairing rule matched a golden record to a my record; check the "
                      "paths and sources, or pair them with --mapping[/]", highlight=False)
    elif first is None and result.counts()["errors"]:
        console.print(f"[bold magenta]no failing pair, but {result.counts()['errors']} pairs could not be measured "
                      "(see cmp_fail_reason)[/]", highlight=False)
    elif first is None and result.counts()["unmatched"]:
        console.print(f"[yellow]no divergence among the {len(result.rows)} pairs, but {result.counts()['unmatched']} "
                      "records have no counterpart and were not compared (see pairs.json)[/]", highlight=False)
    elif first is None:
        console.print("[green]no divergence: every pair is within its thresholds[/]")
    else:
        console.print(f"first divergence: {divergence_line(first)}", markup=False)
        if introduced is not None:
            console.print(f"[bold]first introduced divergence: {divergence_line(introduced)}[/]", highlight=False)
            if introduced.fed_by:
                console.print(f"  its inputs agree: {', '.join(introduced.fed_by)}", markup=False)
            if introduced.evidence:
                console.print(f"  evidence: {introduced.evidence}", markup=False, highlight=False)
        suspects = result.suspects.sentence()
        if suspects:
            console.print(f"[bold]suspects:[/] {suspects}", highlight=False)
    hint = twin_hint(result)
    if hint:
        console.print(f"hint: {hint}", markup=False, highlight=False)
    if result.golden.source == result.my.source == "file" and len(result.rows) <= 20:
        _print_metric_table(result, console)
    else:
        _print_worst_rows(result, console)
    if written:
        console.print("wrote " + ", ".join(str(path) for path in written.values()), markup=False)


def twin_hint(result: "CompareResult") -> str:
    """Return advice to record a noise twin when the runs differ in precision and none was given, else ''."""
    from llmcheck.core.verdicts import run_precision

    if result.noise is not None:
        return ""
    golden, my = (run_precision([record.dtype for record in dump.records]) for dump in (result.golden, result.my))
    if golden is None or my is None or golden == my:
        return ""
    return (f"the runs differ in precision ({golden} golden, {my} my): a defect smaller than {my} rounding noise "
            "passes unseen here; record the golden program at the my-run's precision and give it as "
            "--noise-path (docs/commands/compare.md)")


def _print_worst_rows(result: "CompareResult", console: "Console") -> None:
    """Print the worst rows with the measure they are sorted by (the error measure), and what decided each."""
    worst = worst_rows(result)
    if not worst:
        return
    measure = error_measure(result.metric_specs)
    shown = measure.name if measure is not None else "deciding metric"
    console.print(f"{len(worst)} worst rows by {shown} (data_id, verdict, record, {shown}, attribution, deciding):",
                  highlight=False)
    for row in worst:
        error = row_error(row, measure)
        value = describe(error) if error is not None else (row.reason or "-")
        decided = "" if row.deciding_metric == (measure.name if measure else None) else f"  ({measure_text(row)})"
        console.print(f"  {row.index:>5} [{_STYLE[row.verdict]}]{row.verdict:<5}[/] {row.golden.key.label()}  "
                      f"{value}  {row.attribution or '-'}{decided}", highlight=False, markup=True)


def _print_metric_table(result: "CompareResult", console: "Console") -> None:
    """Print every metric of every pair, one per line (the two-single-files case)."""
    width = max(len(spec.name) for spec in result.metric_specs) if result.metric_specs else 0
    for row in result.rows:
        style = _STYLE.get(row.verdict, "green")
        console.print(f"{row.golden.key.name}: [{style}]{row.verdict}[/]" + (f" ({row.reason})" if row.reason else ""),
                      highlight=False)
        for spec in result.metric_specs:
            metric = row.metrics.get(spec.name)
            if metric is None:
                continue
            judged = ""
            if metric.fail_threshold is not None:
                judged = (f"  ({metric.verdict}: warn {describe(metric.warn_threshold)}, "
                          f"fail {describe(metric.fail_threshold)})")
            console.print(f"  {spec.name:<{width}}  {describe(metric.value)}{judged}", highlight=False)
