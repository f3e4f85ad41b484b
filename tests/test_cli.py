"""CLI errors: one line, naming the flag or file and what to do; exit 2 for usage, 1 for failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcheck.core.capture.seed_flags import expand_multi_value_options
from llmcheck.core.cli import main


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["dump", "-er", "1"], "-er/--execute-range: invalid value '1'"),
        (["dump", "-er", "5,3", "--", "true"], "range 5,3 is empty"),
        (["dump", "-ids", "2,x_1", "--", "true"], "invalid operation id 'x_1'"),
        (["dump", "-time", "7", "--", "true"], "-time/--save-time: invalid value 7"),
        (["dump", "-stp", "3", "--", "true"], "-stp/--save-tensor-part: invalid value 3"),
        (["dump", "-child", "maybe", "--", "true"], "invalid boolean 'maybe'"),
        (["dump", "--type", "tensr", "--", "true"], "'tensr' is not one of"),
        (["dump", "--exec", "python 'unclosed"], "cannot split the command"),
        (["dump", "--exec", "true", "--", "true"], "either with --exec or after '--'"),
        (["dump", "--backend", "nosuch", "--", "true"], "unknown backend 'nosuch'"),
        (["compare", "--golden-path", "x"], "Missing option '-mp' / '--my-path'"),
        (["compare", "--bogus"], "No such option '--bogus'"),
        (["nosuchcommand"], "No such command 'nosuchcommand'"),
    ],
)
def test_usage_errors_are_one_line_with_exit_code_2(args, expected, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("llmcheck: error: ")
    assert expected in err


def test_missing_input_file_is_one_line_failure_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.json"
    assert main(["export", "onnx", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"llmcheck: error: {missing}: no such topology file (check the path") and err.count("\n") == 1


def test_debug_log_level_adds_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "onnx", str(tmp_path / "nope.json"), "-l", "debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "no such topology file (check the path" in err.strip().splitlines()[-1]


def test_seed_style_space_separated_lists_become_repeated_options() -> None:
    args = ["dump", "--type", "model", "layer", "tensor", "-o", "x", "--", "python", "--type", "a", "b"]
    assert expand_multi_value_options(args, ["--type"]) == [
        "dump",
        "--type",
        "model",
        "--type",
        "layer",
        "--type",
        "tensor",
        "-o",
        "x",
        "--",
        "python",
        "--type",
        "a",
        "b",
    ]


def test_a_truncated_topology_json_is_one_error_naming_the_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = tmp_path / "model.json"
    topology.write_text('{"modelName": "Llama", "nodes": [')
    assert main(["export", "onnx", str(topology)]) == 1
    assert capsys.readouterr().err == (
        f"llmcheck: error: {topology}: not valid JSON: Expecting value at byte 33 (the file is truncated or corrupt)\n"
    )


def test_dump_into_an_existing_dump_is_refused_before_the_program_runs(
    make_llmcheck_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    dump = make_llmcheck_dump(tmp_path / "runs", {"a": torch.ones(2)})
    marker = tmp_path / "ran"
    assert main(["dump", "--backend", "torch", "-o", str(dump), "--", "touch", str(marker)]) == 2
    assert "new dumps are never written into a dump" in capsys.readouterr().err
    assert not marker.exists() and [p.name for p in dump.iterdir() if p.is_dir()] == []


def test_one_broken_path_given_as_both_runs_is_one_error_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "run"
    assert main(["compare", "-gp", str(missing), "-mp", str(missing), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"llmcheck: error: {missing}: no such file or directory "
        "(check the path: give a dump folder, a folder holding one dump, or a tensor file)\n"
    )
    assert not (tmp_path / "out").exists()
