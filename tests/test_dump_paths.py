"""One containment rule for every source: a file reached through a dump must lie inside it, links resolved.

Each source gets the same hostile edit -- one of its files replaced by a symbolic link to a
copy outside the dump -- and must refuse it naming the link and where it leads; a link
that stays inside the dump is read; link loops never make a walk endless.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import llmcheck
from llmcheck.core.dumps.dump_paths import dump_file_lines
from llmcheck.core.errors import DumpFormatError, DumpNotFoundError, PathOutsideDumpError
from llmcheck.core.plugins import get_plugins

ATB_FIXTURE = Path(__file__).parent / "data" / "atb" / "msit_dump_20240131_120000"
ATB_OUTPUT = "tensors/0_4242/0/0_Decoder_layer/0_RmsNormOperation/after/outtensor0.bin"


def _llmcheck(folder: Path, make_llmcheck_dump) -> tuple[Path, Path]:
    dump = make_llmcheck_dump(folder, {"a": torch.ones(4)})
    return dump, next(dump.glob("shard_*.safetensors"))


def _atb(folder: Path, make_llmcheck_dump) -> tuple[Path, Path]:
    dump = Path(shutil.copytree(ATB_FIXTURE, folder / ATB_FIXTURE.name))
    return dump, dump / ATB_OUTPUT


def _fx(folder: Path, make_llmcheck_dump) -> tuple[Path, Path]:
    step = folder / "gm_20240101000000000001_dump" / "0"
    step.mkdir(parents=True)
    target = step / "add-aten.add.Tensor.OUTPUT.0.20240101000000000002.npy"
    np.save(target, np.ones(4, np.float32))
    return folder, target


def _ge(folder: Path, make_llmcheck_dump) -> tuple[Path, Path]:
    from llmcheck.plugins.torchair_ge.ge_dump import GeDumpFileName, payload_from_tensor, write_ge_dump

    step = folder / "20240101120000" / "0" / "graph_1" / "1" / "0"
    name = GeDumpFileName("Add", "Add_2", 1, 0, 100)
    write_ge_dump(step, name, [payload_from_tensor(torch.ones(2))], [payload_from_tensor(torch.ones(2))])
    return folder, next(step.iterdir())


def _manual(folder: Path, make_llmcheck_dump) -> tuple[Path, Path]:
    from llmcheck import dump_data

    metadata = dump_data("golden", "mlp_out", torch.ones(4), output_path=folder)
    return metadata, next(metadata.parent.glob("0/*.safetensors"))


def _checkpoint(folder: Path, make_llmcheck_dump) -> tuple[Path, Path]:
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_file({"w": torch.ones(2)}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"v": torch.ones(2)}, str(folder / "model-00002-of-00002.safetensors"))
    return folder, folder / "model-00002-of-00002.safetensors"


def _msprobe(folder: Path, make_llmcheck_dump) -> tuple[Path, Path]:
    rank = folder / "step0" / "rank0"
    (rank / "dump_tensor_data").mkdir(parents=True)
    item = {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": [4],
        "Max": 1.0,
        "Min": 1.0,
        "Mean": 1.0,
        "Norm": 2.0,
        "requires_grad": False,
    }
    entry = {
        "input_args": [{**item, "data_name": "Tensor.__add__.0.forward.input.0.pt"}],
        "input_kwargs": {},
        "output": [{**item, "data_name": "Tensor.__add__.0.forward.output.0.pt"}],
    }
    (rank / "dump.json").write_text(
        json.dumps(
            {
                "task": "tensor",
                "level": "L1",
                "framework": "pytorch",
                "dump_data_dir": str(rank / "dump_tensor_data"),
                "data": {"Tensor.__add__.0.forward": entry},
            }
        )
    )
    (rank / "construct.json").write_text("{}")
    (rank / "stack.json").write_text("{}")
    for io in ("input", "output"):
        torch.save(torch.ones(4), rank / "dump_tensor_data" / f"Tensor.__add__.0.forward.{io}.0.pt")
    return folder, rank / "dump_tensor_data" / "Tensor.__add__.0.forward.output.0.pt"


SOURCES = {
    "msprobe": _msprobe,
    "llmcheck": _llmcheck,
    "atb": _atb,
    "fx": _fx,
    "ge": _ge,
    "manual": _manual,
    "file": _checkpoint,
}


@pytest.mark.parametrize("source", SOURCES)
def test_a_file_linked_to_outside_the_dump_is_refused_naming_the_link_and_its_target(
    source: str, tmp_path: Path, make_llmcheck_dump
) -> None:
    dump, file_in_dump = SOURCES[source](tmp_path / "dump", make_llmcheck_dump)
    outside = tmp_path / "elsewhere" / file_in_dump.name
    outside.parent.mkdir()
    shutil.move(file_in_dump, outside)
    file_in_dump.symlink_to(outside)
    with pytest.raises(PathOutsideDumpError) as caught:
        dump_read = get_plugins().load_tensors(dump)
        for record in dump_read.records:  # a source may meet the file only when reading its data
            if record.data is not None:
                record.data.load()
    message = caught.value.one_line()
    assert message.startswith(f"{file_in_dump}: leads outside the dump") and str(outside) in message


@pytest.mark.parametrize("source", ["llmcheck", "atb", "fx", "ge", "msprobe"])
def test_a_file_linked_to_another_place_inside_the_dump_is_read(
    source: str, tmp_path: Path, make_llmcheck_dump
) -> None:
    dump, file_in_dump = SOURCES[source](tmp_path / "dump", make_llmcheck_dump)
    before = [record.data.load() for record in get_plugins().load_tensors(dump).records if record.data is not None]
    moved = file_in_dump.parent / "moved_here.data"
    shutil.move(file_in_dump, moved)
    file_in_dump.symlink_to(os.path.relpath(moved, file_in_dump.parent))
    after = [record.data.load() for record in get_plugins().load_tensors(dump).records if record.data is not None]
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))


def test_link_loops_in_an_atb_tree_are_one_error_or_not_entered(tmp_path: Path) -> None:
    dump = Path(shutil.copytree(ATB_FIXTURE, tmp_path / ATB_FIXTURE.name))
    layer = dump / "tensors/0_4242/0/0_Decoder_layer"
    (layer / "5_LoopOperation").symlink_to(".")  # a folder link back to its own folder: never entered
    expected = len(get_plugins().load_tensors(ATB_FIXTURE).records)
    assert len(get_plugins().load_tensors(dump).records) == expected
    looping = layer / "0_RmsNormOperation/after/outtensor9.bin"
    looping.symlink_to(looping.name)
    with pytest.raises(DumpFormatError) as caught:
        get_plugins().load_tensors(dump)
    assert caught.value.one_line() == (
        f"{looping}: is a symbolic link that loops (remove the link or replace it with the file)"
    )


# --- what is no regular file, what is too large, what cannot be resolved: one line naming it, never a hang ---


def _compare_in_subprocess(golden: Path, my: Path, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``llmcheck compare`` in its own process: a reader that blocks (on a FIFO) fails the test by its timeout."""
    environment = {**os.environ, "PYTHONPATH": str(Path(llmcheck.__file__).parents[1])}
    command = [sys.executable, "-m", "llmcheck.core.cli", "compare", "-gp", str(golden), "-mp", str(my)]
    return subprocess.run(
        [*command, "-o", str(output), "-j", "1", *extra],
        capture_output=True,
        text=True,
        timeout=COMPARE_TIMEOUT_S,
        env=environment,
    )


