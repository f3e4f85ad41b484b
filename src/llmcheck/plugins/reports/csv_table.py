"""``cmp_report.csv``: one row per pair, the seed tool's 24 columns first, then llmcheck's.

The first 24 columns are the seed tool's, in its order, so scripts written for
``msit llm compare`` keep working; llmcheck's columns follow, then any metric a plugin
added, then statistics columns. Cells a spreadsheet would run as a formula (starting
``= + - @``, not a number) are prefixed with ``'``.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Mapping, Sequence
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcheck.plugin_api import (
    MetricResult,
    RowFields,
    TensorStats,
    atomic_output,
    describe,
    field_blocks,
    metric_columns,
    metric_names,
    metric_values,
)
from llmcheck.plugins.reports.number_texts import repr_texts

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
        *statistics_columns([metric_names(result.rows)]),
    ]


#: The metric columns among the fixed ones, in header order: the seed's seven, then llmcheck's rmse and sqnr.
_FIXED_METRICS = (*SEED_METRICS, "rmse", "sqnr")
#: The columns that hold numbers, in the order :meth:`_Columns._number_columns` lists them (the extra metric columns follow).
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
#: The other fixed columns hold text; :meth:`_Columns._text_columns` lists them in header order.
_TEXT_COLUMNS = tuple(column for column in (*SEED_COLUMNS, *OWN_COLUMNS) if column not in _NUMBER_COLUMNS)
_STR_TYPE, _FLOAT_TYPE = frozenset({str}), frozenset({float})


_NO_STATS = TensorStats()


_CSV_SPECIAL = (",", '"', "\r", "\n")


def _csv_field(text: str) -> str:
    """Return ``text`` as csv's default (excel) dialect writes it: quoted, its quotes doubled, if it holds , " CR or LF."""
    if any(special in text for special in _CSV_SPECIAL):
        return '"' + text.replace('"', '""') + '"'
    return text


#: Rows formatted together by :class:`_Columns`: a few hundred, whose text stays in the processor's cache.
_ROWS_PER_BLOCK = 256
_KEY, _SOURCE, _DTYPE, _SHAPE = attrgetter("key"), attrgetter("source_path"), attrgetter("dtype"), attrgetter("shape")
_STEP, _NAME, _IO, _POSITION, _CALL = map(attrgetter, ("step", "name", "io", "position", "call_index"))
_ROW_NUMBERS = ("nonfinite_mismatch", "error", "feeder_error", "growth", "expected_error", "noise_error")


def _stats_columns(all_stats: Sequence[TensorStats | None]) -> list[list[Any]]:
    """Return the six columns (min, max, mean, L2 norm, NaN and Inf counts) of statistics, a row's ``None`` as no values."""
    values = [(stats or _NO_STATS).values() for stats in all_stats]
    return [list(column) for column in zip(*values)] if values else [[] for _ in range(6)]


def _text_fields(values: list[Any]) -> list[str]:
    """Return the csv fields of a text column: :func:`_cell` of each value, quoted as csv quotes it.

    A column's distinct texts are looked at once for what needs care (most columns hold a
    few distinct texts, none starting like a formula or holding , " CR or LF); a column
    holding one has each distinct text guarded and quoted once (a statistics-only compare
    gives every row the same ``cmp_fail_reason``, holding a comma).
    """
    if set(map(type, values)) == _STR_TYPE:
        distinct = set(values)
        joined = "".join(distinct)
        if _FORMULA_FIRST.isdisjoint({text[:1] for text in distinct}) and not any(
            special in joined for special in _CSV_SPECIAL
        ):
            return values
        if len(distinct) == len(values):
            return list(map(_text_field, values))
        fields = {text: _text_field(text) for text in distinct}
        return list(map(fields.__getitem__, values))
    return repr_texts([values], _text_field)[0]


def _text_field(value: Any) -> str:
    """Return the csv field of a text cell's value: :func:`_cell`, quoted should it need it."""
    return _csv_field(_cell(value))


def _number_field(value: Any) -> str:
    """Return the csv field of a number cell's value: :func:`_number`, quoted should its text need it."""
    return _csv_field(_number(value))


def _described(values: list[Any]) -> list[str]:
    """Return :func:`describe` of each value: for floats ``format(value, ".6g")``, which gives the same words."""
    if _FLOAT_TYPE.issuperset(map(type, values)):
        return list(map(format, values, itertools.repeat(".6g")))
    return list(map(describe, values))


