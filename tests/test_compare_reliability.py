"""compare on hostile ground: a full disk, golden records left unmatched, -o pointed at a dump."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from llmcheck.core.cli import main

ATB_FIXTURE = Path(__file__).parent / "data" / "atb" / "msit_dump_20240131_120000"
GE_FIXTURE = Path(__file__).parent / "data" / "ge"


def _tensors(count: int) -> dict[str, torch.Tensor]:
    return {f"layers.{index}.out": torch.full((4,), float(index)) for index in range(count)}


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


@pytest.mark.slow
def test_a_full_disk_is_one_error_naming_the_output_folder_and_leaves_no_partial_report(
    make_llmcheck_dump, tmp_path: Path
) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", _tensors(60))
    output = tmp_path / "out"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmcheck.core.cli",
            "compare",
            "-gp",
            str(golden),
            "-mp",
            str(golden),
            "-o",
            str(output),
            "-j",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size,
    )
    assert completed.returncode == 1
    errors = [line for line in completed.stderr.splitlines() if not line.startswith("llmcheck: INFO:")]
    assert errors == [
        f"llmcheck: error: {output}: cannot write cmp_report.csv: [Errno 27] File too large (EFBIG) "
        "(free some space there or pass another folder with -o)"
    ]
    assert sorted(path.name for path in output.iterdir()) == []  # no 0-byte or partial report, no temporary file


def _cut_copy(dump: Path, destination: Path, keep_lines: int) -> Path:
    """Return a copy of a dump whose writer was killed after ``keep_lines`` index lines."""
    shutil.copytree(dump, destination)
    manifest = json.loads((destination / "manifest.json").read_text())
    for key in ("end_time", "records", "shards", "tensor_bytes"):
        manifest.pop(key)
    (destination / "manifest.json").write_text(json.dumps(manifest))
    lines = (destination / "index.jsonl").read_text().splitlines(keepends=True)
    (destination / "index.jsonl").write_text("".join(lines[:keep_lines]))
    return destination


def test_golden_records_a_cut_dump_left_unmatched_fail_the_compare_unless_allowed(
    make_llmcheck_dump, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", _tensors(40))
    my = _cut_copy(golden, tmp_path / "my_cut", keep_lines=3)
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out"), "-j", "1"]) == 3
    assert "37 of the 40 golden records have no counterpart and no pairing rule expects that" in caplog.text
    counts = json.loads((tmp_path / "out" / "summary.json").read_text())["counts"]
    assert (counts["passes"], counts["failures"], counts["errors"]) == (3, 0, 0)
    assert (counts["unmatched_golden_unexpected"], counts["unmatched_golden_expected"]) == (37, 0)
    assert (
        main(
            ["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out"), "-j", "1", "--allow-unmatched"]
        )
        == 0
    )
    assert "accepted by --allow-unmatched" in caplog.text


def _fx_dump(folder: Path) -> Path:
    step = folder / "gm_20240101000000000001_dump" / "0"
    step.mkdir(parents=True)
    np.save(step / "add-aten.add.Tensor.OUTPUT.0.20240101000000000002.npy", np.ones(4, np.float32))
    return folder


def _manual_dump(folder: Path) -> Path:
    from llmcheck import dump_data

    return dump_data("golden", "mlp_out", torch.ones(4), output_path=folder).parent


@pytest.mark.parametrize("kind", ["llmcheck", "atb", "ge", "fx", "manual"])
def test_any_dump_own_or_foreign_is_refused_as_the_report_folder(
    kind: str, make_llmcheck_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", _tensors(2))
    if kind == "llmcheck":
        target = make_llmcheck_dump(tmp_path / "other", _tensors(1))
    elif kind == "atb":
        target = Path(shutil.copytree(ATB_FIXTURE, tmp_path / ATB_FIXTURE.name))
    elif kind == "ge":
        target = Path(shutil.copytree(GE_FIXTURE, tmp_path / "ge", ignore=shutil.ignore_patterns("*.py")))
    elif kind == "fx":
        target = _fx_dump(tmp_path / "fx")
    else:
        target = _manual_dump(tmp_path / "manual")
    before = sorted(str(path.relative_to(target)) for path in target.rglob("*"))
    assert main(["compare", "-gp", str(golden), "-mp", str(golden), "-o", str(target), "-j", "1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"llmcheck: error: {target}: is ") and "reports are never written into a dump" in error
    assert sorted(str(path.relative_to(target)) for path in target.rglob("*")) == before


def test_a_previous_report_is_replaced_with_a_notice(
    make_llmcheck_dump, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", _tensors(2))
    output = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(golden), "-o", str(output), "-j", "1"]) == 0
    assert "replacing the previous report" not in caplog.text
    assert main(["compare", "-gp", str(golden), "-mp", str(golden), "-o", str(output), "-j", "1"]) == 0
    assert (
        f"{output}: replacing the previous report (cmp_report.csv, summary.json, pairs.json, report.html)"
        in caplog.text
    )
    assert sorted(os.listdir(output)) == ["cmp_report.csv", "pairs.json", "report.html", "summary.json"]


@pytest.mark.parametrize("enabled_before", [True, False])
def test_a_compare_leaves_the_garbage_collector_as_it_found_it(
    make_llmcheck_dump, tmp_path: Path, enabled_before: bool
) -> None:
    """The compare pauses the cyclic collector for speed; a script calling it must get it back, even on failure."""
    import gc

    golden = make_llmcheck_dump(tmp_path / "g", _tensors(4))
    (gc.enable if enabled_before else gc.disable)()
    try:
        assert main(["compare", "-gp", str(golden), "-mp", str(golden), "-o", str(tmp_path / "out"), "-j", "1"]) == 0
        assert gc.isenabled() is enabled_before
        assert main(["compare", "-gp", str(golden), "-mp", str(tmp_path / "nowhere"), "-o", str(tmp_path / "o2")]) == 1
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()


def test_a_paused_function_calling_itself_gives_the_collector_back() -> None:
    """compare_dumps compares the noise twin by calling itself: the inner pause must not forget the outer state."""
    import gc

    from llmcheck.core.gc_pause import paused_cyclic_gc

    inside: list[bool] = []

    @paused_cyclic_gc()
    def nested(depth: int) -> None:
        inside.append(gc.isenabled())
        if depth:
            nested(depth - 1)

    enabled_before = gc.isenabled()
    gc.enable()
    try:
        nested(2)
        assert inside == [False, False, False] and gc.isenabled()
    finally:
        (gc.enable if enabled_before else gc.disable)()


def _children(pid: int) -> set[int]:
    """Return the pids whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


