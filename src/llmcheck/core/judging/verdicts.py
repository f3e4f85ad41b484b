"""Verdicts: judge a pair's metric values against the thresholds of its dtype class, with user overrides.

A pair is judged by the *less precise* of its two dtypes (fp32 golden against bf16 my is
held to bf16 thresholds), and never more tightly than the dtype most tensors of either run
have (an fp32 softmax inside a bf16 run is held to bf16 too). The thresholds come from each
metric's own table (:attr:`MetricSpec.thresholds`); a ``--thresholds`` file overrides them
per record-name pattern::

    # thresholds.yaml (JSON works too): later entries win
    - {pattern: "*", metric: relative_euclidean_distance, dtype: fp32, warn: 1e-4, fail: 1e-3}
    - {pattern: "lm_head*", metric: cosine_similarity, warn: 0.999, fail: 0.99}

The verdict of a row is the worst of its metrics' verdicts; the deciding metric is the first
metric (in table order) that gave it.
"""

from __future__ import annotations

import fnmatch
import logging
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, cast

import numpy as np

from llmcheck.core.dtypes import dtype_class
from llmcheck.core.errors import LlmcheckError, UsageError, closest_name
from llmcheck.core.records import (
    VERDICT_FAIL,
    VERDICT_PASS,
    VERDICT_WARN,
    ComparisonRow,
    JudgedMetrics,
    MetricLayout,
    MetricResult,
    MetricSpec,
    held_values,
)

#: Float dtype classes from most to least precise; a pair is judged by the later of its two.
PRECISION_ORDER = ("fp64", "fp32", "fp16", "bf16", "fp8")
#: A representative dtype name of each class, for :meth:`MetricSpec.thresholds_for`.
_CLASS_DTYPE = {
    "fp64": "float64",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
    "int": "int64",
    "bool": "bool",
}
_COMPLEX_CLASS = {"complex128": "fp64", "complex64": "fp32", "complex32": "fp16"}
_SEVERITY = {VERDICT_PASS: 0, VERDICT_WARN: 1, VERDICT_FAIL: 2}
#: At most this many metrics' verdict codes number a pattern exactly (3**39 < 2**63): more, and the rows are judged alone.
_PATTERN_METRICS = 39

log = logging.getLogger("llmcheck.verdicts")

#: The pseudo-metric named when one side holds NaN/Inf where the other does not.
NONFINITE_METRIC = "nonfinite_mismatch"


def _class_of(dtype: str) -> str:
    return _COMPLEX_CLASS.get(dtype, dtype_class(dtype))


def least_precise(classes: Sequence[str]) -> str | None:
    """Return the least precise of some float classes (``None`` when there are none)."""
    return max(classes, key=PRECISION_ORDER.index, default=None)


def golden_more_precise(golden_dtype: str, judged_as: str) -> bool:
    """Return whether a golden record is of a more precise float class than its pair is judged as.

    Why: a pair is judged as the less precise of its runs (:func:`judging_class`), so an fp32
    op inside a bf16 run -- a norm computed upcast -- is judged as bf16 against an fp32 golden:
    its records' dtypes agree, but the two runs do not. The error it holds is the bf16 run's
    rounding, carried in, as in any pair across precisions.
    """
    golden_class = _class_of(golden_dtype)
    return (
        golden_class in PRECISION_ORDER
        and judged_as in PRECISION_ORDER
        and PRECISION_ORDER.index(golden_class) < PRECISION_ORDER.index(judged_as)
    )


def run_precision(dtypes: Sequence[str]) -> str | None:
    """Return the float class most tensors of a run have (``None`` for a run without floats)."""
    counts: Counter[str] = Counter()
    for dtype, count in Counter(dtypes).items():  # classes of the distinct dtypes only, in first-seen order
        name = _class_of(dtype)
        if name in PRECISION_ORDER:
            counts[name] += count
    return counts.most_common(1)[0][0] if counts else None


