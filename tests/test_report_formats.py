"""The exact text of cmp_report.csv, pairs.json and report.html's table: the cells a user reads, as written plainly.

The reports write ~10**5 rows without calling ``csv.writer`` or ``json.dumps`` per row (see
``plugins/reports/csv_table.py`` and ``core/pairing/merge.py``); these tests pin what that must
keep: Python's ``repr`` of each float, ``nan``/``inf`` as words, empty cells for what is
unknown, ``torch.<dtype>`` names, formula-looking text defused with ``'``, csv's quoting,
and pairs.json's one-``json.dumps``-per-line layout.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmcheck.core.cli import main
from llmcheck.core.compare import compare_dumps
from llmcheck.core.judging.result import CompareResult
from llmcheck.core.pairing.merge import Pairing, Unmatched, key_json_text, key_to_json, write_pairs_json
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import (
    ALL_RANKS,
    ComparisonRow,
    MetricResult,
    MetricSpec,
    Pair,
    PairPriority,
    RecordKey,
    TensorStats,
    error_measure,
)
from llmcheck.core.reporting.depth_profile import depth_points, placement, row_error
from llmcheck.core.reporting.report import json_safe
from llmcheck.plugin_api import describe
from llmcheck.plugins.reports import csv_table as csv_module
from llmcheck.plugins.reports import html_page
from llmcheck.plugins.reports.csv_table import (
    _FIXED_METRICS,
    _NO_STATS,
    _NUMBER_COLUMNS,
    _TEXT_COLUMNS,
    OWN_COLUMNS,
    SEED_COLUMNS,
    _cell,
    _number,
    csv_header,
    guard_cell,
)
from llmcheck.plugins.reports.number_texts import repr_texts
from llmcheck.testing import write_llmcheck_dump

FORMULA_NAME = "=cmd|' /C calc'!A0"


class _NoResult:
    """The deciding metric's result of a row no metric decided: every cell empty."""

    value = warn_threshold = fail_threshold = None


_NO_RESULT = _NoResult()


class RowByRowCells:
    """Builds the cells of one report row in header order, as text (numbers as csv writes them), cell by cell.

    The plain way, kept here as what ``cmp_report.csv``'s column-by-column writer must equal:
    :func:`csv_rows` gives these rows to ``csv.writer``, and the tests compare both files.
    """

    def __init__(self, header: Sequence[str]) -> None:
        self.extra_columns = tuple(header[len(SEED_COLUMNS) + len(OWN_COLUMNS) :])
        listed = {column: index for index, column in enumerate((*_TEXT_COLUMNS, *_NUMBER_COLUMNS, *self.extra_columns))}
        self._in_header_order = itemgetter(*(listed[column] for column in header))

    def row(self, row: ComparisonRow) -> tuple[str, ...]:
        """Return one report row's cells in header order, each the text csv writes for it."""
        golden, my = row.golden, row.my
        key = golden.key
        metrics = row.metrics
        sibling_growth = row.sibling_growth
        texts = [
            _cell(key.step),
            _cell(golden.attrs.get("data_id", row.index)),  # a manual mapping names it
            _cell(golden.source_path),
            _cell(golden.op_type or ""),
            guard_cell(f"torch.{golden.dtype}"),
            str(list(golden.shape)),
            _cell(my.source_path),
            _cell(my.op_type or ""),
            guard_cell(f"torch.{my.dtype}"),
            str(list(my.shape)),
            _cell(row.reason),
            _cell(key.name),
            _cell(key.step),
            _cell(key.io),
            _cell(key.position),
            _cell(key.call_index),
            _cell(my.key.name),
            _cell(row.verdict),
            _cell(row.deciding_metric or ""),
            _cell(row.judged_as),
            _cell(row.rule),
            _cell(row.attribution),
            _cell(" | ".join(row.fed_by)),
            _cell(row.structure),
            _cell(f"{describe(sibling_growth[0])}-{describe(sibling_growth[1])}") if sibling_growth else "",
            _cell(row.evidence),
        ]
        golden_stats, my_stats = row.golden_stats or _NO_STATS, row.my_stats or _NO_STATS
        deciding = metrics.get(row.deciding_metric or "") or _NO_RESULT
        numbers = [
            golden_stats.max,
            golden_stats.min,
            golden_stats.mean,
            my_stats.max,
            my_stats.min,
            my_stats.mean,
            *[None if (result := metrics.get(name)) is None else result.value for name in _FIXED_METRICS],
            deciding.value,
            deciding.warn_threshold,
            deciding.fail_threshold,
            golden_stats.nan_count,
            golden_stats.inf_count,
            my_stats.nan_count,
            my_stats.inf_count,
            row.nonfinite_mismatch,
            row.error,
            row.feeder_error,
            row.growth,
            row.expected_error,
            row.noise_error,
            *[None if (result := metrics.get(name)) is None else result.value for name in self.extra_columns],
        ]
        texts += map(_number, numbers)
        return self._in_header_order(texts)


