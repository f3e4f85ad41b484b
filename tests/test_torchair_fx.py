"""torchair FX dumps: the loader's layouts and broken files, and FX capture of real HF models on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from llmcheck.core.errors import DumpFormatError, DumpNotFoundError
from llmcheck.core.pairing.merge import merge_pairs
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.torchair_fx.fx_dump import FxDumpFileName, parse_fx_file_name

STAMP = "20240125031118787351"


def _save(folder: Path, name: str, array: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / name, array)


def test_fx_file_names_give_node_target_io_and_list_positions():
    assert parse_fx_file_name(f"mm-aten.mm.default.INPUT.1.{STAMP}.npy") == FxDumpFileName(
        "mm", "aten.mm.default", "input", "1", int(STAMP)
    )
    assert parse_fx_file_name(f"cat_2-aten.cat.default.INPUT.0.3.{STAMP}.npy").position == "0.3"
    assert parse_fx_file_name(f"split-aten.split.Tensor.OUTPUT.1.{STAMP}.npy").io == "output"
    assert parse_fx_file_name("mm-aten.mm.default.INPUT.1.npy") is None
    assert parse_fx_file_name("Add.Add_2.44.6.1706596912161941") is None


def test_rank_layout_steps_are_the_folder_numbers_and_graphs_after_the_first_are_prefixed(tmp_path):
    rank = tmp_path / "worldsize1_global_rank0"
    for graph, stamp in (("gm_20240101000000000001_dump", "1"), ("gm_20240101000000000002_dump", "2")):
        for step in (0, 1):
            _save(rank / graph / str(step), f"add-aten.add.Tensor.INPUT.0.{stamp}0.npy", np.full(3, step, np.float32))
            _save(
                rank / graph / str(step), f"add-aten.add.Tensor.OUTPUT.0.{stamp}0.npy", np.full(3, step + 1, np.float32)
            )

    dump = get_plugins().load_tensors(tmp_path, "fx")

    labels = [r.key.label() for r in dump.records]
    assert labels == [
        "add step 0 input.0",
        "add step 0 output.0",
        "graph1/add step 0 input.0",
        "graph1/add step 0 output.0",
        "add step 1 input.0",
        "add step 1 output.0",
        "graph1/add step 1 input.0",
        "graph1/add step 1 output.0",
    ]
    assert dump.records[-1].data.load().tolist() == [2, 2, 2]
    assert dump.records[0].attrs["fx_node"] == "add" and dump.records[0].op_type == "aten.add.Tensor"


def test_old_data_dump_layout_counts_steps_from_one(tmp_path):
    graph = tmp_path / "data_dump" / "1" / "gm_20240101000000000001_dump"
    _save(graph, f"mm-aten.mm.default.OUTPUT.0.{STAMP}.npy", np.eye(2, dtype=np.float16))
    _save(
        tmp_path / "data_dump" / "2" / "gm_20240101000000000001_dump",
        f"mm-aten.mm.default.OUTPUT.0.{STAMP}.npy",
        np.eye(2, dtype=np.float16),
    )

    dump = get_plugins().load_tensors(tmp_path / "data_dump")

    assert dump.source == "fx"
    assert [(r.key.name, r.key.step, r.dtype) for r in dump.records] == [("mm", 0, "float16"), ("mm", 1, "float16")]


def test_fortran_order_big_endian_and_text_arguments(tmp_path):
    folder = tmp_path / "gm_20240101000000000001_dump" / "0"
    matrix = np.arange(6, dtype=np.float32).reshape(2, 3)
    _save(folder, f"t-aten.t.default.INPUT.0.{STAMP}.npy", np.asfortranarray(matrix.T))
    _save(folder, f"t-aten.t.default.OUTPUT.0.{STAMP}.npy", matrix.astype(">f4"))
    _save(folder, f"to-aten._to_copy.default.INPUT.1.{STAMP}.npy", np.array("torch.float16"))

    dump = get_plugins().load_tensors(tmp_path, "fx")

    assert [r.key.label() for r in dump.records] == ["t step 0 input.0", "t step 0 output.0"]
    assert dump.records[0].data.load().tolist() == matrix.T.tolist()
    assert dump.records[1].data.load().tolist() == matrix.tolist()
    assert dump.manifest["non_numeric_files"] == 1


def test_truncated_npy_and_several_ranks_are_clear_errors(tmp_path):
    folder = tmp_path / "one" / "gm_20240101000000000001_dump" / "0"
    _save(folder, f"add-aten.add.Tensor.OUTPUT.0.{STAMP}.npy", np.ones(100, np.float32))
    path = folder / f"add-aten.add.Tensor.OUTPUT.0.{STAMP}.npy"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DumpFormatError, match="truncated: float32 shape \\[100\\] needs 400 bytes") as caught:
        get_plugins().load_tensors(tmp_path / "one", "fx")
    assert str(path) in caught.value.one_line()

    for rank in (0, 1):
        _save(
            tmp_path / "two" / f"worldsize2_global_rank{rank}" / "gm_20240101000000000001_dump" / "0",
            f"add-aten.add.Tensor.OUTPUT.0.{STAMP}.npy",
            np.ones(2, np.float32),
        )
    with pytest.raises(DumpNotFoundError, match="several ranks"):
        get_plugins().load_tensors(tmp_path / "two", "fx")


# --- capture on this machine ------------------------------------------------------------


def _random_qwen2(dtype: torch.dtype = torch.float32, attention: str = "sdpa"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        attn_implementation=attention,
    )
    return Qwen2ForCausalLM(config).eval().to(dtype)


def _compile_and_dump(model, input_ids: torch.Tensor, dump_path: Path, calls: int = 1):
    from llmcheck.plugins.torchair_fx import make_fx_dump_backend

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=make_fx_dump_backend(dump_path, layout="torchair"))
    with torch.no_grad():
        outputs = [compiled(input_ids, use_cache=False).logits for _ in range(calls)]
    torch._dynamo.reset()
    return outputs


@pytest.mark.slow
def test_torch_compile_backend_dumps_a_real_qwen2_and_fp32_vs_bf16_pair_every_node_by_name(tmp_path):
    input_ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    fp32_model = _random_qwen2()
    fp32_logits = _compile_and_dump(fp32_model, input_ids, tmp_path / "fp32", calls=2)
    with torch.no_grad():
        eager = fp32_model(input_ids, use_cache=False).logits
    assert torch.equal(fp32_logits[0], eager) and torch.equal(fp32_logits[1], eager)
    _compile_and_dump(_random_qwen2(torch.bfloat16), input_ids, tmp_path / "bf16")

    plugins = get_plugins()
    golden, my = plugins.load_tensors(tmp_path / "fp32", "fx"), plugins.load_tensors(tmp_path / "bf16", "fx")
    assert {r.key.step for r in golden.records} == {0, 1}  # one step per call of the compiled graph
    assert {r.op_type for r in golden.records} >= {"aten.mm.default", "aten.embedding.default", "aten.rsqrt.default"}
    bf16_mm = [r for r in my.records if r.op_type == "aten.mm.default"]
    assert {np.load(r.data.loader.path).dtype for r in bf16_mm} == {np.dtype("float32")}  # saved as torchair does
    assert {r.dtype for r in bf16_mm} == {"bfloat16"} and bf16_mm[0].data.load().dtype == torch.bfloat16
    pairing = merge_pairs(golden, my, plugins.map_pairs(golden, my, None))

    golden_step0 = [r for r in golden.records if r.key.step == 0]
    paired = {id(pair.golden) for pair in pairing.pairs if pair.rule == "exact_key"}
    assert all(id(record) in paired for record in golden_step0)
    extra_bf16_nodes = {item.record.attrs["fx_target"] for item in pairing.unmatched_my}
    assert extra_bf16_nodes == {"aten._to_copy.default"}  # the casts only a bf16 model has
    logits = max(golden_step0, key=lambda r: r.order)
    assert logits.shape == (1, 8, 256)


@pytest.mark.slow
def test_torch_export_program_of_hf_llama_is_dumped_and_compared_by_node_name(tmp_path, tiny_llama):
    from llmcheck.core.cli import main
    from llmcheck.plugins.torchair_fx import dump_exported_program

    input_ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(2))
    program = torch.export.export(tiny_llama, (input_ids,), {"use_cache": False}, strict=False)
    result = dump_exported_program(
        program, (input_ids,), {"use_cache": False}, dump_path=tmp_path / "a", layout="torchair"
    )
    dump_exported_program(program, (input_ids,), {"use_cache": False}, dump_path=tmp_path / "b", layout="torchair")
    with torch.no_grad():
        assert torch.equal(result.logits, tiny_llama(input_ids, use_cache=False).logits)

    assert (
        main(
            [
                "compare",
                "--golden-path",
                str(tmp_path / "a"),
                "--my-path",
                str(tmp_path / "b"),
                "-o",
                str(tmp_path / "report"),
                "-j",
                "1",
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["counts"]["failures"] == 0 and summary["counts"]["unmatched"] == 0
    assert summary["counts"]["pairs"] == len(get_plugins().load_tensors(tmp_path / "a").records)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_cuda_runs_of_one_graph_pair_by_node_name_and_agree(tmp_path):
    from llmcheck.core.cli import main

    # SDPA lowers to a different ATen kernel per device (and renumbers the nodes after it);
    # the eager attention traces the same graph on both
    input_ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    _compile_and_dump(_random_qwen2(attention="eager"), input_ids, tmp_path / "cpu")
    _compile_and_dump(_random_qwen2(attention="eager").cuda(), input_ids.cuda(), tmp_path / "cuda")

    assert (
        main(
            [
                "compare",
                "--golden-path",
                str(tmp_path / "cpu"),
                "--my-path",
                str(tmp_path / "cuda"),
                "-o",
                str(tmp_path / "report"),
                "-j",
                "1",
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["counts"]["unmatched"] == 0 and summary["counts"]["pairs"] > 500
    assert summary["counts"]["failures"] == 0 and summary["counts"]["errors"] == 0, summary["first_divergence"]


def test_saved_dtypes_file_restores_bfloat16_and_a_broken_one_is_named(tmp_path):
    folder = tmp_path / "gm_20240101000000000001_dump" / "0"
    values = torch.tensor([1.5, -0.0078125, 3.0e38], dtype=torch.bfloat16)
    file_name = f"mul-aten.mul.Tensor.OUTPUT.0.{STAMP}.npy"
    _save(folder, file_name, values.float().numpy())
    (folder / "llmcheck_saved_dtypes.json").write_text(json.dumps({file_name: "bfloat16"}))

    (record,) = get_plugins().load_tensors(tmp_path, "fx").records
    assert record.dtype == "bfloat16" and torch.equal(record.data.load(), values)

    (folder / "llmcheck_saved_dtypes.json").write_text("{not json")
    with pytest.raises(DumpFormatError, match=r"llmcheck_saved_dtypes\.json: not valid JSON"):
        get_plugins().load_tensors(tmp_path, "fx")


@pytest.mark.parametrize("corrupt_descr", ["|O", "|V4", [("a", "<f4")]])
def test_a_tensor_file_whose_header_dtype_is_corrupted_is_an_error_naming_it(tmp_path, corrupt_descr):
    path = tmp_path / "gm_20240101000000000001_dump" / "0" / f"add-aten.add.Tensor.OUTPUT.0.{STAMP}.npy"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as stream:  # a float32 tensor file whose header's dtype was changed
        np.lib.format.write_array_header_1_0(stream, {"descr": corrupt_descr, "fortran_order": False, "shape": (4,)})
        stream.write(np.ones(4, np.float32).tobytes())
    with pytest.raises(DumpFormatError, match="neither a tensor nor the text of a non-tensor argument") as caught:
        get_plugins().load_tensors(tmp_path, "fx")
    assert str(path) in caught.value.one_line()


def test_a_tensor_file_whose_header_text_is_cut_is_an_error_naming_it(tmp_path):
    path = tmp_path / "gm_20240101000000000001_dump" / "0" / f"add-aten.add.Tensor.OUTPUT.0.{STAMP}.npy"
    path.parent.mkdir(parents=True)
    np.save(path, np.ones(4, np.float32))
    content = path.read_bytes()
    path.write_bytes(content.replace(b"(4,)", b"(4, ", 1))  # numpy's literal parser meets an unclosed tuple
    with pytest.raises(DumpFormatError, match=r"not a valid \.npy file") as caught:
        get_plugins().load_tensors(tmp_path, "fx")
    assert str(path) in caught.value.one_line()