def run_dtype(dtypes: Sequence[str]) -> str | None:
    """Return a dtype name of the float class most tensors of a run have (``None`` for a run without floats)."""
    precision = run_precision(dtypes)
    return _CLASS_DTYPE[precision] if precision else None


@cache
def judging_class(golden_dtype: str, my_dtype: str, run_floor: str | None = None) -> str:
    """Return the dtype class a pair is judged as: the least precise float class, else int or bool.

    ``run_floor`` is the least precise of the two runs' :func:`run_precision`: an fp32 op
    inside a bf16 run computes on bf16-rounded values and carries bf16 error, so a float pair
    is never held to a tighter class than its runs.
    """
    classes = [_class_of(golden_dtype), _class_of(my_dtype)]
    floats = [name for name in classes if name in PRECISION_ORDER]
    if floats:
        return least_precise(floats + ([run_floor] if run_floor else [])) or floats[0]
    return "bool" if classes == ["bool", "bool"] else "int"


@dataclass(frozen=True)
class ThresholdOverride:
    """One ``--thresholds`` entry: for records whose name matches ``pattern``, this metric's (warn, fail)."""

    pattern: str
    metric: str
    warn: float
    fail: float
    dtype_class: str | None = None  # None: every dtype class

    def applies(self, name: str, metric: str, judged_class: str) -> bool:
        """Return whether this entry sets the thresholds of ``metric`` for record ``name``."""
        return (
            metric == self.metric
            and (self.dtype_class in (None, judged_class))
            and fnmatch.fnmatchcase(name, self.pattern)
        )

    def as_json(self) -> dict[str, Any]:
        """Return the entry as the thresholds file writes it (``summary.json`` lists the overrides in effect)."""
        return {
            "pattern": self.pattern,
            "metric": self.metric,
            "dtype": self.dtype_class,
            "warn": self.warn,
            "fail": self.fail,
        }


_OVERRIDE_KEYS = ("pattern", "metric", "warn", "fail", "dtype")
_FILE_SHAPE = "a thresholds file is a list of {pattern, metric, warn, fail[, dtype]} entries"
#: How many of the entries that apply to no pair the warning names (the count says the rest).
ENTRIES_NAMED = 5


def load_threshold_overrides(
    path: Path,
    known_metrics: Sequence[str] | Mapping[str, MetricSpec],
    registered_metrics: Sequence[str],
) -> list[ThresholdOverride]:
    """Return the entries of a ``--thresholds`` file (JSON or YAML list), checked against the known metrics.

    ``known_metrics`` are the metrics this compare measures; ``registered_metrics`` all that
    plugins register: an entry naming one of those that ``--metric`` left out is told so, not
    called unknown. Given the metric specs (not just names), each
    entry's ``warn`` must be no worse than its ``fail`` in the metric's direction: a reversed
    pair would silently never warn. Every problem is a :class:`UsageError` naming the file,
    an empty or unparsable file included: the file is an argument like any other.
    """
    from llmcheck.core.dumps.structured_file import read_structured_file

    path = Path(path)
    try:
        blank = path.is_file() and not path.read_bytes().strip()
    except OSError:
        blank = False  # read_structured_file below says why the file cannot be read
    try:
        entries = None if blank else read_structured_file(path)
    except LlmcheckError as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(exc.what, where=exc.where, hint=exc.hint) from exc
    if isinstance(entries, Mapping) and "thresholds" in entries:
        entries = entries["thresholds"]
    if entries is None:
        # A zero-byte file is most often a generator that failed: judging by the default
        # table instead would hide that. An explicit empty list ([]) is no overrides.
        raise UsageError(
            "the file is empty", where=path, hint=f"{_FILE_SHAPE}; leave out --thresholds to use the default table"
        )
    if not isinstance(entries, list):
        raise UsageError(_FILE_SHAPE, where=path)
    return [
        _override(entry, position, path, known_metrics, registered_metrics)
        for position, entry in enumerate(entries, start=1)
    ]


