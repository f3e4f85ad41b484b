"""``cmp_report.csv``: one row per pair, the seed tool's 24 columns first, then llmcheck's.

The first 24 columns are the seed tool's, in its order, so scripts written for
``msit llm compare`` keep working; llmcheck's columns follow, then any metric a plugin
added, then statistics columns. Cells a spreadsheet would run as a formula (starting
``= + - @``, not a number) are prefixed with ``'``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from operator import itemgetter
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


def _number(value: float | int | None) -> str:
    """Return a number cell as csv writes it: empty for ``None``, ``nan``/``inf``/``-inf`` as words, a float by ``repr``."""
    if value is None or value - value == 0:  # finite (NaN and infinities give NaN)
        return _csv_text(value)
    return describe(value)


def _csv_text(value: Any) -> str:
    """Return the text csv writes for a value that is not text: ``repr`` of a float, nothing for ``None``, else ``str``."""
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def _cell(value: Any) -> str:
    """Return a cell as csv writes it: text starting like a formula defused (:func:`guard_cell`), else as it is."""
    if isinstance(value, str):
        return guard_cell(value) if value[:1] in _FORMULA_FIRST else value
    return _csv_text(value)


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


#: The metric columns among the fixed ones, in header order: the seed's seven, then llmcheck's rmse and sqnr.
_FIXED_METRICS = (*SEED_METRICS, "rmse", "sqnr")
#: The columns that hold numbers, in the order :meth:`_Cells.row` lists them (the extra metric columns follow).
_NUMBER_COLUMNS = (
    *(f"{side}_{stat}_value" for side in ("golden", "my") for stat in ("max", "min", "mean")),
    *_FIXED_METRICS,
    "deciding_value",
    "warn_threshold",
    "fail_threshold",
    "golden_nan_count",
    "golden_inf_count",
    "my_nan_count",
    "my_inf_count",
    "nonfinite_mismatch",
    "error",
    "feeder_error",
    "growth",
    "expected_error",
    "noise_error",
)
#: The other fixed columns hold text; :meth:`_Cells.row` lists them in header order.
_TEXT_COLUMNS = tuple(column for column in (*SEED_COLUMNS, *OWN_COLUMNS) if column not in _NUMBER_COLUMNS)
#: The types whose ``repr`` is their csv text (``None`` aside, which is an empty cell), NaN and infinities included.
_REPR_TYPES = frozenset({float, int, bool, type(None)})


class _Cells:
    """Builds the cells of report rows in header order, as text (numbers as csv writes them).

    ~10**5 rows of 55+ cells make a decode dump's CSV. Each row is listed as its text
    cells and its numbers; the numbers become text in one ``repr`` of their list (the
    ``repr`` csv itself uses, without a call per cell), and one ``itemgetter`` puts all
    cells in header order. Shapes and dtypes repeat and are formatted once.
    """

    def __init__(self, header: Sequence[str]) -> None:
        self.extra_columns = tuple(header[len(SEED_COLUMNS) + len(OWN_COLUMNS) :])
        listed = {column: index for index, column in enumerate((*_TEXT_COLUMNS, *_NUMBER_COLUMNS, *self.extra_columns))}
        self._in_header_order = itemgetter(*(listed[column] for column in header))
        self._shapes: dict[tuple[int, ...], str] = {}
        self._dtypes: dict[str, str] = {}

    def _shape(self, shape: tuple[int, ...]) -> str:
        text = self._shapes.get(shape)
        if text is None:
            text = self._shapes[shape] = str(list(shape))
        return text

    def _dtype(self, dtype: str) -> str:
        text = self._dtypes.get(dtype)
        if text is None:
            text = self._dtypes[dtype] = guard_cell(f"torch.{dtype}")
        return text

    def row(self, row: ComparisonRow) -> tuple[str, ...]:
        """Return one report row's cells in header order, each the text csv writes for it."""
        golden, my = row.golden, row.my
        key = golden.key
        metrics = row.metrics
        sibling_growth = row.sibling_growth
        texts = [
            _cell(key.step),
            _cell(golden.attrs.get("data_id", row.index)),  # a manual mapping names it
            _cell(golden.source_path),
            _cell(golden.op_type or ""),
            self._dtype(golden.dtype),
            self._shape(golden.shape),
            _cell(my.source_path),
            _cell(my.op_type or ""),
            self._dtype(my.dtype),
            self._shape(my.shape),
            _cell(row.reason),
            _cell(key.name),
            _cell(key.step),
            _cell(key.io),
            _cell(key.position),
            _cell(key.call_index),
            _cell(my.key.name),
            _cell(row.verdict),
            _cell(row.deciding_metric or ""),
            _cell(row.judged_as),
            _cell(row.rule),
            _cell(row.attribution),
            _cell(" | ".join(row.fed_by)),
            _cell(row.structure),
            _cell(f"{describe(sibling_growth[0])}-{describe(sibling_growth[1])}") if sibling_growth else "",
            _cell(row.evidence),
        ]
        golden_stats, my_stats = row.golden_stats or _NO_STATS, row.my_stats or _NO_STATS
        deciding = metrics.get(row.deciding_metric or "") or _NO_RESULT
        numbers = [
            golden_stats.max,
            golden_stats.min,
            golden_stats.mean,
            my_stats.max,
            my_stats.min,
            my_stats.mean,
            *[None if (result := metrics.get(name)) is None else result.value for name in _FIXED_METRICS],
            deciding.value,
            deciding.warn_threshold,
            deciding.fail_threshold,
            golden_stats.nan_count,
            golden_stats.inf_count,
            my_stats.nan_count,
            my_stats.inf_count,
            row.nonfinite_mismatch,
            row.error,
            row.feeder_error,
            row.growth,
            row.expected_error,
            row.noise_error,
            *[None if (result := metrics.get(name)) is None else result.value for name in self.extra_columns],
        ]
        if _REPR_TYPES.issuperset(map(type, numbers)):
            # repr of a float is csv's text, and for NaN and infinities the words describe() gives;
            # no number's repr holds ", " or "None"
            texts += repr(numbers)[1:-1].replace("None", "").split(", ")
        else:
            texts += map(_number, numbers)
        return self._in_header_order(texts)


