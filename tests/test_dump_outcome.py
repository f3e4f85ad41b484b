"""``llmcheck dump``'s closing report says what happened to each dump of its own run, and only of its own run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmcheck.core.dumps.store import find_dumps

pytestmark = pytest.mark.slow

#: Runs a step, makes its own dump folder read-only (``chmod``, or ``chattr +i`` for root, whom
#: permissions do not stop), then runs on: the next step's shard cannot be written.
READ_ONLY_PROGRAM = textwrap.dedent("""
    import json, os, subprocess, sys
    import torch

    torch.set_num_threads(1)
    output = json.loads(os.environ["LLMCHECK_TORCH_CAPTURE"])["dump_path"]
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    with torch.no_grad():
        model(torch.ones(4, 32))
        (dump_folder,) = [os.path.join(output, name) for name in os.listdir(output)]
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i", dump_folder], check=True)
        else:
            os.chmod(dump_folder, 0o555)
        for step in range(1, 4):
            model(torch.ones(4, 32))
    print("program done", flush=True)
""")


def _llmcheck(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmcheck.core.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _can_make_read_only(folder: Path) -> str | None:
    """Return why this machine cannot make a folder refuse writes, or None when it can."""
    probe = folder / "probe"
    probe.mkdir()
    try:
        if os.geteuid() == 0:
            if shutil.which("chattr") is None:
                return "running as root without chattr: no way to make a folder read-only to root"
            made = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True)
            if made.returncode != 0:
                return f"chattr +i is refused here: {made.stderr.strip()}"
            subprocess.run(["chattr", "-i", str(probe)], check=True)
        return None
    finally:
        probe.rmdir()


def _writable_again(folder: Path) -> None:
    for dump_path in find_dumps(folder):
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(dump_path)], check=False)
        else:
            dump_path.chmod(0o755)


def test_a_dump_folder_made_read_only_is_reported_as_unclosed_not_as_a_killed_program(tmp_path: Path) -> None:
    why_not = _can_make_read_only(tmp_path)
    if why_not is not None:
        pytest.skip(why_not)
    (tmp_path / "program.py").write_text(READ_ONLY_PROGRAM)
    try:
        completed = _llmcheck("dump", "-er", "all", "-o", "out", "--exec", "python program.py", cwd=tmp_path)
        (dump_path,) = find_dumps(tmp_path / "out")
    finally:
        _writable_again(tmp_path / "out")

    assert completed.returncode == 0, completed.stderr
    assert "program done" in completed.stdout
    stderr = completed.stderr
    assert "capture stopped:" in stderr
    assert "closed as cut" not in stderr
    # how many records were complete when the folder turned read-only depends on when the writes were flushed
    assert re.search(
        rf"the dump {re.escape(str(dump_path))} keeps its \d+ complete records, but its closing manifest could not be "
        "written",
        stderr,
    ), stderr
    assert "killed" not in stderr and "did not exit normally" not in stderr
    assert f"torch capture wrote {dump_path} (cut: capture stopped and could not write its closing manifest: " in stderr
    assert stderr.rstrip().endswith("the program exited with code 0")


#: Runs a step, then waits until the file ``stop_NAME`` appears (the test's signal), then exits.
WAITING_PROGRAM = textwrap.dedent("""
    import os, sys, time
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    with torch.no_grad():
        model(torch.ones(4, 32))
        print("started", flush=True)
        while not os.path.exists(f"stop_{sys.argv[2]}"):
            time.sleep(0.05)
    print(f"run {sys.argv[1]} done", flush=True)
""")


def _wait_for_line(process: subprocess.Popen, line: str) -> None:
    assert process.stdout is not None
    assert process.stdout.readline().strip() == line


def test_two_runs_into_one_output_folder_each_report_only_their_own_dump(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(WAITING_PROGRAM)
    runs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llmcheck.core.cli",
                "dump",
                "-o",
                "out",
                "--exec",
                f"python program.py {name} {name}",
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("first", "second")
    }
    for process in runs.values():
        _wait_for_line(process, "started")  # both dumps are open now
    (tmp_path / "stop_first").touch()
    first_stdout, first_stderr = runs["first"].communicate(timeout=300)  # the second run's dump is still open
    (tmp_path / "stop_second").touch()
    second_stdout, second_stderr = runs["second"].communicate(timeout=300)

    dumps = find_dumps(tmp_path / "out")
    assert len(dumps) == 2
    for name, stdout, stderr in (("first", first_stdout, first_stderr), ("second", second_stdout, second_stderr)):
        assert runs[name].returncode == 0, stderr
        assert f"run {name} done" in stdout
        (own,) = [path for path in dumps if json.loads((path / "manifest.json").read_text())["command_line"][2] == name]
        reported = [line for line in stderr.splitlines() if "torch capture wrote" in line]
        assert reported == [
            f"llmcheck: INFO: torch capture wrote {own} (complete, 8 records); the program exited with code 0"
        ]
        assert "killed" not in stderr