def _override(
    entry: object,
    position: int,
    path: Path,
    known_metrics: Sequence[str] | Mapping[str, MetricSpec],
    registered_metrics: Sequence[str],
) -> ThresholdOverride:
    """Return one checked entry of a thresholds file (``position`` counts from 1)."""
    if not isinstance(entry, Mapping):
        raise UsageError(f"entry {position} is not a mapping", where=path, hint=_FILE_SHAPE)
    unknown_keys = [str(key) for key in entry if key not in _OVERRIDE_KEYS]
    if unknown_keys:
        raise UsageError(
            f"entry {position} has unknown key {unknown_keys[0]!r}",
            where=path,
            hint=f"keys: {', '.join(_OVERRIDE_KEYS)}",
        )
    missing = [key for key in ("metric", "warn", "fail") if key not in entry]
    if missing:
        raise UsageError(f"entry {position} lacks {', '.join(missing)}", where=path)
    pattern = entry.get("pattern", "*")
    if not isinstance(pattern, str) or not pattern:
        raise UsageError(
            f"entry {position}: pattern must be a non-empty name pattern, not {pattern!r}",
            where=path,
            hint="a glob over the whole record name, such as 'model.layers.*.mlp'; leave it out for every record",
        )
    metric = entry["metric"]
    if not isinstance(metric, str) or metric not in known_metrics:
        raise _metric_not_measured(metric, position, path, known_metrics, registered_metrics)
    dtype = entry.get("dtype")
    if dtype is not None and (not isinstance(dtype, str) or dtype not in _CLASS_DTYPE):
        raise UsageError(
            f"entry {position} names unknown dtype class {dtype!r}",
            where=path,
            hint=f"known: {', '.join(_CLASS_DTYPE)}",
        )
    limits = (entry["warn"], entry["fail"])
    try:
        if any(isinstance(limit, bool) for limit in limits):  # YAML's yes/no: float() would take them as 1 and 0
            raise TypeError("a boolean is not a threshold")
        warn, fail = float(limits[0]), float(limits[1])
    except (TypeError, ValueError):
        warn = fail = math.nan
    if not (math.isfinite(warn) and math.isfinite(fail)):
        # NaN compares false with everything: a NaN limit would pass every value without a word.
        raise UsageError(
            f"entry {position}: warn and fail must be finite numbers",
            where=path,
            hint=f"got warn {limits[0]!r}, fail {limits[1]!r}",
        )
    spec = known_metrics.get(metric) if isinstance(known_metrics, Mapping) else None
    if spec is not None and (warn < fail if spec.higher_is_better else warn > fail):
        direction = "higher" if spec.higher_is_better else "lower"
        raise UsageError(
            f"entry {position}: warn {warn:g} is past fail {fail:g} ({metric} is better "
            f"{direction}, so warn must come before fail)",
            where=path,
        )
    return ThresholdOverride(pattern=pattern, metric=metric, warn=warn, fail=fail, dtype_class=dtype)


def _metric_not_measured(
    metric: object,
    position: int,
    path: Path,
    known_metrics: Sequence[str] | Mapping[str, MetricSpec],
    registered_metrics: Sequence[str],
) -> UsageError:
    """Return the error for an entry whose metric this compare does not measure: left out by --metric, or unknown."""
    if isinstance(metric, str) and metric in registered_metrics:
        return UsageError(
            f"entry {position} sets thresholds for {metric!r}, a registered metric that --metric does not select",
            where=path,
            hint=f"add {metric} to --metric to judge it, or remove the entry",
        )
    close = closest_name(metric, registered_metrics) if isinstance(metric, str) else None
    return UsageError(
        f"entry {position} names unknown metric {metric!r}" + (f" (did you mean {close}?)" if close else ""),
        where=path,
        hint=f"registered metrics: {', '.join(registered_metrics) or 'none'}",
    )


