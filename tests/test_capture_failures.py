"""Capture never breaks the program it watches: a full disk or a failing hook stops capture, not the run.

The full disk is real: the capture runs under a file size limit (``ulimit -f``), so the
kernel refuses the shard write with EFBIG exactly as a full disk refuses with ENOSPC. A
limit smaller than a dump's manifest is a disk already full when capture starts.
"""

from __future__ import annotations

import functools
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from llmcheck import read_dump
from llmcheck.core.dumps.store import find_dumps
from llmcheck.plugins.torch_hooks.capture import register_hook
from llmcheck.plugins.torch_hooks.config import DumpConfig

#: Each step's batch grows, so the step's shard outgrows the file size limit after a few steps.
GROWING_LOOP = textwrap.dedent("""
    import sys
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128))
    total = 0.0
    with torch.no_grad():
        for step in range(10):
            try:
                total += float(model(torch.ones(16 * (step + 1), 128)).sum())
            except Exception as exc:
                print(f"forward {step} raised {type(exc).__name__}")
    print(f"program done: 10 steps, total {total:.3f}")
    sys.exit(int(sys.argv[1]))
""")
FILE_SIZE_LIMIT_BYTES = 256 * 1024
#: Smaller than a dump's manifest (about 1 KiB), larger than the one-line notes ``llmcheck dump`` reads back.
FULL_FROM_THE_START_BYTES = 512


def _limit_file_size(limit_bytes: int = FILE_SIZE_LIMIT_BYTES) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing


def _llmcheck(
    *args: str, cwd: Path, limited: bool = False, limit_bytes: int = FILE_SIZE_LIMIT_BYTES
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmcheck.core.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=functools.partial(_limit_file_size, limit_bytes) if limited else None,
    )


