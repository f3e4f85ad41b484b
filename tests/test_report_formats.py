"""The exact text of cmp_report.csv and pairs.json: the cells a user reads, as the csv and json modules write them.

The reports write ~10**5 rows without calling ``csv.writer`` or ``json.dumps`` per row (see
``plugins/reports/csv_table.py`` and ``core/pairing.py``); these tests pin what that must
keep: Python's ``repr`` of each float, ``nan``/``inf`` as words, empty cells for what is
unknown, ``torch.<dtype>`` names, formula-looking text defused with ``'``, csv's quoting,
and pairs.json's one-``json.dumps``-per-line layout.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.compare import compare_dumps
from llmcheck.core.pairing import Pairing, Unmatched, key_json_text, key_to_json, write_pairs_json
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import ALL_RANKS, Pair, PairPriority, RecordKey
from llmcheck.plugins.reports.csv_table import csv_header, csv_rows
from llmcheck.testing import write_llmcheck_dump

FORMULA_NAME = "=cmd|' /C calc'!A0"


@pytest.fixture(scope="module")
def mixed_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs giving every kind of row: pass, fail, error, NaN/Inf, statistics only, a formula name, unmatched."""
    folder = tmp_path_factory.mktemp("mixed")
    nan, inf = math.nan, math.inf
    golden = write_llmcheck_dump(
        folder / "golden",
        {
            "model.embed": torch.tensor([0.5, -1.25, 2.0, 4.0]),
            FORMULA_NAME: torch.tensor([1.0, 2.0, 3.0]),
            "model.layers.0.mlp": torch.tensor([1.0, 2.0, 3.0, 4.0]),
            "model.layers.1.mlp": torch.tensor([1.0, nan, inf, 2.0]),
            "model.norm": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
            "model.stats": torch.tensor([1.0, 2.0, 3.0, 4.0]),
            "lm_head": torch.tensor([1.0, 2.0, 3.0]),
            "only.golden": torch.tensor([1.0]),
        },
        statistics_only={"model.stats"},
    )
    my = write_llmcheck_dump(
        folder / "my",
        {
            "model.embed": torch.tensor([0.5, -1.25, 2.0, 4.0]),
            FORMULA_NAME: torch.tensor([1.0, 2.0, 3.0]),
            "model.layers.0.mlp": torch.tensor([1.0, 2.0, 3.0, 5.0]),
            "model.layers.1.mlp": torch.tensor([1.0, inf, nan, 2.0]),  # NaN and Inf swapped
            "model.norm": torch.tensor([1.0, 2.0, 3.0, 4.0]),  # shape [4] against [2, 2]
            "model.stats": torch.tensor([1.0, 2.0, 3.0, 4.5]),
            "lm_head": torch.tensor([1.0, 2.0, 3.0]).to(torch.bfloat16),
        },
        statistics_only={"model.stats"},
    )
    return golden, my


