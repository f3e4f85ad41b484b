"""Progress while dumping and comparing: a live line on a terminal, log lines in a pipe, silence with -l warning."""

from __future__ import annotations

import io
import logging
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from rich.console import Console

from compare_runs import capture_run, scaled_weight
from llmcheck import DumpConfig, register_hook
from llmcheck.core.compare import compare_with_progress
from llmcheck.core.plugins import get_plugins

PROMPT = torch.tensor([[1, 7, 42, 9]])
STEP_LINE = re.compile(r"dumped step (\d+): (\d+) records, (\d+\.\d\d) MB written, (\d+\.\d\d) MB/s")

SCRIPT = """
import torch
from llmcheck.bundled_model import random_llama
torch.set_num_threads(1)
model = random_llama(seed=0)
with torch.no_grad():
    model.generate(torch.tensor([[1, 7, 42, 9]]), max_new_tokens=3, do_sample=False)
"""


def _generate_with_capture(model: torch.nn.Module, folder: Path) -> None:
    with torch.no_grad(), register_hook(model, DumpConfig(dump_path=folder, token_range=None)):
        model.generate(PROMPT, max_new_tokens=3, do_sample=False)


def test_a_dump_logs_one_line_per_step_when_not_on_a_terminal(
    tiny_llama, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="llmcheck"):
        _generate_with_capture(tiny_llama, tmp_path)
    lines = [
        STEP_LINE.fullmatch(record.getMessage())
        for record in caplog.records
        if record.name == "llmcheck.torch.progress"
    ]
    assert all(lines) and [int(line.group(1)) for line in lines] == [0, 1, 2]
    records = [int(line.group(2)) for line in lines]
    megabytes = [float(line.group(3)) for line in lines]
    assert records == sorted(records) and records[0] > 50 and megabytes[-1] > megabytes[0] > 0


def test_a_dump_is_silent_at_log_level_warning(tiny_llama, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="llmcheck"):
        _generate_with_capture(tiny_llama, tmp_path)
    assert [record for record in caplog.records if record.name.startswith("llmcheck.torch")] == []


def _llmcheck_dump(tmp_path: Path, *flags: str, stderr_on_terminal: bool) -> str:
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "infer.py"
    script.write_text(SCRIPT)
    argv = [
        sys.executable,
        "-m",
        "llmcheck.core.cli",
        "dump",
        "-o",
        str(tmp_path / "out"),
        "-er",
        "all",
        *flags,
        "--",
        "python",
        str(script),
    ]
    env = {**os.environ, "COLUMNS": "160"}
    if not stderr_on_terminal:
        return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env).stderr
    leader, follower = pty.openpty()
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed with the child
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    process = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=follower, timeout=300, env=env)
    os.close(follower)
    reader.join(timeout=30)
    os.close(leader)
    assert process.returncode == 0
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_llmcheck_dump_shows_a_live_line_on_a_terminal_and_step_lines_in_a_pipe(tmp_path: Path) -> None:
    piped = _llmcheck_dump(tmp_path / "piped", stderr_on_terminal=False)
    steps = [int(step) for step in re.findall(r"^llmcheck: INFO: dumped step (\d+): ", piped, re.M)]
    assert steps == [0, 1, 2], piped
    assert "\x1b[" not in piped
    terminal = _llmcheck_dump(tmp_path / "terminal", stderr_on_terminal=True)
    live = re.findall(r"llmcheck: dumping step (\d+): \d+ records, [\d.]+ MB written, [\d.]+ MB/s", terminal)
    assert live[-1] == "2" and "\x1b[" in terminal  # redrawn in place: cursor movement, not a line per step
    assert "INFO: dumped step" not in terminal and "llmcheck: dumped step 2: " in terminal  # the last state stays


@pytest.mark.slow
def test_llmcheck_dump_at_log_level_warning_prints_no_progress(tmp_path: Path) -> None:
    assert "step" not in _llmcheck_dump(tmp_path, "-l", "warning", stderr_on_terminal=False)


def test_compare_logs_progress_lines_when_its_output_is_piped(
    tiny_llama, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    golden = capture_run(tiny_llama, PROMPT, tmp_path / "golden")
    with scaled_weight(tiny_llama, "model.layers.1.mlp.down_proj", 1.5):
        my = capture_run(tiny_llama, PROMPT, tmp_path / "my")
    plugins = get_plugins()
    piped = Console(file=io.StringIO())
    assert not piped.is_terminal
    with caplog.at_level(logging.INFO, logger="llmcheck"):
        compare_with_progress(
            plugins.load_tensors(golden), plugins.load_tensors(my), console=piped, workers=1, progress_interval_s=0.0
        )
    lines = [
        match.groups()
        for record in caplog.records
        if (
            match := re.fullmatch(
                r"comparing: (\d+)% \(([\d.]+) of ([\d.]+) (\w+), [\d.]+ (\w+)/s\)", record.getMessage()
            )
        )
    ]
    percents = [int(line[0]) for line in lines]
    assert percents[0] == 0 and percents[-1] == 100 and percents == sorted(set(percents)) and len(percents) >= 5
    # a compare of a few hundred kB counts in kB, not "0.00 of 0.00 GB"
    (total,) = {line[2] for line in lines}
    assert {line[3] for line in lines} == {"kB"} and 1 <= float(total) < 1000
    assert lines[-1][1] == total


def test_a_large_compare_says_when_it_judges_and_writes_its_reports(
    tiny_llama, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the last byte is measured, a 10^5-row compare judges and writes for a while: the log says so."""
    from llmcheck.core import compare
    from llmcheck.core.cli import main

    golden = capture_run(tiny_llama, PROMPT, tmp_path / "golden")
    arguments = ["compare", "-gp", str(golden), "-mp", str(golden), "-j", "1"]
    with caplog.at_level(logging.INFO, logger="llmcheck"):
        assert main([*arguments, "-o", str(tmp_path / "small")]) == 0
        small = [record.getMessage() for record in caplog.records]
        caplog.clear()
        monkeypatch.setattr(compare, "PROGRESS_ROWS", 1)  # this compare's rows count as many
        assert main([*arguments, "-o", str(tmp_path / "large")]) == 0
        large = [record.getMessage() for record in caplog.records]
    assert not any(message.startswith(("judging", "writing the reports")) for message in small)
    rows = len((tmp_path / "large" / "cmp_report.csv").read_text().splitlines()) - 1
    last = max(index for index, message in enumerate(large) if message.startswith("comparing: 100%"))
    assert large[last + 1 : last + 3] == [
        f"judging {rows} rows against their feeders and repeats",
        f"writing the reports of {rows} rows",
    ]


@pytest.mark.slow
def test_loading_the_bundled_smollm2_draws_no_bar_into_a_pipe(smollm2_path: Path) -> None:
    """transformers' tqdm bar ("Loading weights") would write its redraws into a CI log: piped, there is none."""
    load = "from llmcheck.bundled_model import load_smollm2; model, _ = load_smollm2(); print(type(model).__name__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    loaded = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=300, env=env)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout == "LlamaForCausalLM\n"
    assert "Loading weights" not in loaded.stderr and "it/s]" not in loaded.stderr, loaded.stderr[-500:]
