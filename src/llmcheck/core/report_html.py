"""report.html: one self-contained file (inline CSS and JS, no network) a user opens in any browser.

The page holds the summary, a chart of every metric along execution order (the error
growth curve through the layers, thresholds and the first introduced divergence marked),
and the table of pairs -- sortable, filterable, failing rows highlighted. The report data is
embedded as JSON in the page (``report_template.html`` next to this module is the page).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcheck.core.records import ComparisonRow
from llmcheck.core.report import json_safe

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.core.compare import CompareResult

TEMPLATE_NAME = "report_template.html"
DATA_PLACEHOLDER = "/*LLMCHECK_DATA*/"
#: Unmatched records listed in the page per side (pairs.json lists them all).
UNMATCHED_LISTED = 500


def _row_data(row: ComparisonRow, metric_names: list[str]) -> dict[str, Any]:
    key = row.golden.key
    results = [row.metrics.get(name) for name in metric_names]
    return {
        "id": row.index, "name": key.name, "call": key.call_index, "step": key.step, "io": key.io,
        "pos": key.position, "mn": row.my.key.name, "op": row.golden.op_type, "gd": row.golden.dtype,
        "md": row.my.dtype, "shape": str(list(row.golden.shape)), "v": row.verdict, "d": row.deciding_metric,
        "a": row.attribution, "rule": row.rule, "why": row.reason, "fb": list(row.fed_by),
        "m": [result.value if result else None for result in results],
        "wt": [result.warn_threshold if result else None for result in results],
        "ft": [result.fail_threshold if result else None for result in results],
    }


def report_data(result: "CompareResult") -> dict[str, Any]:
    """Return what the page shows, as JSON-safe data."""
    from llmcheck.core.stats_compare import DECIDING_STAT

    plotted = [(spec.name, spec.higher_is_better) for spec in result.metric_specs]
    if any(DECIDING_STAT in row.metrics for row in result.rows):  # statistics-only pairs: plot what judged them
        plotted.append((DECIDING_STAT, False))
    metric_names = [name for name, _ in plotted]
    return json_safe({
        "summary": result.summary(),
        "metrics": [{"name": name, "higher_is_better": higher} for name, higher in plotted],
        "rows": [_row_data(row, metric_names) for row in sorted(result.rows, key=lambda row: row.golden.order)],
        "unmatched_golden": [[item.record.key.label(), item.note]
                             for item in result.pairing.unmatched_golden[:UNMATCHED_LISTED]],
        "unmatched_my": [[item.record.key.label(), item.note] for item in result.pairing.unmatched_my[:UNMATCHED_LISTED]],
    })


def render_html(result: "CompareResult") -> str:
    """Return the report page with its data embedded."""
    template = resources.files("llmcheck.core").joinpath(TEMPLATE_NAME).read_text(encoding="utf-8")
    payload = json.dumps(report_data(result), separators=(",", ":"), allow_nan=False)
    # Inside <script>, "</" could close the element early; U+2028/9 break older JS parsers.
    payload = payload.replace("</", "<\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return template.replace(DATA_PLACEHOLDER, payload, 1)


def write_html(result: "CompareResult", path: Path) -> None:
    """Write report.html."""
    Path(path).write_text(render_html(result), encoding="utf-8")