class _Columns:
    """Builds the csv text of report rows a block at a time, column by column: the lines ``csv.writer`` writes.

    Built row by row, a row spends its time in the Python of ~55 cells, and ``repr`` in
    formatting ~25 floats (``tests/test_report_formats.py`` keeps that plain way, as what
    this must equal). Here each column is read with C-level ``attrgetter`` and
    ``map``; a text column's distinct texts are looked at once for formula starts and for
    what csv quotes (:func:`_text_fields`); the numbers of the block are formatted at once
    (:func:`~llmcheck.plugins.reports.number_texts.repr_texts`); shapes and dtypes are
    formatted once each; the rows are joined in one pass. Blocks of a few hundred rows keep
    the block's text in the processor's cache.
    """

    def __init__(self, header: Sequence[str]) -> None:
        self.extra_columns = tuple(header[len(SEED_COLUMNS) + len(OWN_COLUMNS) :])
        listed = {column: index for index, column in enumerate((*_TEXT_COLUMNS, *_NUMBER_COLUMNS, *self.extra_columns))}
        self._in_header_order = itemgetter(*(listed[column] for column in header))
        self._dtypes: dict[str, str] = {}
        self._shapes: dict[tuple[int, ...], str] = {}

    def text(self, fields: RowFields) -> str:
        """Return the csv lines of the rows ``fields`` holds, each ending in CRLF."""
        if not len(fields):
            return ""
        columns = self._in_header_order([*self._text_columns(fields), *self._number_columns(fields)])
        return "\r\n".join(map(",".join, zip(*columns))) + "\r\n"

    def _text_columns(self, fields: RowFields) -> list[list[str]]:
        """Return the fields of the text columns, in the order of ``_TEXT_COLUMNS``."""
        goldens, mys = fields.golden, fields.my
        keys = list(map(_KEY, goldens))
        steps = _text_fields(list(map(_STEP, keys)))
        return [
            steps,
            _text_fields([golden.attrs.get("data_id", index) for golden, index in zip(goldens, fields.index)]),
            _text_fields(list(map(_SOURCE, goldens))),
            _text_fields([golden.op_type or "" for golden in goldens]),
            self._dtype_fields(list(map(_DTYPE, goldens))),
            self._shape_fields(list(map(_SHAPE, goldens))),
            _text_fields(list(map(_SOURCE, mys))),
            _text_fields([my.op_type or "" for my in mys]),
            self._dtype_fields(list(map(_DTYPE, mys))),
            self._shape_fields(list(map(_SHAPE, mys))),
            _text_fields(fields.reason),
            _text_fields(list(map(_NAME, keys))),
            steps,
            _text_fields(list(map(_IO, keys))),
            _text_fields(list(map(_POSITION, keys))),
            _text_fields(list(map(_CALL, keys))),
            _text_fields([my.key.name for my in mys]),
            _text_fields(fields.verdict),
            _text_fields([deciding or "" for deciding in fields.deciding_metric]),
            _text_fields(fields.judged_as),
            _text_fields(fields.rule),
            _text_fields(fields.attribution),
            _text_fields([" | ".join(fed_by) for fed_by in fields.fed_by]),
            _text_fields(fields.structure),
            _text_fields(_sibling_growth(fields.sibling_growth)),
            _text_fields(fields.evidence),
        ]

    def _number_columns(self, fields: RowFields) -> list[list[str]]:
        """Return the fields of the number columns, in the order of ``_NUMBER_COLUMNS`` and then the extra ones."""
        # each side's six statistics read at once a row (a record's are a row of columns), then as columns
        golden_mins, golden_maxes, golden_means, _, golden_nans, golden_infs = _stats_columns(fields.golden_stats)
        my_mins, my_maxes, my_means, _, my_nans, my_infs = _stats_columns(fields.my_stats)
        metrics = fields.metrics
        numbers = [
            golden_maxes,
            golden_mins,
            golden_means,
            my_maxes,
            my_mins,
            my_means,
            *metric_values(metrics, _FIXED_METRICS),
            *_deciding_columns(metrics, [deciding or "" for deciding in fields.deciding_metric]),
            golden_nans,
            golden_infs,
            my_nans,
            my_infs,
            *(list(getattr(fields, name)) for name in _ROW_NUMBERS),
            *metric_values(metrics, self.extra_columns),
        ]
        return repr_texts(numbers, _number_field)

    def _dtype_fields(self, dtypes: list[str]) -> list[str]:
        known = self._dtypes
        for dtype in set(dtypes).difference(known):
            known[dtype] = _csv_field(guard_cell(f"torch.{dtype}"))
        return list(map(known.__getitem__, dtypes))

    def _shape_fields(self, shapes: list[tuple[int, ...]]) -> list[str]:
        known = self._shapes
        for shape in set(shapes).difference(known):
            known[shape] = _csv_field(str(list(shape)))
        return list(map(known.__getitem__, shapes))


def _deciding_columns(rows_metrics: list[Mapping[str, MetricResult]], deciding: list[str]) -> list[list[Any]]:
    """Return the value, warn and fail threshold of each row's deciding metric (``None`` where the row holds none).

    Read as columns (:func:`~llmcheck.core.records.metric_columns`) for the few distinct
    deciding metrics, then picked row by row: asking each row for its deciding
    :class:`MetricResult` made one object per row only to read three of its fields.
    """
    names = list(dict.fromkeys(deciding))
    by_name = dict(zip(names, metric_columns(rows_metrics, names)))
    if len(names) == 1:
        values, _, warn, fail, _ = by_name[names[0]]
        return [values, warn, fail]
    chosen = list(map(by_name.__getitem__, deciding))
    return [[columns[field][index] for index, columns in enumerate(chosen)] for field in (0, 2, 3)]


def _sibling_growth(growths: list[tuple[float, float] | None]) -> list[str]:
    """Return the ``lowest-highest`` growth texts of rows' ``sibling_growth`` (empty where a row has none)."""
    present = [growth for growth in growths if growth]
    lowest, highest = _described([low for low, _ in present]), _described([high for _, high in present])
    texts = iter(map("{}-{}".format, lowest, highest))
    return [next(texts) if growth else "" for growth in growths]


def write_csv(result: CompareResult, path: Path) -> None:
    """Write cmp_report.csv: one row per pair, in golden execution order."""
    header = csv_header(result)
    columns = _Columns(header)
    with atomic_output(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerow(header)
        for fields in field_blocks(result.rows, _ROWS_PER_BLOCK):
            handle.write(columns.text(fields))
