"""Source 'megatron': SGLang's dumper run inside Megatron (as Miles runs it), read and compared against SGLang.

The dumps are written by ``tests/sglang_dumps.py`` (SGLang's dumper needs SGLang's runtime):
Megatron's framework plugin of the dumper adds ``megatron_parallel_info`` to each file's
meta and dumps the packed batch's ``input_ids``, ``position_ids`` and ``cu_seqlens_q``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.errors import EXIT_FAILURES_FOUND, EXIT_OK
from llmcheck.core.plugins import get_plugins

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_dumps import Dumper, layer_dumps, megatron_batch, sglang_batch

PROMPT = torch.tensor([[1, 7, 42, 9, 100, 3]])


@pytest.fixture(autouse=True)
def sglang_plugin(llmcheck_plugins: Callable[..., object]) -> None:
    """Load the plugin for the test when the installed llmcheck does not list it yet (an older install's entry points)."""
    if "megatron" not in get_plugins().sources():
        import llmcheck.plugins.sglang

        llmcheck_plugins(llmcheck.plugins.sglang)


def _run(base: Path, framework: str, *, defect: bool = False) -> Path:
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0)
    if defect:
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight.mul_(1.05)
    dumper = Dumper(base, "dump_20250101_000000_000000", framework=framework)
    with torch.no_grad(), layer_dumps(dumper, model):
        if framework == "megatron":
            megatron_batch(dumper, PROMPT, [PROMPT.shape[-1]])
        else:
            sglang_batch(dumper, PROMPT, [0])
        model(PROMPT)
    dumper.step()
    return base


def _compare(golden: Path, my: Path, out: Path) -> tuple[int, dict]:
    code = main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-l", "warning"])
    return code, json.loads((out / "summary.json").read_text())


def test_megatron_against_sglang_names_the_layer_whose_mlp_was_scaled(tmp_path: Path) -> None:
    golden = _run(tmp_path / "megatron", "megatron")

    code, summary = _compare(golden, _run(tmp_path / "sglang_bad", "sglang", defect=True), tmp_path / "out")
    clean_code, clean = _compare(golden, _run(tmp_path / "sglang", "sglang"), tmp_path / "clean")

    assert code == EXIT_FAILURES_FOUND
    assert summary["first_introduced"]["name"] == "layers.1.mlp_output"
    assert summary["counts"]["pairs"] == 7  # input_ids and three outputs of each of two layers
    assert clean_code == EXIT_OK and clean["counts"]["failures"] == 0 and clean["counts"]["unmatched"] == 0


def test_a_megatron_run_is_recognised_and_its_packed_sequences_are_its_rows(tmp_path: Path) -> None:
    dumper = Dumper(tmp_path, "dump_packed", framework="megatron")
    dumper.dump("hidden", torch.zeros(7, 1, 8), layer_id=0)
    megatron_batch(dumper, torch.arange(7), [4, 3])

    dump = get_plugins().load_tensors(tmp_path)

    assert dump.source == "megatron"
    layout = dump.batches[(0, 0)]
    assert (layout.request_ids, layout.query_start_loc, layout.positions) == (
        ("0", "1"),
        (0, 4, 7),
        (0, 1, 2, 3, 0, 1, 2),
    )
    assert [record.key.label() for record in dump.records] == [
        "layers.0.hidden step 0 output.0",
        "input_ids step 0 output.0",
    ]


def test_megatron_source_forced_reads_an_sglang_run_the_same_way(tmp_path: Path) -> None:
    dump = get_plugins().load_tensors(_run(tmp_path / "run", "sglang"), source="megatron")

    assert dump.source == "megatron" and len(dump.records) == 7


def test_megatron_against_a_transformers_golden_names_the_module_whose_weight_was_scaled(tmp_path: Path) -> None:
    from llmcheck import DumpConfig, register_hook
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0)
    with torch.no_grad(), register_hook(model, DumpConfig(dump_path=tmp_path / "golden")):
        model(PROMPT)

    def megatron_run(base: Path, defect: bool) -> Path:  # the dumper's module hooks, inside Megatron
        model = random_llama(seed=0)
        if defect:
            with torch.no_grad():
                model.model.layers[1].mlp.down_proj.weight.mul_(1.05)
        dumper = Dumper(base, "dump_20250101_000000_000000", framework="megatron")
        with torch.no_grad(), dumper.module_hooks(model):
            megatron_batch(dumper, PROMPT, [PROMPT.shape[-1]])
            model(PROMPT)
        dumper.step()
        return base

    code, summary = _compare(tmp_path / "golden", megatron_run(tmp_path / "bad", True), tmp_path / "out")
    _, clean = _compare(tmp_path / "golden", megatron_run(tmp_path / "clean", False), tmp_path / "clean")

    assert code == EXIT_FAILURES_FOUND
    assert summary["culprit"]["name"] == summary["culprit"]["my_name"] == "model.layers.1.mlp.down_proj"
    assert clean["counts"]["failures"] == 0 and clean["culprit"] is None and clean["counts"]["pairs"] > 50