@pytest.mark.slow
def test_sigterm_stops_a_compare_and_its_worker_processes_with_one_line(make_llmcheck_dump, tmp_path: Path) -> None:
    # large enough for the measuring workers to start while the dumps load (metric_engine.PARALLEL_MIN_BYTES)
    torch.manual_seed(0)
    tensors = {f"layers.{index}.out": torch.randn(4_000_000) for index in range(6)}
    golden = make_llmcheck_dump(tmp_path / "g", tensors)
    my = make_llmcheck_dump(tmp_path / "m", {name: tensor * 1.001 for name, tensor in tensors.items()})
    command = [sys.executable, "-m", "llmcheck.core.cli", "compare", "-gp", str(golden), "-mp", str(my)]
    compare = subprocess.Popen(
        [*command, "-o", str(tmp_path / "out"), "-j", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    workers: set[int] = set()
    while compare.poll() is None and not workers:
        workers = _children(compare.pid)
    assert workers, "the compare ended before its workers started"
    compare.send_signal(signal.SIGTERM)
    _, err = compare.communicate(timeout=120)  # returns only once nothing holds its pipes: no orphan left
    assert compare.returncode == 128 + signal.SIGTERM, err
    # (a worker the signal caught while it was being spawned may add its own EOFError below the line)
    assert "llmcheck: error: terminated (SIGTERM); the processes it started were stopped first" in err.splitlines()
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if Path(f"/proc/{pid}/stat").exists()]
    assert not left, [Path(f"/proc/{pid}/cmdline").read_text() for pid in left]
