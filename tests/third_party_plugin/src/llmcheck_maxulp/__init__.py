"""A third-party llmcheck plugin, installed with pip by llmcheck's tests: registers ``max_ulp``.

``max_ulp`` is the largest error measured in units in the last place of the golden value
(in float32), a metric users of low-precision kernels often ask for.
"""

from __future__ import annotations

import numpy as np

from llmcheck.plugin_api import MetricSpec, hookimpl


class MaxUlpAccumulator:
    """Keeps the largest |my - golden| / ulp(golden) seen over all chunks."""

    def __init__(self) -> None:
        self.worst_ulp = 0.0

    def update(self, golden: np.ndarray, my: np.ndarray) -> None:
        ulp = np.spacing(np.abs(golden).astype(np.float32)).astype(np.float64)
        error_ulp = np.abs(my - golden) / ulp
        finite = error_ulp[np.isfinite(error_ulp)]
        if finite.size:
            self.worst_ulp = max(self.worst_ulp, float(finite.max()))

    def result(self) -> float:
        return self.worst_ulp


@hookimpl
def llmcheck_register_metrics(register):
    register(MetricSpec(name="max_ulp", description="largest error in float32 ULPs of the golden value",
                        higher_is_better=False, make_accumulator=MaxUlpAccumulator))
