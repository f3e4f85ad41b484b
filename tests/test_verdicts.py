"""The table judge's results are the very MetricResults the constructor makes, limits looked up once per key."""

from __future__ import annotations

import math

from llmcheck.core.judging.verdicts import TableJudge, ThresholdOverride, thresholds_for
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import VERDICT_FAIL, VERDICT_PASS, VERDICT_WARN, MetricResult


def _constructed(specs, values, name, judged_class, overrides=()):
    """Return each metric's result as MetricResult's own constructor builds it."""
    results = {}
    for spec in specs:
        if spec.name not in values:
            continue
        limits = thresholds_for(spec, name, judged_class, overrides)
        if limits is None:
            results[spec.name] = MetricResult(spec.name, values[spec.name], higher_is_better=spec.higher_is_better)
            continue
        warn, fail = limits
        value = values[spec.name]
        worse = (lambda a, b: a < b) if spec.higher_is_better else (lambda a, b: a > b)
        verdict = (
            VERDICT_FAIL
            if math.isnan(value) or worse(value, fail)
            else VERDICT_WARN
            if worse(value, warn)
            else VERDICT_PASS
        )
        results[spec.name] = MetricResult(spec.name, value, verdict, warn, fail, spec.higher_is_better)
    return results


def test_judged_results_equal_constructed_ones_field_for_field() -> None:
    specs = list(get_plugins().metrics().values())
    overrides = [ThresholdOverride("lm_head*", "relative_euclidean_distance", 1e-3, 1e-2)]
    cases = [
        ({"relative_euclidean_distance": 2e-6, "cosine_similarity": 0.9999999999}, "model.layers.0.mlp", "fp32"),
        ({"relative_euclidean_distance": 5e-4, "cosine_similarity": 0.99}, "lm_head", "fp32"),
        ({"relative_euclidean_distance": math.nan, "rmse": 1.0}, "model.norm", "bf16"),
        ({"relative_euclidean_distance": 2e-2}, "lm_head", "bf16"),
    ]
    for judge, case_overrides in ((TableJudge(specs), ()), (TableJudge(specs, overrides), overrides)):
        for _ in range(2):  # the second time from the limits kept per key
            for values, name, judged_class in cases:
                results, _, _ = judge.judge(values, name, judged_class)
                expected = _constructed(specs, values, name, judged_class, case_overrides)
                assert list(results) == list(expected)
                for result, constructed in zip(results.values(), expected.values()):
                    assert type(result) is MetricResult and repr(result) == repr(constructed)
                    assert math.isnan(result.value) or (result == constructed and hash(result) == hash(constructed))
    # an override on lm_head moves its limits: 5e-4 passes there, and fails an fp32 module
    assert TableJudge(specs, overrides).judge({"relative_euclidean_distance": 5e-4}, "lm_head", "fp32")[1] == "pass"
    assert TableJudge(specs, overrides).judge({"relative_euclidean_distance": 5e-4}, "model.mlp", "fp32")[1] == "fail"


def test_a_rows_metrics_read_as_the_dict_of_results_they_stand_for() -> None:
    import pickle

    from llmcheck.core.records import JudgedMetrics, metric_columns, metric_value, metric_values

    specs = list(get_plugins().metrics().values())
    judge = TableJudge(specs)
    full = {spec.name: 1e-7 * (number + 1) for number, spec in enumerate(specs)}
    full["cosine_similarity"] = 0.5  # fails
    partial = {"relative_euclidean_distance": 3e-2, "rmse": 1.0}
    rows = [judge.judge(values, "model.layers.0.mlp", "fp32")[0] for values in (full, partial, full)]
    for metrics, values in zip(rows, (full, partial, full)):
        expected = _constructed(specs, values, "model.layers.0.mlp", "fp32")
        assert type(metrics) is JudgedMetrics
        assert metrics == expected and expected == metrics and dict(metrics) == expected
        assert list(metrics) == list(expected) and len(metrics) == len(expected)
        assert "cosine_similarity" in metrics if "cosine_similarity" in values else "cosine_similarity" not in metrics
        assert metrics.get("no_such_metric") is None and metrics.get("no_such_metric", 7) == 7
        assert pickle.loads(pickle.dumps(metrics)) == expected
        assert repr(metrics) == f"JudgedMetrics({expected!r})"
        for name, result in expected.items():
            assert metrics[name] == result and metric_value(metrics, name) == result.value
    # rows judged alike share a layout and, when their verdicts agree, one verdict tuple
    assert rows[0]._layout is rows[2]._layout and rows[0]._verdicts is rows[2]._verdicts
    # columns as the results read: rows of one layout; of two classes' layouts naming the same
    # metrics; of two layouts naming different ones, with a plain dict and a row without metrics
    bf16 = judge.judge(full, "model.layers.1.mlp", "bf16")[0]
    plain = {"rmse": MetricResult("rmse", 2.0, VERDICT_WARN, 1.0, 3.0)}
    for block in ([rows[0], rows[2]], [rows[0], bf16, rows[2]], [*rows, plain, {}]):
        names = ("cosine_similarity", "rmse", "no_such_metric")
        for name, columns in zip(names, metric_columns(block, names), strict=True):
            results = [metrics.get(name) for metrics in block]
            assert columns == tuple(
                [None if result is None else getattr(result, field) for result in results]
                for field in ("value", "verdict", "warn_threshold", "fail_threshold", "higher_is_better")
            )
            assert [metric_value(metrics, name) for metrics in block] == columns[0]
        assert metric_values(block, names) == [columns[0] for columns in metric_columns(block, names)]
    assert metric_columns([], ["rmse"]) == [([], [], [], [], [])] and metric_values([], ["rmse"]) == [[]]
