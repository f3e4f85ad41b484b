"""Comparing pairs whose data was not kept: statistics-only dumps judged on their recorded statistics.

A statistics-only capture (``DumpConfig(statistics_only=True)``, ``llmcheck dump -sd``, ATB's
description/statistics headers) costs almost nothing and still locates a divergence: for
each of max, min, mean and L2 norm the row reports the seed tool's
``{stat}_stat_absolute_error`` and ``{stat}_stat_relative_error`` columns
(``|my - golden| / max(|golden|, float32 eps)``).

The verdict comes from the L2 norms. By the reverse triangle inequality
``| ||my|| - ||golden|| | <= ||my - golden||``, so the relative L2-norm difference is a lower
bound of the relative euclidean distance, and it is held to that metric's thresholds: a
failure here is a certain failure, while a pass only says the norms agree (an error that
keeps the norm, such as a permutation, is invisible without the data).

NaN and Inf follow the full-tensor rules (``docs/metrics.md``): the statistics are over the
finite values and the dump records each side's NaN and Inf counts, so counts that differ fail
the row as ``nonfinite_mismatch`` -- even where one side has no finite value, and so no norm,
at all -- and equal counts agree: the norms judge the finite rest, and a pair with no finite
value on either side passes, with nothing left to judge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from llmcheck.core.judging.verdicts import NONFINITE_METRIC, TableJudge, ThresholdOverride
from llmcheck.core.measuring.sentinels import SentinelRange, is_sentinel
from llmcheck.core.records import (
    VERDICT_FAIL,
    VERDICT_PASS,
    MetricResult,
    MetricSpec,
    TensorStats,
    error_measure,
)

#: The statistics compared, in the seed's column order.
STAT_FIELDS = ("max", "min", "mean", "l2norm")
STAT_COLUMNS = tuple(f"{field}_stat_{kind}_error" for field in STAT_FIELDS for kind in ("absolute", "relative"))
DECIDING_STAT = "l2norm_stat_relative_error"
_FP32_EPS = 1.1920928955078125e-07


def nonfinite_counts(stats: TensorStats) -> tuple[int, int] | None:
    """Return the recorded ``(nan_count, inf_count)``, or ``None`` when the source did not record both."""
    if stats.nan_count is None or stats.inf_count is None:
        return None
    return stats.nan_count, stats.inf_count


def nonfinite_difference(golden: TensorStats, my: TensorStats) -> int:
    """Return how many NaN and Inf values one side holds beyond the other (a lower bound of the positions that differ)."""
    return sum(abs((getattr(my, field) or 0) - (getattr(golden, field) or 0)) for field in ("nan_count", "inf_count"))


def comparable_statistics(golden: TensorStats | None, my: TensorStats | None) -> bool:
    """Return whether both sides recorded the statistics a statistics-only comparison needs.

    That is the L2 norms (over the finite values) on both sides; or, where a side has no
    finite value and so no norm, the NaN and Inf counts of both sides: counts that differ
    fail the row, and equal counts with no finite value on either side leave nothing to judge.
    """
    if golden is None or my is None:
        return False
    if golden.l2norm is not None and my.l2norm is not None:
        return True
    golden_counts, my_counts = nonfinite_counts(golden), nonfinite_counts(my)
    if golden_counts is None or my_counts is None:
        return False
    if golden_counts != my_counts:
        return True
    # same counts: judged only when neither side has a finite value (a norm missing beside others is unrecorded)
    return sum(golden_counts) > 0 and not_finite_anywhere(golden, my)


def not_finite_anywhere(golden: TensorStats, my: TensorStats) -> bool:
    """Return whether neither side has a finite value: no min, max, mean or L2 norm on either (only NaN/Inf counts)."""
    return all(getattr(stats, field) is None for stats in (golden, my) for field in STAT_FIELDS)


def statistics_errors(golden: TensorStats, my: TensorStats) -> dict[str, float]:
    """Return the seed's ``{stat}_stat_{absolute,relative}_error`` values for the statistics both sides hold."""
    errors: dict[str, float] = {}
    for field in STAT_FIELDS:
        golden_value, my_value = getattr(golden, field), getattr(my, field)
        if golden_value is None or my_value is None:
            continue
        difference = abs(my_value - golden_value)
        errors[f"{field}_stat_absolute_error"] = difference
        errors[f"{field}_stat_relative_error"] = difference / max(abs(golden_value), _FP32_EPS)
    return errors


