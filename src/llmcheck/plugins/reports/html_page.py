"""report.html: one self-contained file (inline CSS and JS, no network) a user opens in any browser.

The page tells the story first: one sentence (what was compared, the verdict, the culprit
and its evidence, the output effect), then the headline chart -- the error measure along the
model's depth, the error the verdict expected as a line, the introduced divergence marked and
named -- and the module heat map (layers down, submodule kinds across, each cell coloured by its
error over the error the verdict expected there). The per-metric
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
    MetricSpec,
    RowFields,
    atomic_output,
    depth_points,
    drawn_step,
    error_measure,
    field_blocks,
    golden_order,
    heatmap,
    introduced_point,
    json_safe,
    metric_columns,
    metric_names,
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


def _json_numbers(values: list[Any]) -> list[Any]:
    """Return a column of numbers (and ``None``) JSON can hold, converting value by value only when one is not finite.

    The sum of the truthy values is finite when each is (``None`` and zeros are left out, and
    a sum overflowing to infinity only sends the column the slow way); a value of another
    type makes the column go value by value too.
    """
    try:
        if math.isfinite(sum(filter(None, values))):
            return values
    except (TypeError, OverflowError):
        pass
    if set(map(type, values)) <= _PLAIN_NUMBERS:  # NaN and infinities are the floats whose value - value is not 0
        return [value if value is None or not value - value else json_safe(value) for value in values]
    return list(map(_number, values))


class _PageRow(msgspec.Struct, gc=False):
    """One row of the page's table, its fields in the order of the JSON object msgspec writes for it."""

    id: int
    name: str
    call: int
    step: int
    io: str
    pos: str
    mn: str
    op: Any
    gd: str
    md: str
    shape: str
    v: str
    d: Any
    a: str
    rule: str
    why: str
    fb: Any
    ja: str
    m: Any
    wt: Any
    ft: Any
    mv: Any
    cmp: Any
    e: Any
    fe: Any
    g: Any
    x: Any
    ne: Any
    st: str
    sg: Any
    sc: int
    ev: str


_NONE = type(None)
_NOTHING, _PLAIN_NUMBERS = frozenset({_NONE}), frozenset({float, int, _NONE})
_KEY = attrgetter("key")
_NAME, _CALL, _STEP, _IO, _POSITION = map(attrgetter, ("name", "call_index", "step", "io", "position"))
_OP, _DTYPE, _SHAPE = map(attrgetter, ("op_type", "dtype", "shape"))
_ROW_FIELDS = (
    "verdict",
    "deciding_metric",
    "attribution",
    "rule",
    "reason",
    "fed_by",
    "judged_as",
    "error",
    "feeder_error",
    "growth",
    "expected_error",
    "noise_error",
    "structure",
    "sibling_growth",
    "sibling_count",
    "evidence",
)


class _Rows:
    """Builds the page's table rows a block at a time, column by column, JSON-safe already.

    ~10**5 rows in a decode dump: each field is read for the whole block with C-level
    ``attrgetter``/``map``, each metric's values, thresholds and verdicts as a column (a
    column is checked for NaN and infinities in one sum and converted value by value only
    when it holds one), and the rows are msgspec structs built by one ``map``, which msgspec
    encodes as the JSON objects a dict of the same keys would give. Shapes repeat and are
    formatted once.
    """

    def __init__(self, metric_names: list[str], measure: MetricSpec | None) -> None:
        self.metric_names = metric_names
        self.measure = measure
        self._shapes: dict[tuple[int, ...], str] = {}

    def block(self, fields: RowFields) -> list[_PageRow]:
        """Return the table rows of the rows ``fields`` holds."""
        count = len(fields)
        goldens, mys = fields.golden, fields.my
        keys = list(map(_KEY, goldens))
        (
            verdicts,
            deciding,
            attributions,
            rules,
            reasons,
            fed_by,
            judged_as,
            errors,
            feeder_errors,
            growths,
            expected_errors,
            noise_errors,
            structures,
            sibling_growths,
            sibling_counts,
            evidence,
        ) = (getattr(fields, name) for name in _ROW_FIELDS)
        metrics = fields.metrics
        by_metric = [self._metric_column(columns) for columns in metric_columns(metrics, self.metric_names)]
        if by_metric:  # each of the five fields: the metrics' columns turned into one tuple per row
            values, warn, fail, metric_verdicts, comparisons = ([*zip(*field)] for field in zip(*by_metric))
        else:
            values = warn = fail = metric_verdicts = comparisons = [()] * count
        if _NONE in set(map(type, errors)):
            errors = [row_error(row, self.measure) for row in fields.rows()]
        if not all(structures):  # a row the verdict placed nowhere: placed by its name
            structures = [structure or placement(row).structure for structure, row in zip(structures, fields.rows())]
        growth_values = list(itertools.chain.from_iterable(filter(None, sibling_growths)))
        if _json_numbers(growth_values) is growth_values:  # all finite
            sibling_growths = [growth or None for growth in sibling_growths]
        else:
            sibling_growths = [_json_numbers(list(growth)) if growth else None for growth in sibling_growths]
        return list(
            map(
                _PageRow,
                fields.index,
                map(_NAME, keys),
                map(_CALL, keys),
                map(_STEP, keys),
                map(_IO, keys),
                map(_POSITION, keys),
                map(_NAME, map(_KEY, mys)),
                map(_OP, goldens),
                map(_DTYPE, goldens),
                map(_DTYPE, mys),
                self._shape_texts(list(map(_SHAPE, goldens))),
                verdicts,
                deciding,
                attributions,
                rules,
                reasons,
                fed_by,
                judged_as,
                values,
                warn,
                fail,
                metric_verdicts,
                comparisons,
                _json_numbers(errors),
                _json_numbers(feeder_errors),
                _json_numbers(growths),
                _json_numbers(expected_errors),
                _json_numbers(noise_errors),
                structures,
                sibling_growths,
                sibling_counts,
                evidence,
            )
        )

    @staticmethod
    def _metric_column(columns: tuple[list[Any], ...]) -> tuple[list[Any], ...]:
        """Return one metric's values, warn and fail thresholds, verdicts (where it has thresholds) and comparison signs."""
        values, metric_verdicts, warn, fail, higher = columns
        directions = set(higher)
        if len(directions) == 1 and None not in directions:  # every row measured, one direction
            comparisons: list[str | None] = [("<" if directions.pop() else ">")] * len(values)
        else:
            comparisons = [None if up is None else ("<" if up else ">") for up in higher]
        limits = set(map(type, fail))
        if limits == _NOTHING:  # a metric without thresholds (or measured nowhere) gives no verdict
            verdicts: list[str | None] = [None] * len(values)
        elif _NONE in limits:
            verdicts = [None if limit is None else verdict for verdict, limit in zip(metric_verdicts, fail)]
        else:
            verdicts = metric_verdicts
        return _json_numbers(values), _json_numbers(warn), _json_numbers(fail), verdicts, comparisons

    def _shape_texts(self, shapes: list[tuple[int, ...]]) -> list[str]:
        known = self._shapes
        for shape in set(shapes).difference(known):
            known[shape] = str(list(shape))
        return list(map(known.__getitem__, shapes))


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
    data, blocks = _page_data(result)
    data["rows"] = msgspec.json.decode(msgspec.json.encode([row for block in blocks for row in block]))
    return data


