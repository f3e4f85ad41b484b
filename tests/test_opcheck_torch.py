"""opcheck on a real torch op-level dump: SmolLM2-135M in bf16, every ATen call replayed in float64.

The dump is captured with the torch capture at op level (one forward of a short prompt,
the first four decoder layers). Every recorded call is replayed on the CPU in float64
from its dumped inputs and recorded arguments; a bf16 kernel passes when its output is
within bf16 rounding of that replay (or within the rounding the same call makes replayed in
bf16, for an accumulation that cancels). One op's output is spoiled during the run
by a faulty SiLU kernel, as a broken device kernel would write it, and opcheck must name it.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest
import torch

from faulty_kernels import FaultyKernel
from llmcheck.core.cli import main

PLANTED = "model.layers.2.mlp.act_fn/aten.silu.default"


@pytest.fixture(scope="module")
def smollm2_bf16_op_dump(smollm2, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmcheck import DumpConfig, register_hook

    model, tokenizer = smollm2
    bf16_model = copy.deepcopy(model).to(torch.bfloat16).eval()
    prompt = tokenizer("The capital of France is", return_tensors="pt").input_ids
    config = DumpConfig(
        dump_path=tmp_path_factory.mktemp("torch_ops"),
        mode="op",
        token_range=[0],
        include=[f"model.layers.{index}" for index in range(4)],
    )
    with (
        register_hook(bf16_model, config) as session,
        torch.no_grad(),
        FaultyKernel(torch.ops.aten.silu.default, which=2, factor=1.02),
    ):
        bf16_model(prompt)
    assert session.path is not None
    return session.path


@pytest.mark.slow
def test_opcheck_replays_bf16_smollm2_ops_and_catches_the_planted_output(
    smollm2_bf16_op_dump: Path, tmp_path: Path
) -> None:
    code = main(["opcheck", "-i", str(smollm2_bf16_op_dump), "-o", str(tmp_path), "-metric", "cos_sim"])
    with open(tmp_path / "opcheck_result.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    checked = [row for row in rows if row["precision_result"] in ("PASS", "FAILED")]
    failed = [row for row in checked if row["precision_result"] == "FAILED"]
    assert code == 3  # done, and failing outputs were found
    assert len(checked) > 300 and len({row["op_name"] for row in checked}) >= 15
    assert [row for row in rows if row["precision_result"] not in ("PASS", "FAILED")] == []
    assert [row["op_id"] for row in failed] == [PLANTED]  # the flash attention and the matmuls pass
    assert 85.0 < float(failed[0]["rel_precision_rate(%)"]) < 90.0
    passed_types = {row["op_name"] for row in checked if row["precision_result"] == "PASS"}
    assert {
        "aten.mm.default",
        "aten.silu.default",
        "aten.rsqrt.default",
        "aten.mean.dim",
        "aten._to_copy.default",
        "aten.mul.Tensor",
        "aten.add.Tensor",
        "aten.cat.default",
        "aten.neg.default",
    } <= passed_types
