"""opcheck on a real torch op-level dump: SmolLM2-135M in bf16, every ATen call replayed in float64.

The dump is captured with the torch capture at op level (one forward of a short prompt,
the first four decoder layers). Every recorded call is replayed on the CPU in float64
from its dumped inputs and recorded arguments; a bf16 kernel passes when its output is
within bf16 rounding of that replay. One op's output is spoiled during the run
by a faulty SiLU kernel, as a broken device kernel would write it, and opcheck must name it.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from llmcheck.core.cli import main

PLANTED = "model.layers.2.mlp.act_fn/aten.silu.default"
#: Kernels that genuinely compute below bf16's rounding standard on this CPU: the flash
#: attention kernel multiplies bf16-rounded probabilities by V, and a bf16 matmul output
#: near zero after cancellation carries its accumulation error as a large relative error.
LOW_PRECISION_KERNELS = ("aten._scaled_dot_product_flash_attention_for_cpu.default", "aten.mm.default")


class FaultySiluKernel(TorchDispatchMode):
    """A SiLU kernel that writes every 8th element 2 % off in its ``which``-th call (layer ``which``'s MLP).

    It sits below the capture's own dispatch mode, so the capture records the wrong output
    exactly as a faulty device kernel would have produced it, and the ops after it consume it.
    """

    def __init__(self, which: int) -> None:
        super().__init__()
        self.which = which
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.silu.default:
            if self.calls == self.which:
                result = result.clone()
                result.view(-1)[::8] *= 1.02
            self.calls += 1
        return result


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
    with register_hook(bf16_model, config) as session, torch.no_grad(), FaultySiluKernel(which=2):
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
    planted = [row for row in failed if row["op_id"] == PLANTED]
    assert len(planted) == 1 and 85.0 < float(planted[0]["rel_precision_rate(%)"]) < 90.0
    real = [row for row in failed if row["op_id"] != PLANTED]
    assert {row["op_name"] for row in real} <= set(LOW_PRECISION_KERNELS)
    assert all(float(row["cosine_similarity"]) > 0.999 for row in real)
    assert len(failed) <= len(checked) // 50
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
