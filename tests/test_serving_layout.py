"""Pairing a serving engine's batch with a per-request transformers run, on dumps laid out as vLLM writes them.

No vLLM here (``tests/test_vllm_capture.py`` runs the real one): the engine dump is written
from two transformers runs of a seeded Llama, rearranged into vLLM's layout -- both requests'
rows side by side in each engine step, ``qkv_proj`` and ``gate_up_proj`` fused, the fused
norms' ``(normed, residual sum)`` outputs, ``self_attn.attn`` and ``act_fn`` (SiluAndMul)
outputs, the sampled rows' logits -- with each step's :class:`BatchLayout`. The pairing must
find the request whose prompt is the golden's, cut its rows and columns out, and name a
defect in one request's rows at the engine module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmcheck import DumpConfig, register_hook
from llmcheck.bundled_model import random_llama
from llmcheck.core.cli import main
from llmcheck.core.errors import EXIT_FAILURES_FOUND, EXIT_OK
from llmcheck.plugin_api import (
    IO_INPUT,
    IO_OUTPUT,
    MOMENT_AFTER,
    MOMENT_BEFORE,
    BatchLayout,
    DumpWriter,
    RecordKey,
    TensorRecord,
    read_dump,
)

PROMPTS = (torch.tensor([[1, 7, 42, 9]]), torch.tensor([[5, 3, 8, 11, 2, 60]]))
NEW_TOKENS = 3


def _golden(folder: Path, prompt: torch.Tensor) -> Path:
    model = random_llama(seed=0)
    with torch.no_grad(), register_hook(model, DumpConfig(dump_path=folder, token_range=None)) as capture:
        model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert capture.path is not None
    return capture.path


def _tensors(path: Path) -> dict[tuple[str, str, str, int], torch.Tensor]:
    """Return a transformers dump's tensors by (name, io, position, step), the batch dimension dropped."""
    dump = read_dump(path)
    return {
        (r.key.name, r.key.io, r.key.position, r.key.step): r.data.load()[0]  # type: ignore[union-attr]
        for r in dump.records
        if r.data is not None and r.key.call_index == 0
    }


def _engine_step(run: dict, step: int, layers: int) -> dict[tuple[str, str, str], torch.Tensor]:
    """Return one request's rows of one engine step under vLLM's module names and outputs."""
    rows: dict[tuple[str, str, str], torch.Tensor] = {}

    def of(name: str, io: str, position: str = "0") -> torch.Tensor:
        return run[(name, io, position, step)]

    rows[("root", IO_INPUT, "input_ids")] = of("root", IO_INPUT, "input_ids").to(torch.int32)
    rows[("model.embed_tokens", IO_OUTPUT, "0")] = of("model.embed_tokens", IO_OUTPUT)
    for index in range(layers):
        base = f"model.layers.{index}"
        norm_in = of(f"{base}.input_layernorm", IO_INPUT)
        rows[(f"{base}.input_layernorm", IO_OUTPUT, "0")] = of(f"{base}.input_layernorm", IO_OUTPUT)
        if index == 0:
            rows[(f"{base}.input_layernorm", IO_INPUT, "0")] = norm_in
        else:
            rows[(f"{base}.input_layernorm", IO_OUTPUT, "1")] = norm_in
        q, k, v = (of(f"{base}.self_attn.{p}_proj", IO_OUTPUT) for p in "qkv")
        rows[(f"{base}.self_attn.qkv_proj", IO_INPUT, "0")] = of(f"{base}.self_attn.q_proj", IO_INPUT)
        rows[(f"{base}.self_attn.qkv_proj", IO_OUTPUT, "0")] = torch.cat([q, k, v], dim=-1)
        rows[(f"{base}.self_attn.attn", IO_OUTPUT, "0")] = of(f"{base}.self_attn.o_proj", IO_INPUT)
        rows[(f"{base}.self_attn.o_proj", IO_OUTPUT, "0")] = of(f"{base}.self_attn.o_proj", IO_OUTPUT)
        rows[(f"{base}.post_attention_layernorm", IO_OUTPUT, "0")] = of(f"{base}.post_attention_layernorm", IO_OUTPUT)
        rows[(f"{base}.post_attention_layernorm", IO_OUTPUT, "1")] = of(f"{base}.post_attention_layernorm", IO_INPUT)
        gate, up = of(f"{base}.mlp.gate_proj", IO_OUTPUT), of(f"{base}.mlp.up_proj", IO_OUTPUT)
        rows[(f"{base}.mlp.gate_up_proj", IO_OUTPUT, "0")] = torch.cat([gate, up], dim=-1)
        rows[(f"{base}.mlp.act_fn", IO_OUTPUT, "0")] = of(f"{base}.mlp.down_proj", IO_INPUT)
        rows[(f"{base}.mlp.down_proj", IO_OUTPUT, "0")] = of(f"{base}.mlp.down_proj", IO_OUTPUT)
    rows[("model.norm", IO_OUTPUT, "0")] = of("model.norm", IO_OUTPUT)
    rows[("model.norm", IO_OUTPUT, "1")] = of("model.norm", IO_INPUT)
    rows[("logits_processor", IO_OUTPUT, "0")] = of("lm_head", IO_OUTPUT)[-1:]
    return rows


