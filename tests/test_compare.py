"""llmcheck compare on real captured runs: first divergence, attribution, reports, pairing, errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from compare_runs import capture_run, nan_in_output, scaled_weight, wrong_rmsnorm_epsilon
from llmcheck.core.cli import main
from llmcheck.core.compare import compare_dumps
from llmcheck.core.pairing.merge import load_user_mapping
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.reports.csv_table import SEED_COLUMNS

INPUT_IDS = torch.tensor([[1, 7, 42, 9, 100, 3, 250, 18]])


def _load(path: Path):
    return get_plugins().load_tensors(path)


def _compare(golden: Path, my: Path, **options):
    return compare_dumps(_load(golden), _load(my), workers=1, **options)


@pytest.fixture
def golden_dump(tiny_llama, tmp_path: Path) -> Path:
    return capture_run(tiny_llama, INPUT_IDS, tmp_path / "golden")


def test_identical_runs_give_zero_failures_and_zero_warnings(tiny_llama, golden_dump: Path, tmp_path: Path) -> None:
    result = _compare(golden_dump, capture_run(tiny_llama, INPUT_IDS, tmp_path / "my"))
    counts = result.counts()
    assert counts["pairs"] == len(result.golden.records) > 50
    assert counts["passes"] == counts["pairs"] and counts["unmatched"] == 0
    assert result.first_divergence is None and result.first_introduced is None
    assert all(row.rule == "exact_key" for row in result.rows)


def test_compare_names_the_norm_with_the_wrong_epsilon_as_first_introduced_not_its_layer(
    tiny_llama, golden_dump: Path, tmp_path: Path
) -> None:
    with wrong_rmsnorm_epsilon(tiny_llama, "model.layers.1.post_attention_layernorm", 0.5):
        my_dump = capture_run(tiny_llama, INPUT_IDS, tmp_path / "my")
    result = _compare(golden_dump, my_dump)
    introduced = result.first_introduced
    assert introduced is not None
    assert (introduced.golden.key.name, introduced.golden.key.io) == (
        "model.layers.1.post_attention_layernorm",
        "output",
    )
    assert introduced.fed_by == ("model.layers.1.post_attention_layernorm step 0 input.0 (before)",)
    by_label = {row.golden.key.label(): row for row in result.rows}
    parent = by_label["model.layers.1 step 0 output.0"]
    assert parent.verdict == "fail" and parent.golden.order > introduced.golden.order
    downstream = by_label["model.layers.1.mlp.down_proj step 0 output.0"]
    assert downstream.attribution == "inherited"
    assert by_label["model.layers.0 step 0 output.0"].verdict == "pass"


def test_a_weight_three_percent_off_is_introduced_at_that_linear(tiny_llama, golden_dump: Path, tmp_path: Path) -> None:
    with scaled_weight(tiny_llama, "model.layers.0.self_attn.v_proj", 1.03):
        # without weight digests: the activations alone decide, as for a scale applied in code
        my_dump = capture_run(tiny_llama, INPUT_IDS, tmp_path / "my", weight_digests=False)
    result = _compare(golden_dump, my_dump)
    introduced = result.first_introduced
    assert introduced.golden.key.name == "model.layers.0.self_attn.v_proj"
    # A pure scale leaves the cosine at 1: the relative euclidean distance decides.
    assert introduced.deciding_metric == "relative_euclidean_distance"
    assert introduced.metrics["relative_euclidean_distance"].value == pytest.approx(0.03, rel=1e-3)
    assert introduced.metrics["cosine_similarity"].verdict == "pass"


def test_nan_injected_in_one_op_is_caught_at_that_op(tiny_llama, golden_dump: Path, tmp_path: Path) -> None:
    with nan_in_output(tiny_llama, "model.layers.0.mlp.act_fn", (0, 3, 17)):
        my_dump = capture_run(tiny_llama, INPUT_IDS, tmp_path / "my")
    result = _compare(golden_dump, my_dump)
    first = result.first_divergence
    assert first.index == result.first_introduced.index
    assert first.golden.key.label() == "model.layers.0.mlp.act_fn step 0 output.0"
    assert first.deciding_metric == "nonfinite_mismatch" and first.nonfinite_mismatch == 1
    assert first.my_stats.nan_count == 1 and first.golden_stats.nan_count == 0
    assert "1 positions are NaN/Inf on one side only" in first.reason
    # The other 639 elements still agree exactly: the metrics are over positions finite on both sides.
    assert first.metrics["max_absolute_error"].value == 0.0


def test_shape_mismatch_rows_stay_in_the_report_with_their_reason(make_llmcheck_dump, tmp_path: Path) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", {"a": torch.ones(2, 3), "b": torch.ones(1, 4), "c": torch.ones(5)})
    my = make_llmcheck_dump(tmp_path / "m", {"a": torch.ones(3, 2), "b": torch.ones(4), "c": torch.ones(5)})
    assert (
        main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out")]) == 3
    )  # a pair could not be measured
    with open(tmp_path / "out" / "cmp_report.csv", newline="") as handle:
        rows = {row["name"]: row for row in csv.DictReader(handle)}
    assert rows["a"]["verdict"] == "error"
    assert rows["a"]["cmp_fail_reason"] == "shape mismatch: golden [2, 3] vs my [3, 2]"
    assert rows["a"]["cosine_similarity"] == ""
    assert rows["b"]["verdict"] == "pass" and "size-1 dims" in rows["b"]["cmp_fail_reason"]
    assert rows["c"]["verdict"] == "pass"


def test_report_files_follow_the_seed_columns_and_summarise_the_divergence(
    tiny_llama, golden_dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with wrong_rmsnorm_epsilon(tiny_llama, "model.layers.0.input_layernorm", 0.5):
        my_dump = capture_run(tiny_llama, INPUT_IDS, tmp_path / "my")
    out = tmp_path / "out"
    assert (
        main(["compare", "-gp", str(golden_dump.parent), "-mp", str(my_dump), "-o", str(out)]) == 3
    )  # done, and failing pairs were found
    printed = capsys.readouterr().out
    assert "first introduced divergence: model.layers.0.input_layernorm step 0 output.0" in printed
    with open(out / "cmp_report.csv", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        body = list(reader)
    assert header[:24] == list(SEED_COLUMNS)
    assert header[24:28] == ["name", "step", "io", "position"] and "rmse" in header and "sqnr" in header
    assert len(body) == len(_load(golden_dump).records)
    first_row = dict(zip(header, body[0]))
    assert first_row["golden_dtype"] == "torch.int64" and first_row["token_id"] == "0" and first_row["data_id"] == "0"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_introduced"]["name"] == "model.layers.0.input_layernorm"
    assert summary["first_introduced"]["attribution"] == "introduced"
    first = summary["first_divergence"]
    assert first["metric"] in ("cosine_similarity", "relative_euclidean_distance")
    if first["metric"] == "cosine_similarity":
        assert first["value"] < first["threshold"] == 1 - 1e-6
    else:
        assert first["value"] > first["threshold"] == 1e-4
    counts = summary["counts"]
    assert counts["pairs"] == counts["passes"] + counts["warnings"] + counts["failures"] + counts["errors"]
    pairs = json.loads((out / "pairs.json").read_text())
    assert len(pairs["pairs"]) == counts["pairs"] and pairs["unmatched_golden"] == []


def test_csv_cells_that_look_like_formulas_are_defused(make_llmcheck_dump, tmp_path: Path) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", {'=HYPERLINK("x")': torch.ones(3), "@SUM(A1)": torch.ones(3)})
    assert main(["compare", "-gp", str(golden), "-mp", str(golden), "-o", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "cmp_report.csv", newline="") as handle:
        names = [row["name"] for row in csv.DictReader(handle)]
    assert names == ['\'=HYPERLINK("x")', "'@SUM(A1)"]


def test_mapping_file_pairs_renamed_modules_by_wildcard(make_llmcheck_dump, tmp_path: Path) -> None:
    first, second = torch.arange(6.0), torch.arange(6.0) * 2
    golden = make_llmcheck_dump(tmp_path / "g", {"model.layers.0.mlp": first, "model.layers.1.mlp": second})
    # Same shapes in the opposite order: alignment by order alone would pair them wrongly.
    my = make_llmcheck_dump(tmp_path / "m", {"decoder.blocks.1.ffn": second, "decoder.blocks.0.ffn": first})
    unmapped = _compare(golden, my)
    assert [row.rule for row in unmapped.rows] == ["sequence", "sequence"] and unmapped.counts()["failures"] == 2
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text('"model.layers.*.mlp": "decoder.blocks.*.ffn"\n')
    mapped = _compare(golden, my, user_mapping=load_user_mapping(mapping, get_plugins().mapping_rules()))
    assert [(row.golden.key.name, row.my.key.name, row.rule) for row in mapped.rows] == [
        ("model.layers.0.mlp", "decoder.blocks.0.ffn", "user_mapping"),
        ("model.layers.1.mlp", "decoder.blocks.1.ffn", "user_mapping"),
    ]
    assert mapped.counts()["failures"] == 0


def test_an_edited_pairs_json_fed_back_with_mapping_decides_the_pairs(make_llmcheck_dump, tmp_path: Path) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", {"x": torch.ones(4), "y": torch.zeros(4)})
    my = make_llmcheck_dump(tmp_path / "m", {"p": torch.zeros(4), "q": torch.ones(4)})
    out = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out)]) == 3
    document = json.loads((out / "pairs.json").read_text())
    assert [(p["golden"]["name"], p["my"]["name"], p["rule"]) for p in document["pairs"]] == [
        ("x", "p", "sequence"),
        ("y", "q", "sequence"),
    ]
    document["pairs"][0]["my"]["name"], document["pairs"][1]["my"]["name"] = "q", "p"  # the user fixes them
    edited = tmp_path / "pairs_fixed.json"
    edited.write_text(json.dumps(document))
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "--mapping", str(edited)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["failures"] == 0 and summary["counts"]["pairs"] == 2
    assert {p["rule"] for p in json.loads((out / "pairs.json").read_text())["pairs"]} == {"user_mapping"}


def test_threshold_overrides_apply_per_name_pattern(make_llmcheck_dump, tmp_path: Path) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", {"attn.out": torch.ones(8), "mlp.out": torch.ones(8)})
    my = make_llmcheck_dump(tmp_path / "m", {"attn.out": torch.ones(8) * 1.001, "mlp.out": torch.ones(8) * 1.001})
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(
        json.dumps([{"pattern": "attn.*", "metric": "relative_euclidean_distance", "warn": 0.01, "fail": 0.1}])
    )
    out = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "--thresholds", str(thresholds)]) == 3
    with open(out / "cmp_report.csv", newline="") as handle:
        rows = {row["name"]: row for row in csv.DictReader(handle)}
    assert rows["attn.out"]["verdict"] == "pass"  # 1e-3 is within the overridden (0.01, 0.1)
    assert (rows["mlp.out"]["verdict"], rows["mlp.out"]["deciding_metric"], rows["mlp.out"]["fail_threshold"]) == (
        "fail",
        "relative_euclidean_distance",
        "0.0001",
    )  # the default fp32 table


def test_two_single_files_are_compared_directly_and_their_metrics_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = np.linspace(-1, 1, 100, dtype=np.float32)
    np.save(tmp_path / "golden.npy", golden)
    torch.save(torch.from_numpy(golden * 1.01), tmp_path / "my.pt")
    assert (
        main(
            [
                "compare",
                "-gp",
                str(tmp_path / "golden.npy"),
                "-mp",
                str(tmp_path / "my.pt"),
                "-o",
                str(tmp_path / "out"),
            ]
        )
        == 3
    )
    printed = capsys.readouterr().out
    assert "relative_euclidean_distance" in printed and "0.01" in printed and "fail" in printed
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["golden"]["source"] == summary["my"]["source"] == "file"
    assert summary["first_divergence"]["value"] == pytest.approx(0.01, rel=1e-5)


def test_a_state_dict_and_a_safetensors_file_pair_weight_by_weight(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    weights = {
        "layer.weight": torch.randn(4, 4, generator=torch.Generator().manual_seed(0)),
        "layer.bias": torch.zeros(4, dtype=torch.bfloat16),
    }
    torch.save(weights, tmp_path / "golden.pth")
    save_file({**weights, "layer.bias": weights["layer.bias"] + 1}, tmp_path / "my.safetensors")
    result = _compare(tmp_path / "golden.pth", tmp_path / "my.safetensors")
    verdicts = {row.golden.key.name: (row.rule, row.verdict) for row in result.rows}
    assert verdicts == {"layer.weight": ("exact_key", "pass"), "layer.bias": ("exact_key", "fail")}


def test_pairs_over_shared_bytes_are_read_once(tiny_llama, golden_dump: Path) -> None:
    result = _compare(golden_dump, golden_dump)
    # The capture stores a tensor once however many records see it (a module's output is the
    # next module's input), and the compare measures each distinct pair of byte ranges once.
    assert 0 < result.tensor_bytes_read < result.tensor_bytes_compared


def test_worker_processes_give_the_same_rows_as_measuring_in_process(
    tiny_llama, golden_dump: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmcheck.core.measuring import metric_engine

    with scaled_weight(tiny_llama, "model.layers.1.mlp.up_proj", 1.1):
        my_dump = capture_run(tiny_llama, INPUT_IDS, tmp_path / "my")
    golden, my = _load(golden_dump), _load(my_dump)
    in_process = compare_dumps(golden, my, workers=1)
    monkeypatch.setattr(metric_engine, "PARALLEL_MIN_BYTES", 0)
    in_workers = compare_dumps(golden, my, workers=2)
    assert [(r.index, r.verdict, r.deciding_metric) for r in in_process.rows] == [
        (r.index, r.verdict, r.deciding_metric) for r in in_workers.rows
    ]
    for here, there in zip(in_process.rows, in_workers.rows):  # one-threaded BLAS either way: to the last bit
        assert {k: v.value for k, v in here.metrics.items()} == {k: v.value for k, v in there.metrics.items()}


def test_two_runs_with_nothing_in_common_say_so_and_exit_1(
    make_llmcheck_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", {"a": torch.ones(3)})
    my = make_llmcheck_dump(tmp_path / "m", {"b": torch.ones(2, 2, dtype=torch.int32)})
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out")]) == 1
    assert "no pairs: no pairing rule matched a golden record to a my record" in capsys.readouterr().out
    pairs = json.loads((tmp_path / "out" / "pairs.json").read_text())
    assert [item["name"] for item in pairs["unmatched_golden"]] == ["a"]
    assert [item["name"] for item in pairs["unmatched_my"]] == ["b"]


def test_reports_are_never_written_into_a_dump(golden_dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(path.name for path in golden_dump.iterdir())
    assert main(["compare", "-gp", str(golden_dump), "-mp", str(golden_dump), "-o", str(golden_dump / "report")]) == 2
    assert f"is inside the dump {golden_dump}; reports are never written into a dump" in capsys.readouterr().err
    assert sorted(path.name for path in golden_dump.iterdir()) == before


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-gp", "{tmp}/missing", "-mp", "{tmp}"], "{tmp}/missing: no such file or directory"),
        (["-gp", "{tmp}/empty", "-mp", "{tmp}/empty"], "{tmp}/empty: no plugin recognises this as a dump"),
        (
            ["-gp", "{tmp}/bad.npy", "-mp", "{tmp}/bad.npy"],
            "{tmp}/bad.npy: truncated: float32 shape [100] needs 400 bytes but the file holds 360",
        ),
        (["-gp", "{tmp}/g.npy", "-mp", "{tmp}/g.npy", "--metric", "cosine"], "--metric: unknown metric 'cosine'"),
        (["-gp", "{tmp}/g.npy", "-mp", "{tmp}/g.npy", "--mapping", "{tmp}/map.json"], "{tmp}/map.json: not valid JSON"),
        (["-gp", "{tmp}/g.npy", "-mp", "{tmp}/g.npy", "-j", "0"], "-j/--jobs: invalid value 0"),
        (["-gp", "{tmp}/g.npy", "-mp", "{tmp}/g.npy", "-o", "{tmp}/g.npy"], "Directory '{tmp}/g.npy' is a file"),
    ],
)
def test_bad_inputs_are_one_line_errors_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    (tmp_path / "empty").mkdir()
    np.save(tmp_path / "g.npy", np.ones(100, dtype=np.float32))
    (tmp_path / "bad.npy").write_bytes((tmp_path / "g.npy").read_bytes()[:-40])  # truncated
    (tmp_path / "map.json").write_text("{not json")
    argv = ["compare", *(arg.format(tmp=tmp_path) for arg in args)]
    if "-o" not in args:
        argv += ["-o", str(tmp_path / "out")]
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (1, 2)
    assert err.count("\n") == 1 and err.startswith("llmcheck: error: ")
    assert expected.format(tmp=tmp_path) in err
    assert not (tmp_path / "out").exists()


def test_fp32_ops_inside_a_bf16_run_are_held_to_bf16_thresholds(tiny_llama, tmp_path: Path) -> None:
    import copy

    golden = capture_run(tiny_llama, INPUT_IDS, tmp_path / "golden", mode=("module", "op"))
    my = capture_run(copy.deepcopy(tiny_llama).to(torch.bfloat16), INPUT_IDS, tmp_path / "my", mode=("module", "op"))
    result = _compare(golden, my)
    fp32_islands = [row for row in result.rows if row.golden.dtype == row.my.dtype == "float32"]
    # The rotary embedding and softmax run in float32 on bf16-rounded values: bf16 error, bf16 thresholds.
    assert fp32_islands and {row.judged_as for row in fp32_islands} == {"bf16"}
    assert result.counts()["failures"] == 0
    assert {row.judged_as for row in result.rows if row.golden.dtype == "int64"} == {"int"}


def test_failing_rows_are_labelled_introduced_amplified_or_inherited_from_what_fed_them(
    make_llmcheck_dump, tmp_path: Path
) -> None:
    base = torch.linspace(1, 2, 64)
    golden = make_llmcheck_dump(tmp_path / "g", {"a": base, "b": base, "c": base, "d": base})
    my = make_llmcheck_dump(tmp_path / "m", {"a": base, "b": base * (1 + 1e-3), "c": base * 1.5, "d": base * 1.6})
    rows = {row.golden.key.name: row for row in _compare(golden, my).rows}
    assert rows["a"].verdict == "pass" and rows["a"].attribution == ""
    assert (rows["b"].attribution, rows["b"].fed_by) == ("introduced", ("a step 0 output.0",))
    assert rows["c"].attribution == "amplified"  # 0.5 against the 1e-3 that fed it
    assert rows["d"].attribution == "inherited"


def test_the_seed_mapping_folder_with_op_mapping_file_json_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "op_mapping_file.json").write_text(json.dumps({"RmsNormOperation": ["RMSNorm", "LlamaRMSNorm"]}))
    mapping = load_user_mapping(tmp_path, get_plugins().mapping_rules())
    assert mapping.path == tmp_path / "op_mapping_file.json"
    assert mapping.entries == (("RmsNormOperation", "RMSNorm"), ("RmsNormOperation", "LlamaRMSNorm"))


def test_statistics_only_dumps_still_name_the_module_that_introduced_the_error(tiny_llama, tmp_path: Path) -> None:
    golden = capture_run(tiny_llama, INPUT_IDS, tmp_path / "golden", statistics_only=True)
    assert all(record.data is None for record in _load(golden).records)
    same = _compare(golden, capture_run(tiny_llama, INPUT_IDS, tmp_path / "same", statistics_only=True))
    assert same.counts()["failures"] == 0 and same.counts()["errors"] == 0
    with wrong_rmsnorm_epsilon(tiny_llama, "model.layers.1.post_attention_layernorm", 0.5):
        my = capture_run(tiny_llama, INPUT_IDS, tmp_path / "my", statistics_only=True)
    result = _compare(golden, my)
    introduced = result.first_introduced
    assert introduced is not None and introduced.golden.key.name == "model.layers.1.post_attention_layernorm"
    assert introduced.deciding_metric == "l2norm_stat_relative_error"
    assert "statistics only" in introduced.reason
    out = tmp_path / "report"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1"]) == 3
    with open(out / "cmp_report.csv", newline="") as report:
        header = next(csv.reader(report))
    assert header[-8:] == [
        "max_stat_absolute_error",
        "max_stat_relative_error",
        "min_stat_absolute_error",
        "min_stat_relative_error",
        "mean_stat_absolute_error",
        "mean_stat_relative_error",
        "l2norm_stat_absolute_error",
        "l2norm_stat_relative_error",
    ]


def _report_rows(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "cmp_report.csv", newline="") as handle:
        return {row["name"]: row for row in csv.DictReader(handle)}


def _with_nonfinite(tensor: torch.Tensor, value: float, count: int) -> torch.Tensor:
    changed = tensor.clone()
    changed[:count] = value
    return changed


STATS_BASE = torch.linspace(1, 2, 64)
ALL_NAN = torch.full((64,), float("nan"))


def test_statistics_only_tensors_with_the_same_nan_and_inf_on_both_sides_agree(
    make_llmcheck_dump, tmp_path: Path
) -> None:
    tensors = {
        "finite": STATS_BASE,
        "all_nan": ALL_NAN,
        "some_nan": _with_nonfinite(STATS_BASE, float("nan"), 3),
        "all_inf": torch.full((64,), float("inf")),
    }
    golden = make_llmcheck_dump(tmp_path / "g", tensors, statistics_only=set(tensors))
    my = make_llmcheck_dump(tmp_path / "m", tensors, statistics_only=set(tensors))
    out = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1"]) == 0
    rows = _report_rows(out)
    assert {name: (row["verdict"], row["nonfinite_mismatch"]) for name, row in rows.items()} == dict.fromkeys(
        tensors, ("pass", "0")
    )
    assert (rows["all_nan"]["golden_nan_count"], rows["all_nan"]["my_nan_count"]) == ("64", "64")
    assert (rows["all_inf"]["golden_inf_count"], rows["all_inf"]["my_inf_count"]) == ("64", "64")
    # the finite rest of a partly NaN tensor is still judged on its L2 norm
    assert rows["some_nan"]["deciding_metric"] == "l2norm_stat_relative_error"


def test_statistics_only_nan_or_inf_on_one_side_fails_as_nonfinite_mismatch(make_llmcheck_dump, tmp_path: Path) -> None:
    golden_tensors = {"my_all_nan": STATS_BASE, "golden_all_nan": ALL_NAN, "my_two_inf": STATS_BASE}
    my_tensors = {
        "my_all_nan": ALL_NAN,
        "golden_all_nan": STATS_BASE,
        "my_two_inf": _with_nonfinite(STATS_BASE, float("inf"), 2),
    }
    golden = make_llmcheck_dump(tmp_path / "g", golden_tensors, statistics_only=set(golden_tensors))
    my = make_llmcheck_dump(tmp_path / "m", my_tensors, statistics_only=set(my_tensors))
    out = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1"]) == 3
    rows = _report_rows(out)
    assert {name: (row["verdict"], row["nonfinite_mismatch"]) for name, row in rows.items()} == {
        "my_all_nan": ("fail", "64"),
        "golden_all_nan": ("fail", "64"),
        "my_two_inf": ("fail", "2"),
    }
    assert rows["my_all_nan"]["deciding_metric"] == "nonfinite_mismatch"
    assert (rows["my_all_nan"]["golden_nan_count"], rows["my_all_nan"]["my_nan_count"]) == ("0", "64")


def test_statistics_only_integers_that_differ_fail_each_on_its_own_and_name_the_statistic(
    make_llmcheck_dump, tmp_path: Path
) -> None:
    """Token ids a greedy decode picked differently differ in their statistics: on full tensors they fail exactly, and
    on statistics alone too (they passed: the L2-norm bound has no limits for integers), each row judged on its own."""
    golden_tensors = {f"ids_{step}": torch.tensor([[14795 if step == 8 else 253 + step]]) for step in range(10)}
    my_tensors = {**golden_tensors, "ids_8": torch.tensor([[6478]]), "ids_9": torch.tensor([[5855]])}
    golden_tensors["mask"] = my_tensors["mask"] = torch.tensor([True, False, True])
    golden = make_llmcheck_dump(tmp_path / "g", golden_tensors, statistics_only=set(golden_tensors))
    my = make_llmcheck_dump(tmp_path / "m", my_tensors, statistics_only=set(my_tensors))
    out = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1"]) == 3
    rows = _report_rows(out)
    failing = {name for name, row in rows.items() if row["verdict"] == "fail"}
    assert failing == {"ids_8", "ids_9"}
    assert rows["ids_8"]["judged_as"] == "int" and rows["mask"]["judged_as"] == "bool"
    assert (rows["ids_8"]["deciding_metric"], rows["ids_8"]["deciding_value"]) == ("max_stat_absolute_error", "8317.0")
    assert (rows["ids_8"]["warn_threshold"], rows["ids_8"]["fail_threshold"]) == ("0.0", "0.0")
    assert rows["ids_3"]["verdict"] == "pass" and rows["mask"]["verdict"] == "pass"


def _decode_statistics(folder: Path, tokens: list[int]) -> Path:
    """Write a statistics-only decode: each step's input ids (the token picked before) and its output."""
    from llmcheck.core.capture.statistics import tensor_stats
    from llmcheck.core.dumps.store import DumpWriter
    from llmcheck.core.records import RecordKey, TensorRecord

    with DumpWriter(folder, "test") as writer:
        for step, token in enumerate(tokens):
            for order, (io, position, tensor) in enumerate(
                [("input", "input_ids", torch.tensor([[token]])), ("output", "logits", torch.linspace(0, 1, 8) * token)]
            ):
                key = RecordKey(name="root", step=step, io=io, position=position)
                record = TensorRecord(
                    key=key,
                    dtype=str(tensor.dtype).removeprefix("torch."),
                    shape=tuple(tensor.shape),
                    order=2 * step + order,
                    stats=tensor_stats(tensor),
                )
                writer.add(record, None)
    return writer.path