def unmatched_overrides(overrides: Sequence[ThresholdOverride], rows: Iterable[ComparisonRow]) -> list[str]:
    """Return the entries that apply to no row of a compare, each as ``entry N 'pattern' for metric (why)``.

    An entry is matched against the golden record's name, as the verdict is, and against
    the dtype class the row was judged as when it names one. A typo in a pattern (or a
    pattern that forgets the glob covers the whole name) would otherwise change nothing
    without a word.
    """
    judged: dict[tuple[str, str], None] = {}  # (golden name, judged class): decode dumps repeat each per step
    my_names: dict[str, None] = {}
    for row in rows:
        judged.setdefault((row.golden.key.name, row.judged_as), None)
        my_names.setdefault(row.my.key.name, None)
    golden_names = list(dict.fromkeys(name for name, _ in judged))
    idle: list[str] = []
    for position, override in enumerate(overrides, start=1):
        classes = {judged_class for name, judged_class in judged if fnmatch.fnmatchcase(name, override.pattern)}
        if not classes:
            if any(fnmatch.fnmatchcase(name, override.pattern) for name in my_names):
                why = "only my-run names match it; patterns match the golden name"
            else:
                why = "no compared record has a name like it"
                # only for the entries the warning names: each looks through every name
                closest = (
                    closest_name(override.pattern, golden_names, cutoff=0.8) if len(idle) < ENTRIES_NAMED else None
                )
                if closest:
                    why += f"; closest name: {closest!r}"
        elif override.dtype_class is not None and not classes & {override.dtype_class, ""}:  # "": not judged
            why = f"the records it names are judged as {', '.join(sorted(classes))}, not {override.dtype_class}"
        else:
            continue
        idle.append(f"entry {position} {override.pattern!r} for {override.metric} ({why})")
    return idle


def warn_unmatched_overrides(
    path: Path, overrides: Sequence[ThresholdOverride], rows: Iterable[ComparisonRow]
) -> list[str]:
    """Log one warning naming the ``--thresholds`` entries that apply to no pair; return them.

    ``compare`` calls it once the rows are judged (:func:`unmatched_overrides` says how an
    entry is matched); like ``--mapping``'s entries that pair nothing, it is a warning, not
    an error: a thresholds file may be shared by runs that lack some modules.
    """
    idle = unmatched_overrides(overrides, rows)
    if idle:
        log.warning(
            "%s: %d of the %d entries apply to no compared pair: %s%s; a pattern is a glob over the whole golden name",
            path,
            len(idle),
            len(overrides),
            "; ".join(idle[:ENTRIES_NAMED]),
            f"; and {len(idle) - ENTRIES_NAMED} more" if len(idle) > ENTRIES_NAMED else "",
        )
    return idle


def thresholds_for(
    spec: MetricSpec, name: str, judged_class: str, overrides: Sequence[ThresholdOverride]
) -> tuple[float, float] | None:
    """Return the (warn, fail) a metric applies to record ``name`` of ``judged_class``, or None."""
    for override in reversed(overrides):
        if override.applies(name, spec.name, judged_class):
            return override.warn, override.fail
    return spec.thresholds_for(_CLASS_DTYPE.get(judged_class, "float32"))


def _metric_verdict(value: float, higher_is_better: bool, warn: float, fail: float) -> str:
    if math.isnan(value):
        return VERDICT_FAIL
    if value < fail if higher_is_better else value > fail:
        return VERDICT_FAIL
    if value < warn if higher_is_better else value > warn:
        return VERDICT_WARN
    return VERDICT_PASS


#: The verdicts :func:`verdict_codes` gives, by code.
VERDICT_OF_CODE = (VERDICT_PASS, VERDICT_WARN, VERDICT_FAIL)


