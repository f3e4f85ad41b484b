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
keeps the norm, such as a permutation, is invisible without the data). NaN or Inf counts
that differ fail the row, as they do for full tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmcheck.core.records import (
    VERDICT_FAIL,
    VERDICT_PASS,
    MetricResult,
    MetricSpec,
    TensorStats,
)
from llmcheck.core.sentinels import is_sentinel
from llmcheck.core.verdicts import NONFINITE_METRIC, ThresholdOverride, judge

#: The statistics compared, in the seed's column order.
STAT_FIELDS = ("max", "min", "mean", "l2norm")
STAT_COLUMNS = tuple(f"{field}_stat_{kind}_error" for field in STAT_FIELDS for kind in ("absolute", "relative"))
DECIDING_STAT = "l2norm_stat_relative_error"
_FP32_EPS = 1.1920928955078125e-07


def error_measure_spec(specs: Sequence[MetricSpec]) -> MetricSpec | None:
    """Return the metric whose role is the error measure (its thresholds judge the L2-norm difference), or None."""
    return next((spec for spec in specs if spec.error_measure), None)


def comparable_statistics(golden: TensorStats | None, my: TensorStats | None) -> bool:
    """Return whether both sides recorded the statistics a statistics-only comparison needs."""
    return all(stats is not None and stats.l2norm is not None for stats in (golden, my))


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


def _sentinel_signs(stats: TensorStats, limit: float) -> tuple[bool, bool]:
    return is_sentinel(stats.min, limit) and (stats.min or 0) < 0, is_sentinel(stats.max, limit) and (
        stats.max or 0
    ) > 0


def masked_statistics(golden: TensorStats, my: TensorStats, sentinel_limits: tuple[float, float] | None) -> bool:
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
    sentinel_limits: tuple[float, float] | None = None,
) -> tuple[dict[str, MetricResult], str, str | None, int]:
    """Return the statistics results, the verdict, the deciding column and the NaN/Inf count difference.

    ``sentinel_limits`` (golden, my; :func:`llmcheck.core.sentinels.sentinel_limit_in_run`) let
    a mask be recognised: when both sides' min or max is their run's infinity sentinel (:mod:`llmcheck.core.sentinels`), the statistics are the mask's,
    and the row is not judged on them; a sentinel on one side only fails it.
    """
    errors = statistics_errors(golden, my)
    results: dict[str, MetricResult] = {column: MetricResult(column, value) for column, value in errors.items()}
    verdict, deciding = VERDICT_PASS, None
    bounded = error_measure_spec(specs)
    if sentinel_limits is not None and (
        _sentinel_signs(golden, sentinel_limits[0]) != _sentinel_signs(my, sentinel_limits[1])
    ):
        results[NONFINITE_METRIC] = MetricResult(NONFINITE_METRIC, 1.0, VERDICT_FAIL, 0.0, 0.0)
        return results, VERDICT_FAIL, NONFINITE_METRIC, 1
    if masked_statistics(golden, my, sentinel_limits):
        return results, VERDICT_PASS, None, 0
    if bounded is not None and DECIDING_STAT in errors:
        judged, verdict, deciding = judge(
            [bounded], {bounded.name: errors[DECIDING_STAT]}, name, judged_class, overrides
        )
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
    nonfinite_difference = sum(
        abs((getattr(my, field) or 0) - (getattr(golden, field) or 0)) for field in ("nan_count", "inf_count")
    )
    if nonfinite_difference:
        verdict, deciding = VERDICT_FAIL, NONFINITE_METRIC
        results[NONFINITE_METRIC] = MetricResult(NONFINITE_METRIC, float(nonfinite_difference), VERDICT_FAIL, 0.0, 0.0)
    return results, verdict, deciding, nonfinite_difference


def statistics_columns(rows_metrics: Sequence[Mapping[str, MetricResult]]) -> list[str]:
    """Return the statistics columns any row holds, in the seed's order (for the CSV header)."""
    present = {name for metrics in rows_metrics for name in metrics}
    return [column for column in STAT_COLUMNS if column in present]
