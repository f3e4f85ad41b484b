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


def test_one_worst_row_is_a_worst_row(make_llmcheck_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden, my = _dumps(make_llmcheck_dump, tmp_path, {"a": 0.5, "b": 0.0})
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out")]) == 3
    out = capsys.readouterr().out
    assert "\n1 worst row by relative_euclidean_distance (data_id, " in out and "1 worst rows" not in out


def _llama_runs(tmp_path: Path, defect) -> tuple[Path, Path]:
    """Dump a seeded 4-layer Llama in float32 (golden) and the run ``defect(model)`` returns (my)."""
    from compare_runs import capture_run
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0, num_layers=4)
    input_ids = torch.tensor([[1, 7, 42, 9, 100, 3]])
    golden = capture_run(model, input_ids, tmp_path / "golden")
    with defect(model) as my_model:
        my = capture_run(my_model, input_ids, tmp_path / "my")
    return golden, my


def test_a_first_divergence_that_is_where_the_error_is_introduced_is_printed_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import contextlib

    from compare_runs import wrong_rmsnorm_epsilon

    @contextlib.contextmanager
    def wrong_epsilon(model):
        with wrong_rmsnorm_epsilon(model, "model.layers.1.post_attention_layernorm", 0.5):
            yield model

    golden, my = _llama_runs(tmp_path, wrong_epsilon)
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out")]) == 3
    out = capsys.readouterr().out
    assert "first divergence:" not in out
    (line,) = [line for line in out.splitlines() if line.startswith("first ")]
    assert line.startswith("first introduced divergence: model.layers.1.post_attention_layernorm step 0 output.0: ")
    assert line.endswith(", introduced (the first divergence too)")


def test_the_verdict_s_own_measures_are_said_in_words_with_where_to_read_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bfloat16 copy whose layer-2 o_proj weight is 5 % off: its weights decide, a metric no user registered."""
    import contextlib
    import copy

    from compare_runs import scaled_weight

    @contextlib.contextmanager
    def bf16_with_wrong_weight(model):
        copied = copy.deepcopy(model).to(torch.bfloat16)
        with scaled_weight(copied, "model.layers.2.self_attn.o_proj", 1.05):
            yield copied

    golden, my = _llama_runs(tmp_path, bf16_with_wrong_weight)
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out")]) == 3
    out = capsys.readouterr().out
    assert re.search(
        r"^first introduced divergence: model\.layers\.2\.self_attn\.o_proj .*weights_beyond_rounding 1 > 0", out, re.M
    )
    notes = out.split("what the verdict's own measures are (docs/metrics.md, Verdicts in reduced precision):\n", 1)[1]
    assert notes.startswith("  weights_beyond_rounding: its weights that differ from golden beyond rounding\n")
