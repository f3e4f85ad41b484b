"""Compare's output formats are reporters: the four default files, and JUnit XML for CI on request."""

from __future__ import annotations

import csv
import json
import textwrap
import types
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.plugins import get_plugins

DEFAULT_FILES = {"cmp_report.csv", "summary.json", "pairs.json", "report.html"}


@pytest.fixture
def runs(make_llmcheck_dump, tmp_path: Path) -> tuple[Path, Path]:
    """Return a golden and a my dump: one pair equal, one 50 % off, one that cannot be measured (shapes differ)."""
    torch.manual_seed(0)
    golden = {"embed": torch.randn(64), "layer0": torch.randn(64), "layer1": torch.randn(8)}
    my = {"embed": golden["embed"].clone(), "layer0": golden["layer0"] * 1.5, "layer1": torch.randn(4)}
    return make_llmcheck_dump(tmp_path / "golden", golden), make_llmcheck_dump(tmp_path / "my", my)


def test_a_compare_writes_the_four_default_reports_and_junit_only_when_asked(runs, tmp_path: Path) -> None:
    golden, my = runs
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "plain"), "-j", "1"]) == 3
    assert {path.name for path in (tmp_path / "plain").iterdir()} == DEFAULT_FILES
    out = tmp_path / "ci"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1", "--report", "junit"]) == 3
    assert {path.name for path in out.iterdir()} == DEFAULT_FILES | {"junit.xml"}


def test_junit_xml_has_a_case_per_pair_and_the_summary_s_failures_and_errors(runs, tmp_path: Path) -> None:
    golden, my = runs
    out = tmp_path / "ci"
    main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1", "--report", "junit"])
    counts = json.loads((out / "summary.json").read_text())["counts"]
    suites = ElementTree.parse(out / "junit.xml").getroot()
    (suite,) = suites.findall("testsuite")
    cases = suite.findall("testcase")
    assert (
        (int(suite.get("tests")), int(suite.get("failures")), int(suite.get("errors")))
        == (counts["pairs"], counts["failures"], counts["errors"])
        == (3, 1, 1)
    )
    assert suites.get("tests") == suite.get("tests")
    assert [case.get("classname") for case in cases] == ["embed", "layer0", "layer1"]  # execution order
    embed, layer0, layer1 = cases
    assert list(embed) == []  # a passing pair is a passing test
    (failure,) = layer0.findall("failure")
    assert failure.get("message").startswith("layer0 step 0 output.0: relative_euclidean_distance 0.5 > ")
    assert "pairing rule: " in failure.text and "attribution: introduced" in failure.text
    (error,) = layer1.findall("error")
    assert error.get("message") == "shape mismatch: golden [8] vs my [4]"
    properties = {item.get("name"): item.get("value") for item in suite.find("properties")}
    assert properties["golden"] == str(golden) and properties["culprit"] == "layer0 step 0 output.0"


def test_junit_xml_gives_one_defect_one_failure_listing_the_rows_that_carry_it(tmp_path: Path) -> None:
    """A 4-layer Llama whose layer-1 RMSNorm has the wrong epsilon: dozens of rows fail, CI shows one failure."""
    from compare_runs import capture_run, wrong_rmsnorm_epsilon
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0, num_layers=4)
    input_ids = torch.tensor([[1, 7, 42, 9, 100, 3]])
    defect = "model.layers.1.post_attention_layernorm"
    golden = capture_run(model, input_ids, tmp_path / "golden")
    with wrong_rmsnorm_epsilon(model, defect, 0.5):
        my = capture_run(model, input_ids, tmp_path / "my")
    out = tmp_path / "ci"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1", "--report", "junit"]) == 3
    summary = json.loads((out / "summary.json").read_text())
    (suite,) = ElementTree.parse(out / "junit.xml").getroot().findall("testsuite")
    failed = [case for case in suite.findall("testcase") if case.find("failure") is not None]
    assert [case.get("name") for case in failed] == [f"{defect} step 0 output.0"]
    properties = {item.get("name"): item.get("value") for item in suite.find("properties")}
    carried = int(properties["carried_failures"])
    assert summary["counts"]["failures"] == int(properties["failing_pairs"]) == carried + 1 > 10
    assert int(suite.get("failures")) == 1 and int(suite.get("tests")) == summary["counts"]["pairs"] - carried
    failure = failed[0].find("failure")
    assert "introduced" in failure.get("message")
    listed = failure.text.split("carry this error on (not test cases of their own):\n", 1)[1].splitlines()
    assert f"{carried} later failing rows carry this error on" in failure.text and len(listed) == carried
    assert all(line.endswith((", inherited", ", encloses")) for line in listed), listed
    assert any(line.startswith("  model.layers.3 step 0 output.0: ") for line in listed)  # two layers on


