"""Sources 'sglang' and 'sglang_tensor_dump': dumps of a real model named as SGLang's debug utilities name them, read and compared.

SGLang's dumper cannot be imported without SGLang's runtime, so ``tests/sglang_dumps.py``
writes the dumps by its published naming (see that module).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.errors import EXIT_FAILURES_FOUND, EXIT_OK
from llmcheck.core.plugins import get_plugins
from llmcheck.plugin_api import BatchLayout
from llmcheck.plugins.sglang.file_tags import key_parts, parse_file_name

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_dumps import Dumper, forward_hook_dump, layer_dumps, sglang_batch

PROMPT = torch.tensor([[1, 7, 42, 9, 100, 3]])
DEFECT_MODULE = "model.layers.1.mlp.down_proj"


@pytest.fixture(autouse=True)
def sglang_plugin(llmcheck_plugins: Callable[..., object]) -> None:
    """Load the plugin for the test when the installed llmcheck does not list it yet (an older install's entry points)."""
    if "sglang" not in get_plugins().sources():
        import llmcheck.plugins.sglang

        llmcheck_plugins(llmcheck.plugins.sglang)


def _model(defect: bool):
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0)
    if defect:
        with torch.no_grad():
            dict(model.named_modules())[DEFECT_MODULE].weight.mul_(1.05)
    return model


def _dumper_run(base: Path, *, defect: bool = False, first_version: bool = False) -> Path:
    model = _model(defect)
    dumper = Dumper(
        base, "sglang_dump_1" if first_version else "dump_20250101_000000_000000", first_version=first_version
    )
    with torch.no_grad(), dumper.module_hooks(model), layer_dumps(dumper, model):
        sglang_batch(dumper, PROMPT, [0])
        model(PROMPT)
    dumper.step()
    return base


def _compare(golden: Path, my: Path, out: Path) -> tuple[int, dict]:
    code = main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-l", "warning"])
    summary = json.loads((out / "summary.json").read_text())
    return code, summary


def test_sglang_dumper_compare_names_the_scaled_module_and_a_clean_pair_passes(tmp_path: Path) -> None:
    golden = _dumper_run(tmp_path / "golden")
    my = _dumper_run(tmp_path / "my", defect=True)

    code, summary = _compare(golden, my, tmp_path / "out")
    clean_code, clean = _compare(golden, _dumper_run(tmp_path / "again"), tmp_path / "clean")

    assert code == EXIT_FAILURES_FOUND
    assert summary["first_introduced"]["name"] == DEFECT_MODULE
    assert summary["first_introduced"]["attribution"] == "introduced"
    assert summary["counts"]["unmatched"] == 0
    assert clean_code == EXIT_OK and clean["counts"]["failures"] == 0 and clean["first_divergence"] is None


def test_a_dumper_run_keeps_module_paths_layer_names_and_the_step_rows(tmp_path: Path) -> None:
    dump = get_plugins().load_tensors(_dumper_run(tmp_path / "run"))

    labels = {record.key.label() for record in dump.records}
    assert dump.source == "sglang"
    assert "model.layers.0.self_attn.q_proj step 0 output.0" in labels
    assert "model.layers.0.mlp step 0 input.0 (before)" in labels
    assert "root step 0 input.0 (before)" in labels
    assert "layers.1.mlp_output step 0 output.0" in labels
    assert "input_ids step 0 output.0" in labels
    assert not any(record.key.name in ("positions", "seq_lens") for record in dump.records)  # bookkeeping: in batches
    assert dump.batches == {(0, 0): BatchLayout(0, ("0",), (0, 6), (0, 1, 2, 3, 4, 5), 0)}
    down_proj = next(r for r in dump.records if r.key.name == DEFECT_MODULE and r.key.io == "output")
    assert down_proj.shape == (1, 6, 64) and down_proj.data.load().shape == (1, 6, 64)


