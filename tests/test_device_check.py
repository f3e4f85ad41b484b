"""``benchmarks/device_check.sh``: on a machine without CUDA it still runs, naming each CUDA part as skipped.

On a GPU machine the script itself is the check (its table goes into the closing note); here
the CUDA parts are asked for alone, so the test is quick: the FX part runs its tests on any
machine and is covered by tests/test_fx_capture_fast.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "device_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the parts run: run benchmarks/device_check.sh")
def test_without_cuda_each_cuda_part_is_named_as_skipped_in_one_table(tmp_path: Path) -> None:
    completed = subprocess.run(
        ["bash", str(SCRIPT), "--logs", str(tmp_path), "cuda-tests", "capture-overhead", "vllm"],
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    table = completed.stdout.strip().splitlines()
    assert table[0].startswith(f"llmcheck device check on no CUDA device (CPU only); torch {torch.__version__}")
    assert table[1].split() == ["part", "outcome", "time", "figures"]
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in table[2:-1]}
    assert rows == {
        "cuda-tests": "skipped: no CUDA device - -",
        "capture-overhead": "skipped: no CUDA device - -",
        "vllm": "skipped: vLLM is not installed - -",
    }
    assert table[-1] == f"logs: {tmp_path}"


def test_an_unknown_part_is_one_error_line_naming_the_parts() -> None:
    completed = subprocess.run(["bash", str(SCRIPT), "gpu"], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2
    assert completed.stderr == (
        "device_check: error: gpu: no such part (give one of: cuda-tests capture-overhead fx-fast-path vllm)\n"
    )