def statistics_error_columns(golden: np.ndarray, my: np.ndarray) -> np.ndarray:
    """Return :func:`statistics_errors` of many pairs whose statistics are all finite: (pairs, :data:`STAT_COLUMNS`).

    ``golden`` and ``my`` hold each pair's statistics, (pairs, :data:`STAT_FIELDS`), as float64.
    The same IEEE operations on the same float64 values: each value is the one
    :func:`statistics_errors` gives, bit for bit.
    """
    difference = np.abs(my - golden)
    errors = np.empty((len(golden), len(STAT_COLUMNS)))
    errors[:, 0::2] = difference
    errors[:, 1::2] = difference / np.maximum(np.abs(golden), _FP32_EPS)
    return errors


def _sentinel_signs(stats: TensorStats, sentinels: SentinelRange) -> tuple[bool, bool]:
    return is_sentinel(stats.min, sentinels) and (stats.min or 0) < 0, is_sentinel(stats.max, sentinels) and (
        stats.max or 0
    ) > 0


def _infinite_extreme(*sides: TensorStats) -> bool:
    """Return whether a side's min or max is an infinity (a source whose statistics count them in)."""
    return any(value is not None and math.isinf(value) for stats in sides for value in (stats.min, stats.max))


def masked_statistics(
    golden: TensorStats, my: TensorStats, sentinel_limits: tuple[SentinelRange, SentinelRange] | None
) -> bool:
    """Return whether both sides' statistics are dominated by the same mask sentinels (and so say nothing)."""
    if sentinel_limits is None:
        return False
    golden_signs, my_signs = _sentinel_signs(golden, sentinel_limits[0]), _sentinel_signs(my, sentinel_limits[1])
    return any(golden_signs) and golden_signs == my_signs


def judge_statistics(
    golden: TensorStats,
    my: TensorStats,
    specs: Sequence[MetricSpec],
    name: str,
    judged_class: str,
    overrides: Sequence[ThresholdOverride] = (),
    sentinel_limits: tuple[SentinelRange, SentinelRange] | None = None,
    bound_table: TableJudge | None = None,
    exact_table: TableJudge | None = None,
) -> tuple[dict[str, MetricResult], str, str | None, int]:
    """Return the statistics results, the verdict, the deciding column and the NaN/Inf count difference.

    ``sentinel_limits`` (golden, my; :func:`llmcheck.core.measuring.sentinels.sentinel_range_in_run`) let
    a mask be recognised: when both sides' min or max is their run's infinity sentinel
    (:mod:`llmcheck.core.measuring.sentinels`), the statistics are the mask's, and the row is not judged
    on them. A finite sentinel on one side only is judged as the number it is, as on full tensors
    (a lost mask's norm is far from the golden's); an infinite one fails the row.

    NaN and Inf follow the full-tensor rules: counts that differ fail the row
    (``nonfinite_mismatch``, at least that many positions differ); equal counts agree, and
    the L2 norms (over the finite values) judge what remains -- nothing, when neither side has
    a finite value.

    ``bound_table`` judges the error measure alone, with these ``overrides``: a compare's
    statistics-only pairs share one, which looks each table of limits up once (else one is made here).
    ``exact_table`` is the compare's table of judged metrics: integers and booleans are judged
    by its ``max_absolute_error``, as on full tensors (:func:`_judge_exact_values`; else one is
    made here of ``specs``).
    """
    errors = statistics_errors(golden, my)
    results: dict[str, MetricResult] = {column: MetricResult(column, value) for column, value in errors.items()}
    verdict, deciding = VERDICT_PASS, None
    bounded = error_measure(specs)
    if (
        sentinel_limits is not None
        and _sentinel_signs(golden, sentinel_limits[0]) != _sentinel_signs(my, sentinel_limits[1])
        and _infinite_extreme(golden, my)
    ):
        one_sided = max(1, nonfinite_difference(golden, my))
        results[NONFINITE_METRIC] = MetricResult(NONFINITE_METRIC, float(one_sided), VERDICT_FAIL, 0.0, 0.0)
        return results, VERDICT_FAIL, NONFINITE_METRIC, one_sided
    # a mask's statistics say nothing of the values, but its NaN/Inf counts still must agree
    masked = masked_statistics(golden, my, sentinel_limits)
    if masked:
        # the norms differ by the sentinels' own difference (finfo.min of each dtype): no error of the values,
        # and none that a row this mask feeds received
        results.pop(DECIDING_STAT, None)
    if bounded is not None and DECIDING_STAT in errors and not masked:
        if bound_table is None:
            bound_table = TableJudge([bounded], overrides)
        judged, verdict, deciding = bound_table.judge({bounded.name: errors[DECIDING_STAT]}, name, judged_class)
        if deciding is not None:
            as_bounded = judged[deciding]
            results[DECIDING_STAT] = MetricResult(
                DECIDING_STAT,
                as_bounded.value,
                as_bounded.verdict,
                as_bounded.warn_threshold,
                as_bounded.fail_threshold,
                as_bounded.higher_is_better,
            )
            deciding = DECIDING_STAT
    if deciding is None and not masked and judged_class in EXACT_CLASSES:
        if exact_table is None:
            exact_table = TableJudge([spec for spec in specs if spec.name == _EXACT_METRIC], overrides)
        verdict, deciding = _judge_exact_values(errors, exact_table, name, judged_class, results)
    mismatched = nonfinite_difference(golden, my)
    if mismatched:
        verdict, deciding = VERDICT_FAIL, NONFINITE_METRIC
        results[NONFINITE_METRIC] = MetricResult(NONFINITE_METRIC, float(mismatched), VERDICT_FAIL, 0.0, 0.0)
    return results, verdict, deciding, mismatched


