"""compare names the real reason a pair is not measured, and a dump compared with itself passes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from llmcheck import DumpConfig, register_hook
from llmcheck.core.cli import main

MSPROBE_DUMP = Path(__file__).resolve().parent / "data" / "msprobe" / "msprobe_pytorch_dump"


def _statistics_only_dump(folder: Path, batch: int) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU())
    with register_hook(model, DumpConfig(dump_path=folder, statistics_only=True)) as session, torch.no_grad():
        model(torch.ones(batch, 16))
    assert session.path is not None
    return session.path


def _report_rows(output: Path) -> list[dict[str, str]]:
    with open(output / "cmp_report.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_a_shape_mismatch_in_statistics_only_dumps_is_named_as_one(tmp_path: Path) -> None:
    golden = _statistics_only_dump(tmp_path / "golden", batch=4)
    my = _statistics_only_dump(tmp_path / "my", batch=5)
    code = main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "cmp")])
    rows = _report_rows(tmp_path / "cmp")
    assert code == 3
    root_output = next(row for row in rows if row["name"] == "root" and row["io"] == "output")
    assert root_output["verdict"] == "error"
    assert root_output["cmp_fail_reason"] == "shape mismatch: golden [4, 8] vs my [5, 8]"
    assert not any("no tensor data" in row["cmp_fail_reason"] for row in rows)


def test_the_msprobe_fixture_compared_with_itself_passes_with_a_notice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    code = main(["compare", "-gp", str(MSPROBE_DUMP), "-mp", str(MSPROBE_DUMP), "-o", str(tmp_path / "cmp")])
    rows = _report_rows(tmp_path / "cmp")
    assert code == 0
    assert len(rows) == 39 and {row["verdict"] for row in rows} == {"pass"}
    unmeasured = [row for row in rows if row["cmp_fail_reason"].startswith("the same record of the same dump")]
    assert len(unmeasured) == 6  # bool masks: msprobe keeps no statistic to compare
    (empty,) = [row for row in rows if row["cmp_fail_reason"].startswith("both tensors are empty")]
    assert empty["cmp_fail_reason"] == "both tensors are empty (shape [0]): nothing to compare"
    assert "golden and my-run are the same dump: every record is compared with itself" in caplog.text
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert summary["counts"]["errors"] == 0


def test_two_different_dumps_get_no_same_dump_notice(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    golden = _statistics_only_dump(tmp_path / "golden", batch=4)
    my = _statistics_only_dump(tmp_path / "my", batch=4)
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "cmp")]) == 0
    assert "the same dump" not in caplog.text
