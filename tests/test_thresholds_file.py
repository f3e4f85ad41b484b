"""``compare --thresholds FILE``: every bad file is one usage error naming it, an entry that applies to nothing a warning."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.compare import compare_dumps
from llmcheck.core.judging.verdicts import ThresholdOverride, warn_unmatched_overrides
from llmcheck.core.plugins import get_plugins

torch.set_num_threads(1)

REFUSED = 2  # a usage error, as for every other bad argument


@pytest.fixture
def runs(make_llmcheck_dump, tmp_path: Path) -> tuple[Path, Path]:
    """Return a golden and a my dump of two float32 records, the my-run 0.1 % off."""
    golden = make_llmcheck_dump(tmp_path / "g", {"attn.out": torch.ones(8), "mlp.out": torch.ones(8)})
    my = make_llmcheck_dump(tmp_path / "m", {"attn.out": torch.ones(8) * 1.001, "mlp.out": torch.ones(8) * 1.001})
    return golden, my


def _compare(runs: tuple[Path, Path], thresholds: Path, *options: str) -> int:
    golden, my = runs
    out = thresholds.parent / "out"
    return main(
        ["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "--thresholds", str(thresholds), *options]
    )


GOOD_ENTRY = '{"pattern": "*", "metric": "relative_euclidean_distance", "warn": 0.01, "fail": 0.1}'


@pytest.mark.parametrize(
    ("file_name", "text", "got"),
    [
        ("nan.json", '[GOOD, {"metric": "cosine_similarity", "warn": NaN, "fail": NaN}]', "got warn nan, fail nan"),
        ("inf.json", '[GOOD, {"metric": "rmse", "warn": 0.1, "fail": Infinity}]', "got warn 0.1, fail inf"),
        ("nan.yaml", "- GOOD\n- {metric: relative_euclidean_distance, warn: .nan, fail: .nan}\n", "got warn nan"),
        ("text.json", '[GOOD, {"metric": "rmse", "warn": "small", "fail": 0.2}]', "got warn 'small', fail 0.2"),
        ("yes.yaml", "- GOOD\n- {metric: rmse, warn: yes, fail: 0.2}\n", "got warn True, fail 0.2"),
    ],
)
def test_a_nan_infinite_or_non_number_threshold_is_a_usage_error_naming_the_file_and_entry(
    runs, tmp_path: Path, capsys: pytest.CaptureFixture[str], file_name: str, text: str, got: str
) -> None:
    # NaN compares false with everything: accepted, it would pass every value of the metric without a word.
    thresholds = tmp_path / file_name
    thresholds.write_text(text.replace("GOOD", GOOD_ENTRY))
    assert _compare(runs, thresholds) == REFUSED
    err = capsys.readouterr().err
    assert err.startswith(f"llmcheck: error: {thresholds}: entry 2: warn and fail must be finite numbers (")
    assert got in err and err.count("\n") == 1
    assert not (tmp_path / "out" / "summary.json").exists()


def test_a_metric_that_metric_leaves_out_is_named_as_registered_but_not_selected(
    runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(json.dumps([{"pattern": "*", "metric": "rmse", "warn": 0.1, "fail": 0.2}]))
    assert _compare(runs, thresholds, "--metric", "relative_euclidean_distance") == REFUSED
    assert capsys.readouterr().err == (
        f"llmcheck: error: {thresholds}: entry 1 sets thresholds for 'rmse', a registered metric that --metric "
        "does not select (add rmse to --metric to judge it, or remove the entry)\n"
    )
    # Selected, the same file is taken.
    assert _compare(runs, thresholds, "--metric", "relative_euclidean_distance", "rmse") == 3


def test_a_misspelt_metric_is_unknown_with_the_closest_registered_name(
    runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(json.dumps([{"metric": "cosine_similarty", "warn": 0.99, "fail": 0.9}]))
    assert _compare(runs, thresholds) == REFUSED
    err = capsys.readouterr().err
    assert err.startswith(
        f"llmcheck: error: {thresholds}: entry 1 names unknown metric 'cosine_similarty' "
        "(did you mean cosine_similarity?) (registered metrics: "
    )
    assert all(name in err for name in get_plugins().metrics())


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"pattern": None, "metric": "rmse", "warn": 0.1, "fail": 0.2}, "entry 1: pattern must be a non-empty"),
        ({"pattern": "", "metric": "rmse", "warn": 0.1, "fail": 0.2}, "entry 1: pattern must be a non-empty"),
        ({"metric": ["rmse"], "warn": 0.1, "fail": 0.2}, "entry 1 names unknown metric ['rmse']"),
        ({"metric": "rmse", "dtype": ["fp32"], "warn": 0.1, "fail": 0.2}, "entry 1 names unknown dtype class"),
    ],
)
def test_an_entry_of_the_wrong_type_is_a_usage_error_not_a_traceback_or_a_pattern_matching_nothing(
    runs, tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: dict[str, object], message: str
) -> None:
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(json.dumps([entry]))
    assert _compare(runs, thresholds) == REFUSED
    assert capsys.readouterr().err.startswith(f"llmcheck: error: {thresholds}: {message}")


@pytest.mark.parametrize(
    ("file_name", "text", "message"),
    [
        ("empty.json", "", "the file is empty"),
        ("blank.json", "\n  \n", "the file is empty"),
        ("empty.yaml", "", "the file is empty"),
        ("comments.yaml", "# nothing yet\n", "the file is empty"),
        ("broken.json", '[{"metric": "rmse",', "not valid JSON"),
        ("broken.yaml", "- {metric: rmse\n", "not valid YAML"),
        ("object.json", '{"metric": "rmse", "warn": 0.1, "fail": 0.2}', "a thresholds file is a list of"),
    ],
)
def test_an_empty_or_unparsable_thresholds_file_is_a_usage_error_like_every_bad_entry(
    runs, tmp_path: Path, capsys: pytest.CaptureFixture[str], file_name: str, text: str, message: str
) -> None:
    # A zero-byte file is most often a generator that failed: falling back to the default table would hide that.
    thresholds = tmp_path / file_name
    thresholds.write_text(text)
    assert _compare(runs, thresholds) == REFUSED
    err = capsys.readouterr().err
    assert err.startswith(f"llmcheck: error: {thresholds}: {message}") and err.count("\n") == 1


def test_an_explicit_empty_list_is_no_overrides(runs, tmp_path: Path) -> None:
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text("[]")
    # 1e-3 off fails the fp32 table, as without --thresholds.
    assert _compare(runs, thresholds) == 3


def test_an_entry_that_applies_to_no_pair_is_a_warning_naming_the_file_and_entry(
    runs, caplog: pytest.LogCaptureFixture
) -> None:
    golden, my = runs
    result = compare_dumps(get_plugins().load_tensors(golden), get_plugins().load_tensors(my), workers=1)
    thresholds = Path("thresholds.yaml")
    overrides = [
        ThresholdOverride("attn.*", "relative_euclidean_distance", 0.01, 0.1),  # applies
        ThresholdOverride("atn.out", "relative_euclidean_distance", 0.01, 0.1),  # a typo
        ThresholdOverride("mlp", "cosine_similarity", 0.99, 0.9),  # the glob covers the whole name
        ThresholdOverride("mlp.*", "relative_euclidean_distance", 0.01, 0.1, dtype_class="bf16"),  # an fp32 run
    ]
    with caplog.at_level(logging.WARNING, logger="llmcheck"):
        idle = warn_unmatched_overrides(thresholds, overrides, result.rows)
    assert idle == [
        "entry 2 'atn.out' for relative_euclidean_distance "
        "(no compared record has a name like it; closest name: 'attn.out')",
        "entry 3 'mlp' for cosine_similarity (no compared record has a name like it)",
        "entry 4 'mlp.*' for relative_euclidean_distance (the records it names are judged as fp32, not bf16)",
    ]
    assert caplog.messages == [
        f"{thresholds}: 3 of the 4 entries apply to no compared pair: {'; '.join(idle)}; "
        "a pattern is a glob over the whole golden name"
    ]
    caplog.clear()
    assert warn_unmatched_overrides(thresholds, overrides[:1], result.rows) == [] and not caplog.messages


def test_compare_warns_of_a_thresholds_pattern_that_matches_no_record(
    runs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(
        json.dumps([{"pattern": "atn.*", "metric": "relative_euclidean_distance", "warn": 1, "fail": 2}])
    )
    assert _compare(runs, thresholds) == 3
    assert (
        f"{thresholds}: 1 of the 1 entries apply to no compared pair: entry 1 'atn.*' for relative_euclidean_distance "
        "(no compared record has a name like it"
    ) in caplog.text


def test_summary_lists_the_threshold_overrides_in_effect_beside_the_default_table(runs, tmp_path: Path) -> None:
    entries = [
        {"pattern": "attn.*", "metric": "relative_euclidean_distance", "dtype": "fp32", "warn": 0.01, "fail": 0.1}
    ]
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(json.dumps(entries))
    assert _compare(runs, thresholds) == 3  # mlp.out still fails the table
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["threshold_overrides"] == entries
    assert summary["thresholds"]["relative_euclidean_distance"]["fp32"] != [0.01, 0.1]  # the table itself
