"""What a new user reads: the overview help, the step flags' meaning, warnings and errors that say what to do."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from compare_runs import capture_run
from llmcheck import DumpConfig, read_dump, register_hook
from llmcheck.core.capture.seed_flags import parse_execute_range, split_command
from llmcheck.core.cli import main
from llmcheck.plugins.torch_hooks.backend import config_from_options

PROMPT = torch.tensor([[1, 7, 42, 9]])


def test_overview_help_shows_every_command_uncut_with_an_example_and_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    commands = text.split("Commands:", 1)[1].split("Examples:", 1)[0]
    assert "..." not in commands
    for command in ("compare", "demo", "dump", "export", "opcheck", "plugins"):
        assert re.search(rf"^  {command}\s+\S", commands, re.M), command
        assert re.search(rf"^\s+llmcheck {command}\b", text, re.M), command
    for code, meaning in (
        ("0", "nothing failed"),
        ("1", "could not do the job"),
        ("2", "usage error"),
        ("3", "found failing tensors"),
    ):
        assert re.search(rf"^\s+{code}\s+.*{meaning}", text, re.M), code


def test_compare_help_says_a_path_is_a_dump_or_a_folder_holding_exactly_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--help"]) == 0
    assert "a folder holding exactly one dump" in " ".join(capsys.readouterr().out.split())


def _steps_dumped(model: torch.nn.Module, config: DumpConfig) -> list[int]:
    with torch.no_grad(), register_hook(model, config) as capture:
        model.generate(PROMPT, max_new_tokens=5, do_sample=False)
    return sorted({record.key.step for record in read_dump(capture.path).records})


def test_token_range_lists_steps_while_er_gives_closed_ranges(tiny_llama, tmp_path: Path) -> None:
    listed = DumpConfig(dump_path=tmp_path / "listed", token_range=[0, 4])
    assert _steps_dumped(tiny_llama, listed) == [0, 4]
    ranged = config_from_options({"execute_range": parse_execute_range("0,4")}, tmp_path / "ranged", ["python"])
    assert _steps_dumped(tiny_llama, ranged) == [0, 1, 2, 3, 4]
    pairs = config_from_options({"execute_range": parse_execute_range("1,2,4,4")}, tmp_path / "pairs", ["python"])
    assert _steps_dumped(tiny_llama, pairs) == [1, 2, 4]


def test_dump_help_and_torch_docs_say_which_is_which(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "0,4 is steps 0 to 4" in help_text and "DumpConfig(token_range=[0, 4]) lists steps: 0 and 4" in help_text
    docs = " ".join((Path(__file__).parent.parent / "docs" / "sources" / "torch.md").read_text().split())
    assert "**`token_range` lists steps; `-er` gives ranges.**" in docs


@pytest.mark.parametrize(
    "command",
    ["python crash.py > out.txt", "python a.py | tee log", "python a.py && echo ok", "python a.py ; echo done"],
)
def test_a_lone_shell_operator_in_exec_is_warned_about_and_passed_as_is(
    command: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="llmcheck"):
        argv = split_command(command, ())
    operator = command.split()[2]
    assert argv[2] == operator  # no shell: the program receives it
    [warning] = [record.getMessage() for record in caplog.records]
    assert f"--exec: {operator!r} reaches the program as a plain argument" in warning
    assert 'into a shell script and pass --exec "bash run.sh"' in warning


def test_a_plain_command_gives_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="llmcheck"):
        assert split_command("python infer.py --out 'a > b.txt'", ()) == ["python", "infer.py", "--out", "a > b.txt"]
    assert caplog.records == []


@pytest.fixture
def torch_dump(tiny_llama, tmp_path: Path) -> Path:
    return capture_run(tiny_llama, PROMPT, tmp_path / "golden")


def test_wrong_source_error_says_what_the_path_is_and_how_to_read_it(
    torch_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "compare",
                "-gp",
                str(torch_dump),
                "-mp",
                str(torch_dump),
                "--golden-source",
                "fx",
                "-o",
                str(tmp_path / "out"),
            ]
        )
        == 1
    )
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        f"llmcheck: error: {torch_dump}: not a fx dump: it is an llmcheck torch dump "
        "(drop --golden-source to read it as llmcheck, or give the path of the fx dump)"
    )


def test_both_wrong_sources_are_named_in_one_line(
    torch_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "compare",
                "-gp",
                str(torch_dump),
                "-mp",
                str(tmp_path / "missing"),
                "--golden-source",
                "fx",
                "-o",
                str(tmp_path / "out"),
            ]
        )
        == 1
    )
    [line] = capsys.readouterr().err.splitlines()
    assert f"{torch_dump}: not a fx dump: it is an llmcheck torch dump (drop --golden-source" in line
    assert f"; {tmp_path / 'missing'}: no such file or directory (check the path" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "-gp", "{tmp}/missing", "-mp", "{tmp}/missing", "-o", "{tmp}/out"],
        ["compare", "-gp", "{tmp}", "-mp", "{tmp}", "--mapping", "{tmp}/missing.json", "-o", "{tmp}/out"],
        ["opcheck", "-i", "{tmp}/missing", "-o", "{tmp}/out"],
        ["export", "onnx", "{tmp}/missing.json"],
    ],
)
def test_no_such_file_errors_say_what_to_do(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([arg.format(tmp=tmp_path) for arg in argv]) in (1, 2)
    [line] = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"llmcheck: error: .*missing(\.json)?: no such [^(]*\(check the path[^)]*\)", line), line