def test_a_decode_whose_runs_picked_other_tokens_says_so_where_the_ids_first_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = _decode_statistics(tmp_path / "g", [5, 9, 14795, 30])
    my = _decode_statistics(tmp_path / "m", [5, 9, 6478, 5855])
    out = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1"]) == 3
    said = "the runs were given other values at root step 2 input.input_ids"
    assert said in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["first_divergence"]["step"] == 2 and summary["first_divergence"]["metric"] == "max_stat_absolute_error"
    )
    assert said + ", so every later step compares other inputs" in (out / "report.html").read_text()


def test_statistics_only_mask_with_a_nan_on_one_side_fails_although_the_mask_agrees(
    make_llmcheck_dump, tmp_path: Path
) -> None:
    mask = torch.zeros(64)
    mask[32:] = torch.finfo(torch.float32).min  # an additive attention mask: its statistics are the sentinel's
    golden = make_llmcheck_dump(tmp_path / "g", {"mask": mask}, statistics_only={"mask"})
    my = make_llmcheck_dump(tmp_path / "m", {"mask": _with_nonfinite(mask, float("nan"), 1)}, statistics_only={"mask"})
    (row,) = _compare(golden, my).rows
    assert (row.verdict, row.deciding_metric, row.nonfinite_mismatch) == ("fail", "nonfinite_mismatch", 1)


