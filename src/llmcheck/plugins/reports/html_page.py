"""report.html: one self-contained file (inline CSS and JS, no network) a user opens in any browser.

The page tells the story first: one sentence (what was compared, the verdict, the culprit
and its evidence, the output effect), then the headline chart -- the error measure along the
model's depth, the expected-noise envelope as a band, the introduced divergence marked and
named -- and the module heat map (layers down, submodule kinds across). The per-metric
charts (each drawing only the pairs that metric judged) are folded away; the table of pairs
fits 1280 px, with a details drawer per row. The page names no metric: the error measure is
the metric holding that role, and each metric's direction comes with its results. The
data is embedded as JSON (``report_template.html`` next to this module is the page). The
built-in ``reports`` plugin registers it as the ``html`` reporter.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from llmcheck.plugin_api import (
    ComparisonRow,
    MetricSpec,
    atomic_write_text,
    depth_points,
    drawn_step,
    error_measure,
    heatmap,
    introduced_point,
    json_safe,
    placement,
    row_error,
)

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.plugin_api import CompareResult

TEMPLATE_NAME = "report_template.html"
DATA_PLACEHOLDER = "/*LLMCHECK_DATA*/"
#: Unmatched records listed in the page per side (pairs.json lists them all).
UNMATCHED_LISTED = 500


def _number(value: Any) -> Any:
    """Return a number JSON can hold: non-finite floats as strings (see :func:`json_safe`)."""
    return json_safe(value) if isinstance(value, float) and not math.isfinite(value) else value


def _row_data(row: ComparisonRow, metric_names: list[str], measure: MetricSpec | None) -> dict[str, Any]:
    """Return one row of the page's table, JSON-safe already (rows are most of the page: no second pass)."""
    key = row.golden.key
    results = [row.metrics.get(name) for name in metric_names]
    return {
        "id": row.index,
        "name": key.name,
        "call": key.call_index,
        "step": key.step,
        "io": key.io,
        "pos": key.position,
        "mn": row.my.key.name,
        "op": row.golden.op_type,
        "gd": row.golden.dtype,
        "md": row.my.dtype,
        "shape": str(list(row.golden.shape)),
        "v": row.verdict,
        "d": row.deciding_metric,
        "a": row.attribution,
        "rule": row.rule,
        "why": row.reason,
        "fb": list(row.fed_by),
        "ja": row.judged_as,
        "m": [_number(result.value) if result else None for result in results],
        "wt": [_number(result.warn_threshold) if result else None for result in results],
        "ft": [_number(result.fail_threshold) if result else None for result in results],
        "mv": [result.verdict if result and result.fail_threshold is not None else None for result in results],
        "cmp": [result.comparison if result else None for result in results],
        "e": _number(row_error(row, measure)),
        "fe": _number(row.feeder_error),
        "g": _number(row.growth),
        "x": _number(row.expected_error),
        "ne": _number(row.noise_error),
        "st": row.structure or placement(row).structure,
        "sg": [_number(value) for value in row.sibling_growth] if row.sibling_growth else None,
        "sc": row.sibling_count,
        "ev": row.evidence,
    }


def _depth_views(result: CompareResult, measure: MetricSpec | None) -> dict[str, Any]:
    """Return the headline chart's points and the heat map of the drawn step."""
    introduced, first = result.first_introduced, result.first_divergence
    step = drawn_step(result.rows, introduced, first)
    if step is None:
        return {"step": None, "points": [], "introduced": None, "culprit": None, "culprit_error": None, "heatmap": None}
    points = depth_points(result.rows, step, measure)
    return {
        "step": step,
        "points": points,
        "introduced": introduced_point(points, introduced),
        "culprit": introduced.golden.key.label() if introduced is not None else None,
        "culprit_error": row_error(introduced, measure) if introduced is not None else None,
        "heatmap": heatmap(result.rows, step, measure),
    }


def report_data(result: CompareResult) -> dict[str, Any]:
    """Return what the page shows, as JSON-safe data."""
    from llmcheck.plugin_api import DECIDING_STAT
    from llmcheck.plugins.reports.story import story

    plotted = [(spec.name, spec.higher_is_better) for spec in result.metric_specs]
    if any(DECIDING_STAT in row.metrics for row in result.rows):  # statistics-only pairs: plot what judged them
        plotted.append((DECIDING_STAT, False))
    metric_names = [name for name, _ in plotted]
    measure = error_measure(result.metric_specs)
    data = json_safe(
        {
            "summary": result.summary(),
            "story": story(result),
            "error_measure": measure.name if measure is not None else None,
            "metrics": [{"name": name, "higher_is_better": higher} for name, higher in plotted],
            "rows": [],
            "depth": _depth_views(result, measure),
            "unmatched_golden": [
                [item.record.key.label(), item.note] for item in result.pairing.unmatched_golden[:UNMATCHED_LISTED]
            ],
            "unmatched_my": [
                [item.record.key.label(), item.note] for item in result.pairing.unmatched_my[:UNMATCHED_LISTED]
            ],
        }
    )
    data["rows"] = [
        _row_data(row, metric_names, measure) for row in sorted(result.rows, key=lambda row: row.golden.order)
    ]
    return data


def render_html(result: CompareResult) -> str:
    """Return the report page with its data embedded."""
    template = resources.files(__package__).joinpath(TEMPLATE_NAME).read_text(encoding="utf-8")
    # msgspec writes the ~10**5 table rows of a decode dump several times faster than json.dumps;
    # the data is JSON-safe already (non-finite numbers are strings), and the page is UTF-8.
    payload = msgspec.json.encode(report_data(result)).decode("utf-8")
    # Inside <script>, "</" could close the element early; U+2028/9 break older JS parsers.
    payload = payload.replace("</", "<\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return template.replace(DATA_PLACEHOLDER, payload, 1)


def write_html(result: CompareResult, path: Path) -> None:
    """Write report.html."""
    atomic_write_text(path, render_html(result))
