"""A third-party llmcheck plugin, installed with pip by llmcheck's tests: a metric, a reporter, a backend and its options.

* metric ``max_ulp``: the largest error measured in units in the last place of the golden
  value (in float32), a metric users of low-precision kernels often ask for;
* reporter ``ulp`` (``compare --report ulp``): ``max_ulp.json``, each pair's ``max_ulp``;
* backend ``stamp`` (``dump --backend stamp``) with its own options ``--label`` and
  ``--times``: runs the program that many times and writes ``stamp.json``.

It uses only what ``llmcheck`` exports at its top level: no core module, no core change.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

from llmcheck.plugin_api import BackendOption, CaptureRequest, MetricSpec, Reporter, hookimpl


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
    register(
        MetricSpec(
            name="max_ulp",
            description="largest error in float32 ULPs of the golden value",
            higher_is_better=False,
            make_accumulator=MaxUlpAccumulator,
        )
    )


def write_max_ulp(result, path: Path) -> None:
    """Write each pair's max_ulp, by golden record label."""
    ulps = {row.golden.key.label(): row.metrics["max_ulp"].value for row in result.rows if "max_ulp" in row.metrics}
    path.write_text(json.dumps(ulps, indent=2) + "\n")


@hookimpl
def llmcheck_register_reporters(register):
    register(
        Reporter(name="ulp", description="each pair's max_ulp as JSON", file_name="max_ulp.json", write=write_max_ulp)
    )


class StampBackend:
    """Runs the program ``--times`` times and writes ``stamp.json``: the label, the argv, each exit code."""

    name = "stamp"
    description = "runs the program and writes stamp.json (a third-party example backend)"

    def run(self, request: CaptureRequest) -> int:
        output_dir = Path(request.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        codes = [subprocess.run(list(request.command), check=False).returncode for _ in range(request.options["times"])]
        stamp = {"label": request.options["label"], "argv": list(request.command), "exit_codes": codes}
        (output_dir / "stamp.json").write_text(json.dumps(stamp) + "\n")
        return codes[-1]


@hookimpl
def llmcheck_register_capture_backends(register):
    register(StampBackend())


@hookimpl
def llmcheck_register_backend_options(register):
    register(BackendOption(backend="stamp", name="label", help="Name written into stamp.json.", default="run"))
    register(
        BackendOption(backend="stamp", name="times", help="How many times to run the program.", type=int, default=1)
    )
