"""The FX backend's fast path: ATen graphs rewritten to record into an llmcheck dump, beside torchair's layout."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.dumps.store import find_dumps
from llmcheck.core.errors import LlmcheckError, UsageError
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.torchair_fx import dump_exported_program, make_fx_dump_backend

NO_CACHE = {"use_cache": False}


def _exported_llama(dtype: torch.dtype = torch.float32):
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0).to(dtype)
    input_ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(2))
    return model, input_ids, torch.export.export(model, (input_ids,), NO_CACHE, strict=False)


@pytest.fixture(scope="module")
def llama_dumps(tmp_path_factory) -> dict[str, Path]:
    """Return an exported seeded Llama's fp32 run dumped in both layouts and its bf16 run in llmcheck's."""
    root = tmp_path_factory.mktemp("fx_fast")
    _, input_ids, program = _exported_llama()
    fast_result = dump_exported_program(program, (input_ids,), NO_CACHE, dump_path=root / "fast")
    torchair_result = dump_exported_program(program, (input_ids,), NO_CACHE, dump_path=root / "npy", layout="torchair")
    with torch.no_grad():
        plain = program.module()(input_ids, **NO_CACHE)
    # the capture changes nothing: the fast path's and the interpreter's outputs are the plain graph's, bit for bit
    assert torch.equal(fast_result.logits, plain.logits) and torch.equal(torchair_result.logits, plain.logits)
    _, _, bf16_program = _exported_llama(torch.bfloat16)
    dump_exported_program(bf16_program, (input_ids,), NO_CACHE, dump_path=root / "bf16")
    return {"fast": root / "fast", "npy": root / "npy", "bf16": root / "bf16", "root": root}


def _compare(golden: Path, my: Path, output: Path) -> dict:
    code = main(["compare", "--golden-path", str(golden), "--my-path", str(my), "-o", str(output), "-j", "1"])
    assert code in (0, 3)
    return json.loads((output / "summary.json").read_text())


@pytest.mark.slow
def test_fast_dump_holds_the_records_of_the_torchair_layout_with_the_same_values(llama_dumps):
    plugins = get_plugins()
    fast, npy = plugins.load_tensors(llama_dumps["fast"]), plugins.load_tensors(llama_dumps["npy"])

    assert (fast.source, npy.source) == ("llmcheck", "fx")
    assert fast.manifest["backend"] == "fx" and fast.cut is None
    by_key = {record.key: record for record in npy.records}
    assert [r.key for r in fast.records] == [r.key for r in npy.records]  # same names, io, positions, in call order
    for record in fast.records:
        twin = by_key[record.key]
        assert (record.dtype, record.shape, record.op_type) == (twin.dtype, twin.shape, twin.op_type)
        assert torch.equal(record.data.load(), twin.data.load()), record.key.label()
        assert {k: record.attrs[k] for k in ("fx_node", "fx_target", "graph_index")} == {
            k: twin.attrs[k] for k in ("fx_node", "fx_target", "graph_index")
        }
    assert fast.manifest["non_numeric_arguments"] == npy.manifest["non_numeric_files"] > 0
    mm = next(r for r in fast.records if r.op_type == "aten.embedding.default" and r.key.io == "output")
    assert mm.stats is not None and mm.stats.max == pytest.approx(float(mm.data.load().max()))
    # an output that is the next call's input is stored once: fewer tensors than records hold data
    stored = {(r.data.path, r.data.offset) for r in fast.records}
    assert len(stored) < len(fast.records)
    assert [child.op_type for child in fast.topology.children] == ["GraphModule"]


@pytest.mark.slow
def test_compare_pairs_a_fast_dump_with_the_torchair_layout_and_with_a_bf16_fast_dump(llama_dumps):
    same = _compare(llama_dumps["npy"], llama_dumps["fast"], llama_dumps["root"] / "npy_vs_fast")
    assert same["counts"]["unmatched"] == 0 and same["counts"]["failures"] == 0
    assert same["counts"]["pairs"] == len(get_plugins().load_tensors(llama_dumps["fast"]).records)

    output = llama_dumps["root"] / "fp32_vs_bf16"
    _compare(llama_dumps["fast"], llama_dumps["bf16"], output)
    pairs = json.loads((output / "pairs.json").read_text())
    assert {pair["rule"] for pair in pairs["pairs"]} == {"exact_key"}
    assert len(pairs["pairs"]) == len(get_plugins().load_tensors(llama_dumps["fast"]).records)
    assert pairs["unmatched_golden"] == [] and pairs["unmatched_my"] == []  # the exported graphs have the same nodes
    bf16 = get_plugins().load_tensors(llama_dumps["bf16"])
    assert {r.dtype for r in bf16.records if r.op_type == "aten.linear.default"} == {"bfloat16"}


def test_statistics_only_keeps_statistics_and_tensor_part_picks_the_side(tmp_path):
    program_input = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    program = torch.export.export(_TwoOps(), (program_input,), strict=False)

    dump_exported_program(program, (program_input,), dump_path=tmp_path / "stats", statistics_only=True)
    dump_exported_program(program, (program_input,), dump_path=tmp_path / "outputs", tensor_part=1)

    stats = get_plugins().load_tensors(tmp_path / "stats")
    assert stats.records and all(r.data is None and r.stats is not None for r in stats.records)
    relu_out = next(r for r in stats.records if r.op_type == "aten.relu.default" and r.key.io == "output")
    assert relu_out.stats.min == 0.0 and relu_out.stats.max == pytest.approx(float((program_input * 2).relu().max()))
    outputs = get_plugins().load_tensors(tmp_path / "outputs")
    assert [(r.key.name, r.key.io) for r in outputs.records] == [("mul", "output"), ("relu", "output")]


class _TwoOps(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear(self.norm(x))


class _BrokenStack(torch.nn.Module):
    """Two blocks with a graph break between them: torch.compile makes two graphs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = _Block(), _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        torch._dynamo.graph_break()
        return self.second(hidden)


