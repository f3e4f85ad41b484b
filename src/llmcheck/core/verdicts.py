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
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from llmcheck.core.errors import UsageError
from llmcheck.core.records import (
    VERDICT_FAIL,
    VERDICT_PASS,
    VERDICT_WARN,
    JudgedMetrics,
    MetricLayout,
    MetricResult,
    MetricSpec,
    dtype_class,
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

#: The pseudo-metric named when one side holds NaN/Inf where the other does not.
NONFINITE_METRIC = "nonfinite_mismatch"


def _class_of(dtype: str) -> str:
    return _COMPLEX_CLASS.get(dtype, dtype_class(dtype))


def least_precise(classes: Sequence[str]) -> str | None:
    """Return the least precise of some float classes (``None`` when there are none)."""
    return max(classes, key=PRECISION_ORDER.index, default=None)


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


_OVERRIDE_KEYS = ("pattern", "metric", "warn", "fail", "dtype")


def load_threshold_overrides(
    path: Path, known_metrics: Sequence[str] | Mapping[str, MetricSpec]
) -> list[ThresholdOverride]:
    """Return the entries of a ``--thresholds`` file (JSON or YAML list), checked against the known metrics.

    Given the metric specs (not just names), each entry's ``warn`` must be no worse than its
    ``fail`` in the metric's direction: a reversed pair would silently never warn.
    """
    from llmcheck.core.structured_file import read_structured_file

    entries = read_structured_file(path)
    if isinstance(entries, Mapping) and "thresholds" in entries:
        entries = entries["thresholds"]
    if not isinstance(entries, list):
        raise UsageError("a thresholds file is a list of {pattern, metric, warn, fail[, dtype]} entries", where=path)
    overrides = []
    for position, entry in enumerate(entries, start=1):
        if not isinstance(entry, Mapping):
            raise UsageError(f"entry {position} is not a mapping", where=path)
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
        if entry["metric"] not in known_metrics:
            raise UsageError(
                f"entry {position} names unknown metric {entry['metric']!r}",
                where=path,
                hint=f"known: {', '.join(known_metrics)}",
            )
        dtype = entry.get("dtype")
        if dtype is not None and dtype not in _CLASS_DTYPE:
            raise UsageError(
                f"entry {position} names unknown dtype class {dtype!r}",
                where=path,
                hint=f"known: {', '.join(_CLASS_DTYPE)}",
            )
        try:
            warn, fail = float(entry["warn"]), float(entry["fail"])
        except (TypeError, ValueError) as exc:
            raise UsageError(f"entry {position}: warn and fail must be numbers", where=path) from exc
        spec = known_metrics.get(entry["metric"]) if isinstance(known_metrics, Mapping) else None
        if spec is not None and (warn < fail if spec.higher_is_better else warn > fail):
            direction = "higher" if spec.higher_is_better else "lower"
            raise UsageError(
                f"entry {position}: warn {warn:g} is past fail {fail:g} ({entry['metric']} is better "
                f"{direction}, so warn must come before fail)",
                where=path,
            )
        overrides.append(
            ThresholdOverride(
                pattern=str(entry.get("pattern", "*")),
                metric=str(entry["metric"]),
                warn=warn,
                fail=fail,
                dtype_class=dtype,
            )
        )
    return overrides


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


def judge(
    specs: Sequence[MetricSpec],
    values: Mapping[str, float],
    name: str,
    judged_class: str,
    overrides: Sequence[ThresholdOverride] = (),
) -> tuple[Mapping[str, MetricResult], str, str | None]:
    """Return each metric's result, the row's verdict and the deciding metric (first with the worst verdict)."""
    return TableJudge(specs, overrides).judge(values, name, judged_class)


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
        # (id of a table above, the metrics present where some are missing) -> the rows' shared layout
        self._layouts: dict[tuple[int, tuple[str, ...] | None], MetricLayout] = {}
        self._verdict_tuples: dict[tuple[str, ...], tuple[str, ...]] = {}

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
        return JudgedMetrics(layout, tuple(judged), shared), verdict, deciding or first_judged
