"""An ATB dump folder read as records: keys, execution order, op parameters, topology, CSVs and profiling,
on a hand-written tree in the probe's layout (tests/data/atb/msit_dump_20240131_120000)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from llmcheck.core.errors import DumpFormatError, DumpNotFoundError
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.atb.cpu_profiling import convert_cpu_profiling, parse_cpu_profiling_text
from llmcheck.plugins.atb.op_csv import read_op_csv

DATA = Path(__file__).parent / "data" / "atb"
TREE = DATA / "msit_dump_20240131_120000"
RUN = TREE / "tensors" / "0_4242"


def load(path: Path, source: str | None = None):
    return get_plugins().load_tensors(path, source)


def test_records_carry_op_id_type_step_io_position_moment_and_parent():
    dump = load(TREE)
    assert dump.source == "atb" and dump.manifest["run"] == "0_4242" and dump.manifest["execute_counts"] == [0, 1]
    linear_out = next(r for r in dump.records if r.key.name == "0_1" and r.key.io == "output" and r.key.step == 0)
    assert (linear_out.key.position, linear_out.key.moment) == ("0", "after")
    assert linear_out.op_type == "LinearOperation" and linear_out.parent == "0"
    assert linear_out.attrs["op_name"] == "LinearOperation_0_1"
    assert linear_out.attrs["op_path"] == "0_Decoder_layer/1_LinearOperation"
    assert linear_out.source_path == "tensors/0_4242/0/0_Decoder_layer/1_LinearOperation/after/outtensor0.bin"
    assert (linear_out.dtype, linear_out.shape, linear_out.device) == ("float16", (2, 4), "npu:0")
    assert linear_out.data.load().tolist() == [[0.25, 0.5, 0.75, 1.0], [-0.25, -0.5, -0.75, -1.0]]
    weight = next(r for r in dump.records if r.key.name == "0_1" and r.key.io == "input" and r.key.position == "1")
    assert weight.key.moment == "before" and weight.shape == (4, 4)


def test_records_follow_execution_order_inputs_children_then_outputs():
    labels = [record.key.label() for record in load(TREE).records]
    assert labels == [
        "0 step 0 input.0 (before)",
        "0_0 step 0 input.0 (before)",
        "0_0 step 0 input.1 (before)",
        "0_0 step 0 output.0",
        "0_1 step 0 input.0 (before)",
        "0_1 step 0 input.1 (before)",
        "0_1 step 0 output.0",
        "0 step 0 output.0",
        "0_1 step 1 output.0",
        "0 step 1 output.0",
    ]
    assert [record.order for record in load(TREE).records] == list(range(10))


def test_op_params_come_from_op_param_json_or_else_the_op_csv():
    records = load(TREE).records
    norm = next(r for r in records if r.key.name == "0_0")
    assert norm.attrs["op_param"] == {"layerType": 1, "normParam": {"epsilon": 1e-06, "quantType": 0}}
    linear_step1 = next(r for r in records if r.key.name == "0_1" and r.key.step == 1)
    assert linear_step1.attrs["op_param"]["transposeB"] is True  # from operation_tensors_1.csv
    layer = next(r for r in records if r.key.name == "0" and r.key.step == 0)
    assert layer.attrs["op_param"] == {}  # a graph op's param is ""


def test_layer_topology_json_becomes_the_dump_topology_named_by_op_id():
    topology = load(TREE).topology
    assert (topology.name, topology.op_type) == ("0", "Decoder_layer")
    assert [(child.name, child.op_type) for child in topology.children] == [
        ("0_0", "RmsNormOperation"),
        ("0_1", "LinearOperation"),
    ]
    assert topology.children[1].inputs == ("Decoder_layer_0_internal_0", "Decoder_layer_0_input_2")
    assert topology.children[1].attrs["op_param"]["transposeB"] is True


def test_cpu_profiling_keeps_the_last_execute_and_setup_line_per_op():
    records = load(TREE).records
    linear = next(r for r in records if r.key.name == "0_1" and r.key.step == 0)
    profile = linear.attrs["cpu_profiling"]
    assert profile["execute_kernelExecuteTime"] == 110.0 and profile["setup_runnerSetupTime"] == 90.0
    assert "cpu_profiling" not in next(r for r in records if r.key.step == 1).attrs


def test_a_path_inside_the_tree_narrows_the_records_to_it():
    dump = load(RUN / "0" / "0_Decoder_layer" / "1_LinearOperation")
    assert [r.key.label() for r in dump.records] == [
        "0_1 step 0 input.0 (before)",
        "0_1 step 0 input.1 (before)",
        "0_1 step 0 output.0",
    ]
    assert dump.manifest["scope"] == "tensors/0_4242/0/0_Decoder_layer/1_LinearOperation"
    assert [r.key.step for r in load(RUN / "1").records] == [1, 1]
    one_file = load(RUN / "0" / "0_Decoder_layer" / "after" / "outtensor0.bin")
    assert [r.key.label() for r in one_file.records] == ["0 step 0 output.0"]


def test_a_folder_above_the_root_finds_it_and_two_roots_are_listed(tmp_path):
    shutil.copytree(TREE, tmp_path / TREE.name)
    assert len(load(tmp_path).records) == 10
    shutil.copytree(TREE, tmp_path / "msit_dump_20240131_130000")
    with pytest.raises(
        DumpNotFoundError, match="holds 2 ATB dumps: msit_dump_20240131_120000, msit_dump_20240131_130000"
    ):
        load(tmp_path)


@pytest.mark.parametrize("root_name", ["ait_dump", "atb_temp", "msit_dump", "my_renamed_copy"])
def test_every_era_of_root_name_is_recognised(tmp_path, root_name):
    shutil.copytree(TREE, tmp_path / root_name)
    dump = load(tmp_path / root_name / "tensors")
    assert dump.root == (tmp_path / root_name).absolute() and len(dump.records) == 10


def test_msprobe_atb_dump_data_layout_reads_data_and_info(tmp_path):
    root = tmp_path / "atb_dump_data"
    shutil.copytree(TREE / "tensors", root / "data")
    shutil.copytree(TREE / "layer" / "4242", root / "info" / "layer" / "0_4242")
    dump = load(tmp_path)
    assert dump.manifest["layout"] == "msprobe" and len(dump.records) == 10
    assert dump.topology.op_type == "Decoder_layer"


def test_model_topology_wins_over_layers_and_is_named_by_layer_ids(tmp_path):
    shutil.copytree(TREE, tmp_path / TREE.name)
    model_dir = tmp_path / TREE.name / "model" / "4242"
    model_dir.mkdir(parents=True)
    shutil.copy(DATA / "peer_model_Bloom7BFlashAttentionModel.json", model_dir / "Bloom7BFlashAttentionModel.json")
    topology = load(tmp_path / TREE.name).topology
    assert (topology.name, topology.op_type) == ("Bloom7BFlashAttentionModel", "Bloom7BFlashAttentionModel")
    layer = topology.children[0]
    assert (layer.name, layer.op_type, layer.attrs["op_name"]) == ("3", "BloomLayer", "Bloom7bCommonLayer_3")
    assert [child.name for child in layer.children][:5] == ["3_0", "3_1", "3_2", "3_3", "3_4"]
    assert layer.children[4].children[0].name == "3_4_0"


def test_one_folder_per_device_is_one_multi_rank_run_and_one_device_can_be_chosen(tmp_path):
    root = tmp_path / TREE.name
    shutil.copytree(TREE, root)
    shutil.copytree(root / "tensors" / "0_4242", root / "tensors" / "1_4243")
    both = load(root)
    assert both.ranks == (0, 1) and both.manifest["ranks"] == [0, 1]
    assert len(both.records) == 2 * len(load(root / "tensors" / "0_4242").records)
    assert {record.device for record in both.records if record.key.rank == 1} == {"npu:1"}
    chosen = load(root / "tensors" / "1_4243")
    assert chosen.manifest["run"] == "1_4243" and chosen.records[0].device == "npu:1"


def test_two_processes_on_one_device_are_two_runs_to_choose_from(tmp_path):
    root = tmp_path / TREE.name
    shutil.copytree(TREE, root)
    shutil.copytree(root / "tensors" / "0_4242", root / "tensors" / "0_4243")
    with pytest.raises(DumpNotFoundError, match=r"2 runs .*tensors/0_4242, tensors/0_4243"):
        load(root)


def test_a_corrupt_tensor_file_in_the_tree_is_one_error_naming_it(tmp_path):
    root = tmp_path / TREE.name
    shutil.copytree(TREE, root)
    broken = root / "tensors" / "0_4242" / "0" / "0_Decoder_layer" / "0_RmsNormOperation" / "after" / "outtensor0.bin"
    broken.write_bytes(broken.read_bytes()[:-3])
    with pytest.raises(DumpFormatError) as caught:
        load(root)
    assert caught.value.where == str(broken) and caught.value.offset == broken.stat().st_size


def test_a_lone_bin_file_is_a_one_record_dump(tmp_path):
    path = tmp_path / "outtensor2.bin"
    shutil.copy(DATA / "bin" / "fp16_nd_2x3.bin", path)
    dump = load(path)
    assert dump.manifest["layout"] == "file"
    (record,) = dump.records
    assert (record.key.name, record.key.io, record.key.position, record.shape) == ("tensor", "output", "0", (2, 3))
    assert record.attrs["file_role"] == "outtensor2"


def test_a_lone_bin_file_compares_against_a_npy_file(tmp_path, capsys):
    import numpy as np

    from llmcheck.core.cli import main

    np.save(tmp_path / "golden.npy", np.array([[0.5, -1.0, 2.0], [65504.0, -0.0, 1 / 1024]], dtype=np.float32))
    assert (
        main(
            [
                "compare",
                "-gp",
                str(tmp_path / "golden.npy"),
                "-mp",
                str(DATA / "bin" / "fp16_nd_2x3.bin"),
                "-o",
                str(tmp_path / "report"),
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["counts"]["pairs"] == 1 and summary["counts"]["failures"] == 0


def test_other_kinds_of_path_are_not_claimed(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    from llmcheck.plugins.atb import llmcheck_load_tensors

    assert llmcheck_load_tensors(tmp_path, None) is None
    assert llmcheck_load_tensors(tmp_path / "notes.txt", None) is None
    assert llmcheck_load_tensors(TREE, "ge") is None


def test_op_csv_rows_give_names_params_dtypes_shapes_and_files():
    rows = read_op_csv(TREE / "operation_io_tensors" / "4242" / "operation_tensors_0.csv")
    assert [(row.case_num, row.op_type, row.op_id) for row in rows] == [
        (1, "RmsNormOperation", "0_0"),
        (2, "LinearOperation", "0_1"),
    ]
    linear = rows[1]
    assert linear.op_param["transposeB"] is True
    assert [(t.atb_dtype, t.dtype, t.format, t.shape) for t in linear.inputs] == [
        ("float16", "float16", "nd", (2, 4)),
        ("float16", "float16", "nd", (4, 4)),
    ]
    assert linear.outputs[0].file.endswith("1_LinearOperation/after/outtensor0.bin")


def test_op_csv_row_with_missing_columns_names_its_byte_offset(tmp_path):
    source = (TREE / "operation_io_tensors" / "4242" / "operation_tensors_0.csv").read_text()
    header = source.splitlines(keepends=True)[0]
    path = tmp_path / "operation_tensors_0.csv"
    path.write_text(header + "1|X_1|X_1|{}|0\n")
    with pytest.raises(DumpFormatError, match="row has 5 columns, expected 21") as caught:
        read_op_csv(path)
    assert caught.value.offset == len(header.encode())


def test_cpu_profiling_text_becomes_csv_with_opname_and_sorted_execute_setup_columns(tmp_path):
    folder = tmp_path / "cpu_profiling" / "4242"
    folder.mkdir(parents=True)
    text = TREE / "cpu_profiling" / "4242" / "operation_statistic_0.txt"
    shutil.copy(text, folder / text.name)
    written = convert_cpu_profiling(tmp_path / "cpu_profiling")
    assert written == [folder / "operation_statistic_0.csv"] and (folder / text.name).is_file()
    with open(written[0], newline="") as handle:
        rows = list(csv.reader(handle))
    columns = rows[0]
    assert columns[0] == "opname" and columns[1:] == sorted(columns[1:])
    assert {
        "execute_kernelExecuteTime",
        "execute_preLaunchTime",
        "setup_runnerSetupTime",
        "setup_setupCacheMissCount",
    } <= set(columns)
    by_op = {row[0]: dict(zip(columns, row)) for row in rows[1:]}
    assert by_op["LinearOperation_0_1"]["execute_kernelExecuteTime"] == "110"
    assert by_op["RmsNormOperation_0_0"]["setup_runnerSetupTime"] == "40"
    assert convert_cpu_profiling(tmp_path / "cpu_profiling") == []  # an existing CSV is never overwritten


def test_cpu_profiling_line_with_a_broken_pair_names_the_file(tmp_path):
    path = tmp_path / "operation_statistic_3.txt"
    path.write_text("[LinearOperation_0_1]:totalTime:1, kernelExecuteTime:2\n[LinearOperation_0_1]:totalTime\n")
    with pytest.raises(DumpFormatError, match="not 'key:value'") as caught:
        parse_cpu_profiling_text(path)
    assert caught.value.offset == len("[LinearOperation_0_1]:totalTime:1, kernelExecuteTime:2\n")


def test_nz_tensor_in_a_tree_is_read_as_nd(tmp_path):
    root = tmp_path / "msit_dump_x"
    target = root / "tensors" / "0_1" / "0" / "0_LinearOperation" / "before" / "intensor1.bin"
    target.parent.mkdir(parents=True)
    shutil.copy(DATA / "bin" / "fp16_nz_16x32.bin", target)
    (record,) = load(root).records
    assert record.shape == (1, 16, 32) and record.attrs["storage_dims"] == [1, 2, 16, 16]
    assert torch.equal(record.data.load(), torch.arange(512, dtype=torch.float16).reshape(1, 16, 32))


def _atb_warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "llmcheck.atb"]


def test_the_files_a_tree_legitimately_holds_beside_its_tensors_give_no_warning(tmp_path, caplog):
    caplog.set_level("WARNING")
    assert len(load(TREE).records) == 10
    root = tmp_path / "atb_dump_data"  # msprobe's layout writes a statistic.csv per execute count
    shutil.copytree(TREE / "tensors", root / "data")
    (root / "data" / "0_4242" / "0" / "statistic.csv").write_text("Device and PID,Execution Count\n")
    assert len(load(root).records) == 10
    assert _atb_warnings(caplog) == []


NOT_A_TENSOR_NAME = "not read: the name is not intensor{i}.bin or outtensor{i}.bin (optionally _{name} before .bin)"


@pytest.mark.parametrize(
    "moved_to, why",
    [
        ("after/outtensorX.bin", NOT_A_TENSOR_NAME),  # hand-renamed in its moment folder
        ("after/out0.dat", NOT_A_TENSOR_NAME),  # a moment folder holds tensor files only
        ("weight_copy.bin", NOT_A_TENSOR_NAME),  # a .bin beside op_param.json
        ("results/after/outtensor0.bin", "not read: the folder name is not {index}_{OpType}"),
    ],
    ids=["renamed", "not-a-bin-in-after", "bin-beside-op-param", "folder-not-an-op"],
)
def test_a_file_or_folder_of_the_tree_the_reader_cannot_place_is_named_in_a_warning(tmp_path, caplog, moved_to, why):
    caplog.set_level("WARNING")
    root = tmp_path / TREE.name
    shutil.copytree(TREE, root)
    op = root / "tensors" / "0_4242" / "0" / "0_Decoder_layer" / "1_LinearOperation"
    (op / moved_to).parent.mkdir(parents=True, exist_ok=True)
    (op / "after" / "outtensor0.bin").rename(op / moved_to)

    records = load(root).records

    assert len(records) == 9 and "0_1 step 0 output.0" not in [record.key.label() for record in records]
    skipped = op / moved_to if why == NOT_A_TENSOR_NAME else op / "results"
    assert _atb_warnings(caplog) == [f"{skipped}: {why}"]


def test_a_folder_link_in_the_tree_is_not_entered_and_named_in_a_warning(tmp_path, caplog):
    caplog.set_level("WARNING")
    root = tmp_path / TREE.name
    shutil.copytree(TREE, root)
    layer = root / "tensors" / "0_4242" / "0" / "0_Decoder_layer"
    outside = tmp_path / "elsewhere" / "2_LinearOperation"
    shutil.copytree(layer / "1_LinearOperation", outside)
    (layer / "2_LinearOperation").symlink_to(outside)

    assert len(load(root).records) == 10  # not entered

    assert _atb_warnings(caplog) == [
        f"{layer / '2_LinearOperation'}: not entered: a folder link leading outside the dump to {outside}"
    ]
