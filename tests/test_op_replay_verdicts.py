"""At op level an op that computes what it was given is no culprit: the judge replays it before naming it.

The real SmolLM2, captured at op level by llmcheck's own torch capture and compared in-process:
its clean bf16 run squares a hidden state with 3.7 % error into 11.7 % (past bf16's 10 %
fail line) in the final norm's ``aten.pow``, an honest amplification the dtype table alone
would blame. A wrong argument replays as faithfully as a right one, so an op called with
another epsilon than the golden's is still named.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from compare_runs import capture_run, wrong_rmsnorm_epsilon
from llmcheck.core.compare import compare_dumps
from llmcheck.core.plugins import get_plugins

pytestmark = pytest.mark.slow

QUESTION = "Why is the sky blue during the day but red at sunset? Explain it simply."


@pytest.fixture(scope="module")
def question_ids(smollm2) -> torch.Tensor:
    _, tokenizer = smollm2
    return tokenizer(QUESTION, return_tensors="pt").input_ids


@pytest.fixture(scope="module")
def golden_ops(smollm2, question_ids, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The golden op-level dump, removed after this module: its op records hold every weight, 1.2 GB."""
    model, _ = smollm2
    folder = tmp_path_factory.mktemp("golden")
    yield capture_run(model, question_ids, folder, mode="op")
    shutil.rmtree(folder, ignore_errors=True)


def _compare(golden: Path, my: Path):
    plugins = get_plugins()
    return compare_dumps(plugins.load_tensors(golden), plugins.load_tensors(my), workers=1)


def test_clean_bf16_run_at_op_level_names_no_culprit_where_an_op_amplifies_its_inputs_error(
    question_ids, golden_ops: Path, tmp_path: Path
) -> None:
    from llmcheck.bundled_model import load_smollm2

    low, _ = load_smollm2(dtype=torch.bfloat16)  # as a user loads it: the rotary frequencies stay fp32
    my = capture_run(low, question_ids, tmp_path / "my", mode="op")
    del low
    result = _compare(golden_ops, my)
    counts = result.counts()
    assert counts["failures"] == 0 and counts["errors"] == 0 and result.first_introduced is None
    squared = next(
        row
        for row in result.rows
        if row.golden.key.name == "model.norm/aten.pow.Tensor_Scalar" and row.golden.key.io == "output"
    )
    # past the bf16 table's fail line, three times its input's error: a warning that says why
    assert squared.error > 0.1 and squared.feeder_error < 0.05
    assert squared.verdict == "warn" and "replayed from the my-run's own inputs" in squared.evidence
    assert "aten.pow.Tensor_Scalar gives its outputs within" in squared.evidence


def test_an_op_called_with_another_argument_than_the_golden_is_named_although_its_replay_agrees(
    smollm2, question_ids, golden_ops: Path, tmp_path: Path
) -> None:
    model, _ = smollm2
    with wrong_rmsnorm_epsilon(model, "model.layers.3.post_attention_layernorm", 1e-2):
        my = capture_run(model, question_ids, tmp_path / "my", mode="op")
    culprit = _compare(golden_ops, my).first_introduced
    assert culprit is not None and culprit.verdict == "fail"
    assert culprit.golden.key.name == "model.layers.3.post_attention_layernorm/aten.add.Tensor"  # variance + eps
    assert "replayed" not in culprit.evidence