def verdict_codes(values: np.ndarray, higher_is_better: bool, warn: float, fail: float) -> np.ndarray:
    """Return the verdict of each of a metric's values (float64), coded as :data:`VERDICT_OF_CODE` orders them.

    The verdict a value gets alone (NaN fails; past ``fail`` fails, else past ``warn``
    warns), a column at a time: IEEE comparisons of float64 values give the same answers
    whether numpy or Python makes them.
    """
    if higher_is_better:
        failing, warning = values < fail, values < warn
    else:
        failing, warning = values > fail, values > warn
    failing |= np.isnan(values)
    codes = warning.astype(np.int8)
    codes[failing] = 2
    return codes


def judge(
    specs: Sequence[MetricSpec],
    values: Mapping[str, float],
    name: str,
    judged_class: str,
    overrides: Sequence[ThresholdOverride] = (),
) -> tuple[Mapping[str, MetricResult], str, str | None]:
    """Return each metric's result, the row's verdict and the deciding metric (first with the worst verdict)."""
    return TableJudge(specs, overrides).judge(values, name, judged_class)


def _patterns(codes: np.ndarray) -> tuple[list[int], list[int]]:
    """Return the pattern of each row of verdict codes (rows, metrics), numbered, and the first row of each pattern."""
    numbered = codes.astype(np.int64) @ (3 ** np.arange(codes.shape[1], dtype=np.int64))
    _, first_rows, pattern_of = np.unique(numbered, return_index=True, return_inverse=True)
    return pattern_of.reshape(-1).tolist(), first_rows.tolist()