#: Long enough for a compare of these small dumps on a loaded machine; a reader blocked on a FIFO never ends.
COMPARE_TIMEOUT_S = 120

#: (source, a file of its dump, by a glob below the built folder): every kind of file a reader opens.
READ_FILES = [
    ("llmcheck", "**/index.jsonl"),
    ("llmcheck", "**/manifest.json"),
    ("llmcheck", "**/shard_*.safetensors"),
    ("fx", "**/*.npy"),
    ("file", "model-00002-of-00002.safetensors"),
    ("atb", "**/layer/4242/Decoder_layer_0.json"),
    ("atb", "**/operation_io_tensors/4242/operation_tensors_1.csv"),
    ("atb", "**/cpu_profiling/4242/operation_statistic_0.txt"),
    ("atb", "**/0_RmsNormOperation/op_param.json"),
    ("atb", "**/0_RmsNormOperation/after/outtensor0.bin"),
    ("ge", "**/Add.Add_2.*"),
    ("manual", "**/golden_tensor/0/*.safetensors"),
    ("msprobe", "**/dump.json"),
    ("msprobe", "**/stack.json"),
    ("msprobe", "**/construct.json"),
    ("msprobe", "**/*.output.0.pt"),
]


def _built_pair(source: str, tmp_path: Path, make_llmcheck_dump) -> tuple[Path, Path]:
    """Return a dump of ``source`` and a pristine copy of it to compare with."""
    dump, _ = SOURCES[source](tmp_path / "dump", make_llmcheck_dump)
    shutil.copytree(tmp_path / "dump", tmp_path / "pristine", symlinks=True)
    return dump, tmp_path / "pristine" / dump.relative_to(tmp_path / "dump")