def test_junit_xml_gives_each_defect_its_failure_and_rows_that_add_error_their_own(tmp_path: Path) -> None:
    """Two defects -- a wrong epsilon in layer 0, an o_proj weight off in layer 2 -- are two introduced failures."""
    from compare_runs import capture_run, scaled_weight, wrong_rmsnorm_epsilon
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0, num_layers=4)
    input_ids = torch.tensor([[1, 7, 42, 9, 100, 3]])
    golden = capture_run(model, input_ids, tmp_path / "golden")
    with (
        wrong_rmsnorm_epsilon(model, "model.layers.0.post_attention_layernorm", 0.5),
        scaled_weight(model, "model.layers.2.self_attn.o_proj", 3.0),
    ):
        my = capture_run(model, input_ids, tmp_path / "my")
    out = tmp_path / "ci"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1", "--report", "junit"]) == 3
    rows = {
        f"{row['name']} step 0 {row['io']}.{row['position']}": row
        for row in csv.DictReader((out / "cmp_report.csv").open())
    }
    (suite,) = ElementTree.parse(out / "junit.xml").getroot().findall("testsuite")
    failures = {
        case.get("name"): case.find("failure") for case in suite.findall("testcase") if case.find("failure") is not None
    }
    assert [label for label in failures if rows[label]["attribution"] == "introduced"] == [
        "model.layers.0.post_attention_layernorm step 0 output.0",
        "model.layers.2.self_attn.o_proj step 0 output.0",
    ]
    # every other failure adds error of its own (amplified); every carrying row is listed under one failure
    assert {rows[label]["attribution"] for label in failures} == {"introduced", "amplified"}
    listed = [
        line.strip().split(": ", 1)[0]
        for failure in failures.values()
        for line in failure.text.partition("(not test cases of their own):\n")[2].splitlines()
    ]
    failing = sum(row["verdict"] == "fail" for row in rows.values())
    assert len(set(listed)) == len(listed) and len(listed) + len(failures) == failing > 20


def test_an_unknown_report_is_one_error_listing_the_known_ones_before_anything_runs(
    runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, my = runs
    out = tmp_path / "out"
    assert (
        main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "--report", "junit", "--report", "xlsx"])
        == 2
    )
    assert capsys.readouterr().err == (
        "llmcheck: error: --report: unknown report 'xlsx' (known reports: csv, summary, pairs, html, junit)\n"
    )
    assert not out.exists()


def test_skip_report_leaves_a_default_report_out_and_refuses_one_that_is_not_default(
    runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, my = runs
    out = tmp_path / "rows_only"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "--skip-report", "html"]) == 3
    assert {path.name for path in out.iterdir()} == DEFAULT_FILES - {"report.html"}
    capsys.readouterr()
    refused = tmp_path / "refused"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(refused), "--skip-report", "junit"]) == 2
    assert capsys.readouterr().err == (
        "llmcheck: error: --skip-report: report 'junit' is not written by default "
        "(default reports: csv, summary, pairs, html)\n"
    )
    assert not refused.exists()


def _hook_example(hook_name: str) -> types.ModuleType:
    """Return the ``Example::`` of a hook's docstring, run as a plugin module."""
    from llmcheck.core import hookspecs

    module = types.ModuleType(f"{hook_name}_example")
    exec(textwrap.dedent(getattr(hookspecs, hook_name).__doc__.split("Example::", 1)[1]), module.__dict__)
    return module


