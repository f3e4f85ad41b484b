"""Ctrl-C under ``llmcheck dump --exec`` is the program's to handle; the dump it leaves is marked cut.

The Ctrl-C is real: ``llmcheck dump`` runs on a pseudo-terminal as its controlling terminal,
and the test types ``^C`` into it, so the terminal's line discipline sends SIGINT to the
foreground process group -- llmcheck and the program together, as a shell's does.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path

import pytest

from llmcheck import read_dump
from llmcheck.core.dumps.store import MANIFEST_NAME, find_dumps

pytestmark = pytest.mark.slow

#: Runs steps until SIGINT, then cleans up for a moment, says so, and exits with its own code 7.
POLITE_PROGRAM = textwrap.dedent("""
    import signal, sys, time
    import torch

    torch.set_num_threads(1)
    asked_to_stop = []
    signal.signal(signal.SIGINT, lambda number, frame: asked_to_stop.append(number))
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    steps = 0
    with torch.no_grad():
        while not asked_to_stop and steps < 100_000:
            model(torch.ones(4, 32))
            steps += 1
            if steps == 3:
                print("ready", flush=True)
            time.sleep(0.005)
    print(f"cleaning up after {len(asked_to_stop)} SIGINT", flush=True)
    time.sleep(float(sys.argv[1]))
    print(f"cleaned up after {steps} steps", flush=True)
    sys.exit(7)
""")
CLEAN_UP_S = 1.0
#: Long enough that only a second Ctrl-C ends the wait.
SLOW_CLEAN_UP_S = 120.0
START_TIMEOUT_S = 180.0


def _dump_args(output: Path, clean_up_s: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "llmcheck.core.cli",
        "dump",
        "--backend",
        "torch",
        "-er",
        "all",
        "-o",
        str(output),
        "--exec",
        f"python program.py {clean_up_s}",
    ]


def _make_controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class _TerminalRun:
    """``llmcheck dump`` started on a pseudo-terminal, whose output the test reads and into which it types."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        self.process = subprocess.Popen(
            args,
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_make_controlling_terminal,
        )
        os.close(slave)
        self.output = ""

    def read_until(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            if time.monotonic() > deadline or not self._read(deadline - time.monotonic()):
                raise AssertionError(f"{text!r} never came; output so far:\n{self.output}")

    def type_ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def finish(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while self._read(deadline - time.monotonic()):
            pass
        os.close(self.master)
        return self.process.wait(timeout=max(1.0, deadline - time.monotonic()))

    def _read(self, timeout_s: float) -> bool:
        """Read what the terminal has; return False at its end (every writer gone) or when time is up."""
        ready, _, _ = select.select([self.master], [], [], max(0.0, timeout_s))
        if not ready:
            return False
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: no process holds the terminal open any more
            return False
        self.output += chunk.decode(errors="replace").replace("\r\n", "\n")
        return bool(chunk)


def _single_dump(output: Path) -> Path:
    (dump_path,) = find_dumps(output)
    return dump_path


def test_ctrl_c_lets_the_program_clean_up_and_exit_with_its_own_code_and_marks_the_dump_cut(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(POLITE_PROGRAM)
    run = _TerminalRun(_dump_args(tmp_path / "out", CLEAN_UP_S), tmp_path)
    run.read_until("ready", START_TIMEOUT_S)
    run.type_ctrl_c()
    exit_code = run.finish(START_TIMEOUT_S)

    assert exit_code == 7, run.output
    assert "cleaning up after 1 SIGINT" in run.output  # the terminal's Ctrl-C once, not again by llmcheck
    assert "cleaned up after" in run.output
    dump_path = _single_dump(tmp_path / "out")
    manifest = json.loads((dump_path / MANIFEST_NAME).read_text())
    assert manifest["cut"].startswith("interrupted: llmcheck dump got SIGINT")
    assert manifest["records"] > 0
    assert f"torch capture wrote {dump_path} (cut, {manifest['records']} records: interrupted" in run.output
    assert "the program exited with code 7 after SIGINT" in run.output
    dump = read_dump(dump_path)
    assert dump.cut is not None and "interrupted" in dump.cut
    assert len(dump.records) == manifest["records"]

    compared = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmcheck.core.cli",
            "compare",
            "-gp",
            dump_path,
            "-mp",
            dump_path,
            "-o",
            tmp_path / "cmp",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "dump is cut short: capture stopped early: interrupted" in compared.stderr, compared.stderr


def test_sigint_sent_to_llmcheck_alone_is_passed_on_to_the_program(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(POLITE_PROGRAM)
    process = subprocess.Popen(
        _dump_args(tmp_path / "out", CLEAN_UP_S),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # no terminal: only llmcheck gets the signal
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGINT)
    rest_of_output, stderr = process.communicate(timeout=START_TIMEOUT_S)

    assert process.returncode == 7, stderr
    assert "cleaning up after 1 SIGINT" in rest_of_output
    assert "cleaned up after" in rest_of_output
    assert "SIGINT: passed SIGINT on to it" in stderr
    manifest = json.loads((_single_dump(tmp_path / "out") / MANIFEST_NAME).read_text())
    assert manifest["cut"].startswith("interrupted: llmcheck dump got SIGINT")


def test_a_second_ctrl_c_stops_the_wait_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(POLITE_PROGRAM)
    run = _TerminalRun(_dump_args(tmp_path / "out", SLOW_CLEAN_UP_S), tmp_path)
    run.read_until("ready", START_TIMEOUT_S)
    run.type_ctrl_c()
    run.read_until("cleaning up after 1 SIGINT", 60)
    started = time.monotonic()
    run.type_ctrl_c()
    exit_code = run.finish(60)

    assert time.monotonic() - started < SLOW_CLEAN_UP_S / 2
    assert exit_code == 137, run.output
    assert "a second SIGINT: stopped waiting for the program" in run.output
    assert "cleaned up after" not in run.output
    dump_path = _single_dump(tmp_path / "out")
    manifest = json.loads((dump_path / MANIFEST_NAME).read_text())
    assert manifest["cut"].startswith("interrupted: llmcheck dump got SIGINT")
    assert "killed by llmcheck after a second SIGINT" in run.output