def _source_flags(source: str) -> tuple[str, ...]:
    return ("--golden-source", source, "--my-source", source) if source in ("fx", "ge") else ()


@pytest.mark.parametrize("source, pattern", READ_FILES, ids=[f"{source}:{glob}" for source, glob in READ_FILES])
def test_a_fifo_in_place_of_any_file_a_reader_opens_is_one_error_naming_it_and_never_a_hang(
    source: str, pattern: str, tmp_path: Path, make_llmcheck_dump
) -> None:
    dump, pristine = _built_pair(source, tmp_path, make_llmcheck_dump)
    fifo = sorted((tmp_path / "dump").glob(pattern))[0]
    fifo.unlink()
    os.mkfifo(fifo)  # opening it for reading would wait forever for a writer
    completed = _compare_in_subprocess(dump, pristine, tmp_path / "report", *_source_flags(source))
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr.splitlines()[-1] == (
        f"llmcheck: error: {fifo}: is a FIFO (named pipe), not a regular file; llmcheck reads only regular files "
        "in a dump (replace it with the file it stands for)"
    )


#: The ATB files besides the tensors that were read through a link to /dev/zero (memory grew to gigabytes).
ATB_AUXILIARY = [
    "layer/4242/Decoder_layer_0.json",
    "operation_io_tensors/4242/operation_tensors_1.csv",
    "cpu_profiling/4242/operation_statistic_0.txt",
    "tensors/0_4242/0/0_Decoder_layer/0_RmsNormOperation/op_param.json",
]


@pytest.mark.parametrize("relative", ATB_AUXILIARY)
def test_an_atb_auxiliary_file_linked_to_a_device_is_refused_as_outside_the_dump(
    relative: str, tmp_path: Path, make_llmcheck_dump
) -> None:
    dump, pristine = _built_pair("atb", tmp_path, make_llmcheck_dump)
    (dump / relative).unlink()
    (dump / relative).symlink_to("/dev/zero")
    completed = _compare_in_subprocess(dump, pristine, tmp_path / "report")
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr.splitlines()[-1] == (
        f"llmcheck: error: {dump / relative}: leads outside the dump {dump} to /dev/zero (llmcheck reads only files "
        "inside the dump; copy the file in instead of linking to it)"
    )


@pytest.mark.parametrize("relative", ATB_AUXILIARY)
def test_an_atb_auxiliary_file_linked_outside_the_dump_is_refused_and_its_content_never_read(
    relative: str, tmp_path: Path
) -> None:
    dump = Path(shutil.copytree(ATB_FIXTURE, tmp_path / ATB_FIXTURE.name))
    outside = tmp_path / "elsewhere" / Path(relative).name
    outside.parent.mkdir()
    shutil.move(dump / relative, outside)
    (dump / relative).symlink_to(outside)
    with pytest.raises(PathOutsideDumpError) as caught:
        get_plugins().load_tensors(dump)
    assert caught.value.one_line().startswith(f"{dump / relative}: leads outside the dump {dump} to {outside}")


def test_a_symbolic_link_loop_on_an_atb_auxiliary_file_is_one_error_naming_it(tmp_path: Path) -> None:
    dump = Path(shutil.copytree(ATB_FIXTURE, tmp_path / ATB_FIXTURE.name))
    looping = dump / ATB_AUXILIARY[0]
    looping.unlink()
    looping.symlink_to(looping.name)
    with pytest.raises(DumpFormatError) as caught:
        get_plugins().load_tensors(dump)
    assert caught.value.one_line() == (
        f"{looping}: is a symbolic link that loops (remove the link or replace it with the file)"
    )


def test_a_metadata_file_larger_than_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from llmcheck.plugin_api import METADATA_LIMIT_BYTES

    dump = Path(shutil.copytree(ATB_FIXTURE, tmp_path / ATB_FIXTURE.name))
    op_param = dump / ATB_AUXILIARY[3]
    with open(op_param, "r+b") as handle:
        handle.truncate(METADATA_LIMIT_BYTES + 1)  # sparse: no disk is written
    with pytest.raises(DumpFormatError) as caught:
        get_plugins().load_tensors(dump)
    assert caught.value.one_line() == (
        f"{op_param}: is {METADATA_LIMIT_BYTES + 1} bytes, more than the {METADATA_LIMIT_BYTES} a metadata file "
        "may have (this file is read whole; check that it is the file the tool wrote)"
    )