#: The statistics whose difference bounds the largest difference of any element from below.
_ELEMENT_BOUNDS = ("max_stat_absolute_error", "min_stat_absolute_error", "mean_stat_absolute_error")
#: The metric integers and booleans are judged by on full tensors (their limits 0: exact), and their classes.
_EXACT_METRIC = "max_absolute_error"
EXACT_CLASSES = frozenset({"int", "bool"})


def _judge_exact_values(
    errors: dict[str, float], table: TableJudge, name: str, judged_class: str, results: dict[str, MetricResult]
) -> tuple[str, str | None]:
    """Judge a pair whose class the error measure has no limits for (integers, booleans) on what its statistics prove.

    Why: on full tensors such a pair is judged by its largest difference (``max_absolute_error``,
    whose limits for integers are 0); on statistics alone nothing judged it, and token ids
    that differ (a greedy decode whose runs picked other tokens) passed. The differences of the
    two sides' max, min and mean each bound that largest difference from below: the largest of
    them is judged by ``table`` as ``max_absolute_error`` is (nothing, where it judges no such
    metric), and named as the deciding statistic.
    """
    column = max(_ELEMENT_BOUNDS, key=lambda bound: errors.get(bound, 0.0))
    judged, verdict, deciding = table.judge({_EXACT_METRIC: errors.get(column, 0.0)}, name, judged_class)
    if deciding is None:
        return VERDICT_PASS, None
    result = judged[deciding]
    results[column] = MetricResult(
        column, result.value, result.verdict, result.warn_threshold, result.fail_threshold, result.higher_is_better
    )
    return verdict, column


def statistics_reason(
    golden: TensorStats, my: TensorStats, sides: str, error_measure: str, *, masked: bool = False
) -> str:
    """Return the ``cmp_fail_reason`` of a statistics-only row: what it was judged on, and its NaN/Inf counts.

    ``sides`` names the side or sides without tensor data (``"golden and my"``),
    ``error_measure`` the metric the L2-norm difference stands in for, ``masked`` whether
    both sides' statistics are a mask's (:func:`masked_statistics`).
    """
    prefix = f"statistics only (no tensor data on the {sides} side)"
    counts = f"golden {golden.nan_count} NaN, {golden.inf_count} Inf; my {my.nan_count} NaN, {my.inf_count} Inf"
    mismatched = nonfinite_difference(golden, my)
    if mismatched:
        return f"{prefix}: at least {mismatched} positions are NaN/Inf on one side only ({counts})"
    nonfinite = sum(nonfinite_counts(golden) or (0, 0))
    if nonfinite and not_finite_anywhere(golden, my):
        return f"{prefix}: every value is NaN or Inf, the same counts on both sides ({counts}); nothing finite to judge"
    if masked:
        judged = (
            f"{prefix}: both sides hold their dtype's infinity sentinel (a mask), which dominates min, max, "
            "mean and L2 norm; not judged on them"
        )
    else:
        judged = f"{prefix}: judged on the L2 norms, a lower bound of {error_measure}"
    if nonfinite:
        judged += f"; the same NaN/Inf counts on both sides, left out of the statistics ({counts})"
    return judged


def statistics_columns(rows_metrics: Iterable[Iterable[str]]) -> list[str]:
    """Return the statistics columns any row holds, in the seed's order (for the CSV header).

    ``rows_metrics``: each row's metrics (a mapping iterates its names), or sets of names
    (:func:`~llmcheck.core.judging.row_table.metric_names` gives all rows' as one).
    """
    present = {name for metrics in rows_metrics for name in metrics}
    return [column for column in STAT_COLUMNS if column in present]
