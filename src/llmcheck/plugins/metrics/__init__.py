"""Built-in plugin 'metrics': the seed tool's seven measures with its defects fixed, plus RMSE and SQNR.

Registered in the seed's column order (``cosine_similarity`` ... ``relative_euclidean_distance``)
then ``rmse`` and ``sqnr``. Thresholds come from the one table in
:mod:`llmcheck.plugins.metrics.default_thresholds`. See ``docs/metrics.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from llmcheck.plugin_api import MetricSpec, hookimpl
from llmcheck.plugins.metrics import accumulators
from llmcheck.plugins.metrics.default_thresholds import DEFAULT_THRESHOLDS

#: (name, description, higher_is_better, accumulator class), in report order.
_BUILTIN: tuple[tuple[str, str, bool, type], ...] = (
    (
        "cosine_similarity",
        "cosine of the angle between the flattened tensors (1 = same direction)",
        True,
        accumulators.CosineSimilarity,
    ),
    (
        "max_relative_error",
        "largest |my-golden|/|golden| where |golden| > fp32 eps",
        False,
        accumulators.MaxRelativeError,
    ),
    (
        "mean_relative_error",
        "mean |my-golden|/|golden| over the positions where |golden| > fp32 eps",
        False,
        accumulators.MeanRelativeError,
    ),
    ("max_absolute_error", "largest |my-golden| over every position", False, accumulators.MaxAbsoluteError),
    ("mean_absolute_error", "mean |my-golden| over every position", False, accumulators.MeanAbsoluteError),
    (
        "kl_divergence",
        "KL(softmax(golden) || softmax(my)) over the whole flattened tensor",
        False,
        accumulators.KlDivergence,
    ),
    ("relative_euclidean_distance", "||my-golden|| / ||golden||", False, accumulators.RelativeEuclideanDistance),
    ("rmse", "root mean square of my-golden", False, accumulators.RootMeanSquareError),
    (
        "sqnr",
        "signal to quantisation noise ratio in dB, 10 log10(sum golden^2 / sum (my-golden)^2)",
        True,
        accumulators.SignalToQuantizationNoise,
    ),
)


#: The scale-free error measure attribution and the precision-noise verdicts work on.
ERROR_MEASURE = "relative_euclidean_distance"


def builtin_metric_specs() -> list[MetricSpec]:
    """Return the built-in metrics in report order, each with its row of the threshold table."""
    return [
        MetricSpec(
            name=name,
            description=description,
            higher_is_better=higher_is_better,
            make_accumulator=accumulator,
            thresholds=DEFAULT_THRESHOLDS.get(name, {}),
            error_measure=name == ERROR_MEASURE,
        )
        for name, description, higher_is_better, accumulator in _BUILTIN
    ]


@hookimpl
def llmcheck_register_metrics(register: Callable[[MetricSpec], None]) -> None:
    for spec in builtin_metric_specs():
        register(spec)
