"""The terminal summary names no metric itself: directions come from the results, worst rows sort by what they show."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.hookspecs import hookimpl
from llmcheck.core.records import MetricSpec


class PeakSignalToNoise:
    """PSNR in dB of my against golden, peak = the golden's largest magnitude (higher is better)."""

    def __init__(self) -> None:
        self.squared_error, self.count, self.peak = 0.0, 0, 0.0

    def update(self, golden: np.ndarray, my: np.ndarray) -> None:
        self.squared_error += float(np.sum((golden - my) ** 2))
        self.count += golden.size
        self.peak = max(self.peak, float(np.max(np.abs(golden)))) if golden.size else self.peak

    def result(self) -> float:
        if self.squared_error == 0:
            return math.inf
        return 10 * math.log10(self.peak**2 / (self.squared_error / self.count))


class PsnrPlugin:
    """A third-party metric plugin where higher is better."""

    @staticmethod
    @hookimpl
    def llmcheck_register_metrics(register) -> None:
        register(
            MetricSpec(
                "psnr",
                "peak signal-to-noise ratio, dB",
                higher_is_better=True,
                make_accumulator=PeakSignalToNoise,
                thresholds={"default": (30.0, 20.0)},
            )
        )


def _dumps(make_llmcheck_dump, tmp_path: Path, errors: dict[str, float]) -> tuple[Path, Path]:
    generator = torch.Generator().manual_seed(0)
    golden = {name: torch.randn(4096, generator=generator) for name in errors}
    my = {}
    for name, relative in errors.items():
        noise = torch.randn(4096, generator=generator)
        my[name] = golden[name] + noise * (relative * golden[name].norm() / noise.norm())
    return make_llmcheck_dump(tmp_path / "golden", golden), make_llmcheck_dump(tmp_path / "my", my)


def test_a_higher_is_better_metric_prints_less_than_its_threshold(
    llmcheck_plugins, make_llmcheck_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    llmcheck_plugins(PsnrPlugin())
    golden, my = _dumps(make_llmcheck_dump, tmp_path, {"block": 0.6, "head": 0.3})
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "--metric", "psnr", "-o", str(tmp_path / "out")]) == 3
    out = capsys.readouterr().out
    value = float(re.search(r"first divergence: block step 0 output\.0: psnr ([\d.]+) < 20\b", out).group(1))
    assert 10 < value < 20
    warned = float(re.search(r"head step 0 output\.0 .*\(psnr ([\d.]+) < 30 \(warn threshold\)\)", out).group(1))
    assert 20 < warned < 30


def test_the_worst_rows_are_sorted_by_the_error_measure_they_show(
    make_llmcheck_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    errors = {"a": 0.02, "b": 0.5, "c": 0.1, "d": 0.0, "e": 0.3}
    golden, my = _dumps(make_llmcheck_dump, tmp_path, errors)
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out")]) == 3
    out = capsys.readouterr().out
    assert "4 worst rows by relative_euclidean_distance" in out
    listed = re.findall(r"^\s+\d+ fail\s+(\w) step 0 output\.0\s+([\d.e-]+)", out, re.M)
    assert [name for name, _ in listed] == ["b", "e", "c", "a"]
    assert [float(value) for _, value in listed] == pytest.approx([0.5, 0.3, 0.1, 0.02], rel=1e-3)
