"""A dump's index and closing manifest are read strictly: a lost field or a lost count is never read as a whole dump.

The dump is a real one: a small program captured by ``llmcheck dump --exec``; each test
damages a copy of it the way a hand edit or a truncating copy would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmcheck.core.cli import main
from llmcheck.core.dumps.store import INDEX_NAME, MANIFEST_NAME, find_dumps

pytestmark = pytest.mark.slow

PROGRAM = textwrap.dedent("""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for step in range(3):
            model(torch.ones(2, 16) * step)
""")


@pytest.fixture(scope="module")
def captured_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("capture")
    (folder / "program.py").write_text(PROGRAM)
    completed = subprocess.run(
        [sys.executable, "-m", "llmcheck.core.cli", "dump", "-er", "all", "-o", "out", "--exec", "python program.py"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    (dump_path,) = find_dumps(folder / "out")
    return dump_path


def _copy(dump_path: Path, destination: Path) -> Path:
    shutil.copytree(dump_path, destination)
    return destination


def _index_lines(dump_path: Path) -> list[dict]:
    return [json.loads(line) for line in (dump_path / INDEX_NAME).read_text().splitlines()]


def _write_index(dump_path: Path, lines: list[dict]) -> None:
    (dump_path / INDEX_NAME).write_text("".join(json.dumps(line) + "\n" for line in lines))


def _compare(golden: Path, my: Path, output: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(output), "-j", "1"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("field", ["position", "io", "step", "call_index", "moment", "rank"])
def test_an_index_line_without_a_key_field_is_an_error_naming_the_line(
    captured_dump: Path, tmp_path: Path, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = _copy(captured_dump, tmp_path / "damaged")
    lines = _index_lines(damaged)
    del lines[4][field]
    _write_index(damaged, lines)
    code, stderr = _compare(captured_dump, damaged, tmp_path / "cmp", capsys)
    assert code == 1
    assert f"llmcheck: error: {damaged / INDEX_NAME}:5: object missing required field `{field}`" in stderr


def test_a_closed_manifest_without_its_record_count_is_an_error(
    captured_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = _copy(captured_dump, tmp_path / "damaged")
    lines = _index_lines(damaged)
    _write_index(damaged, lines[: len(lines) // 2])  # a copy cut short ...
    manifest = json.loads((damaged / MANIFEST_NAME).read_text())
    del manifest["records"]  # ... whose manifest no longer says how many records there were
    (damaged / MANIFEST_NAME).write_text(json.dumps(manifest))
    code, stderr = _compare(captured_dump, damaged, tmp_path / "cmp", capsys)
    assert code == 1
    assert (
        f"llmcheck: error: {damaged / MANIFEST_NAME}: field $.records: missing, though end_time says the writer "
        "closed the dump (a closing manifest always counts its records" in stderr
    )


def test_a_dump_whose_writer_did_not_close_it_still_reads_as_cut(
    captured_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    unclosed = _copy(captured_dump, tmp_path / "unclosed")
    manifest = json.loads((unclosed / MANIFEST_NAME).read_text())
    for key in ("end_time", "records", "shards", "tensor_bytes"):
        del manifest[key]
    (unclosed / MANIFEST_NAME).write_text(json.dumps(manifest))
    code, _ = _compare(captured_dump, unclosed, tmp_path / "cmp", capsys)
    assert code == 0
    assert "dump is cut short: the writer did not close the dump" in caplog.text