@pytest.mark.parametrize(
    ("golden_tensor", "my_tensor", "reason"),
    [
        (
            ALL_NAN,
            ALL_NAN,
            "statistics only (no tensor data on the golden and my side): every value is NaN or Inf, the same "
            "counts on both sides (golden 64 NaN, 0 Inf; my 64 NaN, 0 Inf); nothing finite to judge",
        ),
        (
            STATS_BASE,
            ALL_NAN,
            "statistics only (no tensor data on the golden and my side): at least 64 positions are NaN/Inf on one "
            "side only (golden 0 NaN, 0 Inf; my 64 NaN, 0 Inf)",
        ),
        (
            _with_nonfinite(STATS_BASE, float("nan"), 3),
            _with_nonfinite(STATS_BASE, float("nan"), 3),
            "statistics only (no tensor data on the golden and my side): judged on the L2 norms, a lower bound of "
            "relative_euclidean_distance; the same NaN/Inf counts on both sides, left out of the statistics "
            "(golden 3 NaN, 0 Inf; my 3 NaN, 0 Inf)",
        ),
    ],
)
def test_a_statistics_only_reason_says_what_the_nan_and_inf_counts_decided(golden_tensor, my_tensor, reason) -> None:
    from llmcheck.core.capture.statistics import tensor_stats
    from llmcheck.core.judging.stats_compare import statistics_reason

    assert (
        statistics_reason(
            tensor_stats(golden_tensor), tensor_stats(my_tensor), "golden and my", "relative_euclidean_distance"
        )
        == reason
    )