class TableJudge:
    """Judges the pairs of one compare against one set of metrics and overrides (:func:`judge`, many times).

    A decode dump asks for a verdict 10**5 times: without overrides each metric's limits
    depend on the dtype class alone, so they are looked up once per class, not per pair, and
    with overrides once per (record name, class) -- a decode dump repeats each name once per step.
    """

    def __init__(self, specs: Sequence[MetricSpec], overrides: Sequence[ThresholdOverride] = ()) -> None:
        self.specs = list(specs)
        self.overrides = list(overrides)
        # (record name or None without overrides, class) -> each metric's (name, higher is better, limits)
        self._table: dict[tuple[str | None, str], list[tuple[str, bool, tuple[float, float] | None]]] = {}
        # each metric's (name, higher is better, limits) -> the one table holding them: names alike share it
        self._alike_tables: dict[tuple[tuple[str, bool, tuple[float, float] | None], ...], list[Any]] = {}
        # (id of a table above, the metrics present where some are missing) -> the rows' shared layout
        self._layouts: dict[tuple[int, tuple[str, ...] | None], MetricLayout] = {}
        self._verdict_tuples: dict[tuple[str, ...], tuple[str, ...]] = {}
        # each metric's (name, result's name, warn, fail, higher is better) -> the layout of results judged elsewhere
        self._held_layouts: dict[tuple[tuple[str, str, float | None, float | None, bool], ...], MetricLayout] = {}

    def _limits(self, name: str, judged_class: str) -> list[tuple[str, bool, tuple[float, float] | None]]:
        key = (name if self.overrides else None, judged_class)
        table = self._table.get(key)
        if table is None:
            table_dtype = _CLASS_DTYPE.get(judged_class, "float32")
            table = self._table[key] = [
                (
                    spec.name,
                    spec.higher_is_better,
                    thresholds_for(spec, name, judged_class, self.overrides)
                    if self.overrides
                    else spec.thresholds_for(table_dtype),
                )
                for spec in self.specs
            ]
            table = self._table[key] = self._alike_tables.setdefault(tuple(table), table)
        return table

    def judge(
        self, values: Mapping[str, float], name: str, judged_class: str
    ) -> tuple[Mapping[str, MetricResult], str, str | None]:
        """Return each metric's result, the row's verdict and the deciding metric (first with the worst verdict).

        The results are a :class:`~llmcheck.core.records.JudgedMetrics` over a layout shared
        by the rows judged alike: 10**5 rows hold their values and verdicts, not 10**6 results.
        """
        table = self._limits(name, judged_class)
        judged: list[float] = []
        verdicts: list[str] = []
        verdict, deciding, first_judged = VERDICT_PASS, None, None
        for metric, higher_is_better, limits in table:
            if metric not in values:
                continue
            value = values[metric]
            judged.append(value)
            if limits is None:
                verdicts.append(VERDICT_PASS)
                continue
            warn, fail = limits
            metric_verdict = _metric_verdict(value, higher_is_better, warn, fail)
            verdicts.append(metric_verdict)
            first_judged = first_judged or metric
            if metric_verdict != VERDICT_PASS and _SEVERITY[metric_verdict] > _SEVERITY[verdict]:
                verdict, deciding = metric_verdict, metric
        present = None if len(judged) == len(table) else tuple(metric for metric, _, _ in table if metric in values)
        layout = self._layouts.get((id(table), present))
        if layout is None:
            kept = [entry for entry in table if present is None or entry[0] in present]
            layout = self._layouts[(id(table), present)] = MetricLayout(
                [metric for metric, _, _ in kept],
                [None if limits is None else limits[0] for _, _, limits in kept],
                [None if limits is None else limits[1] for _, _, limits in kept],
                [higher_is_better for _, higher_is_better, _ in kept],
            )
        shared = tuple(verdicts)
        shared = self._verdict_tuples.setdefault(shared, shared)  # most rows: all pass, one tuple for them all
        return JudgedMetrics(layout, held_values(judged), shared), verdict, deciding or first_judged

    def judge_columns(
        self, metrics: Sequence[str], values: np.ndarray, names: Sequence[str], classes: Sequence[str]
    ) -> tuple[list[Mapping[str, MetricResult]], list[str], list[str | None]]:
        """Return :meth:`judge` of each row of ``values``: its results, verdict and deciding metric, a list each.

        ``values`` holds a row per pair, (rows, metrics), its columns the float64 values of
        ``metrics``; row ``i`` is record ``names[i]`` judged as ``classes[i]``.

        Why: judged row by row, a 10**5-pair decode dump spent a second comparing values with
        their limits. Here the rows judged under one table of limits are compared a column
        at a time (:func:`verdict_codes`); the rows that got the same verdict of every metric
        then share the layout, the verdicts and the deciding metric, which :meth:`judge`
        gives for the first of them. A table that does not judge exactly ``metrics``, in
        order, judges its rows one by one.
        """
        count = len(names)
        results: list[Mapping[str, MetricResult]] = [None] * count  # type: ignore[list-item]  # each row is set below
        verdicts = [VERDICT_PASS] * count
        deciding: list[str | None] = [None] * count
        row_values: list[list[float]] = values.tolist()
        for table, rows in self._rows_by_table(names, classes):
            codes = self._codes(table, metrics, values[rows])
            pattern_of: list[int] | list[None] = [None] * len(rows)
            shared: list[tuple[JudgedMetrics, str, str | None] | None] = []
            if codes is not None:
                pattern_of, first_rows = _patterns(codes)
                for position in first_rows:
                    row = rows[position]
                    judged, verdict, decided = self.judge(dict(zip(metrics, row_values[row])), names[row], classes[row])
                    held = cast(JudgedMetrics, judged)
                    # the verdicts the table gives alone, else (never seen) the pattern's rows are judged one by one
                    alike = held.verdicts == tuple([VERDICT_OF_CODE[code] for code in codes[position].tolist()])
                    shared.append((held, verdict, decided) if alike else None)
            for row, pattern in zip(rows, pattern_of):
                found = None if pattern is None else shared[pattern]
                if found is None:
                    results[row], verdicts[row], deciding[row] = self.judge(
                        dict(zip(metrics, row_values[row])), names[row], classes[row]
                    )
                else:
                    # a row's values as C doubles, as held_values keeps floats (tolist gives floats)
                    results[row] = found[0].alike(array("d", row_values[row]))
                    verdicts[row], deciding[row] = found[1], found[2]
        return results, verdicts, deciding

    def verdict_code_columns(
        self, metrics: Sequence[str], values: np.ndarray, names: Sequence[str], classes: Sequence[str]
    ) -> np.ndarray | None:
        """Return the verdict code (:data:`VERDICT_OF_CODE`) of each value of :meth:`judge_columns`' ``values``, 0 where a metric has no limits.

        None when some rows' table cannot judge them a column at a time (:meth:`_codes`).
        """
        found = np.zeros(values.shape, dtype=np.int8)
        for table, rows in self._rows_by_table(names, classes):
            codes = self._codes(table, metrics, values[rows])
            if codes is None:
                return None
            found[rows] = codes
        return found

    def _rows_by_table(
        self, names: Sequence[str], classes: Sequence[str]
    ) -> list[tuple[list[tuple[str, bool, tuple[float, float] | None]], list[int]]]:
        """Return each table of limits that judges some of the rows (record ``names[i]`` as ``classes[i]``), with those rows."""
        keys: Sequence[tuple[str, str] | str] = list(zip(names, classes)) if self.overrides else classes
        keyed: dict[tuple[str, str] | str, list[int]] = {}  # the rows of each key of the table of limits
        for row, key in enumerate(keys):
            keyed.setdefault(key, []).append(row)
        tables: dict[int, tuple[list[tuple[str, bool, tuple[float, float] | None]], list[int]]] = {}
        for key_rows in keyed.values():
            table = self._limits(names[key_rows[0]], classes[key_rows[0]])
            tables.setdefault(id(table), (table, []))[1].extend(key_rows)
        return list(tables.values())

    @staticmethod
    def _codes(
        table: list[tuple[str, bool, tuple[float, float] | None]], metrics: Sequence[str], values: np.ndarray
    ) -> np.ndarray | None:
        """Return the verdict code of each of ``values`` (rows, metrics) under ``table``, 0 where a metric has no limits.

        None when the table cannot judge the rows a column at a time: it judges other
        metrics than ``metrics`` (or in another order), has too many to number their
        patterns, or a limit that a float64 cannot hold exactly (Python compares it exactly).
        """
        if len(table) != len(metrics) or len(table) > _PATTERN_METRICS or values.dtype != np.float64:
            return None
        codes = np.zeros(values.shape, dtype=np.int8)
        for column, ((metric, higher_is_better, limits), measured) in enumerate(zip(table, metrics)):
            if metric != measured:
                return None
            if limits is None:
                continue
            if any(type(limit) is not float and float(limit) != limit for limit in limits):
                return None
            codes[:, column] = verdict_codes(values[:, column], higher_is_better, *limits)
        return codes

    def held_alike(self, results: Mapping[str, MetricResult]) -> Mapping[str, MetricResult]:
        """Return results judged elsewhere (a statistics-only pair's) as a :class:`~llmcheck.core.records.JudgedMetrics`.

        Why: a statistics-only row's nine results in a dict, their names made anew per row,
        cost 1.9 KB -- the largest part of a statistics-only compare's rows. Held over a
        layout shared by the rows with the same metrics and limits, they cost their values
        and a tuple; the mapping gives results equal field for field, in the same order.
        Results filed under a name other than their own are given back as they are.
        """
        limits = tuple(
            [
                (name, result.name, result.warn_threshold, result.fail_threshold, result.higher_is_better)
                for name, result in results.items()
            ]
        )
        layout = self._held_layouts.get(limits)
        if layout is None:
            if any(name != own_name for name, own_name, _, _, _ in limits):
                return results
            layout = self._held_layouts[limits] = MetricLayout(
                [name for name, _, _, _, _ in limits],
                [warn for _, _, warn, _, _ in limits],
                [fail for _, _, _, fail, _ in limits],
                [higher for _, _, _, _, higher in limits],
            )
        verdicts = tuple([result.verdict for result in results.values()])
        verdicts = self._verdict_tuples.setdefault(verdicts, verdicts)
        return JudgedMetrics(layout, held_values([result.value for result in results.values()]), verdicts)