@pytest.mark.parametrize("file_name", ["stack.json", "construct.json"])
def test_an_msprobe_stack_or_construct_json_linked_outside_the_rank_folder_is_refused(
    file_name: str, tmp_path: Path, make_llmcheck_dump
) -> None:
    dump, tensor_file = _msprobe(tmp_path / "dump", make_llmcheck_dump)
    in_dump = tensor_file.parent.parent / file_name
    outside = tmp_path / "elsewhere" / file_name
    outside.parent.mkdir()
    outside.write_text(json.dumps({"Tensor.__add__.0.forward": ["File /etc/passwd, line 1"]}))
    in_dump.unlink()
    in_dump.symlink_to(outside)
    with pytest.raises(PathOutsideDumpError) as caught:
        get_plugins().load_tensors(dump)
    assert caught.value.one_line().startswith(f"{in_dump}: leads outside the dump {in_dump.parent} to {outside}")


def test_a_manual_first_form_entry_naming_a_file_outside_the_my_dump_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmcheck import dump_data
    from llmcheck.core.cli import main

    my, elsewhere = tmp_path / "my", tmp_path / "elsewhere"
    for folder in (my, elsewhere):
        folder.mkdir()
    np.save(my / "mine_0.npy", np.ones(4, np.float32))
    np.save(elsewhere / "mine_1.npy", np.full(4, 7.0, np.float32))  # a value from outside both dumps
    dump_data(0, "mlp_out", torch.ones(4), str(my / "mine_0.npy"), str(tmp_path / "golden"))
    metadata = dump_data(1, "mlp_out", torch.ones(4), str(elsewhere / "mine_1.npy"), str(tmp_path / "golden"))
    code = main(["compare", "-gp", str(metadata), "-mp", str(my), "-o", str(tmp_path / "report"), "-j", "1"])
    assert code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"llmcheck: error: {metadata}: data_id mlp_out token 1 names {elsewhere / 'mine_1.npy'}, which leads outside "
        f"the --my-path dump {my} (pass the folder that holds every file the entries name as --my-path)"
    )
    assert not (tmp_path / "report").exists()


#: Where each source keeps a run: the folder a run-folder link stands in for, below the built folder.
RUN_FOLDERS = {
    "llmcheck": "*",
    "atb": "*/tensors/0_4242",
    "fx": "gm_*_dump",
    "ge": "20240101120000",
    "msprobe": "step0",
}


@pytest.mark.parametrize("source", RUN_FOLDERS)
def test_a_run_folder_that_is_a_link_is_never_entered_by_any_source_and_the_error_names_it(
    source: str, tmp_path: Path, make_llmcheck_dump
) -> None:
    SOURCES[source](tmp_path / "dump", make_llmcheck_dump)
    run = next((tmp_path / "dump").glob(RUN_FOLDERS[source]))
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run, elsewhere)
    run.symlink_to(elsewhere)  # the same rule whether it leads out of the dump or not: folder links are never entered
    with pytest.raises(DumpNotFoundError) as caught:
        get_plugins().load_tensors(tmp_path / "dump")
    assert caught.value.what == (
        f"no dump here but behind folder links, which llmcheck never enters: {run.name if source != 'atb' else 'tensors/0_4242'} "
        f"(to {elsewhere})"
    )
    assert caught.value.hint == "pass the folder a link leads to, or copy it in"


def test_an_index_read_a_line_at_a_time_keeps_the_rules_of_a_file_read_whole(
    tmp_path: Path, make_llmcheck_dump
) -> None:
    # the index is streamed (a ten-million-record index is 4 GB), yet missing, linked out or cut short it says so
    dump = make_llmcheck_dump(tmp_path / "dump", {"a": torch.ones(4), "b": torch.zeros(2)})
    index = dump / "index.jsonl"
    lines = index.read_bytes().splitlines(keepends=True)
    assert [line.rstrip(b"\n") for line in dump_file_lines(index, dump)] == [line.rstrip(b"\n") for line in lines]

    outside = tmp_path / "elsewhere.jsonl"
    shutil.move(index, outside)
    index.symlink_to(outside)
    with pytest.raises(PathOutsideDumpError) as linked:
        get_plugins().load_tensors(dump)
    assert linked.value.one_line().startswith(f"{index}: leads outside the dump")

    index.unlink()
    with pytest.raises(DumpFormatError) as missing:
        get_plugins().load_tensors(dump)
    assert missing.value.one_line().startswith(f"{index}: index.jsonl is missing")

    index.write_bytes(
        lines[0] + lines[1][:-5]
    )  # the second line cut short: the first record is read, and the cut named
    cut = get_plugins().load_tensors(dump)
    assert [record.key.name for record in cut.records] == ["a"]
    assert cut.cut is not None and f"index.jsonl ends in a partial line at byte {len(lines[0])}" in cut.cut