def test_statistics_only_runs_with_nan_are_judged_as_full_tensor_runs_are(tiny_llama, tmp_path: Path) -> None:
    def capture(name: str, nan_weight: bool, statistics_only: bool) -> Path:
        if not nan_weight:
            return capture_run(tiny_llama, INPUT_IDS, tmp_path / name, statistics_only=statistics_only)
        with scaled_weight(tiny_llama, "model.layers.1.mlp.down_proj", float("nan")):  # NaN from there to the logits
            return capture_run(tiny_llama, INPUT_IDS, tmp_path / name, statistics_only=statistics_only)

    verdicts = {}
    for statistics_only in (False, True):
        clean, nan, nan_again = (
            capture(f"{n}_{statistics_only}", n != "clean", statistics_only) for n in ("clean", "nan", "again")
        )
        same = _compare(nan, nan_again)
        assert same.counts()["failures"] == 0 and same.counts()["errors"] == 0
        against_clean = _compare(clean, nan)
        assert against_clean.counts()["errors"] == 0
        verdicts[statistics_only] = {row.golden.key.label(): row.verdict for row in against_clean.rows}
    assert verdicts[True] == verdicts[False]
    assert verdicts[True]["model.norm step 0 output.0"] == "fail"


def test_metrics_without_thresholds_alone_are_refused_instead_of_passing_everything(
    make_llmcheck_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", {"a": torch.ones(4)})
    my = make_llmcheck_dump(tmp_path / "m", {"a": torch.full((4,), 9.0)})
    assert (
        main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out"), "--metric", "rmse", "sqnr"])
        == 2
    )
    assert "none of the metrics rmse, sqnr has thresholds" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"patern": "*", "metric": "cosine_similarity", "warn": 0.9, "fail": 0.8}, "unknown key 'patern'"),
        (
            {"pattern": "*", "metric": "relative_euclidean_distance", "warn": 0.01, "fail": 0.001},
            "warn 0.01 is past fail",
        ),
        ({"pattern": "*", "metric": "cosine_similarity", "warn": 0.8, "fail": 0.9}, "warn 0.8 is past fail"),
    ],
)
def test_threshold_files_with_unknown_keys_or_reversed_limits_are_refused(
    make_llmcheck_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str], entry, message
) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", {"a": torch.ones(4)})
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text(json.dumps([entry]))
    assert (
        main(
            [
                "compare",
                "-gp",
                str(golden),
                "-mp",
                str(golden),
                "-o",
                str(tmp_path / "out"),
                "--thresholds",
                str(thresholds),
            ]
        )
        == 2
    )
    assert message in capsys.readouterr().err


