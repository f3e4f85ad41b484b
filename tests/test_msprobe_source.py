"""Source 'msprobe': dumps written by the real msprobe (MindStudio Probe) in this test run, read and compared.

msprobe runs in its own process (tests/msprobe_dump_run.py): it wraps torch's APIs
process-wide. Where it cannot be installed or run, the tests that need its dumps skip
with the reason; the peer fixture and the parsing tests run everywhere.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.compare import compare_dumps
from llmcheck.core.errors import EXIT_FAILURES_FOUND
from llmcheck.core.judging.result import CompareResult
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.msprobe.entry_names import parse_entry_name

HERE = Path(__file__).resolve().parent
#: A statistics-mode mix-level dump of a Megatron model on an NPU, as msprobe wrote it (a peer's file).
PEER_DUMP = HERE / "data" / "msprobe" / "msprobe_pytorch_dump"
DEFECT_MODULE = "model.layers.1.mlp.up_proj"
DEFECT = ("--scale-weight", DEFECT_MODULE, "1.05")


def _msprobe_unavailable() -> str | None:
    """Return why the real msprobe cannot run here, or None when it can."""
    probe = subprocess.run(
        [sys.executable, "-c", "from msprobe.pytorch import PrecisionDebugger"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode == 0:
        return None
    lines = (probe.stderr or probe.stdout).strip().splitlines()
    return "msprobe (pip install 'llmcheck[msprobe]') cannot run here: " + (lines[-1] if lines else "import failed")


@pytest.fixture(scope="session")
def msprobe_dump(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Return a function that writes (once per argument set) a real msprobe or llmcheck dump and returns its root."""
    reason = _msprobe_unavailable()
    root = tmp_path_factory.mktemp("msprobe")
    written: dict[tuple[str, ...], Path] = {}

    def dump(*args: str) -> Path:
        if "llmcheck" not in args and reason is not None:
            pytest.skip(reason)
        if args not in written:
            out = root / f"run{len(written)}"
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
            finished = subprocess.run(
                [sys.executable, str(HERE / "msprobe_dump_run.py"), str(out), *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
                cwd=root,
            )
            assert finished.returncode == 0, finished.stderr[-3000:]
            written[args] = out
        return written[args]

    return dump


def _load(path: Path):
    return get_plugins().load_tensors(path)


def _compare(golden: Path, my: Path) -> CompareResult:
    return compare_dumps(_load(golden), _load(my), workers=1)


def _dump_json(root: Path) -> Path:
    (found,) = root.glob("step*/*/dump.json")
    return found


def _tensor_items(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict) and "dtype" in value and "shape" in value:
        yield value
    elif isinstance(value, dict):
        for inner in value.values():
            yield from _tensor_items(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _tensor_items(inner)


# --- reading: every level and task --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "task, level, summary_mode",
    [
        ("tensor", "L0", "statistics"),
        ("tensor", "L1", "statistics"),
        ("tensor", "mix", "statistics"),
        ("statistics", "L0", "statistics"),
        ("statistics", "mix", "statistics"),
        ("statistics", "L1", "md5"),
    ],
)
def test_every_tensor_entry_of_dump_json_becomes_one_record_with_its_statistics_and_data(
    msprobe_dump: Callable[..., Path], task: str, level: str, summary_mode: str
) -> None:
    root = msprobe_dump("--task", task, "--level", level, "--summary-mode", summary_mode)
    document = json.loads(_dump_json(root).read_text())
    assert (document["task"], document["level"]) == (task, level)
    entries = list(_tensor_items(document["data"]))
    dump = _load(root)
    assert dump.source == "msprobe"
    assert len(dump.records) == len(entries) > 20
    assert [record.order for record in dump.records] == sorted(record.order for record in dump.records)
    for record in dump.records:
        item = next(
            item
            for item in _tensor_items(document["data"][record.attrs["msprobe_entry"]])
            if [int(size) for size in item["shape"]] == list(record.shape) and item["dtype"] == f"torch.{record.dtype}"
        )
        assert record.dtype == item["dtype"].removeprefix("torch.")
        if task == "tensor":  # every record's tensor loads, in the dtype and shape dump.json states
            tensor = record.data.load()
            assert (str(tensor.dtype), tuple(tensor.shape)) == (item["dtype"], record.shape)
        else:
            assert record.data is None
        if summary_mode == "md5":
            assert record.digest is not None and len(record.digest) == 8
    names = {record.key.name for record in dump.records}
    if level in ("L0", "mix"):  # modules are keyed by module path, as llmcheck's torch capture keys them
        assert {"model.layers.0.mlp.down_proj", "model.layers.1.self_attn", "model.norm"} <= names
        weight = next(
            r
            for r in dump.records
            if r.key.name == "model.layers.0.mlp.down_proj" and r.key.position == "parameters.weight"
        )
        assert weight.op_type == "Linear" and weight.shape == (32, 64) and weight.parent == "model.layers.0.mlp"
    if level in ("L1", "mix"):  # APIs by their msprobe name, call count and enclosing module
        linears = [r for r in dump.records if r.key.name == "Functional.linear" and r.key.io == "output"]
        assert len(linears) == 15  # 7 per layer, and the LM head
        assert linears[14].key.call_index == 14
    mean = next(r for r in dump.records if r.key.io == "output" and r.dtype == "float32").stats.mean
    assert isinstance(mean, float)


def test_the_peer_fixture_dump_reads_with_statistics_parents_and_stacks() -> None:
    dump = _load(PEER_DUMP)
    document = json.loads((PEER_DUMP / "dump.json").read_text())
    assert len(dump.records) == len(list(_tensor_items(document["data"]))) == 39
    first = dump.records[0]
    assert first.key.label() == "Tensor.__add__ step 0 input.0 (before)"
    assert (first.dtype, first.shape, first.stats.max) == ("int64", (), 423.0)
    assert first.attrs["stack"][0].startswith("File /path_to_package/mstt/")
    rms = next(r for r in dump.records if r.key.name == "NPU.npu_rms_norm")
    assert rms.parent == "module.module.language_model.encoder.layers.0.input_norm"
    backward = [r for r in dump.records if r.key.name == "NPU.npu_fusion_attention/backward"]
    assert backward and {r.key.io for r in backward} == {"input", "output"}


def test_the_rank_folders_of_one_step_are_read_as_one_multi_rank_run(tmp_path: Path) -> None:
    for rank in (0, 1):
        shutil.copytree(PEER_DUMP, tmp_path / "step0" / f"rank{rank}")
    dump = _load(tmp_path)
    assert dump.ranks == (0, 1) and len(dump.records) == 2 * 39
    assert len(dump.by_key()) == len(dump.records)  # the ranks' records keep apart
    assert dump.records[1].key.label() == "Tensor.__add__ step 0 input.0 (before) rank 1"
    assert len(_load(tmp_path / "step0" / "rank1").records) == 39


@pytest.mark.parametrize(
    "entry, expected",
    [
        ("Module.model.layers.2.mlp.LlamaMLP.forward.0", ("model.layers.2.mlp", "LlamaMLP", 0)),
        ("Module.model.layers.2.mlp.LlamaMLP.forward.3", ("model.layers.2.mlp", "LlamaMLP", 3)),
        ("Functional.linear.20.forward", ("Functional.linear", "Functional.linear", 20)),
        ("NPU.npu_fusion_attention.0.backward", ("NPU.npu_fusion_attention/backward", "NPU.npu_fusion_attention", 0)),
        ("Module.LlamaForCausalLM.forward.0", ("root", "LlamaForCausalLM", 0)),
    ],
)
def test_entry_names_become_module_paths_and_api_names_with_their_call_index(entry: str, expected: tuple) -> None:
    name = parse_entry_name(entry)
    assert (name.record_name, name.op_type, name.call_index) == expected


# --- comparing: the defect is named -------------------------------------------------------


@pytest.mark.slow
def test_msprobe_tensor_dumps_name_the_scaled_weight_as_first_introduced(msprobe_dump: Callable[..., Path]) -> None:
    result = _compare(
        msprobe_dump("--task", "tensor", "--level", "L0"), msprobe_dump("--task", "tensor", "--level", "L0", *DEFECT)
    )
    assert result.counts()["unmatched"] == 0
    introduced = result.first_introduced
    assert (introduced.golden.key.name, introduced.golden.key.position) == (DEFECT_MODULE, "parameters.weight")
    assert introduced.rule == "exact_key"
    assert introduced.metrics["relative_euclidean_distance"].value == pytest.approx(0.05, rel=1e-4)
    passing = {row.golden.key.name for row in result.rows if row.verdict == "pass"}
    assert "model.layers.1.mlp.gate_proj" in passing and "model.layers.0.mlp" in passing


@pytest.mark.slow
def test_msprobe_statistics_dumps_at_mix_level_name_the_defect_inside_its_module(
    msprobe_dump: Callable[..., Path],
) -> None:
    result = _compare(
        msprobe_dump("--task", "statistics", "--level", "mix"),
        msprobe_dump("--task", "statistics", "--level", "mix", *DEFECT),
    )
    introduced = result.first_introduced
    # The linear API call inside the module sees the scaled weight first (its input 1).
    assert (introduced.golden.key.name, introduced.golden.key.position) == ("Functional.linear", "1")
    assert introduced.golden.parent == DEFECT_MODULE
    assert introduced.deciding_metric == "l2norm_stat_relative_error"
    assert introduced.metrics["l2norm_stat_relative_error"].value == pytest.approx(0.05, rel=1e-4)


@pytest.mark.slow
def test_md5_dumps_are_exact_or_not(msprobe_dump: Callable[..., Path]) -> None:
    golden = msprobe_dump("--task", "statistics", "--level", "L1", "--summary-mode", "md5")
    rerun = msprobe_dump("--task", "statistics", "--level", "L1", "--summary-mode", "md5", "--writer", "msprobe")
    same = _compare(golden, rerun)
    assert same.counts()["failures"] == 0 and same.counts()["errors"] == 0
    assert all(
        row.metrics["digest_mismatch"].value == 0.0 and row.reason.startswith("digests equal: bit-identical")
        for row in same.rows
    )
    defect = _compare(golden, msprobe_dump("--task", "statistics", "--level", "L1", "--summary-mode", "md5", *DEFECT))
    introduced = defect.first_introduced
    assert introduced.deciding_metric == "digest_mismatch" and introduced.verdict == "fail"
    # L1 keeps no module tree: the call count says which linear (layer 1's up_proj is the 13th call).
    assert (introduced.golden.key.name, introduced.golden.key.call_index) == ("Functional.linear", 12)
    assert introduced.reason.startswith(
        f"digests differ (golden {introduced.golden.digest}, my {introduced.my.digest})"
    )


@pytest.mark.slow
@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_an_msprobe_dump_pairs_with_an_llmcheck_dump_by_module_path(
    msprobe_dump: Callable[..., Path], task: str
) -> None:
    (llmcheck_dump,) = msprobe_dump("--writer", "llmcheck").glob("llmcheck_dump_*")
    clean = _compare(llmcheck_dump, msprobe_dump("--task", task, "--level", "L0"))
    assert clean.counts()["failures"] == 0 and clean.counts()["pairs"] >= 60
    assert {row.rule for row in clean.rows} == {"msprobe_module_path"}
    defect = _compare(llmcheck_dump, msprobe_dump("--task", task, "--level", "L0", *DEFECT))
    introduced = defect.first_introduced
    assert (introduced.golden.key.name, introduced.golden.key.io) == (DEFECT_MODULE, "output")
    assert introduced.my.attrs["msprobe_entry"] == "Module.model.layers.1.mlp.up_proj.Linear.forward.0"


@pytest.mark.slow
def test_llmcheck_compare_on_two_msprobe_dumps_writes_the_culprit_to_summary_json(
    msprobe_dump: Callable[..., Path], tmp_path: Path
) -> None:
    code = main(
        [
            "compare",
            "--golden-path",
            str(msprobe_dump("--task", "tensor", "--level", "L0")),
            "--my-path",
            str(msprobe_dump("--task", "tensor", "--level", "L0", *DEFECT)),
            "-o",
            str(tmp_path / "out"),
            "-j",
            "1",
        ]
    )
    assert code == EXIT_FAILURES_FOUND
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["golden"]["source"] == summary["my"]["source"] == "msprobe"
    assert summary["first_introduced"]["name"] == DEFECT_MODULE


# --- bad inputs: one clean line -----------------------------------------------------------


class _RunsCode:
    """A pickle payload whose unpickling would create a file: it must never be unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _corrupted_copy(source: Path, destination: Path) -> tuple[Path, Path]:
    shutil.copytree(source, destination)
    dump_json = _dump_json(destination)
    return dump_json, dump_json.parent / "dump_tensor_data"


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage, expected",
    [
        ("truncated dump.json", "dump.json: not valid JSON"),
        (
            "dict payload",
            ".pt: refused: holds a dict, not a tensor (llmcheck loads msprobe tensors with "
            "torch.load(weights_only=True) only",
        ),
        ("code payload", ".pt: refused: not loadable with weights_only=True"),
    ],
)
def test_corrupt_msprobe_inputs_give_one_line_naming_the_file(
    msprobe_dump: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, expected: str
) -> None:
    golden = msprobe_dump("--task", "tensor", "--level", "L0")
    dump_json, tensors = _corrupted_copy(golden, tmp_path / "broken")
    marker = tmp_path / "unpickled"
    victim = tensors / "Module.model.layers.0.mlp.down_proj.Linear.forward.0.output.0.pt"
    if damage == "truncated dump.json":
        dump_json.write_bytes(dump_json.read_bytes()[: dump_json.stat().st_size // 2])
    elif damage == "dict payload":
        torch.save({"not": "a tensor"}, victim)
    else:
        victim.write_bytes(pickle.dumps(_RunsCode(marker)))
    code = main(
        ["compare", "--golden-path", str(golden), "--my-path", str(tmp_path / "broken"), "-o", str(tmp_path / "out")]
    )
    err = capsys.readouterr().err
    assert code in (1, 2)
    assert err.count("\n") == 1 and err.startswith("llmcheck: error: ")
    assert expected in err
    if damage != "truncated dump.json":
        assert str(victim) in err
    assert not marker.exists()


# --- a hand-written tensor-mode dump: what dump.json says and what the .pt files hold must agree --------


LAYER_1 = "Module.model.layers.1.mlp.LlamaMLP.forward.0"


def _write_tensor_dump(root: Path, scale: float = 1.0) -> Path:
    """Write a two-module L0 tensor-mode dump as msprobe lays it out; return its dump.json."""
    rank = root / "step0" / "rank0"
    (rank / "dump_tensor_data").mkdir(parents=True)
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4) / 8
    data = {}
    for layer in (0, 1):
        entry = f"Module.model.layers.{layer}.mlp.LlamaMLP.forward.0"
        y = x * (scale if layer == 1 else 1.0) + layer
        items = {}
        for section, tensor in (("input_args", x), ("output", y)):
            data_name = f"{entry}.{section.split('_')[0]}.0.pt"
            torch.save(tensor.clone(), rank / "dump_tensor_data" / data_name)
            items[section] = [
                {
                    "type": "torch.Tensor",
                    "dtype": "torch.float32",
                    "shape": list(tensor.shape),
                    "Max": tensor.max().item(),
                    "Min": tensor.min().item(),
                    "Mean": tensor.mean().item(),
                    "Norm": tensor.norm().item(),
                    "requires_grad": False,
                    "data_name": data_name,
                }
            ]
        data[entry] = {"input_args": items["input_args"], "input_kwargs": {}, "output": items["output"]}
        x = y
    header = {"task": "tensor", "level": "L0", "framework": "pytorch", "dump_data_dir": None}
    (rank / "dump.json").write_text(json.dumps({**header, "data": data}, indent=1))
    (rank / "construct.json").write_text(json.dumps({entry: None for entry in data}))
    (rank / "stack.json").write_text("{}")
    return rank / "dump.json"


def _edit_layer_1_output(dump_json: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    document = json.loads(dump_json.read_text())
    edit(document["data"][LAYER_1]["output"][0])
    dump_json.write_text(json.dumps(document))


def _compare_error(golden: Path, my: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["compare", "--golden-path", str(golden), "--my-path", str(my), "-o", str(out)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("damaged_side", ["my", "golden"])
@pytest.mark.parametrize("field", ["dtype", "shape"])
def test_a_tensor_item_without_dtype_or_shape_is_one_error_never_a_dropped_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, damaged_side: str
) -> None:
    _write_tensor_dump(tmp_path / "clean", scale=1.0)
    damaged_json = _write_tensor_dump(tmp_path / "damaged", scale=1.05)  # its layer 1 output is the failing tensor
    _edit_layer_1_output(damaged_json, lambda item: item.pop(field))
    golden, my = tmp_path / "clean", tmp_path / "damaged"
    if damaged_side == "golden":
        golden, my = my, golden

    code, err = _compare_error(golden, my, tmp_path / "out", capsys)

    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"llmcheck: error: {damaged_json}: {LAYER_1} output.0: tensor item has no {field} (")
    assert not (tmp_path / "out" / "summary.json").exists()


def test_a_pt_file_of_another_dtype_than_dump_json_states_names_both_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_tensor_dump(tmp_path / "golden")
    dump_json = _write_tensor_dump(tmp_path / "my")
    pt_file = dump_json.parent / "dump_tensor_data" / f"{LAYER_1}.output.0.pt"
    torch.save(torch.load(pt_file).half(), pt_file)  # dump.json still says float32 [2, 4]

    code, err = _compare_error(tmp_path / "golden", tmp_path / "my", tmp_path / "out", capsys)

    assert code == 1 and err.count("\n") == 1
    assert err.startswith(
        f"llmcheck: error: {pt_file}: dtype mismatch: the file holds float16, {dump_json} says float32 "
        f"for {LAYER_1} output.0 (the dump disagrees with itself"
    )


def test_a_dump_json_shape_the_pt_file_does_not_have_is_the_dump_disagreeing_with_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_tensor_dump(tmp_path / "golden")
    dump_json = _write_tensor_dump(tmp_path / "my")
    _edit_layer_1_output(dump_json, lambda item: item.update(shape=[3, 4]))  # the .pt holds [2, 4]

    code, err = _compare_error(tmp_path / "golden", tmp_path / "my", tmp_path / "out", capsys)

    assert code == 1 and err.count("\n") == 1
    pt_file = dump_json.parent / "dump_tensor_data" / f"{LAYER_1}.output.0.pt"
    assert err.startswith(
        f"llmcheck: error: {pt_file}: shape mismatch: the file holds [2, 4], {dump_json} says [3, 4] "
        f"for {LAYER_1} output.0 (the dump disagrees with itself"
    )


def test_an_8_bit_float_msprobe_saved_as_float32_reads_and_keyword_items_are_not_tensors(tmp_path: Path) -> None:
    dump_json = _write_tensor_dump(tmp_path / "dump")
    _edit_layer_1_output(dump_json, lambda item: item.update(dtype="torch.float8_e4m3fn"))
    document = json.loads(dump_json.read_text())
    document["data"][LAYER_1]["input_kwargs"] = {  # keyword arguments named dtype and shape: no tensor
        "dtype": {"type": "torch.dtype", "value": "torch.float32"},
        "shape": {"type": "torch.Size", "value": [2, 4]},
    }
    dump_json.write_text(json.dumps(document))

    records = _load(tmp_path / "dump").records

    assert len(records) == 4
    output = next(r for r in records if r.key.name == "model.layers.1.mlp" and r.key.io == "output")
    assert (output.dtype, output.attrs["saved_dtype"]) == ("float8_e4m3fn", "float32")
    assert output.data.load().dtype == torch.float32


def test_an_absent_pt_file_is_named_in_a_warning_and_its_record_judged_on_statistics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING")
    dump_json = _write_tensor_dump(tmp_path / "dump")
    absent = dump_json.parent / "dump_tensor_data" / f"{LAYER_1}.output.0.pt"
    absent.unlink()

    records = _load(tmp_path / "dump").records

    output = next(r for r in records if r.key.name == "model.layers.1.mlp" and r.key.io == "output")
    assert output.data is None and output.stats.max == pytest.approx(1.875)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "llmcheck.msprobe"]
    assert f"1 tensor files named in dump.json are absent ({absent})" in warning