def _compile_twice(model: torch.nn.Module, inputs: torch.Tensor, backend) -> list[torch.Tensor]:
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend)
        with torch.no_grad():
            return [compiled(inputs) for _ in range(2)]
    finally:
        torch._dynamo.reset()


def test_torch_compile_fast_path_is_bit_exact_and_names_records_like_the_torchair_layout(tmp_path):
    model = _BrokenStack().eval()
    inputs = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(1))
    with make_fx_dump_backend(tmp_path / "fast") as backend:
        fast_outputs = _compile_twice(model, inputs, backend)
    npy_outputs = _compile_twice(model, inputs, make_fx_dump_backend(tmp_path / "npy", layout="torchair"))
    with torch.no_grad():
        eager = model(inputs)

    assert all(torch.equal(output, eager) for output in [*fast_outputs, *npy_outputs])  # bitwise
    fast = get_plugins().load_tensors(tmp_path / "fast")
    npy = get_plugins().load_tensors(tmp_path / "npy")
    assert find_dumps(tmp_path / "fast") == [backend.path] and fast.manifest["graphs"] == 2
    assert {r.key.step for r in fast.records} == {0, 1}  # one step per call of each graph
    # both layouts keep the first graph's node names and prefix later graphs: the same keys
    assert {r.key for r in fast.records} == {r.key for r in npy.records}
    assert any(r.key.name.startswith("graph1/") for r in fast.records)
    assert len(fast.records) == len(npy.records)


def test_the_environment_backend_writes_one_dump_in_the_layout_it_names(tmp_path, monkeypatch):
    from llmcheck.plugins.torchair_fx import fx_backend

    monkeypatch.setenv("LLMCHECK_FX_DUMP_PATH", str(tmp_path / "env"))
    monkeypatch.setenv("LLMCHECK_FX_DUMP_LAYOUT", "llmcheck")
    model = _BrokenStack().eval()
    inputs = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(1))
    _compile_twice(model, inputs, fx_backend.fx_dump_backend)
    fx_backend._ENVIRONMENT_BACKENDS.pop((str(tmp_path / "env"), "llmcheck")).close()  # what the process's exit does

    (dump_folder,) = find_dumps(tmp_path / "env")  # both graphs in one dump
    assert get_plugins().load_tensors(dump_folder).manifest["graphs"] == 2

    monkeypatch.setenv("LLMCHECK_FX_DUMP_LAYOUT", "npy")
    with pytest.raises(UsageError, match="unknown FX dump layout 'npy'") as caught:
        fx_backend.fx_dump_backend(torch.fx.symbolic_trace(_TwoOps()), [inputs])
    assert caught.value.one_line().startswith("LLMCHECK_FX_DUMP_LAYOUT: ")


def test_a_dump_path_that_is_a_file_or_a_bad_option_is_one_clean_error(tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("not a folder")
    program = torch.export.export(_TwoOps(), (torch.ones(2),), strict=False)

    for layout in ("llmcheck", "torchair"):
        with pytest.raises(UsageError, match="exists and is not a folder") as caught:
            make_fx_dump_backend(a_file, layout=layout)
        assert caught.value.one_line().startswith(f"{a_file}: ")
        with pytest.raises(UsageError, match="exists and is not a folder"):
            dump_exported_program(program, (torch.ones(2),), dump_path=a_file, layout=layout)
    with pytest.raises(LlmcheckError, match="cannot create the output folder"):
        make_fx_dump_backend(a_file / "below")
    with pytest.raises(UsageError, match="unknown FX dump layout 'npy'"):
        make_fx_dump_backend(tmp_path / "ok", layout="npy")
    with pytest.raises(UsageError, match="apply to the llmcheck layout only"):
        dump_exported_program(program, (torch.ones(2),), dump_path=tmp_path / "ok", layout="torchair", tensor_part=1)
    with pytest.raises(UsageError, match="tensor_part must be 0, 1 or 2"):
        make_fx_dump_backend(tmp_path / "ok", tensor_part=3)
    assert not (tmp_path / "ok").exists() or find_dumps(tmp_path / "ok") == []


class _SparseSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.add.Tensor(x, x)


def test_a_tensor_that_cannot_be_stored_is_logged_and_described(tmp_path, caplog):
    from llmcheck.plugins.torchair_fx.fx_recording import FxDump

    module = torch.fx.symbolic_trace(_SparseSum())
    sparse = torch.eye(3).to_sparse()
    with FxDump(tmp_path) as dump, caplog.at_level(logging.WARNING, logger="llmcheck.fx"):
        recorder = dump.add_graph(module, [sparse])
        result = recorder.run_step(module, sparse)

    assert torch.equal(result.to_dense(), 2 * torch.eye(3))
    records = get_plugins().load_tensors(tmp_path).records
    assert [(r.key.name, r.key.io, r.key.position) for r in records] == [
        ("add_tensor", "input", "0"),
        ("add_tensor", "input", "1"),
        ("add_tensor", "output", "0"),
    ]
    assert all(r.data is None and r.attrs["not_captured"].startswith("torch.sparse_coo") for r in records)
    assert "add_tensor input.0 step 0 is a torch.sparse_coo" in caplog.text
