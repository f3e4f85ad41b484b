"""Topology JSON -> ONNX: the peer's real Bloom model topology passes onnx.checker at every level,
parameters are typed attributes, and the op CSV gives element types (float and bf16 right) and shapes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto

from llmcheck.core.cli import main
from llmcheck.plugins.atb import atb_json_to_onnx
from llmcheck.plugins.atb.onnx_export import ATB_DOMAIN
from llmcheck.plugins.atb.topology import depth_of, read_topology

DATA = Path(__file__).parent / "data" / "atb"
BLOOM = DATA / "peer_model_Bloom7BFlashAttentionModel.json"
COLUMNS = (
    "CaseNum|CaseName|OpName|OpParam|InNum|InDType|InFormat|InShape|OutNum|OutDType|OutFormat|OutShape|"
    "DataGenType|DataGenRange|InTensorFile|OutTensorFile|TestType|TestLevel|FromModel|SocVersion|ExpectedError"
)


def attributes(node: onnx.NodeProto) -> dict:
    return {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}


@pytest.mark.parametrize("level", [-1, 0, 1, 2, 3, 4, 5])
def test_peer_bloom_topology_passes_the_onnx_checker_at_every_level(tmp_path, level):
    written = atb_json_to_onnx(BLOOM, level, tmp_path / f"bloom_{level}.onnx")
    model = onnx.load(written)
    onnx.checker.check_model(model, full_check=True)
    assert {(opset.domain, opset.version) for opset in model.opset_import} >= {("", 17), (ATB_DOMAIN, 1)}
    names = [node.name for node in model.graph.node]
    assert len(names) == len(set(names)) and all(node.domain == ATB_DOMAIN for node in model.graph.node)
    expected_count = {0: 1, 1: 1, 2: 11, 3: 14}.get(level, 16)  # 16 leaf operations in the file
    assert len(names) == expected_count


def test_levels_show_the_layer_its_children_and_the_leaves():
    root = read_topology(BLOOM)
    assert depth_of(root) == 4
    leaves = [node.op_type for node in onnx.load_from_string(_model_bytes(-1)).graph.node]
    assert leaves[:4] == ["LayerNormOperation", "LinearOperation", "SplitOperation", "SelfAttentionOperation"]
    level2 = [node.name for node in onnx.load_from_string(_model_bytes(2)).graph.node]
    assert "ParallelLinearBaseV2_3_4" in level2 and "MlpGateLayerV2_3_7" in level2
    (only,) = onnx.load_from_string(_model_bytes(1)).graph.node
    assert (only.name, only.op_type, len(only.input), len(only.output)) == ("Bloom7bCommonLayer_3", "BloomLayer", 24, 3)


def _model_bytes(level: int) -> bytes:
    from llmcheck.plugins.atb.onnx_export import build_onnx_model

    return build_onnx_model(read_topology(BLOOM), level, {}).SerializeToString()


def test_op_params_become_typed_attributes_with_nested_objects_flattened():
    nodes = {node.name: node for node in onnx.load_from_string(_model_bytes(-1)).graph.node}
    norm = attributes(nodes["LayerNormOperation_3_0"])
    assert norm["layerType"] == 1 and norm["normParam.beginNormAxis"] == 2
    assert norm["normParam.epsilon"] == pytest.approx(1e-05)
    assert {a.name: a.type for a in nodes["LayerNormOperation_3_0"].attribute}[
        "normParam.epsilon"
    ] == onnx.AttributeProto.FLOAT
    linear = attributes(nodes["LinearOperation_3_1"])
    assert linear == {"hasBias": 1, "transposeA": 0, "transposeB": 0}
    attention = nodes["SelfAttentionOperation_3_3"]
    names = [a.name for a in attention.attribute]
    assert len(names) == len(set(names)) and attributes(attention)["headNum"] == 32


def test_op_csv_beside_the_dump_gives_float_and_bf16_element_types_and_shapes(tmp_path):
    model_dir = tmp_path / "msit_dump_20240131_120000" / "model" / "4242"
    model_dir.mkdir(parents=True)
    json_path = model_dir / "Bloom7BFlashAttentionModel.json"
    shutil.copy(BLOOM, json_path)
    csv_dir = tmp_path / "msit_dump_20240131_120000" / "operation_io_tensors" / "4242"
    csv_dir.mkdir(parents=True)
    (csv_dir / "operation_tensors_0.csv").write_text(
        "\n".join(
            [
                COLUMNS,
                "1|LayerNormOperation_3_01|LayerNormOperation_3_0|{}|3|float;float;float|nd;nd;nd|7,4096;4096;4096|1|bf16|nd|"
                "7,4096|customize;customize;customize| |a;b;c|d|||||NO_ERROR",
                "2|LinearOperation_3_12|LinearOperation_3_1|{}|3|bf16;bf16;float|nd;nd;nd|7,4096;4096,12288;12288|1|bf16|nd|"
                "7,12288|customize;customize;customize| |a;b;c|d|||||NO_ERROR",
            ]
        )
        + "\n"
    )
    model = onnx.load(atb_json_to_onnx(json_path, -1))
    assert json_path.with_suffix(".onnx").is_file()
    types = {
        info.name: info.type.tensor_type for info in [*model.graph.input, *model.graph.output, *model.graph.value_info]
    }
    norm, linear = model.graph.node[0], model.graph.node[1]
    norm_in = types[norm.input[0]]
    assert norm_in.elem_type == TensorProto.FLOAT and [d.dim_value for d in norm_in.shape.dim] == [7, 4096]
    norm_out = types[norm.output[0]]
    assert norm_out.elem_type == TensorProto.BFLOAT16 and [d.dim_value for d in norm_out.shape.dim] == [7, 4096]
    weight = types[linear.input[1]]
    assert weight.elem_type == TensorProto.BFLOAT16 and [d.dim_value for d in weight.shape.dim] == [4096, 12288]
    onnx.checker.check_model(model, full_check=True)


def test_a_tensor_written_twice_gets_a_versioned_name_so_the_graph_stays_ssa(tmp_path):
    layer = {
        "opName": "Decoder_0",
        "opType": "Decoder",
        "param": "",
        "inTensors": ["x", "cache"],
        "outTensors": ["y"],
        "nodes": [
            {
                "opName": "KvCacheOperation_0_0",
                "opType": "KvCacheOperation",
                "param": {},
                "inTensors": ["x", "cache"],
                "outTensors": ["cache"],
            },
            {
                "opName": "SelfAttentionOperation_0_1",
                "opType": "SelfAttentionOperation",
                "param": {
                    "headNum": 2,
                    "qkScale": 0.5,
                    "kernelType": "high",
                    "tags": ["a", "b"],
                    "sizes": [1, 2],
                    "mixed": [1, 2.5],
                    "big": 2**70,
                    "nothing": None,
                    "empty": [],
                },
                "inTensors": ["x", "cache"],
                "outTensors": ["y"],
            },
        ],
    }
    path = tmp_path / "Decoder_0.json"
    path.write_text(json.dumps(layer))
    model = onnx.load(atb_json_to_onnx(path, -1))
    kv, attention = model.graph.node
    assert list(kv.output) == ["cache@2"] and list(attention.input) == ["x", "cache@2"]
    assert [i.name for i in model.graph.input] == ["x", "cache"] and [o.name for o in model.graph.output] == ["y"]
    values = attributes(attention)
    assert values["kernelType"] == b"high" and values["tags"] == [b"a", b"b"] and values["sizes"] == [1, 2]
    assert values["mixed"] == pytest.approx([1.0, 2.5]) and values["big"] == str(2**70).encode()
    assert values["nothing"] == b"null" and values["empty"] == []
    onnx.checker.check_model(model, full_check=True)


def test_export_onnx_command_writes_the_file_and_says_where(tmp_path, capsys):
    out = tmp_path / "bloom.onnx"
    assert main(["export", "onnx", str(BLOOM), "--level", "2", "-o", str(out)]) == 0
    assert f"llmcheck: wrote {out}" in capsys.readouterr().out
    assert len(onnx.load(out).graph.node) == 11


def test_export_onnx_of_a_broken_topology_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "broken.json"
    path.write_text('{"opName": "X_0", "opType": "X", "nodes": [{"opName": 3}]}')
    assert main(["export", "onnx", str(path)]) == 1
    assert capsys.readouterr().err.strip() == f"llmcheck: error: {path}: a node has no string opName/opType"
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    assert main(["export", "onnx", str(other)]) == 1
    assert "no plugin recognises this topology file" in capsys.readouterr().err


LAYER = DATA / "msit_dump_20240131_120000" / "layer" / "4242" / "Decoder_layer_0.json"


def test_export_onnx_keeps_a_file_that_is_not_an_onnx_model_and_says_what_it_holds(tmp_path, capsys):
    notes = tmp_path / "precious.onnx"
    notes.write_text("my notes, not an onnx model\n")
    assert main(["export", "onnx", str(LAYER), "-o", str(notes)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        f"llmcheck: error: {notes}: exists and holds text (28 bytes, starting 'my notes, not an onnx model'), "
        "not an ONNX model; it is kept (pass another path with -o, or move the file away)"
    )
    assert notes.read_text() == "my notes, not an onnx model\n" and "wrote" not in captured.out
    data = tmp_path / "weights.onnx"
    data.write_bytes(bytes(range(256)) * 4)
    assert main(["export", "onnx", str(LAYER), "-o", str(data)]) == 2
    assert f"{data}: exists and holds 1024 bytes of data, not an ONNX model; it is kept" in capsys.readouterr().err
    assert data.read_bytes() == bytes(range(256)) * 4
    assert sorted(path.name for path in tmp_path.iterdir()) == ["precious.onnx", "weights.onnx"]  # no leftovers


def test_export_onnx_keeps_a_non_model_at_the_default_path_beside_the_topology(tmp_path, capsys):
    topology = tmp_path / "Decoder_layer_0.json"
    shutil.copy(LAYER, topology)
    beside = tmp_path / "Decoder_layer_0.onnx"
    beside.write_text("hand-drawn graph notes\n")
    assert main(["export", "onnx", str(topology)]) == 2
    assert capsys.readouterr().err.startswith(f"llmcheck: error: {beside}: exists and holds text")
    assert beside.read_text() == "hand-drawn graph notes\n"


def test_export_onnx_replacing_an_earlier_export_says_so(tmp_path, capsys, caplog):
    out = tmp_path / "layer.onnx"
    assert main(["export", "onnx", str(LAYER), "--level", "0", "-o", str(out)]) == 0
    assert "replacing" not in caplog.text  # a new file: nothing to say
    assert len(onnx.load(out).graph.node) == 1
    assert main(["export", "onnx", str(LAYER), "-o", str(out)]) == 0
    (notice,) = [record for record in caplog.records if "replacing" in record.getMessage()]
    assert notice.levelname == "WARNING" and notice.getMessage() == f"{out}: replacing the previous ONNX model"
    assert f"llmcheck: wrote {out}" in capsys.readouterr().out
    assert len(onnx.load(out).graph.node) == 2  # the new export, every leaf


def test_export_onnx_of_a_folder_says_it_is_one_and_names_the_topology_file_in_it(capsys):
    dump = DATA / "msit_dump_20240131_120000"
    assert main(["export", "onnx", str(dump)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"llmcheck: error: {dump}: is a folder, not a topology file (give its topology file {LAYER})"
    )


@pytest.mark.parametrize("with_graph", [False, True], ids=["default dump", "dumped with --type onnx"])
def test_export_onnx_of_a_torch_dumps_topology_says_where_its_graph_is(tmp_path, capsys, with_graph: bool):
    import torch

    from compare_runs import capture_run

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    dump = capture_run(model, torch.ones(2, 4), tmp_path / "dump", export_onnx=with_graph)
    topology = dump / "topology.json"
    assert main(["export", "onnx", str(topology)]) == 1
    what = f"llmcheck: error: {topology}: an llmcheck dump's module tree, which holds no dataflow to draw as ONNX"
    if with_graph:  # the capture already drew it: say which file to open
        expected = f"{what}; the capture wrote the dump's graph (open {dump / 'model.onnx'})"
    else:  # name the flag that makes the capture write it
        expected = (
            f"{what}, and this dump has no graph (dump with --type onnx (DumpConfig(export_onnx=True)): the capture "
            "writes its graph as model.onnx in the dump; export onnx converts ATB topologies)"
        )
    assert capsys.readouterr().err.strip() == expected
    assert sorted(path.name for path in dump.iterdir() if path.suffix == ".onnx") == (
        ["model.onnx"] if with_graph else []
    )