def test_the_first_dumpers_forward_pass_id_files_read_to_the_same_keys_as_todays(tmp_path: Path) -> None:
    today = get_plugins().load_tensors(_dumper_run(tmp_path / "today"))
    first = get_plugins().load_tensors(_dumper_run(tmp_path / "first", first_version=True))

    # the first dumpers counted passes from 1: the same records, one step later
    assert [(r.key.name, r.key.io, r.key.position, r.key.step - 1) for r in first.records] == [
        (r.key.name, r.key.io, r.key.position, r.key.step) for r in today.records
    ]
    assert torch.equal(first.records[-1].data.load(), today.records[-1].data.load())


def test_a_mixed_prefill_and_decode_step_gives_each_request_its_rows(tmp_path: Path) -> None:
    dumper = Dumper(tmp_path, "dump_mixed")
    dumper.dump("hidden", torch.zeros(6, 4), layer_id=0)
    # request "a" prefills 5 tokens; request "b" decodes its 4th token (3 cached)
    dumper.dump("seq_lens", torch.tensor([5, 4]))
    dumper.dump("positions", torch.tensor([0, 1, 2, 3, 4, 3]))
    dumper.dump("rids", ["a", "b"])

    dump = get_plugins().load_tensors(tmp_path)

    layout = dump.batches[(0, 0)]
    assert (layout.request_ids, layout.query_start_loc) == (("a", "b"), (0, 5, 6))
    assert layout.rows_of("b") == range(5, 6)
    assert [record.key.name for record in dump.records] == ["layers.0.hidden"]


@pytest.mark.parametrize(
    "name, module, io, position",
    [
        ("non_intrusive__inputs.0", "root", "input", "0"),
        ("non_intrusive__model.layers.0.self_attn.qkv_proj.output", "model.layers.0.self_attn.qkv_proj", "output", "0"),
        ("non_intrusive__model.rotary_emb.output.1", "model.rotary_emb", "output", "1"),
        ("non_intrusive__model.layers.0.inputs.hidden_states", "model.layers.0", "input", "hidden_states"),
        ("non_intrusive__bert.attention.output.dense.output", "bert.attention.output.dense", "output", "0"),
        ("attn_output", "layers.3.attn_output", "output", "0,arg=100"),
    ],
)
def test_dumper_names_become_module_paths_or_layer_names(name: str, module: str, io: str, position: str) -> None:
    extra = "___arg=100" if name == "attn_output" else ""
    file_name = parse_file_name(
        f"step=0___rank=0___dump_index=7___name={name}___recompute_status=disabled___layer_id=3{extra}.pt"
    )
    assert file_name is not None

    parts = key_parts(file_name)

    assert (parts.name, parts.io, parts.position) == (module, io, position)


def _pickled_object_file(path: Path) -> None:
    # an object of a class (as a dumped engine object would be): loading it would run the class's code
    torch.save({"value": torch.zeros(2), "meta": {"step": 0, "args": argparse.Namespace(tp_size=1)}}, path)


@pytest.mark.parametrize(
    "file_name, write",
    [
        ("notes.txt", lambda path: path.write_text("not a tensor")),
        ("step=0___rank=0___dump_index=99___name=cut.pt", lambda path: path.write_bytes(b"PK\x03\x04 cut short")),
        ("step=0___rank=0___dump_index=99___name=obj.pt", _pickled_object_file),
    ],
    ids=["foreign", "corrupt", "not-weights-only"],
)
def test_a_foreign_corrupt_or_unsafe_file_in_a_run_is_one_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], file_name: str, write: Callable[[Path], None]
) -> None:
    golden = _dumper_run(tmp_path / "golden")
    my = _dumper_run(tmp_path / "my")
    (run,) = my.iterdir()
    write(run / file_name)

    code = main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out")])

    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"llmcheck: error: {run / file_name}: ")


