"""Files that once ended as "internal error": each is now one line naming the file, what is wrong and what to do.

Every case is a real file in its real format with one thing wrong -- a torch file that is
empty or holds a tensor without values, a safetensors header with a null field, JSON nested
100,000 deep, a link to nothing, a name longer than the system allows -- run through the
CLI as a user would meet it. A manual first-form entry and msprobe's stack.json are held to
the one containment rule of every reader.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from llmcheck.core.cli import main

ATB_FIXTURE = Path(__file__).parent / "data" / "atb" / "msit_dump_20240131_120000"
MSPROBE_FIXTURE = Path(__file__).parent / "data" / "msprobe" / "msprobe_pytorch_dump"
DEEP_JSON = "[" * 100_000 + "]" * 100_000


def _error_line(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI and return its one error line (exit 1 asserted)."""
    code = main(arguments)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("llmcheck: error:")]
    assert code == 1 and len(errors) == 1, errors
    return errors[0]


def _compare(golden: Path, my: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "report"), "-j", "1", *extra]


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "is empty (0 bytes), not a torch file (save the tensor again)"),
        (
            torch.ones(3).to_sparse(),
            "holds a tensor of layout torch.sparse_coo, not a dense tensor (save tensor.to_dense())",
        ),
        (
            {"w": torch.empty(3, device="meta")},
            "holds tensor 'w' on the meta device, which has no values (only a shape and a dtype) "
            "(save the tensor of a real run)",
        ),
    ],
    ids=["empty", "sparse", "meta"],
)
def test_a_torch_file_without_dense_values_is_one_error_naming_it(
    content: object, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, good = tmp_path / "bad.pt", tmp_path / "good.pt"
    if content is None:
        bad.write_bytes(b"")
    else:
        torch.save(content, bad)
    torch.save(torch.ones(3), good)
    assert _error_line(_compare(bad, good, tmp_path), capsys) == f"llmcheck: error: {bad}: {expected}"


def _safetensors_with_header(path: Path, edit: dict[str, object]) -> Path:
    """Write a real safetensors file, then replace fields of its JSON header."""
    save_file({"w": torch.ones(2)}, str(path))
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = {**json.loads(data[8 : 8 + size]), **edit}
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + size :])
    return path


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            {"w": {"dtype": "F32", "shape": [2], "data_offsets": None}},
            "tensor 'w' has a malformed header entry at byte 8",
        ),
        (
            {"__metadata__": {"llmcheck_raw_dtypes": "{bfloat16"}},
            "__metadata__.llmcheck_raw_dtypes is not valid JSON: Expecting property name enclosed in double quotes",
        ),
        (
            {"w": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}},
            "tensor 'w' has unsupported dtype ['F32'] at byte 8",
        ),
    ],
    ids=["data_offsets null", "raw dtypes not JSON", "dtype a list"],
)
def test_a_safetensors_header_with_a_field_of_the_wrong_kind_is_one_error_naming_the_file(
    edit: dict[str, object], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _safetensors_with_header(tmp_path / "bad.safetensors", edit)
    save_file({"w": torch.ones(2)}, str(tmp_path / "good.safetensors"))
    line = _error_line(_compare(bad, tmp_path / "good.safetensors", tmp_path), capsys)
    assert line == f"llmcheck: error: {bad}: {expected}"


def test_a_checkpoint_whose_model_file_is_a_link_to_nothing_is_one_error_naming_the_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, my = tmp_path / "golden", tmp_path / "my"
    for folder in (golden, my):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    (golden / "model.safetensors").symlink_to("model-renamed.safetensors")
    save_file({"w": torch.ones(2)}, str(my / "model.safetensors"))
    assert _error_line(_compare(golden, my, tmp_path), capsys) == (
        f"llmcheck: error: {golden / 'model.safetensors'}: is a link to model-renamed.safetensors, which does not "
        "exist (copy the file in, or remove the link)"
    )


def test_an_fx_saved_dtypes_file_nested_too_deep_is_one_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for side in ("golden", "my"):
        step = tmp_path / side / "gm_20240101000000000001_dump" / "0"
        step.mkdir(parents=True)
        np.save(step / "mm-aten.mm.default.OUTPUT.0.20240101000000000002.npy", np.ones(4, np.float32))
    saved_dtypes = tmp_path / "golden" / "gm_20240101000000000001_dump" / "0" / "llmcheck_saved_dtypes.json"
    saved_dtypes.write_text(DEEP_JSON)
    flags = ("--golden-source", "fx", "--my-source", "fx")
    assert _error_line(_compare(tmp_path / "golden", tmp_path / "my", tmp_path, *flags), capsys) == (
        f"llmcheck: error: {saved_dtypes}: JSON nested too deep to read (the file is damaged; write it again)"
    )


def test_an_index_line_whose_attrs_nest_too_deep_is_one_error_naming_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reader keeps a line's attrs as raw text to decode once per text: their depth is still checked on the line."""
    from llmcheck.core.dumps.store import DumpWriter
    from llmcheck.core.records import RecordKey, TensorRecord

    folders = []
    for side in ("golden", "my"):
        with DumpWriter(tmp_path / side, "test") as writer:
            for order in range(2):
                key = RecordKey(f"op{order}")
                writer.add(TensorRecord(key=key, dtype="float32", shape=(2,), order=order, attrs={"args": [order]}))
        folders.append(writer.path)
    index = folders[1] / "index.jsonl"
    first, second = index.read_text().splitlines()
    index.write_text(first + "\n" + second.replace('{"args":[1]}', '{"args":' + DEEP_JSON + "}") + "\n")
    assert _error_line(_compare(folders[0], folders[1], tmp_path), capsys).startswith(
        f"llmcheck: error: {index}:2: nested too deeply at byte "
    )


def test_an_atb_op_param_nested_too_deep_is_one_error_under_opcheck(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = Path(shutil.copytree(ATB_FIXTURE, tmp_path / ATB_FIXTURE.name))
    op_param = dump / "tensors/0_4242/0/0_Decoder_layer/1_LinearOperation/op_param.json"
    op_param.write_text(DEEP_JSON)
    assert _error_line(["opcheck", "-i", str(dump), "-o", str(tmp_path / "out"), "-j", "1"], capsys) == (
        f"llmcheck: error: {op_param}: JSON nested too deep to read (the file is damaged; write it again)"
    )


def _msprobe_copy(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """Return a copy of the msprobe fixture's rank folder, with a tensor folder beside its dump.json."""
    rank = Path(shutil.copytree(MSPROBE_FIXTURE, tmp_path / name / "step0" / "rank0"))
    (rank / "dump_tensor_data").mkdir()
    return tmp_path / name, rank


def test_an_msprobe_data_name_too_long_for_the_system_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, rank = _msprobe_copy(tmp_path, "golden")
    my, _ = _msprobe_copy(tmp_path, "my")
    document = json.loads((rank / "dump.json").read_text())
    entry = next(iter(document["data"].values()))
    item = next(item for item in entry["output"] if isinstance(item, dict))
    item["data_name"] = "x" * 5000 + ".pt"
    (rank / "dump.json").write_text(json.dumps(document))
    line = _error_line(_compare(golden, my, tmp_path), capsys)
    assert line.startswith(f"llmcheck: error: {rank / 'dump_tensor_data'}/xxx") and line.endswith(
        "...: a name in the path is 5003 characters, more than the system allows "
        "(the file that names it is damaged; write it again)"
    )


def test_a_path_argument_too_long_for_the_system_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    too_long, good = tmp_path / ("y" * 5000), tmp_path / "good.pt"
    torch.save(torch.ones(3), good)
    line = _error_line(_compare(too_long, good, tmp_path), capsys)
    assert line == (
        f"llmcheck: error: {str(too_long)[:200]}...: a name in the path is 5000 characters, more than the system "
        "allows (the file that names it is damaged; write it again)"
    )


def test_an_msprobe_item_whose_type_is_not_text_is_read_by_its_dtype_and_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, rank = _msprobe_copy(tmp_path, "golden")
    my, _ = _msprobe_copy(tmp_path, "my")
    unedited_code = main(_compare(golden, my, tmp_path / "unedited"))
    document = json.loads((rank / "dump.json").read_text())
    entry = next(iter(document["data"].values()))
    item = next(item for item in entry["output"] if isinstance(item, dict))
    item["type"] = {"torch": "Tensor"}  # a value of the wrong kind, as an edit leaves it
    (rank / "dump.json").write_text(json.dumps(document))
    assert main(_compare(golden, my, tmp_path / "edited")) == unedited_code
    assert "llmcheck: error:" not in capsys.readouterr().err
    unedited = json.loads((tmp_path / "unedited" / "report" / "summary.json").read_text())
    edited = json.loads((tmp_path / "edited" / "report" / "summary.json").read_text())
    assert edited["counts"] == unedited["counts"]  # the item is still read as the tensor it describes


def test_an_onnx_export_of_a_topology_that_is_a_fifo_is_one_error_and_never_a_hang(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    import llmcheck

    topology = tmp_path / "model.json"
    os.mkfifo(topology)
    completed = subprocess.run(
        [sys.executable, "-m", "llmcheck.core.cli", "export", "onnx", str(topology)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(llmcheck.__file__).parents[1])},
    )
    assert completed.returncode == 1
    assert completed.stderr.splitlines()[-1] == (
        f"llmcheck: error: {topology}: is a FIFO (named pipe), not a regular file; llmcheck reads only regular files "
        "in a dump (replace it with the file it stands for)"
    )