def _uncaptured_output(tmp_path: Path) -> str:
    (tmp_path / "loop.py").write_text(GROWING_LOOP)
    return subprocess.run(
        [sys.executable, "loop.py", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    ).stdout


@pytest.mark.slow
def test_full_disk_during_capture_leaves_the_program_its_output_and_exit_code(tmp_path: Path) -> None:
    expected_output = _uncaptured_output(tmp_path)
    completed = _llmcheck(
        "dump",
        "--backend",
        "torch",
        "-o",
        "out",
        "-er",
        "all",
        "--exec",
        "python loop.py 5",
        cwd=tmp_path,
        limited=True,
    )
    assert completed.returncode == 5, completed.stderr
    assert completed.stdout == expected_output  # every forward ran and returned what it does uncaptured
    assert "Traceback" not in completed.stderr and "Exception ignored" not in completed.stderr
    stopped = [line for line in completed.stderr.splitlines() if "capture stopped" in line]
    assert len(stopped) == 1, completed.stderr  # warned once
    assert "shard_" in stopped[0] and "[Errno 27] File too large (EFBIG)" in stopped[0]
    (dump_path,) = find_dumps(tmp_path / "out")
    assert not list(dump_path.glob("*.tmp")) and not list(dump_path.glob(".*.tmp"))
    dump = read_dump(dump_path)
    assert dump.cut is not None and dump.cut.startswith("capture stopped early:") and "EFBIG" in dump.cut
    steps = sorted({record.key.step for record in dump.records})
    assert steps and steps == list(range(len(steps))) and len(steps) < 10  # complete steps, then the cut
    assert all(record.data is not None for record in dump.records)  # every kept record reads back
    assert dump.manifest["records"] == len(dump.records)
    closing = [line for line in completed.stderr.splitlines() if "torch capture wrote" in line]
    assert closing == [
        f"llmcheck: WARNING: torch capture wrote {dump_path} (cut, {len(dump.records)} records: "
        f"{dump.manifest['cut']}); the program exited with code 5"
    ]


@pytest.mark.slow
def test_raise_policy_hands_the_write_failure_to_the_forward(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(GROWING_LOOP)
    completed = _llmcheck(
        "dump",
        "--backend",
        "torch",
        "-o",
        "out",
        "-er",
        "all",
        "--on-capture-error",
        "raise",
        "--exec",
        "python loop.py 0",
        cwd=tmp_path,
        limited=True,
    )
    assert completed.returncode == 0, completed.stderr
    raised = [line for line in completed.stdout.splitlines() if line.startswith("forward")]
    assert len(raised) == 1 and raised[0].endswith("raised WriteFailedError")  # once; then capture is off
    assert "program done: 10 steps" in completed.stdout
    (dump_path,) = find_dumps(tmp_path / "out")
    assert "capture stopped early" in read_dump(dump_path).cut
    assert not list(dump_path.glob("*.tmp")) and not list(dump_path.glob(".*.tmp"))


#: Captures its model with ``register_hook`` under the policy given as argv[1]; says whether the result changed.
API_PROGRAM = textwrap.dedent("""
    import sys
    import torch
    from llmcheck import DumpConfig, register_hook
    from llmcheck.bundled_model import random_llama

    torch.set_num_threads(1)
    model = random_llama(seed=0)
    prompt = torch.tensor([[1, 7, 42, 9]])
    with torch.no_grad():
        uncaptured = model(prompt).logits
    try:
        with register_hook(model, DumpConfig(dump_path="out", on_capture_error=sys.argv[1])), torch.no_grad():
            captured = model(prompt).logits
    except Exception as exc:
        print(f"register_hook raised {type(exc).__name__}")
        sys.exit(3)
    print(f"program done: logits as uncaptured: {torch.equal(captured, uncaptured)}")
""")
PLAIN_PROGRAM = textwrap.dedent("""
    import sys
    import torch
    from llmcheck.bundled_model import random_llama

    torch.set_num_threads(1)
    with torch.no_grad():
        logits = random_llama(seed=0)(torch.tensor([[1, 7, 42, 9]])).logits
    print(f"program done: {logits.shape[-1]} logits")
    sys.exit(4)
""")


def _run_limited(program: str, *args: str, cwd: Path, limit_bytes: int) -> subprocess.CompletedProcess:
    (cwd / "program.py").write_text(program)
    return subprocess.run(
        [sys.executable, "program.py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=functools.partial(_limit_file_size, limit_bytes),
    )


def _dump_folders(output: Path) -> list[Path]:
    return sorted(output.glob("llmcheck_dump_*"))


@pytest.mark.slow
def test_a_disk_full_before_capture_starts_leaves_register_hook_and_the_program_running(tmp_path: Path) -> None:
    completed = _run_limited(API_PROGRAM, "stop", cwd=tmp_path, limit_bytes=FULL_FROM_THE_START_BYTES)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "program done: logits as uncaptured: True\n"
    assert "Traceback" not in completed.stderr
    (warning,) = completed.stderr.splitlines()  # one line, nothing else
    assert warning.startswith("capture could not start: out/llmcheck_dump_")  # the dump_path as given
    assert warning.endswith(
        "_rank0_cpu/manifest.json: cannot write: [Errno 27] File too large (EFBIG); "
        "no dump was written, the program runs on without capture"
    )
    assert _dump_folders(tmp_path / "out") == []  # no empty dump folder left behind


@pytest.mark.slow
def test_raise_policy_hands_a_disk_full_at_start_to_the_program(tmp_path: Path) -> None:
    completed = _run_limited(API_PROGRAM, "raise", cwd=tmp_path, limit_bytes=FULL_FROM_THE_START_BYTES)
    assert completed.returncode == 3, completed.stderr
    assert completed.stdout == "register_hook raised WriteFailedError\n"
    assert "capture could not start" not in completed.stderr  # the program was told, by the exception
    assert _dump_folders(tmp_path / "out") == []


@pytest.mark.slow
def test_dump_cli_blames_a_disk_full_before_capture_starts_not_the_program(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(PLAIN_PROGRAM)
    completed = _llmcheck(
        "dump",
        "--backend",
        "torch",
        "-o",
        "out",
        "--",
        "python",
        "program.py",
        cwd=tmp_path,
        limited=True,
        limit_bytes=FULL_FROM_THE_START_BYTES,
    )
    assert completed.returncode == 4, completed.stderr  # the program's own exit code
    assert completed.stdout == "program done: 256 logits\n"
    assert "Traceback" not in completed.stderr and "imports torch" not in completed.stderr
    lines = completed.stderr.splitlines()
    started = [line for line in lines if line.startswith("llmcheck: WARNING: capture could not start:")]
    assert len(started) == 1 and "manifest.json: cannot write: [Errno 27] File too large (EFBIG)" in started[0]
    out = tmp_path / "out"
    assert lines[-1].startswith(f"llmcheck: WARNING: {out}: no dump was written: capture could not start: {out}/")
    assert lines[-1].endswith(
        "manifest.json: cannot write: [Errno 27] File too large (EFBIG) "
        "(free some space there or pass another folder with -o); the program exited with code 4"
    )
    assert _dump_folders(out) == []


class _UnsavableTensor(torch.Tensor):
    """A tensor subclass whose copies fail: what a third-party subclass with an incomplete __torch_function__ does."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.clone:
            raise RuntimeError("clone is not supported by this tensor type")
        return super().__torch_function__(func, types, args, kwargs or {})


class _SubclassOutput(torch.nn.Module):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return (hidden * 2).as_subclass(_UnsavableTensor)


@pytest.mark.parametrize("policy", ["stop", "raise"])
def test_an_exception_inside_a_hook_never_reaches_the_forward_unless_asked(
    tmp_path: Path, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), _SubclassOutput(), torch.nn.Linear(4, 4))
    torch.manual_seed(0)
    inputs = torch.randn(2, 4)
    with torch.no_grad():
        expected = model(inputs).as_subclass(torch.Tensor)
    session = register_hook(model, DumpConfig(dump_path=tmp_path, token_range=None, on_capture_error=policy))
    with torch.no_grad():
        if policy == "raise":
            with pytest.raises(RuntimeError, match="clone is not supported"):
                model(inputs)
        else:
            assert torch.equal(model(inputs).as_subclass(torch.Tensor), expected)
        assert torch.equal(model(inputs).as_subclass(torch.Tensor), expected)  # capture is off from then on
    session.close()
    assert session.failure == "RuntimeError: clone is not supported by this tensor type"
    assert [r.message for r in caplog.records if "capture stopped" in r.message] != []
    dump = read_dump(session.path)
    assert "clone is not supported" in dump.cut
    assert {record.key.name for record in dump.records} <= {"root", "0"}  # what came before the failing module
    assert not session.model._forward_hooks and not session.model._forward_pre_hooks


def test_op_level_capture_stopped_mid_step_leaves_the_dispatch_mode(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), _SubclassOutput(), torch.nn.Linear(4, 4))
    session = register_hook(model, DumpConfig(dump_path=tmp_path, token_range=None, mode=("module", "op")))
    with torch.no_grad():
        model(torch.ones(2, 4))
        assert session.failure is not None and _get_current_dispatch_mode() is None
        assert torch.equal(torch.ones(2) + 1, torch.full((2,), 2.0))  # no mode left intercepting ops
    session.close()
    assert read_dump(session.path).cut is not None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "exit_code", "says"),
    [
        ("import torch\nprint(torch.ones(1).sum().item())\n", 1, "no forward ran"),  # no dump: a CI step fails
        ("import torch\nraise ValueError('broken program')\n", 1, "before any PyTorch module forward ran"),
        (None, 2, "before any PyTorch module forward ran"),  # the script file does not exist
        (
            "import torch, os, signal\ntorch.nn.Linear(2, 2)(torch.ones(1, 2))\nos.kill(os.getpid(), signal.SIGKILL)\n",
            137,
            "cut",
        ),
    ],
)
def test_the_end_message_tells_how_the_program_ended_and_whether_the_dump_is_whole(
    tmp_path: Path, script: str | None, exit_code: int, says: str
) -> None:
    if script is not None:
        (tmp_path / "program.py").write_text(script)
    completed = _llmcheck("dump", "--backend", "torch", "-o", "out", "--exec", "python program.py", cwd=tmp_path)
    assert completed.returncode == exit_code, completed.stderr
    if says == "no forward ran":
        assert completed.stdout == "1.0\n"  # the program itself succeeded
        assert completed.stderr.splitlines()[-1] == (
            f"llmcheck: error: {tmp_path / 'out'}: no dump was written: the program ran no PyTorch module forward "
            "under capture (is it a Python program that imports torch?)"
        )
        assert find_dumps(tmp_path / "out") == []
        return
    assert "is it a Python program that imports torch?" not in completed.stderr
    ended = "was killed by signal 9" if exit_code == 137 else f"exited with code {exit_code}"
    assert f"the program {ended}" in completed.stderr
    if says == "cut":
        (dump_path,) = find_dumps(tmp_path / "out")
        assert f"torch capture wrote {dump_path} (cut" in completed.stderr
    else:
        assert says in completed.stderr