def test_a_base_folder_of_several_runs_names_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _dumper_run(tmp_path / "base")
    _dumper_run(tmp_path / "base", first_version=True)

    code = main(["compare", "-gp", str(tmp_path / "base"), "-mp", str(tmp_path / "base"), "-o", str(tmp_path / "out")])

    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(
        f"llmcheck: error: {tmp_path / 'base'}: holds 2 dumper runs: dump_20250101_000000_000000, sglang_dump_1"
    )


# --- the forward-hook dumps: one Pass{id}.pt dict per forward pass ------------------------------------


def _forward_hook_run(folder: Path, *, defect: bool = False) -> Path:
    forward_hook_dump(_model(defect), folder, [PROMPT, PROMPT[:, :4]])
    return folder


def test_forward_hook_compare_names_the_scaled_module_and_a_clean_pair_passes(tmp_path: Path) -> None:
    golden = _forward_hook_run(tmp_path / "golden")

    code, summary = _compare(golden, _forward_hook_run(tmp_path / "my", defect=True), tmp_path / "out")
    clean_code, clean = _compare(golden, _forward_hook_run(tmp_path / "again"), tmp_path / "clean")

    assert code == EXIT_FAILURES_FOUND
    assert (summary["first_introduced"]["name"], summary["first_introduced"]["step"]) == (DEFECT_MODULE, 0)
    assert clean_code == EXIT_OK and clean["counts"]["failures"] == 0


def test_a_pass_file_holds_the_previous_pass_of_what_runs_after_the_top_module(tmp_path: Path) -> None:
    dump = get_plugins().load_tensors(_forward_hook_run(tmp_path / "run"))

    assert dump.source == "sglang_tensor_dump"
    lm_head = [r for r in dump.records if r.key.name == "lm_head"]
    # lm_head of pass 0 was written into Pass00001.pt; pass 1's was never written (no pass after it)
    assert [(r.key.step, Path(r.source_path).name, r.shape) for r in lm_head] == [(0, "Pass00001.pt", (1, 6, 256))]
    assert dump.batches[(0, 1)].query_start_loc == (0, 4)
    rotary = [r.key.position for r in dump.records if r.key.name == "model.rotary_emb" and r.key.step == 0]
    assert rotary == ["0", "1"]  # a tuple output: one record per tensor


def test_a_foreign_file_in_a_rank_folder_is_one_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _forward_hook_run(tmp_path / "run")
    (rank_folder,) = run.iterdir()
    (rank_folder / "Pass00002.pt").write_bytes(pickle.dumps({"model.norm": [1, 2]}))

    code = main(["compare", "-gp", str(run), "-mp", str(run), "-o", str(tmp_path / "out")])

    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"llmcheck: error: {rank_folder / 'Pass00002.pt'}: ")


def test_an_sglang_dump_against_a_transformers_golden_names_the_defect_and_a_clean_run_passes(tmp_path: Path) -> None:
    from llmcheck import DumpConfig, register_hook

    model = _model(defect=False)
    with torch.no_grad(), register_hook(model, DumpConfig(dump_path=tmp_path / "golden")):
        model(PROMPT)
    defective = _dumper_run(tmp_path / "sglang", defect=True)
    clean = _dumper_run(tmp_path / "sglang_clean")

    code, summary = _compare(tmp_path / "golden", defective, tmp_path / "out")
    _, clean_summary = _compare(tmp_path / "golden", clean, tmp_path / "clean")

    assert code == EXIT_FAILURES_FOUND
    assert summary["culprit"]["name"] == DEFECT_MODULE and summary["culprit"]["my_name"] == DEFECT_MODULE
    pairs = json.loads((tmp_path / "out" / "pairs.json").read_text())["pairs"]
    assert pairs and all(pair["rule"].startswith("serving_layout(request 0: the only request)") for pair in pairs)
    assert clean_summary["counts"]["failures"] == 0 and clean_summary["culprit"] is None
    assert clean_summary["counts"]["pairs"] == summary["counts"]["pairs"] > 50