def test_the_reporter_example_of_the_hook_reference_writes_its_file(llmcheck_plugins, runs, tmp_path: Path) -> None:
    llmcheck_plugins(_hook_example("llmcheck_register_reporters"))
    golden, my = runs
    out = tmp_path / "out"
    main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1", "--report", "verdicts"])
    assert (out / "verdicts.csv").read_text().splitlines() == [
        "embed step 0 output.0, pass",
        "layer0 step 0 output.0, fail",
        "layer1 step 0 output.0, error",
    ]


def test_the_backend_option_example_of_the_hook_reference_declares_its_flag(llmcheck_plugins) -> None:
    facade = llmcheck_plugins(_hook_example("llmcheck_register_backend_options"))
    (repeat,) = facade.backend_options("plain")
    assert repeat.flag_text == "-r/--repeat" and repeat.value(3) == 3 and repeat.default == 1


def test_reporters_write_with_the_cyclic_collector_paused_and_get_it_back(llmcheck_plugins, runs, tmp_path) -> None:
    """~10**5 report rows beside the compare's live objects: a full collection would walk them all, freeing nothing."""
    import gc

    from llmcheck.core.compare import compare_dumps
    from llmcheck.core.reporting.reporters import Reporter, write_reports
    from llmcheck.plugin_api import hookimpl

    seen: list[bool] = []

    class CollectorWatch:
        @hookimpl
        def llmcheck_register_reporters(self, register) -> None:
            register(
                Reporter("gcwatch", "notes the collector", "gc.txt", lambda result, path: seen.append(gc.isenabled()))
            )

    plugins = llmcheck_plugins(CollectorWatch())
    golden, my = (plugins.load_tensors(path) for path in runs)
    result = compare_dumps(golden, my, workers=1)
    enabled_before = gc.isenabled()
    gc.enable()
    try:
        written = write_reports(result, tmp_path / "out", get_plugins().reporters(), ["gcwatch"])
        assert seen == [False] and gc.isenabled()
    finally:
        (gc.enable if enabled_before else gc.disable)()
    assert set(written) == {"csv", "summary", "pairs", "html", "gcwatch"}


def test_a_report_rewritten_without_junit_drops_the_previous_junit_and_model_explorer_views(
    runs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    golden, my = runs
    out = tmp_path / "report"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1", "--report", "junit"]) == 3
    explorer = out / "model_explorer"  # what `llmcheck export model-explorer` leaves there by default
    explorer.mkdir()
    (explorer / "node_data_error.json").write_text("{}")
    (explorer / "model.onnx").write_bytes(b"")
    (out / "notes.txt").write_text("the user's own file")
    caplog.clear()
    assert main(["compare", "-gp", str(golden), "-mp", str(golden), "-o", str(out), "-j", "1"]) == 0
    assert {path.name for path in out.iterdir()} == DEFAULT_FILES | {"notes.txt"}
    assert json.loads((out / "summary.json").read_text())["counts"]["failures"] == 0
    assert (
        f"{out}: replacing the previous report (cmp_report.csv, summary.json, pairs.json, report.html); "
        "removed its junit.xml, model_explorer/, which this run does not write"
    ) in caplog.text


def test_a_model_explorer_folder_holding_other_files_is_kept_and_said_stale(
    runs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    golden, my = runs
    out = tmp_path / "report"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1"]) == 3
    (out / "model_explorer").mkdir()
    (out / "model_explorer" / "my_screenshot.png").write_bytes(b"png")
    assert main(["compare", "-gp", str(golden), "-mp", str(golden), "-o", str(out), "-j", "1"]) == 0
    assert (out / "model_explorer" / "my_screenshot.png").read_bytes() == b"png"
    assert "model_explorer/ holds files llmcheck did not write, so it was kept" in caplog.text


def test_an_input_error_leaves_the_previous_report_whole_and_says_nothing_of_replacing_it(
    runs, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, my = runs
    out = tmp_path / "report"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1", "--report", "junit"]) == 3
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    capsys.readouterr()
    caplog.clear()
    missing = tmp_path / "no_such_run"
    assert main(["compare", "-gp", str(golden), "-mp", str(missing), "-o", str(out), "-j", "1"]) == 1
    assert capsys.readouterr().err.startswith(f"llmcheck: error: {missing}: no such file or directory")
    assert "replacing the previous report" not in caplog.text
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