def csv_rows(result: CompareResult, header: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """Yield each report row's cells in ``header`` order (a header from :func:`csv_header`)."""
    return map(RowByRowCells(header).row, result.rows)


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


def test_pairs_json_written_block_by_block_is_the_file_written_in_one_block(
    mixed_dumps: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode dump's 10**5 pairs are written a block at a time: blocks of 2 and 3 entries give the same bytes."""
    from llmcheck.core.pairing import merge as pairing

    golden, my = (get_plugins().load_tensors(path) for path in mixed_dumps)
    result = compare_dumps(golden, my, workers=1)
    texts = []
    for block in (1 << 20, 3, 2, 1):
        monkeypatch.setattr(pairing, "_ENTRIES_PER_WRITE", block)
        pairing.write_pairs_json(tmp_path / f"pairs_{block}.json", result.pairing, result.golden, result.my)
        texts.append((tmp_path / f"pairs_{block}.json").read_bytes())
    assert len(result.pairing.pairs) > 3 and texts[1:] == texts[:1] * 3
    document = json.loads(texts[0])
    assert len(document["pairs"]) == len(result.pairing.pairs) and document["unmatched_my"] == []


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


def _repr_cell(value: object) -> str:
    return "" if value is None else repr(value)


def _doubles_of_every_kind(count: int) -> dict[str, list[float]]:
    """Doubles a report may hold: any bit pattern, float32 values, every magnitude, the edges of each layout."""
    rng = np.random.default_rng(17)
    bits = rng.integers(0, 2**64, size=count, dtype=np.uint64)
    any_bits = bits.view(np.float64)
    with np.errstate(all="ignore"):  # NaN, infinities and overflows are left out below
        float32 = bits.astype(np.uint32).view(np.float32).astype(np.float64)
        magnitudes = rng.uniform(1, 10, count) * 10.0 ** rng.integers(-324, 309, count)
    edges = [2.0**k for k in range(-1074, 1024)] + [10.0**k for k in range(-323, 309)] + [1e-5, 1e-4, 1e16, 5e-324]
    edges += [math.nextafter(x, direction) for x in edges for direction in (0.0, math.inf)]
    return {
        "any bit pattern": any_bits[np.isfinite(any_bits)].tolist(),
        "float32 values": float32[np.isfinite(float32)].tolist(),
        "every magnitude": magnitudes[np.isfinite(magnitudes)].tolist(),
        "around 1e-5, where the layouts differ": (rng.normal(size=count) * 3e-5).tolist(),
        "edges of each layout, negated too": [*edges, *(-x for x in edges), 0.0, -0.0],
    }


@pytest.mark.parametrize("kind", list(_doubles_of_every_kind(1)))
def test_number_texts_are_what_repr_writes_for_doubles_of_every_kind(kind: str) -> None:
    values = _doubles_of_every_kind(100_000)[kind]
    assert repr_texts([values], str) == [[repr(value) for value in values]]


def test_number_texts_of_none_nan_infinities_ints_bools_and_other_types() -> None:
    columns = [
        [1.5, None, math.nan, -math.inf, math.inf, -0.0, 2.5e-7, 1.25e-5],  # nulls written one by one
        [None, None],
        [],
        [0, -3, 2**70, None],  # ints of any size
        [True, 1.0, None],  # a bool: repr of the list
        [np.float32(1.5), "x", 2.0],  # other types: written by ``other``
        [1e300, 1e300, 1e-300],  # a sum overflowing to infinity
    ]
    texts = repr_texts(columns, lambda value: f"<{value}>")
    assert texts[:5] == [[_repr_cell(value) for value in column] for column in columns[:5]]
    assert texts[5] == ["<1.5>", "<x>", "<2.0>"]
    assert texts[6] == ["1e+300", "1e+300", "1e-300"]


AWKWARD_NAMES = [
    "=1+2",
    "-2",
    "+cmd|' /C calc'!A0",
    "@SUM(A1)",
    "a, b",
    'say "hi"',
    "two\nlines",
    "\uff1dx",
    "\tx",
    "</script>\u2028",
]


def with_awkward_rows(result: CompareResult) -> CompareResult:
    """Return ``result`` with rows holding NaN, infinities, None, negative zero, formula-like and quoted names."""
    nan, inf = math.nan, math.inf
    row = result.rows[0]
    extra = []
    for index, name in enumerate(AWKWARD_NAMES):
        golden_record = row.golden.with_changes(
            key=RecordKey(name=name, step=index), source_path=f"{name}.bin", op_type=name or None, shape=(index, 2)
        )
        extra.append(
            dataclasses.replace(
                row,
                index=100 + index,
                golden=golden_record,
                my=row.my.with_changes(key=RecordKey(name=name, step=index), dtype="bfloat16", shape=()),
                metrics={
                    **row.metrics,
                    "cosine_similarity": MetricResult("cosine_similarity", [-0.0, nan, 1.5e-5, 1e17][index % 4]),
                    "l2norm_stat_relative_error": MetricResult("l2norm_stat_relative_error", -inf),
                },
                golden_stats=TensorStats(min=-0.0, max=inf, mean=-1.25e-5, nan_count=3, inf_count=None),
                my_stats=None,
                reason=name,
                fed_by=(name, "model.embed"),
                error=[None, -0.0, nan, -inf][index % 4],
                growth=[inf, 2.5e-7, None, 0][index % 4],
                sibling_growth=[(-0.0, nan), (1.5e-5, 2.0), None, (-inf, 1e20)][index % 4],
                evidence=name,
                structure=name if index % 2 else "",
            )
        )
    return dataclasses.replace(result, rows=[*result.rows, *extra])


def test_csv_written_column_by_column_is_what_csv_writer_writes_row_by_row(
    mixed_dumps: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN, infinities, None, negative zero, formula-like and quoted text: the fast path's bytes are the general path's."""
    golden, my = (get_plugins().load_tensors(path) for path in mixed_dumps)
    result = with_awkward_rows(compare_dumps(golden, my, workers=1))
    monkeypatch.setattr(csv_module, "_ROWS_PER_BLOCK", 4)  # blocks of all kinds of rows, a short last one
    csv_module.write_csv(result, tmp_path / "cmp_report.csv")
    expected = io.StringIO(newline="")
    writer = csv.writer(expected)
    header = csv_header(result)
    writer.writerow(header)
    writer.writerows(csv_rows(result, header))
    written = (tmp_path / "cmp_report.csv").read_bytes().decode("utf-8")
    assert written == expected.getvalue()
    added = list(csv.DictReader(io.StringIO(written, newline="")))[-len(AWKWARD_NAMES) :]
    assert [cells["name"] for cells in added] == [
        "'=1+2",
        "-2",  # a number: left as it is
        "'+cmd|' /C calc'!A0",
        "'@SUM(A1)",
        "a, b",
        'say "hi"',
        "two\nlines",
        "'\uff1dx",
        "'\tx",
        "</script>\u2028",
    ]
    assert [cells["cosine_similarity"] for cells in added[:4]] == ["-0.0", "nan", "1.5e-05", "1e+17"]
    assert [cells["error"] for cells in added[:4]] == ["", "-0.0", "nan", "-inf"]
    assert [cells["sibling_growth"] for cells in added[:4]] == ["'-0-nan", "1.5e-05-2", "", "'-inf-1e+20"]


def page_row(row: ComparisonRow, metric_names: list[str], measure: MetricSpec | None) -> dict[str, Any]:
    """One row of report.html's table, field by field: what the page's script reads (non-finite numbers as words)."""
    results = [row.metrics.get(name) for name in metric_names]
    return json_safe(
        {
            "id": row.index,
            "name": row.golden.key.name,
            "call": row.golden.key.call_index,
            "step": row.golden.key.step,
            "io": row.golden.key.io,
            "pos": row.golden.key.position,
            "mn": row.my.key.name,
            "op": row.golden.op_type,
            "gd": row.golden.dtype,
            "md": row.my.dtype,
            "shape": str(list(row.golden.shape)),
            "v": row.verdict,
            "d": row.deciding_metric,
            "a": row.attribution,
            "rule": row.rule,
            "why": row.reason,
            "fb": list(row.fed_by),
            "ja": row.judged_as,
            "m": [None if result is None else result.value for result in results],
            "wt": [None if result is None else result.warn_threshold for result in results],
            "ft": [None if result is None else result.fail_threshold for result in results],
            "mv": [None if result is None or result.fail_threshold is None else result.verdict for result in results],
            "cmp": [None if result is None else result.comparison for result in results],
            "e": row_error(row, measure),
            "fe": row.feeder_error,
            "g": row.growth,
            "x": row.expected_error,
            "ne": row.noise_error,
            "st": row.structure or placement(row).structure,
            "sg": list(row.sibling_growth) if row.sibling_growth else None,
            "sc": row.sibling_count,
            "ev": row.evidence,
        }
    )


def test_page_rows_built_column_by_column_are_the_rows_built_field_by_field(
    mixed_dumps: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN, infinities, None, negative zero, formula-like and script-closing text: the page holds the same bytes."""
    golden, my = (get_plugins().load_tensors(path) for path in mixed_dumps)
    result = with_awkward_rows(compare_dumps(golden, my, workers=1))
    monkeypatch.setattr(html_page, "_ROWS_PER_PART", 4)  # blocks of all kinds of rows, a short last one
    data = html_page.report_data(result)
    metric_names = [metric["name"] for metric in data["metrics"]]
    measure = error_measure(result.metric_specs)
    rows = sorted(result.rows, key=lambda row: row.golden.order)
    expected = [page_row(row, metric_names, measure) for row in rows]
    assert data["rows"] == expected
    page = html_page.render_html(result)
    encoded_rows = msgspec.json.encode(expected)
    assert html_page._script_safe(encoded_rows) in page
    assert b"<\\/script>\\u2028" in page and b"</script>\xe2\x80\xa8" not in page
    awkward = {row["name"]: row for row in data["rows"]}
    assert awkward["=1+2"]["m"][0] == -0.0 and math.copysign(1, awkward["=1+2"]["m"][0]) == -1
    assert (awkward["-2"]["m"][0], awkward["-2"]["e"], awkward["-2"]["sg"]) == ("nan", -0.0, [1.5e-05, 2.0])
    assert (awkward["=1+2"]["g"], awkward["=1+2"]["sg"]) == ("inf", [-0.0, "nan"])


def test_junit_written_case_by_case_is_what_element_tree_writes_for_the_whole_document(
    mixed_dumps: tuple[Path, Path], tmp_path: Path
) -> None:
    """Quotes, ampersands, tabs, line breaks and characters XML cannot hold, in passing, warned, failing and error cases."""
    from xml.etree import ElementTree

    from llmcheck.plugins.reports.junit_xml import junit_document, write_junit

    golden, my = (get_plugins().load_tensors(path) for path in mixed_dumps)
    result = with_awkward_rows(compare_dumps(golden, my, workers=1))
    awkward = [row for row in result.rows if row.index >= 100]
    rows = [row for row in result.rows if row.index < 100]
    for index, row in enumerate(awkward * 2):  # each awkward name in a passing case and in one with a child
        rows.append(
            dataclasses.replace(
                row,
                index=200 + index,
                golden=row.golden.with_changes(key=RecordKey(name=f"{row.golden.key.name} &<\x01>", step=index)),
                verdict="pass" if index < len(awkward) else ("warn", "fail", "error")[index % 3],
            )
        )
    result = dataclasses.replace(result, rows=rows)
    write_junit(result, tmp_path / "junit.xml")
    document = junit_document(result)
    ElementTree.indent(document)
    expected = '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(document, encoding="unicode") + "\n"
    assert (tmp_path / "junit.xml").read_text(encoding="utf-8") == expected
    assert {case.get("classname") for case in document.iter("testcase")} >= {
        "two\nlines &<\ufffd>",
        'say "hi" &<\ufffd>',
    }
    assert sum(1 for _ in document.iter("failure")) >= 2 and sum(1 for _ in document.iter("error")) >= 2


#: Texts of any characters, and texts of those ElementTree escapes or XML cannot hold.
_ATTRIBUTE_TEXTS = st.one_of(st.text(), st.text(alphabet="ab .&<>\"'\r\n\t\x00\x01\x0b\x1f\ufffe\uffff\u2028\u00e9"))


@settings(max_examples=300, deadline=None)
@given(st.lists(_ATTRIBUTE_TEXTS, max_size=8))
def test_junit_attribute_values_of_a_column_are_element_tree_s_value_by_value(texts: list[str]) -> None:
    """Any text, escapes and characters XML cannot hold among them: a column's values are what ElementTree writes."""
    from xml.etree import ElementTree

    from llmcheck.plugins.reports.junit_xml import _attribute_values, _text

    def written_by_element_tree(text: str) -> str:
        serialized = ElementTree.tostring(ElementTree.Element("a", v=_text(text)), encoding="unicode")
        return serialized[len('<a v="') : -len('" />')]

    assert _attribute_values(texts) == [written_by_element_tree(text) for text in texts]


def test_the_depth_charts_op_points_are_labelled_by_module_and_op_not_by_overload(tmp_path: Path) -> None:
    # an op-level dump's op names end in their overload: labelled by the last dotted part, the
    # axis of an op-level statistics compare read "default, Tensor, Tensor_Scalar, dim, ..."
    tensors = {
        "model.embed_tokens/aten.embedding.default": torch.ones(4),
        "model.norm/aten.pow.Tensor_Scalar": torch.ones(4),
        "lm_head/aten.mm.default": torch.ones(4),
        "model.norm": torch.ones(4),
    }
    golden = get_plugins().load_tensors(write_llmcheck_dump(tmp_path / "g", tensors))
    my = get_plugins().load_tensors(write_llmcheck_dump(tmp_path / "m", tensors))
    result = compare_dumps(golden, my, workers=1)
    labels = [point["label"] for point in depth_points(result.rows, 0, error_measure(result.metric_specs))]
    assert labels == ["embed_tokens/embedding", "norm/pow", "lm_head/mm", "norm"]
