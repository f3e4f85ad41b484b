"""Torch capture on the real SmolLM2-135M: the run is not changed, bit for bit, and every layer is dumped."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from llmcheck import DumpConfig, read_dump, register_hook

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_bf16(smollm2):
    """SmolLM2 cast to bfloat16 (a copy: the session's fp32 model stays as it is)."""
    model, tokenizer = smollm2
    return copy.deepcopy(model).to(torch.bfloat16), tokenizer


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_capture_leaves_smollm2_outputs_bitwise_identical(tmp_path: Path, smollm2, smollm2_bf16, precision) -> None:
    model, tokenizer = smollm2 if precision == "fp32" else smollm2_bf16
    prompt = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        plain_logits = model(prompt).logits
        plain_tokens = model.generate(prompt, max_new_tokens=3, do_sample=False)
        with register_hook(model, DumpConfig(dump_path=tmp_path / "module", token_range=None)) as module_capture:
            captured_logits = model(prompt).logits
            captured_tokens = model.generate(prompt, max_new_tokens=3, do_sample=False)
        with register_hook(model, DumpConfig(dump_path=tmp_path / "op", mode="op", statistics_only=True)) as op_capture:
            op_logits = model(prompt).logits
    assert torch.equal(captured_logits, plain_logits)
    assert torch.equal(op_logits, plain_logits)
    assert torch.equal(captured_tokens, plain_tokens)

    dump = read_dump(module_capture.path)
    layer_outputs = {(r.key.name, r.key.step) for r in dump.records if r.key.io == "output" and r.key.position == "0"}
    for step in range(4):  # the plain forward, then generate's prefill and two decode steps
        for layer in range(30):
            assert (f"model.layers.{layer}", step) in layer_outputs
    logits_record = next(r for r in dump.records if r.key.name == "root" and r.key.position == "logits")
    assert logits_record.dtype == ("float32" if precision == "fp32" else "bfloat16")
    assert torch.equal(logits_record.data.load(), plain_logits)
    op_names = {r.key.name for r in read_dump(op_capture.path).records}
    assert "model.layers.29.self_attn.o_proj/aten.mm.default" in op_names
