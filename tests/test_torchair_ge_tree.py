"""GE graph text and GE dump trees: parsing torchair's graph, locating it, and reading the CANN folder levels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmcheck.core.errors import DumpFormatError, DumpNotFoundError
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.torchair_ge.ge_dump import GeDumpFileName, payload_from_tensor, write_ge_dump
from llmcheck.plugins.torchair_ge.ge_graph_text import (
    GeGraphOp,
    parse_graph_file_name,
    read_ge_graph,
    write_ge_graph_text,
)

GRAPH_TEXT = r"""# written by torchair
name: "graph_1"
op {
  name: "arg0_1"
  type: "Data"
  output_desc { name: "y" dtype: DT_FLOAT shape { dim: 2 dim: 4 } layout: "ND" }
}
op {
  name: "model/layers.0/Add"
  type: "Add"
  input: "arg0_1:0"
  input: "arg0_1:0"
  input: "NoOp_3:-1"
  attr { key: "_op_info" value { s: "line\n\"two\"\101" } }
  output_desc {
    name: "y"
    dtype: DT_FLOAT
    attr {
      key: "_fx_tensor_name"
      value {
        s: "add-aten.add.Tensor.OUTPUT.0"
      }
    }
  }
}
op { name: "Split_1" type: "SplitV" input: "model/layers.0/Add:0"
  output_desc { attr { key: "_fx_tensor_name" value { s: "split-aten.split.Tensor." "OUTPUT.0" } } }
  output_desc { attr { key: "_fx_tensor_name" value { s: "split-aten.split.Tensor.OUTPUT.1" } } }
  output_desc { name: "y2" }
}
"""


def test_graph_text_gives_ops_inputs_and_every_outputs_fx_tensor(tmp_path):
    path = tmp_path / "dynamo_original_graph_1_rank_0_pid_7_ts_20240101000000000001.txt"
    path.write_text(GRAPH_TEXT)

    graph = read_ge_graph(path)

    assert graph.name == "graph_1"
    assert [op.name for op in graph.ops] == ["arg0_1", "model/layers.0/Add", "Split_1"]
    add = graph.ops[1]
    assert add.inputs == ("arg0_1:0", "arg0_1:0")  # the control edge ":-1" is not a data input
    assert add.fx_tensor_names == ("add-aten.add.Tensor.OUTPUT.0",)
    assert graph.ops[2].fx_tensor_names == (
        "split-aten.split.Tensor.OUTPUT.0",
        "split-aten.split.Tensor.OUTPUT.1",
        None,
    )
    assert graph.op_by_name()["model_layers.0_Add"] is add  # dump files write "/" as "_"


def test_fused_names_split_into_graph_ops_by_longest_prefix_with_backtracking(tmp_path):
    ops = tuple(GeGraphOp(name, "T", position=i) for i, name in enumerate(["Add_1", "Add_12", "Mul", "Mul_3"]))
    graph = read_ge_graph(write_ge_graph_text(tmp_path, "g", ops))

    assert [op.name for op in graph.constituents("Add_12Mul_3")] == ["Add_12", "Mul_3"]
    assert [op.name for op in graph.constituents("Add_1Add_12")] == ["Add_1", "Add_12"]
    assert [op.name for op in graph.constituents("Add_1Mul")] == ["Add_1", "Mul"]
    assert graph.constituents("Cast_9") == []
    assert graph.constituents("Add_1X") == []


def test_malformed_graph_text_is_one_error_with_its_line(tmp_path):
    path = tmp_path / "dynamo_original_graph_1_rank_0_pid_7_ts_1.txt"
    path.write_text('name: "g"\nop {\n  name: "a"\n  type: "Add"\n')

    with pytest.raises(DumpFormatError, match="missing '}'") as caught:
        read_ge_graph(path)
    assert str(path) in caught.value.one_line()
    path.write_text('op {\n  name: "a" ?\n}\n')
    with pytest.raises(DumpFormatError, match="unexpected character '\\?' at line 2 column 13"):
        read_ge_graph(path)


def test_graph_file_names_of_old_and_new_torchair():
    new = parse_graph_file_name("dynamo_original_graph_3_rank_1_pid_4242_ts_20240101120000123456.txt")
    assert (new.graph_id, new.rank, new.pid, new.timestamp) == (3, 1, 4242, 20240101120000123456)
    old = parse_graph_file_name("dynamo_original_graph_20240101120000123456.txt")
    assert (old.graph_id, old.rank, old.timestamp) == (None, None, 20240101120000123456)
    assert parse_graph_file_name("dynamo_optimized_graph_1_rank_0_pid_1_ts_2.txt") is None


# --- dump trees ---------------------------------------------------------------------------


def _write_op(folder: Path, op_type: str, name: str, timestamp: int, value: float) -> None:
    tensor = torch.full((2, 2), value)
    write_ge_dump(
        folder,
        GeDumpFileName(op_type, name, 1, 0, timestamp),
        [payload_from_tensor(tensor)],
        [payload_from_tensor(tensor + 1)],
    )


def _graph(folder: Path, graph_id: int = 1, rank: int = 0, pid: int = 10) -> Path:
    ops = (
        GeGraphOp("arg0", "Data", (), (None,)),
        GeGraphOp("Mul_1", "Mul", ("arg0:0",), ("mul-aten.mul.Tensor.OUTPUT.0",)),
        GeGraphOp("Add_2", "Add", ("Mul_1:0",), ("add-aten.add.Tensor.OUTPUT.0",)),
    )
    return write_ge_graph_text(
        folder,
        "graph_1",
        [GeGraphOp(o.name, o.op_type, o.inputs, o.fx_tensor_names, i) for i, o in enumerate(ops)],
        graph_id=graph_id,
        rank=rank,
        pid=pid,
    )


def test_world_size_tree_gives_steps_rank_device_and_graph_order(tmp_path):
    run = tmp_path / "worldsize2_global_rank1" / "20240101120000" / "3" / "graph_1" / "1"
    for step in (0, 1):
        # timestamps say Add ran first; the graph says Mul comes first, and the graph wins
        _write_op(run / str(step), "Add", "Add_2", 100 + 10 * step, float(step))
        _write_op(run / str(step), "Mul", "Mul_1", 200 + 10 * step, float(step))
    _graph(tmp_path, rank=1)
    _graph(tmp_path, rank=0, pid=11)  # the other rank's graph, same folder: ignored for rank 1

    dump = get_plugins().load_tensors(tmp_path, "ge")

    assert dump.source == "ge"
    assert [r.key.label() for r in dump.records[:4]] == [
        "Mul_1 step 0 input.0",
        "Mul_1 step 0 output.0",
        "Add_2 step 0 input.0",
        "Add_2 step 0 output.0",
    ]
    assert [r.key.step for r in dump.records] == [0] * 4 + [1] * 4
    assert [r.order for r in dump.records] == list(range(8))
    first = dump.records[0]
    assert (first.rank, first.device, first.op_type, first.dtype, first.shape) == (1, "npu:3", "Mul", "float32", (2, 2))
    assert dump.records[1].data.load().tolist() == [[1, 1], [1, 1]]
    assert [op.name for op in dump.topology.children[0].children] == ["arg0", "Mul_1", "Add_2"]


def test_older_tree_without_world_size_and_a_graph_found_above_the_given_folder(tmp_path):
    step_folder = tmp_path / "20240101120000" / "0" / "graph_1" / "1" / "0"
    _write_op(step_folder, "Add", "Add_2", 100, 1.0)
    _graph(tmp_path)

    dump = get_plugins().load_tensors(step_folder, "ge")

    assert [r.key.label() for r in dump.records] == ["Add_2 step 0 input.0", "Add_2 step 0 output.0"]
    assert dump.records[0].rank == 0 and dump.records[0].device == "npu:0"
    assert dump.topology is not None and dump.manifest["graph_files"]


def test_repeated_op_in_one_step_is_two_calls_not_an_overwrite(tmp_path):
    step_folder = tmp_path / "20240101120000" / "0" / "graph_1" / "1" / "0"
    _write_op(step_folder, "Add", "Add_2", 100, 1.0)
    _write_op(step_folder, "Add", "Add_2", 200, 5.0)

    dump = get_plugins().load_tensors(tmp_path)

    calls = [(r.key.call_index, r.data.load()[0, 0].item()) for r in dump.records if r.key.io == "input"]
    assert calls == [(0, 1.0), (1, 5.0)]


def test_two_runs_or_two_ranks_in_one_folder_are_refused(tmp_path):
    for run in ("20240101120000", "20240101130000"):
        _write_op(tmp_path / "runs" / run / "0" / "graph_1" / "1" / "0", "Add", "Add_2", 100, 1.0)
    for rank in (0, 1):
        _write_op(
            tmp_path / "ranks" / f"worldsize2_global_rank{rank}" / "20240101120000" / "0" / "graph_1" / "1" / "0",
            "Add",
            "Add_2",
            100,
            1.0,
        )

    with pytest.raises(DumpNotFoundError, match="several runs"):
        get_plugins().load_tensors(tmp_path / "runs", "ge")
    with pytest.raises(DumpNotFoundError, match=r"several ranks \(0, 1\)"):
        get_plugins().load_tensors(tmp_path / "ranks", "ge")


def test_graph_files_of_two_processes_are_refused(tmp_path):
    _write_op(tmp_path / "20240101120000" / "0" / "graph_1" / "1" / "0", "Add", "Add_2", 100, 1.0)
    _graph(tmp_path, pid=10)
    _graph(tmp_path, graph_id=2, pid=11)

    with pytest.raises(DumpNotFoundError, match=r"graph files of several processes \(pids 10, 11\)"):
        get_plugins().load_tensors(tmp_path, "ge")


def test_a_folder_without_ge_files_is_not_a_ge_dump(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")

    assert get_plugins().manager.hook.llmcheck_load_tensors(path=tmp_path, source="ge") is None


def test_compare_on_a_truncated_ge_file_prints_one_line_naming_it(tmp_path, capsys):
    from llmcheck.core.cli import main

    step_folder = tmp_path / "20240101120000" / "0" / "graph_1" / "1" / "0"
    _write_op(step_folder, "Add", "Add_2", 100, 1.0)
    broken = next(step_folder.iterdir())
    broken.write_bytes(broken.read_bytes()[:-3])

    assert (
        main(["compare", "--golden-path", str(tmp_path), "--my-path", str(tmp_path), "-o", str(tmp_path / "out")]) == 1
    )
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"llmcheck: error: {broken}: truncated")
    assert not (tmp_path / "out").exists()


def test_any_graph_file_the_original_glob_accepts_is_found_and_maps_ops(tmp_path):
    step_folder = tmp_path / "20240101120000" / "0" / "graph_1" / "1" / "0"
    _write_op(step_folder, "Add", "Add_2", 100, 1.0)
    written = _graph(tmp_path)
    renamed = written.with_name("dynamo_original_graph_17065969118878_test.txt")
    written.rename(renamed)
    assert parse_graph_file_name(renamed.name).timestamp == 17065969118878

    dump = get_plugins().load_tensors(tmp_path, "ge")

    assert dump.manifest["graph_files"] and dump.topology is not None
    assert [op.name for op in dump.topology.children[0].children] == ["arg0", "Mul_1", "Add_2"]


NOT_A_DUMP_FILE_NAME = "not read: the name is not {OpType}.{OpName}.{taskId}.{streamId}.{timestampUs}"


def _ge_warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "llmcheck.ge"]


def test_a_file_among_the_dump_files_whose_name_is_not_a_dump_name_is_named_in_a_warning(tmp_path, caplog):
    caplog.set_level("WARNING")
    model = tmp_path / "20240101120000" / "0" / "graph_1" / "1"
    for step in (0, 1):
        _write_op(model / str(step), "Add", "Add_2", 100 + step, 1.0)
        _write_op(model / str(step), "Mul", "Mul_1", 200 + step, 2.0)
    beside = model / "0" / "Add.Add_2.1.0.100"
    beside.rename(model / "0" / "Add.Add_2.1.0")  # the timestamp part lost: beside Mul's file
    alone = model / "1"  # step 1 keeps only a misnamed file: a step folder of the CANN tree all the same
    for file in alone.iterdir():
        file.rename(file.with_name(file.name.replace(".", "_")))
    _graph(tmp_path)  # what torchair legitimately writes beside the dump: no warning
    (model / "0" / "Add.Add_2.1.0.100.input.0.npy").write_bytes(b"")  # msaccucmp's conversion
    (model / "0" / ".nfs0001").write_bytes(b"")  # hidden

    dump = get_plugins().load_tensors(tmp_path, "ge")

    assert [r.key.label() for r in dump.records] == ["Mul_1 step 0 input.0", "Mul_1 step 0 output.0"]
    assert _ge_warnings(caplog) == [
        f"{model / '0' / 'Add.Add_2.1.0'}: {NOT_A_DUMP_FILE_NAME}",
        f"{alone / 'Add_Add_2_1_0_101'}: {NOT_A_DUMP_FILE_NAME}",
        f"{alone / 'Mul_Mul_1_1_0_201'}: {NOT_A_DUMP_FILE_NAME}",
    ]


def test_the_hand_built_ge_files_and_their_fixture_script_give_no_warning(caplog):
    caplog.set_level("WARNING")
    assert len(get_plugins().load_tensors(Path(__file__).parent / "data" / "ge", "ge").records) > 0
    assert _ge_warnings(caplog) == []


def test_a_folder_link_in_a_ge_tree_is_not_entered_and_named_in_a_warning(tmp_path, caplog):
    caplog.set_level("WARNING")
    model = tmp_path / "dump" / "20240101120000" / "0" / "graph_1" / "1"
    _write_op(model / "0", "Add", "Add_2", 100, 1.0)
    outside = tmp_path / "elsewhere" / "1"
    _write_op(outside, "Add", "Add_2", 200, 1.0)
    (model / "1").symlink_to(outside)

    dump = get_plugins().load_tensors(tmp_path / "dump", "ge")

    assert {r.key.step for r in dump.records} == {0}
    assert _ge_warnings(caplog) == [f"{model / '1'}: not entered: a folder link leading outside the dump to {outside}"]