@pytest.fixture(scope="module")
def mixed_report(mixed_dumps: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    golden, my = mixed_dumps
    out = tmp_path_factory.mktemp("report")
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1"]) == 3
    return out


def csv_table(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "cmp_report.csv", newline="", encoding="utf-8") as handle:
        return {row["name"]: row for row in csv.DictReader(handle)}


def test_csv_cells_of_each_kind_of_row_are_the_texts_a_user_reads(mixed_report: Path) -> None:
    rows = csv_table(mixed_report)
    assert list(rows) == [
        "model.embed",
        "'" + FORMULA_NAME,  # a spreadsheet would run it: defused
        "model.layers.0.mlp",
        "model.layers.1.mlp",
        "model.norm",
        "model.stats",
        "lm_head",
    ]
    embed = rows["model.embed"]
    # floats as Python's repr, a negative number left as it is, an identical pair's sqnr infinite
    assert (embed["golden_max_value"], embed["golden_min_value"], embed["golden_mean_value"]) == (
        "4.0",
        "-1.25",
        "1.3125",
    )
    assert (embed["verdict"], embed["cosine_similarity"], embed["sqnr"], embed["warn_threshold"]) == (
        "pass",
        "1.0",
        "inf",
        "0.9999999",
    )
    assert (embed["golden_dtype"], embed["golden_shape"], embed["data_id"], embed["token_id"]) == (
        "torch.float32",
        "[4]",
        "0",
        "0",
    )
    assert embed["feeder_error"] == embed["expected_error"] == embed["evidence"] == ""
    assert rows["'" + FORMULA_NAME]["my_name"] == "'" + FORMULA_NAME
    assert rows["'" + FORMULA_NAME]["fed_by"] == "model.embed step 0 output.0"

    failing = rows["model.layers.0.mlp"]
    assert (failing["verdict"], failing["deciding_metric"], failing["deciding_value"], failing["fail_threshold"]) == (
        "fail",
        "cosine_similarity",
        "0.9939990885479664",
        "0.999999",
    )
    assert (failing["attribution"], failing["fed_by"], failing["growth"]) == (
        "introduced",
        "'" + FORMULA_NAME + " step 0 output.0",  # text starting like a formula, wherever it is
        "inf",
    )
    assert (failing["structure"], failing["sibling_growth"]) == ("model.layers.{i}.mlp", "0-0")

    nonfinite = rows["model.layers.1.mlp"]
    assert [nonfinite[f"{side}_{kind}_count"] for side in ("golden", "my") for kind in ("nan", "inf")] == ["1"] * 4
    assert (nonfinite["nonfinite_mismatch"], nonfinite["deciding_metric"], nonfinite["deciding_value"]) == (
        "2",
        "nonfinite_mismatch",
        "2.0",
    )
    assert nonfinite["golden_max_value"] == "2.0"  # the statistics are over the finite elements
    assert nonfinite["cmp_fail_reason"].startswith("2 positions are NaN/Inf on one side only")

    mismatch = rows["model.norm"]
    assert (mismatch["verdict"], mismatch["golden_shape"], mismatch["my_shape"]) == ("error", "[2, 2]", "[4]")
    assert mismatch["cmp_fail_reason"] == "shape mismatch: golden [2, 2] vs my [4]"
    assert mismatch["cosine_similarity"] == mismatch["deciding_value"] == mismatch["deciding_metric"] == ""

    statistics = rows["model.stats"]
    assert statistics["golden_data_path"].endswith("index.jsonl:model.stats")
    assert statistics["cosine_similarity"] == statistics["rmse"] == ""
    assert (statistics["deciding_metric"], statistics["l2norm_stat_relative_error"]) == (
        "l2norm_stat_relative_error",
        "0.06848802832164047",
    )
    assert (statistics["max_stat_absolute_error"], statistics["mean_stat_relative_error"]) == ("0.5", "0.05")
    assert embed["l2norm_stat_relative_error"] == ""  # a measured pair has no statistics columns

    head = rows["lm_head"]
    assert (head["golden_dtype"], head["my_dtype"], head["judged_as"]) == ("torch.float32", "torch.bfloat16", "bf16")
    assert (head["warn_threshold"], head["fail_threshold"]) == ("0.9999", "0.995")


def test_csv_file_is_what_csv_writer_writes_for_those_cells(mixed_report: Path, mixed_dumps: tuple[Path, Path]) -> None:
    text = (mixed_report / "cmp_report.csv").read_bytes().decode("utf-8")
    lines = text.split("\r\n")
    assert lines[-1] == "" and all("\n" not in line for line in lines[:-1])  # csv's CRLF line ends, nothing else
    mismatch = next(line for line in lines if ",model.norm," in line)
    assert ',"[2, 2]",' in mismatch and ',"shape mismatch: golden [2, 2] vs my [4]",' in mismatch
    golden, my = (get_plugins().load_tensors(path) for path in mixed_dumps)
    result = compare_dumps(golden, my, workers=1)
    expected = io.StringIO(newline="")
    writer = csv.writer(expected)
    header = csv_header(result)
    writer.writerow(header)
    writer.writerows(csv_rows(result, header))
    assert text == expected.getvalue()


def test_pairs_json_lists_one_json_dumps_entry_per_line(mixed_report: Path) -> None:
    text = (mixed_report / "pairs.json").read_text(encoding="utf-8")
    document = json.loads(text)
    assert [item["name"] for item in document["unmatched_golden"]] == ["only.golden"]
    assert document["unmatched_my"] == []
    lines = text.splitlines()
    first_pair = lines[lines.index(' "pairs": [') + 1]
    assert first_pair == (
        '  {"golden": {"name": "model.embed", "io": "output", "position": "0", "step": 0, "call_index": 0, '
        '"moment": "after"}, "my": {"name": "model.embed", "io": "output", "position": "0", "step": 0, '
        '"call_index": 0, "moment": "after"}, "rule": "exact_key", "priority": 20},'
    )
    assert lines[lines.index(' "unmatched_golden": [') + 1] == (
        '  {"name": "only.golden", "io": "output", "position": "0", "step": 0, "call_index": 0, "moment": "after", '
        '"note": "no pairing rule found a counterpart"}'
    )
    assert lines[-2:] == [' "unmatched_my": []', "}"]


@pytest.mark.parametrize(
    "key",
    [
        RecordKey(name="model.layers.0.mlp"),
        RecordKey(name='a "quoted" \\ name\twith\ncontrol', io="input", position="1.0", step=7, call_index=2),
        RecordKey(name="模型.层.0 — ünïcode", moment="before"),
        RecordKey(name="sharded", rank=3),
        RecordKey(name="gathered", rank=ALL_RANKS),
    ],
)
def test_a_record_key_is_written_as_json_dumps_writes_it(key: RecordKey) -> None:
    assert key_json_text(key) == json.dumps(key_to_json(key))


def test_notes_derived_pairs_and_expected_records_are_written_as_json_dumps_writes_them(
    mixed_dumps: tuple[Path, Path], tmp_path: Path
) -> None:
    golden, my = (get_plugins().load_tensors(path) for path in mixed_dumps)
    gathered = my.records[1].with_changes(key=RecordKey(name=my.records[1].key.name, rank=ALL_RANKS))
    pairing = Pairing(
        pairs=[
            Pair(golden.records[0], my.records[0], "user_mapping", PairPriority.USER_MAPPING, note="renamed: ë \u2028"),
            Pair(golden.records[1], gathered, "tp_unshard(sum)", 50),  # built by a rule, not read: derived
        ],
        unmatched_golden=[Unmatched(golden.records[2], "a Cast the compiler inserted", expected=True)],
        unmatched_my=[Unmatched(my.records[3])],
    )
    path = tmp_path / "pairs.json"
    write_pairs_json(path, pairing, golden, my)
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(' "pairs": [')
    assert lines[start + 1 : start + 3] == [
        "  "
        + json.dumps(
            {
                "golden": key_to_json(golden.records[0].key),
                "my": key_to_json(my.records[0].key),
                "rule": "user_mapping",
                "priority": 100,
                "note": "renamed: ë \u2028",
            }
        )
        + ",",
        "  "
        + json.dumps(
            {
                "golden": key_to_json(golden.records[1].key),
                "my": key_to_json(gathered.key),
                "rule": "tp_unshard(sum)",
                "priority": 50,
                "derived": True,
            }
        ),
    ]
    unmatched = {**key_to_json(golden.records[2].key), "note": "a Cast the compiler inserted", "expected": True}
    assert lines[lines.index(' "unmatched_golden": [') + 1] == "  " + json.dumps(unmatched)
    assert (
        json.loads(path.read_text(encoding="utf-8"))["unmatched_my"][0]["note"] == "no pairing rule found a counterpart"
    )