def _engine_dump(folder: Path, runs: list[dict], layers: int, defect: bool) -> Path:
    """Write the requests side by side, one engine step per decoding step, as vLLM's capture does."""
    request_ids = ("0-aaaa", "1-bbbb")
    with DumpWriter(folder, "vllm", background=False) as writer:
        order = 0
        for step in range(NEW_TOKENS):
            parts = [_engine_step(run, step, layers) for run in runs]
            if defect:  # request 1-bbbb's k columns of layer 1's qkv_proj off by 10 %
                fused = parts[1][("model.layers.1.self_attn.qkv_proj", IO_OUTPUT, "0")]
                width = runs[1][("model.layers.1.self_attn.k_proj", IO_OUTPUT, "0", step)].shape[-1]
                fused[:, -2 * width : -width] *= 1.1
            for key in parts[0]:
                tensor = torch.cat([part[key] for part in parts]).contiguous()
                moment = MOMENT_BEFORE if key[1] == IO_INPUT else MOMENT_AFTER
                record = TensorRecord(
                    RecordKey(key[0], key[1], key[2], step, 0, moment),
                    str(tensor.dtype)[6:],
                    tuple(tensor.shape),
                    order,
                )
                writer.add(record, tensor)
                order += 1
            lengths = [part[("model.embed_tokens", IO_OUTPUT, "0")].shape[0] for part in parts]
            starts = [0, lengths[0], lengths[0] + lengths[1]]
            firsts = [0 if step == 0 else PROMPTS[index].shape[1] + step - 1 for index in range(2)]
            positions = [p for first, n in zip(firsts, lengths) for p in range(first, first + n)]
            writer.add_batch_layout(BatchLayout(step, request_ids, tuple(starts), tuple(positions)))
    return writer.path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("serving")
    goldens = [_golden(folder / f"golden{index}", prompt) for index, prompt in enumerate(PROMPTS)]
    runs = [_tensors(path) for path in goldens]
    layers = len(random_llama(seed=0).model.layers)
    return {
        "golden": goldens[1],
        "clean": _engine_dump(folder / "clean", runs, layers, defect=False),
        "defect": _engine_dump(folder / "defect", runs, layers, defect=True),
    }


def _compare(golden: Path, my: Path, out: Path) -> tuple[int, dict, dict]:
    # this writer leaves out what vLLM records beside (o_proj input, mlp, self_attn): those goldens stay unmatched
    code = main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-l", "warning", "--allow-unmatched"])
    return code, json.loads((out / "summary.json").read_text()), json.loads((out / "pairs.json").read_text())


def test_the_request_whose_prompt_is_the_goldens_is_cut_out_and_every_row_passes(dumps: dict, tmp_path: Path) -> None:
    code, summary, pairs = _compare(dumps["golden"], dumps["clean"], tmp_path / "clean")

    assert code == EXIT_OK and summary["counts"]["failures"] == 0 and summary["counts"]["pairs"] > 100
    rules = {pair["rule"] for pair in pairs["pairs"]}
    assert rules == {"serving_layout(request 1-bbbb: the request whose prompt tokens are the golden's)"}
    partners = {(pair["golden"]["name"], pair["my"]["name"]) for pair in pairs["pairs"]}
    assert ("model.layers.1.self_attn.v_proj", "model.layers.1.self_attn.qkv_proj") in partners
    assert ("model.layers.0", "model.layers.1.input_layernorm") in partners  # the residual sum
    assert ("lm_head", "logits_processor") in partners


def test_a_defect_in_one_requests_rows_is_named_at_the_engine_module(dumps: dict, tmp_path: Path) -> None:
    code, summary, _ = _compare(dumps["golden"], dumps["defect"], tmp_path / "defect")

    assert code == EXIT_FAILURES_FOUND
    assert summary["culprit"]["name"] == "model.layers.1.self_attn.k_proj"
    assert summary["culprit"]["my_name"] == "model.layers.1.self_attn.qkv_proj"


def test_the_other_request_is_unaffected_by_the_defect_in_this_one(dumps: dict, tmp_path: Path) -> None:
    other = _golden(tmp_path / "golden0", PROMPTS[0])
    code, summary, pairs = _compare(other, dumps["defect"], tmp_path / "other")

    assert code == EXIT_OK and summary["counts"]["failures"] == 0
    assert all("request 0-aaaa" in pair["rule"] for pair in pairs["pairs"])