def _page_data(result: CompareResult) -> tuple[dict[str, Any], Iterator[list[_PageRow]]]:
    """Return the page's data but its table rows, and the rows (built as they are taken) in golden order, in blocks."""
    from llmcheck.plugin_api import DECIDING_STAT
    from llmcheck.plugins.reports.story import story

    plotted = [(spec.name, spec.higher_is_better) for spec in result.metric_specs]
    if DECIDING_STAT in metric_names(result.rows):  # statistics-only pairs: plot what judged them
        plotted.append((DECIDING_STAT, False))
    plotted_names = [name for name, _ in plotted]
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
    blocks = field_blocks(result.rows, _ROWS_PER_PART, golden_order(result.rows))
    return data, map(_Rows(plotted_names, measure).block, blocks)


#: Stands for the table rows in the encoded page data until they are written in its place.
_ROWS_STAND_IN = "\x00llmcheck table rows\x00"
#: Table rows built and encoded at a time: the page of a 10**5-pair compare holds ~50 MB of rows, never all at
#: once; a few hundred rows' columns stay in the processor's cache while they are read.
_ROWS_PER_PART = 512


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
    data, blocks = _page_data(result)
    data["rows"] = _ROWS_STAND_IN
    # msgspec writes the ~10**5 table rows of a decode dump several times faster than json.dumps;
    # the data is JSON-safe already (non-finite numbers are strings), and the page is UTF-8: the
    # encoded bytes go into the page as they are.
    before_rows, _, after_rows = msgspec.json.encode(data).partition(msgspec.json.encode(_ROWS_STAND_IN))
    yield head
    yield _script_safe(before_rows)
    yield b"["
    first = True
    for block in blocks:
        encoded = msgspec.json.encode(block)[1:-1]
        yield _script_safe(encoded if first else b"," + encoded)
        first = False
    yield b"]"
    yield _script_safe(after_rows)
    yield tail


def _script_safe(payload: bytes) -> bytes:
    """Return JSON text that cannot end the ``<script>`` element holding it, nor trip older JS parsers."""
    # Inside <script>, "</" could close the element early; U+2028/9 (UTF-8 E2 80 A8/A9) break older JS parsers.
    # A rare byte is looked for first: one byte's search (memchr) is ten times faster than two bytes', and most
    # parts hold neither "<" nor E2 -- "/" would not do: op record names hold one (module/op).
    if b"<" in payload and b"</" in payload:
        payload = payload.replace(b"</", b"<\\/")
    if b"\xe2" in payload and b"\xe2\x80" in payload:
        payload = payload.replace("\u2028".encode(), b"\\u2028").replace("\u2029".encode(), b"\\u2029")
    return payload


def render_html(result: CompareResult) -> bytes:
    """Return the report page with its data embedded, UTF-8 encoded."""
    return b"".join(page_parts(result))


def write_html(result: CompareResult, path: Path) -> None:
    """Write report.html."""
    with atomic_output(path, "wb") as handle:
        handle.writelines(page_parts(result))
