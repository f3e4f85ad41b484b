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

import itertools
import math
from collections.abc import Iterator
from importlib import resources
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from llmcheck.plugin_api import (
    ComparisonRow,
    MetricResult,
    MetricSpec,
    atomic_output,
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


def _numbers(values: list[Any]) -> list[Any]:
    return [_number(value) for value in values]


def _finite(values: list[Any]) -> bool:
    """Return whether none of ``values`` (numbers and ``None``) is NaN or infinite, in one C-level pass.

    The sum of the truthy values is finite when each is (``None`` and zeros are left out,
    and a sum overflowing to infinity only sends the row the slow way); a value of another
    type makes it answer False, so the row is converted value by value as before.
    """
    try:
        total = sum(filter(None, values))
    except TypeError:
        return False
    return bool(total - total == 0)


_VALUE, _WARN, _FAIL = attrgetter("value"), attrgetter("warn_threshold"), attrgetter("fail_threshold")
_VERDICT, _COMPARISON = attrgetter("verdict"), attrgetter("comparison")


class _Rows:
    """Builds the page's table rows, JSON-safe already (rows are most of the page: no second pass).

    ~10**5 rows in a decode dump: each row's numbers are checked for NaN and infinities in
    one pass (:func:`_finite`) and converted one by one only when one is; shapes repeat and
    are formatted once.
    """

    def __init__(self, metric_names: list[str], measure: MetricSpec | None) -> None:
        self.metric_names = metric_names
        self.measure = measure
        self._all_metrics = frozenset(metric_names)
        self._shapes: dict[tuple[int, ...], str] = {}

    def row(self, row: ComparisonRow) -> dict[str, Any]:
        """Return one row of the page's table."""
        key, golden = row.golden.key, row.golden
        metrics = row.metrics
        if self._all_metrics <= metrics.keys():  # every plotted metric measured (C-level attribute reads)
            results: list[MetricResult | None] = list(map(metrics.__getitem__, self.metric_names))
            values, warn, fail = (list(map(read, results)) for read in (_VALUE, _WARN, _FAIL))
            verdicts = [None if limit is None else verdict for verdict, limit in zip(map(_VERDICT, results), fail)]
            comparisons: list[str | None] = list(map(_COMPARISON, results))
        else:
            results = [metrics.get(name) for name in self.metric_names]
            values = [None if result is None else result.value for result in results]
            warn = [None if result is None else result.warn_threshold for result in results]
            fail = [None if result is None else result.fail_threshold for result in results]
            verdicts = [
                None if result is None or result.fail_threshold is None else result.verdict for result in results
            ]
            comparisons = [None if result is None else result.comparison for result in results]
        error = row_error(row, self.measure)
        feeder_error, growth, expected_error, noise_error = (
            row.feeder_error,
            row.growth,
            row.expected_error,
            row.noise_error,
        )
        sibling_growth = list(row.sibling_growth) if row.sibling_growth else None
        if not _finite([*values, *warn, *fail, error, feeder_error, growth, expected_error, noise_error]) or (
            sibling_growth is not None and not _finite(sibling_growth)
        ):
            values, warn, fail = _numbers(values), _numbers(warn), _numbers(fail)
            error, feeder_error, growth, expected_error, noise_error = _numbers(
                [error, feeder_error, growth, expected_error, noise_error]
            )
            sibling_growth = None if sibling_growth is None else _numbers(sibling_growth)
        shape = self._shapes.get(golden.shape)
        if shape is None:
            shape = self._shapes[golden.shape] = str(list(golden.shape))
        return {
            "id": row.index,
            "name": key.name,
            "call": key.call_index,
            "step": key.step,
            "io": key.io,
            "pos": key.position,
            "mn": row.my.key.name,
            "op": golden.op_type,
            "gd": golden.dtype,
            "md": row.my.dtype,
            "shape": shape,
            "v": row.verdict,
            "d": row.deciding_metric,
            "a": row.attribution,
            "rule": row.rule,
            "why": row.reason,
            "fb": list(row.fed_by),
            "ja": row.judged_as,
            "m": values,
            "wt": warn,
            "ft": fail,
            "mv": verdicts,
            "cmp": comparisons,
            "e": error,
            "fe": feeder_error,
            "g": growth,
            "x": expected_error,
            "ne": noise_error,
            "st": row.structure or placement(row).structure,
            "sg": sibling_growth,
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
    data, rows = _page_data(result)
    data["rows"] = list(rows)
    return data


def _page_data(result: CompareResult) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """Return the page's data but its table rows, and the rows (built as they are taken) in golden order."""
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
    return data, map(_Rows(metric_names, measure).row, sorted(result.rows, key=lambda row: row.golden.order))


#: Stands for the table rows in the encoded page data until they are written in its place.
_ROWS_STAND_IN = "\x00llmcheck table rows\x00"
#: Table rows encoded at a time: the page of a 10**5-pair compare holds ~50 MB of rows, never all at once.
_ROWS_PER_PART = 2048


def page_parts(result: CompareResult) -> Iterator[bytes]:
    """Yield the report page, UTF-8 encoded, in parts to write one after the other.

    The table rows -- 50 MB of the page for 10**5 pairs -- are built and encoded a few
    thousand at a time, so neither they nor their text are ever held whole; the parts join
    into exactly the bytes one encoding of all the data gives (msgspec writes a list as
    ``[a,b,...]``, without spaces).
    """
    template = resources.files(__package__).joinpath(TEMPLATE_NAME).read_text(encoding="utf-8").encode("utf-8")
    head, placeholder, tail = template.partition(DATA_PLACEHOLDER.encode("utf-8"))
    if not placeholder:
        yield template
        return
    data, rows = _page_data(result)
    data["rows"] = _ROWS_STAND_IN
    # msgspec writes the ~10**5 table rows of a decode dump several times faster than json.dumps;
    # the data is JSON-safe already (non-finite numbers are strings), and the page is UTF-8: the
    # encoded bytes go into the page as they are.
    before_rows, _, after_rows = msgspec.json.encode(data).partition(msgspec.json.encode(_ROWS_STAND_IN))
    yield head
    yield _script_safe(before_rows)
    yield b"["
    first = True
    while part := list(itertools.islice(rows, _ROWS_PER_PART)):
        encoded = msgspec.json.encode(part)[1:-1]
        yield _script_safe(encoded if first else b"," + encoded)
        first = False
    yield b"]"
    yield _script_safe(after_rows)
    yield tail


def _script_safe(payload: bytes) -> bytes:
    """Return JSON text that cannot end the ``<script>`` element holding it, nor trip older JS parsers."""
    # Inside <script>, "</" could close the element early; U+2028/9 (UTF-8 E2 80 A8/A9) break older JS parsers.
    if b"</" in payload:
        payload = payload.replace(b"</", b"<\\/")
    if b"\xe2\x80" in payload:
        payload = payload.replace("\u2028".encode(), b"\\u2028").replace("\u2029".encode(), b"\\u2029")
    return payload


def render_html(result: CompareResult) -> bytes:
    """Return the report page with its data embedded, UTF-8 encoded."""
    return b"".join(page_parts(result))


def write_html(result: CompareResult, path: Path) -> None:
    """Write report.html."""
    with atomic_output(path, "wb") as handle:
        handle.writelines(page_parts(result))
