"""opcheck passes a clean capture: an op replayed on the same device in the same dtype is within its rounding.

A clean op-level capture of the bundled SmolLM2 in fp32 on the CPU, and of every bug-zoo
model in fp32 and bf16, must pass opcheck completely: every output checked, none failed.
The fp32 matmuls and attention of such a run land far past 2^-20 of the float64 reference
wherever their terms cancel; the rounding the same call makes at the recorded precision is
what they are allowed. A kernel wrong by more than that still fails.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest
import torch

from faulty_kernels import FaultyKernel, load_bug_zoo
from llmcheck import DumpConfig, register_hook
from llmcheck.core.cli import main

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
#: Off by 100 times fp32's 2^-20 tolerance: no accumulation order lands there.
PLANTED_RELATIVE_ERROR = 1e-4


def _opcheck_rows(dump_path: Path, output: Path) -> tuple[int, list[dict[str, str]]]:
    code = main(["opcheck", "-i", str(dump_path), "-o", str(output), "-j", "1", "-metric", "cos_sim"])
    with open(output / "opcheck_result.csv", newline="", encoding="utf-8") as handle:
        return code, list(csv.DictReader(handle))


def _not_passed(rows: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    return [
        (row["op_id"], row["precision_result"], row["fail_reason"]) for row in rows if row["precision_result"] != "PASS"
    ]


def _capture_smollm2(smollm2, dump_path: Path, fault: FaultyKernel | None = None) -> Path:
    model, tokenizer = smollm2
    config = DumpConfig(
        dump_path=dump_path, mode="op", token_range=[0], include=[f"model.layers.{index}" for index in range(4)]
    )
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids
    with register_hook(model, config) as session, torch.no_grad():
        if fault is None:
            model(prompt)
        else:
            with fault:
                model(prompt)
    assert session.path is not None
    return session.path


def test_a_clean_fp32_op_capture_of_smollm2_passes_opcheck_completely(smollm2, tmp_path: Path) -> None:
    code, rows = _opcheck_rows(_capture_smollm2(smollm2, tmp_path / "dump"), tmp_path / "opcheck")
    assert _not_passed(rows) == []
    assert code == 0
    assert len(rows) >= 300
    mm_rows = [row for row in rows if row["op_name"] == "aten.mm.default"]
    assert len(mm_rows) == 4 * 7  # q, k, v, o, gate, up, down of four layers, each checked and passed
    assert {row["op_name"] for row in rows} >= {
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten.silu.default",
        "aten.mean.dim",
    }


def test_a_matmul_off_by_more_than_its_rounding_still_fails(smollm2, tmp_path: Path) -> None:
    dump_path = _capture_smollm2(
        smollm2, tmp_path / "dump", FaultyKernel(torch.ops.aten.mm.default, which=7, factor=1 + PLANTED_RELATIVE_ERROR)
    )  # layer 1's q_proj
    code, rows = _opcheck_rows(dump_path, tmp_path / "opcheck")
    assert code == 3
    assert [(op_id, result) for op_id, result, _ in _not_passed(rows)] == [
        ("model.layers.1.self_attn.q_proj/aten.mm.default", "FAILED")
    ]


@pytest.mark.parametrize("arch_name", ["llama", "qwen2", "phi3"])
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
def test_a_clean_op_capture_of_each_zoo_model_passes_opcheck_completely(
    arch_name: str, dtype_name: str, tmp_path: Path
) -> None:
    bug_zoo = load_bug_zoo()
    arch = bug_zoo.ARCHS[arch_name]
    model = copy.deepcopy(bug_zoo.build_model(arch)).to(bug_zoo.DTYPES[dtype_name])
    with register_hook(model, DumpConfig(dump_path=tmp_path / "dump", mode="op")) as session, torch.no_grad():
        model(bug_zoo.input_ids(arch))
    assert session.path is not None
    code, rows = _opcheck_rows(session.path, tmp_path / "opcheck")
    assert _not_passed(rows) == []
    assert code == 0
    assert len(rows) > 300
