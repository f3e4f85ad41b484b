"""The table judge's results are the very MetricResults the constructor makes, limits looked up once per key."""

from __future__ import annotations

import math

from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import VERDICT_FAIL, VERDICT_PASS, VERDICT_WARN, MetricResult
from llmcheck.core.verdicts import TableJudge, ThresholdOverride, thresholds_for


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