def test_outputs_are_never_written_into_a_dump_by_any_command(
    make_llmcheck_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = make_llmcheck_dump(tmp_path / "g", {"a": torch.ones(4)})
    index_before = (dump / "index.jsonl").read_bytes()
    assert main(["opcheck", "-i", str(dump), "-o", str(dump)]) == 2
    assert main(["demo", "-o", str(dump / "sub")]) == 2
    topology = tmp_path / "model.json"
    topology.write_text(
        json.dumps(
            {
                "modelName": "m",
                "inTensors": ["x"],
                "outTensors": ["y"],
                "nodes": [
                    {
                        "opName": "RmsNormOperation_0",
                        "opType": "RmsNormOperation",
                        "inTensors": ["x"],
                        "outTensors": ["y"],
                    }
                ],
            }
        )
    )
    assert main(["export", "onnx", str(topology), "-o", str(dump / "index.jsonl")]) == 2
    assert main(["export", "onnx", str(topology), "-o", str(topology)]) == 2
    errors = capsys.readouterr().err
    assert errors.count("are never written into a dump") == 2 and "would be overwritten" in errors
    assert (dump / "index.jsonl").read_bytes() == index_before and "modelName" in topology.read_text()


def test_two_checkpoint_folders_are_compared_weight_by_weight(tiny_llama, tmp_path: Path) -> None:
    tiny_llama.save_pretrained(tmp_path / "original")
    with scaled_weight(tiny_llama, "model.layers.1.mlp.up_proj", 1.02):  # a conversion scale 2 % off
        tiny_llama.save_pretrained(tmp_path / "converted")
    result = _compare(tmp_path / "original", tmp_path / "converted")
    assert result.golden.source == "file" and result.counts()["unmatched"] == 0
    failing = [row.golden.key.name for row in result.rows if row.verdict == "fail"]
    assert failing == ["model.layers.1.mlp.up_proj.weight"]


def test_int64_values_that_differ_only_above_two_to_the_53_fail_exactly(make_llmcheck_dump, tmp_path: Path) -> None:
    golden = make_llmcheck_dump(tmp_path / "g", {"ids": torch.tensor([2**53 + 1, 5]), "same": torch.tensor([2**62])})
    my = make_llmcheck_dump(tmp_path / "m", {"ids": torch.tensor([2**53, 5]), "same": torch.tensor([2**62])})
    rows = {row.golden.key.name: row for row in _compare(golden, my).rows}
    assert rows["ids"].verdict == "fail" and rows["ids"].metrics["max_absolute_error"].value == 1.0
    assert rows["same"].verdict == "pass" and rows["same"].metrics["max_absolute_error"].value == 0.0


def test_an_executor_that_only_returns_its_measurements_gives_the_rows_of_local_measuring(
    tiny_llama, golden_dump: Path, tmp_path: Path
) -> None:
    """A third-party executor may return the measurements without handing each to ``on_measured``."""
    from llmcheck.core.measuring.metric_engine import measure_jobs
    from llmcheck.core.measuring.pair_chunk import Workspace

    def returning_executor(jobs, specs, on_measured):  # never calls on_measured
        measured = measure_jobs(jobs, specs, Workspace(1 << 16))
        return {measurement.index: measurement for measurement in measured}, {}

    with scaled_weight(tiny_llama, "model.layers.1.mlp.up_proj", 1.1):
        my_dump = capture_run(tiny_llama, INPUT_IDS, tmp_path / "my")
    golden, my = _load(golden_dump), _load(my_dump)
    local = compare_dumps(golden, my, workers=1)
    elsewhere = compare_dumps(golden, my, executor=returning_executor)
    assert [(row.verdict, row.deciding_metric, dict(row.metrics)) for row in elsewhere.rows] == [
        (row.verdict, row.deciding_metric, dict(row.metrics)) for row in local.rows
    ]
    assert elsewhere.tensor_bytes_read == local.tensor_bytes_read