_NO_STATS = TensorStats()


class _NoResult:
    """The deciding metric's result of a row no metric decided: every cell empty."""

    value = warn_threshold = fail_threshold = None


_NO_RESULT = _NoResult()


def csv_rows(result: CompareResult, header: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """Yield each report row's cells in ``header`` order (a header from :func:`csv_header`)."""
    return map(_Cells(header).row, result.rows)


#: The shape columns: the only fixed cells that hold a comma (``[1, 1, 1024]``), so csv quotes them.
_GOLDEN_SHAPE, _MY_SHAPE = SEED_COLUMNS.index("golden_shape"), SEED_COLUMNS.index("my_shape")
_CSV_SPECIAL = (",", '"', "\r", "\n")


def _csv_field(text: str) -> str:
    """Return ``text`` as csv's default (excel) dialect writes it: quoted, its quotes doubled, if it holds , " CR or LF."""
    if any(special in text for special in _CSV_SPECIAL):
        return '"' + text.replace('"', '""') + '"'
    return text


class _CsvLines:
    """Turns rows of cells into the lines ``csv.writer`` writes for them, the common case without calling it.

    ``csv.writer`` looks at every character of every cell; for a row of text cells none
    of which needs quoting but the shapes, ``",".join`` gives
    the same line several times faster. Whether a row is plain is checked exactly on the
    joined text (no quote, no line break, no comma beyond the separators and the shapes');
    any other row goes through ``csv.writer`` itself.
    """

    def __init__(self) -> None:
        self._buffer = io.StringIO()
        self._writer = csv.writer(self._buffer)
        self._fields: dict[str, str] = {}

    def written_by_csv(self, cells: Sequence[Any]) -> str:
        """Return the line ``csv.writer`` writes for ``cells``."""
        self._buffer.seek(0)
        self._buffer.truncate()
        self._writer.writerow(cells)
        return self._buffer.getvalue()

    def line(self, cells: Sequence[str]) -> str:
        """Return the csv line of one report row: text cells (:meth:`_Cells.row`), shapes at their columns."""
        golden_shape, my_shape = cells[_GOLDEN_SHAPE], cells[_MY_SHAPE]
        head = ",".join(cells[:_GOLDEN_SHAPE])
        middle = ",".join(cells[_GOLDEN_SHAPE + 1 : _MY_SHAPE])
        tail = ",".join(cells[_MY_SHAPE + 1 :])
        unquoted = head + middle + tail
        if (
            unquoted.count(",") == len(cells) - 5  # the separators within the three parts: no comma in a cell
            and '"' not in unquoted
            and "\r" not in unquoted
            and "\n" not in unquoted
        ):
            fields = self._fields
            golden_field = fields.get(golden_shape) or fields.setdefault(golden_shape, _csv_field(golden_shape))
            my_field = fields.get(my_shape) or fields.setdefault(my_shape, _csv_field(my_shape))
            return f"{head},{golden_field},{middle},{my_field},{tail}\r\n"
        return self.written_by_csv(cells)


def write_csv(result: CompareResult, path: Path) -> None:
    """Write cmp_report.csv: one row per pair, in golden execution order."""
    header = csv_header(result)
    lines = _CsvLines()
    with atomic_output(path, "w", newline="", encoding="utf-8") as handle:
        handle.write(lines.written_by_csv(header))
        handle.writelines(map(lines.line, csv_rows(result, header)))
