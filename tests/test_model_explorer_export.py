"""``llmcheck export model-explorer``: the compare laid over the captured module graph.

Two seeded tiny Llama runs are dumped with the module-graph ONNX (``export_onnx=True``); the
suspect run has layer 1's ``mlp.down_proj`` weight 5 % off. The node data and the annotated
ONNX must mark that module's node as the failing one where the error is introduced. The
server test starts the real Model Explorer (when installed) and loads it in headless Chromium.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import onnx
import pytest
import torch
from click.testing import CliRunner

from compare_runs import capture_run, scaled_weight
from devtools_page import DevToolsPage
from headless_browser import find_browser
from llmcheck.core.cli import cli, main
from llmcheck.core.reporting.model_explorer_launch import model_explorer_missing

CULPRIT = "model.layers.1.mlp.down_proj"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "out" / "screenshots"


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory) -> Path:
    """A compare folder of a golden and a suspect run (down_proj of layer 1 scaled by 1.05)."""
    from llmcheck.bundled_model import random_llama

    root = tmp_path_factory.mktemp("explorer")
    model = random_llama(seed=0)
    prompt = torch.tensor([[1, 5, 9, 13, 2, 7]])
    golden = capture_run(model, prompt, root / "golden", export_onnx=True)
    with scaled_weight(model, CULPRIT, 1.05):
        my = capture_run(model, prompt, root / "my", export_onnx=True)
    result = CliRunner().invoke(cli, ["compare", "-gp", str(golden), "-mp", str(my), "-o", str(root / "cmp")])
    assert result.exit_code == 3, result.output  # 3: the compare found failing pairs
    return root / "cmp"


@pytest.fixture(scope="module")
def exported(compare_dir: Path) -> Path:
    result = CliRunner().invoke(cli, ["export", "model-explorer", str(compare_dir), "-o", str(compare_dir / "me")])
    assert result.exit_code == 0, result.output
    assert "24 of 24 graph nodes have pairs, 3 not passing" in result.output
    return compare_dir / "me"


def _results(path: Path) -> dict[str, float]:
    content = json.loads(path.read_text())
    assert list(content) == ["LlamaForCausalLM"]  # the graph id Model Explorer's ONNX adapter gives model.onnx
    return {node: entry["value"] for node, entry in content["LlamaForCausalLM"]["results"].items()}


@pytest.mark.slow
def test_node_data_marks_the_scaled_module_as_the_worst_node(exported: Path) -> None:
    verdicts = _results(exported / "node_data_verdict.json")
    errors = _results(exported / "node_data_error.json")
    assert verdicts[CULPRIT] == 2  # fail
    assert {node for node, code in verdicts.items() if code == 2} == {CULPRIT, "model.norm", "lm_head"}
    assert all(verdicts[node] == 0 for node in verdicts if node.startswith("model.layers.0."))
    assert max(errors, key=errors.get) == CULPRIT
    assert errors[CULPRIT] == pytest.approx(0.05, rel=1e-3)  # the weight's 5 %: a linear layer passes it on as is
    growth = _results(exported / "node_data_growth.json")
    assert CULPRIT not in growth  # introduced there: infinite growth is no number for Model Explorer
    assert growth["lm_head"] == pytest.approx(1.013, abs=0.01)


@pytest.mark.slow
def test_annotated_onnx_carries_the_values_for_netron(exported: Path) -> None:
    model = onnx.load(str(exported / "model.onnx"))
    onnx.checker.check_model(model)
    node = next(node for node in model.graph.node if node.name == CULPRIT)
    meta = {prop.key: prop.value for prop in node.metadata_props}
    assert meta["llmcheck.verdict"] == "fail"
    assert meta["llmcheck.attribution"] == "introduced"
    assert float(meta["llmcheck.error"]) == pytest.approx(0.05, rel=1e-3)
    # three significant digits: the 5 % reads the same whatever the last float digits of this CPU's kernels
    assert node.doc_string == "llmcheck: fail, error 0.05, growth -, introduced"
    passing = next(node for node in model.graph.node if node.name == "model.layers.0.mlp.down_proj")
    assert {prop.key: prop.value for prop in passing.metadata_props}["llmcheck.verdict"] == "pass"


def test_bad_inputs_are_one_clean_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def error_of(folder: Path, *options: str) -> str:
        assert main(["export", "model-explorer", str(folder), *options]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        return err.strip()

    assert error_of(tmp_path / "nowhere") == (
        f"llmcheck: error: {tmp_path / 'nowhere'}: is not a folder (give the folder `llmcheck compare -o` wrote)"
    )
    assert error_of(tmp_path) == (
        f"llmcheck: error: {tmp_path}: no summary.json: not a compare folder "
        "(give the folder `llmcheck compare -o` wrote)"
    )
    (tmp_path / "summary.json").write_text(
        json.dumps(
            {"format": "llmcheck-compare-summary", "golden": {"path": str(tmp_path / "dump")}, "counts": {"pairs": 1}}
        )
    )
    (tmp_path / "cmp_report.csv").write_text("name,io,call_index,verdict\nlm_head,output,0,pass\n")
    (tmp_path / "dump").mkdir()
    no_graph = error_of(tmp_path)
    assert no_graph == (
        f"llmcheck: error: {tmp_path / 'dump'}: no ONNX graph in the compared dumps: export model-explorer draws "
        "the graph a torch dump holds only when made with --type onnx (dump the golden run again with llmcheck "
        "dump --type tensor onnx (DumpConfig(export_onnx=True)) and compare again; for ATB run `llmcheck export "
        "onnx` on its topology; or give the graph with --graph)"
    )
    (tmp_path / "graph.onnx").write_text("not a model")
    assert error_of(tmp_path, "--graph", str(tmp_path / "graph.onnx")).startswith(
        f"llmcheck: error: {tmp_path / 'graph.onnx'}: cannot be read as ONNX"
    )
    assert error_of(tmp_path, "--graph", str(tmp_path / "absent.onnx")) == (
        f"llmcheck: error: {tmp_path / 'absent.onnx'}: no such ONNX graph (check the --graph path)"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_model_explorer_serves_the_graph_and_the_overlay(exported: Path) -> None:
    missing = model_explorer_missing()
    if missing is not None:
        pytest.skip(f"{missing} is not installed: pip install 'llmcheck[explorer]'")
    find_browser()
    graph, verdict_data = exported / "model.onnx", exported / "node_data_verdict.json"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    # What a user runs: --open serves until stopped (BROWSER=true: no browser window is opened here).
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmcheck.core.cli",
            "export",
            "model-explorer",
            str(exported.parent),
            "-o",
            str(exported),
            "--open",
            "--port",
            str(port),
        ],
        env={**os.environ, "BROWSER": "true"},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(base + "/check_health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "Model Explorer did not start"
                time.sleep(0.5)
        # What the web app asks for: the graph, converted by the ONNX adapter, and the node data file.
        command = {
            "extensionId": "onnx_adapter",
            "cmdId": "convert",
            "modelPath": str(graph.resolve()),
            "settings": {},
            "deleteAfterConversion": False,
        }
        converted = _get_json(f"{base}/api/v1/send_command?json={urllib.parse.quote(json.dumps(command))}")
        nodes = {node["id"]: node for node in converted["graphs"][0]["nodes"]}
        attrs = {attr["key"]: attr["value"] for attr in nodes[CULPRIT]["attrs"]}
        assert attrs["[metadata] llmcheck.verdict"] == "fail"
        served = _get_json(f"{base}/api/v1/read_text_file?path={urllib.parse.quote(str(verdict_data.resolve()))}")
        overlay = json.loads(served["content"])["LlamaForCausalLM"]["results"]
        assert set(overlay) <= set(nodes) and overlay[CULPRIT]["value"] == 2  # keyed to the drawn graph's node ids
        # The page itself, in headless Chromium: it loads the graph (the header names it and counts its nodes).
        data = {
            "models": [{"url": str(graph.resolve())}],
            "nodeData": [str(verdict_data.resolve())],
            "nodeDataTargets": [""],
        }
        page = f"{base}/?data={urllib.parse.quote(json.dumps(data))}"
        with DevToolsPage(page) as browser:
            # the graph is drawn (its header) and the overlay is loaded (its name in the node data panel)
            shown = browser.wait_for_text("LlamaForCausalLM", "53 nodes", "llmcheck verdict", timeout=90)
            # the toolbar's "Expand all layers" (its icon), so the screenshot shows the coloured module nodes
            clicked = browser.evaluate(
                "(() => { const icon = [...document.querySelectorAll('mat-icon')]"
                ".find(e => e.innerText.trim() === 'unfold_more_double');"
                " if (!icon) return false; icon.parentElement.click(); return true; })()"
            )
            assert clicked, "Model Explorer's toolbar has no expand-all button"
            time.sleep(3)  # the layout animates
            browser.screenshot(SCREENSHOTS / "model_explorer_overlay.png")
        assert "Aggregated stats" in shown
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # its own session: llmcheck and the server it started
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hidden", "missing"),
    [
        (("model_explorer", "model_explorer_onnx"), "ai-edge-model-explorer"),  # neither: the README's install
        (("model_explorer_onnx",), "model-explorer-onnx"),  # Model Explorer without its ONNX adapter
    ],
)
def test_open_without_the_extra_says_how_to_install_it(
    compare_dir: Path,
    tmp_path: Path,
    monkeypatch,
    capsys: pytest.CaptureFixture[str],
    hidden: tuple[str, ...],
    missing: str,
) -> None:
    if "model_explorer" not in hidden and importlib.util.find_spec("model_explorer") is None:
        pytest.skip("needs Model Explorer without its ONNX adapter: pip install 'llmcheck[explorer]'")
    # None in sys.modules is Python's own way of making a package unimportable, as on a machine without it
    for module in hidden:
        monkeypatch.setitem(sys.modules, module, None)
    assert main(["export", "model-explorer", str(compare_dir), "-o", str(tmp_path / "me"), "--open"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"llmcheck: error: --open: needs Model Explorer, and {missing} is not installed "
        "(install it with: pip install 'llmcheck[explorer]')"
    )
    assert not (tmp_path / "me").exists()  # checked before anything is written


def test_atb_topology_onnx_nodes_get_the_pairs_of_their_op_ids(tmp_path: Path) -> None:
    """ATB: the graph is ``export onnx``'s topology ONNX; nodes are named by opName, records by op id."""
    fixture = Path(__file__).parent / "data" / "atb" / "msit_dump_20240131_120000"
    golden, my = tmp_path / "golden", tmp_path / "my"
    shutil.copytree(fixture, golden)
    shutil.copytree(fixture, my)
    # a kernel that wrote one wrong element: the last float16 of LinearOperation 0_1's output in step 0
    output = my / "tensors/0_4242/0/0_Decoder_layer/1_LinearOperation/after/outtensor0.bin"
    data = bytearray(output.read_bytes())
    data[-2:] = b"\x00\x3c"  # 1.0 where the golden run wrote -1.0
    output.write_bytes(bytes(data))
    runner = CliRunner()
    assert runner.invoke(cli, ["export", "onnx", str(golden / "layer/4242/Decoder_layer_0.json")]).exit_code == 0
    compared = runner.invoke(cli, ["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "cmp")])
    assert compared.exit_code == 3, compared.output
    exported = runner.invoke(cli, ["export", "model-explorer", str(tmp_path / "cmp")])
    assert exported.exit_code == 0 and "2 of 2 graph nodes have pairs, 1 not passing" in exported.output
    verdicts = json.loads((tmp_path / "cmp/model_explorer/node_data_verdict.json").read_text())
    assert verdicts["Decoder_layer_0"]["results"] == {
        "RmsNormOperation_0_0": {"value": 0},
        "LinearOperation_0_1": {"value": 2},
    }
    model = onnx.load(str(tmp_path / "cmp/model_explorer/Decoder_layer_0.onnx"))
    linear = next(node for node in model.graph.node if node.name == "LinearOperation_0_1")
    meta = {prop.key: prop.value for prop in linear.metadata_props}
    assert meta["llmcheck.record"] == "0_1" and meta["llmcheck.verdict"] == "fail"
    assert float(meta["llmcheck.error"]) == pytest.approx(1.0328, abs=1e-4)
    assert (
        linear.doc_string == "ATB LinearOperation LinearOperation_0_1\nllmcheck: fail, error 1.03, growth -, introduced"
    )


@pytest.mark.slow
def test_an_annotated_copy_given_as_graph_is_annotated_afresh_never_overwritten(
    compare_dir: Path, exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    annotated = exported / "model.onnx"
    assert main(["export", "model-explorer", str(compare_dir), "--graph", str(annotated), "-o", str(exported)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"llmcheck: error: {annotated}: would overwrite the graph it reads (write elsewhere with -o)"
    )
    assert main(["export", "model-explorer", str(compare_dir), "--graph", str(annotated), "-o", str(tmp_path)]) == 0
    node = next(node for node in onnx.load(str(tmp_path / "model.onnx")).graph.node if node.name == CULPRIT)
    keys = [prop.key for prop in node.metadata_props]
    assert keys.count("llmcheck.verdict") == 1 and node.doc_string.count("llmcheck: ") == 1


# --- a compare folder that is damaged, or moved away from its dumps ------------------------------

ATB_DUMP = Path(__file__).parent / "data" / "atb" / "msit_dump_20240131_120000"
AGAIN = "(copy the compare folder again, or rerun `llmcheck compare`)"


@pytest.fixture(scope="module")
def atb_compare(tmp_path_factory) -> Path:
    """An ATB compare run as users run it, from its folder with relative paths: ``golden``, ``my``, ``cmp``.

    The my-run's LinearOperation 0_1 wrote one wrong element; the golden dump holds the topology ONNX.
    """
    root = tmp_path_factory.mktemp("atb_compare")
    shutil.copytree(ATB_DUMP, root / "golden")
    shutil.copytree(ATB_DUMP, root / "my")
    output = root / "my/tensors/0_4242/0/0_Decoder_layer/1_LinearOperation/after/outtensor0.bin"
    data = bytearray(output.read_bytes())
    data[-2:] = b"\x00\x3c"
    output.write_bytes(bytes(data))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert main(["export", "onnx", "golden/layer/4242/Decoder_layer_0.json", "-l", "error"]) == 0
        assert main(["compare", "-gp", "golden", "-mp", "my", "-o", "cmp", "-l", "error"]) == 3
    return root / "cmp"


def _copy_of(compare_dir: Path, target: Path) -> Path:
    shutil.copytree(compare_dir, target, ignore=shutil.ignore_patterns("model_explorer"))
    return target


def _one_error_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["export", "model-explorer", *args]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    assert "graph nodes have pairs" not in captured.out  # nothing is drawn from a damaged report
    return captured.err.strip()


def test_the_atb_compare_is_drawn_whole(atb_compare: Path, tmp_path: Path, capsys) -> None:
    assert main(["export", "model-explorer", str(atb_compare), "-o", str(tmp_path / "me")]) == 0
    assert "2 of 2 graph nodes have pairs, 1 not passing" in capsys.readouterr().out


def test_the_views_replace_earlier_views_and_never_a_file_of_the_users(
    atb_compare: Path, tmp_path: Path, capsys, caplog
) -> None:
    views = tmp_path / "me"
    assert main(["export", "model-explorer", str(atb_compare), "-o", str(views)]) == 0
    (graph,) = views.glob("*.onnx")
    assert "replacing" not in caplog.text
    assert main(["export", "model-explorer", str(atb_compare), "-o", str(views)]) == 0
    assert (
        f"{views}: replacing the previous views ({graph.name}, node_data_error.json, node_data_verdict.json"
        in caplog.text
    )
    notes = views / "node_data_error.json"
    notes.write_text("my notes on the error view\n")
    before = {path.name: path.read_bytes() for path in views.iterdir()}
    capsys.readouterr()
    assert main(["export", "model-explorer", str(atb_compare), "-o", str(views)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"llmcheck: error: {notes}: exists and holds text (27 bytes, starting 'my notes on the error view'), "
        "not JSON; it is kept (pass another path with -o, or move the file away)"
    )
    assert {path.name: path.read_bytes() for path in views.iterdir()} == before  # nothing was written


def test_a_report_cut_short_is_refused_naming_its_last_line(atb_compare: Path, tmp_path: Path, capsys) -> None:
    cut = _copy_of(atb_compare, tmp_path / "cmp")
    report = cut / "cmp_report.csv"
    lines = report.read_bytes().splitlines(keepends=True)
    assert len(lines) == 11  # the header and the 10 pairs summary.json counts
    report.write_bytes(b"".join(lines[:3]) + lines[3][:40])  # an interrupted copy: line 4 stops mid-row
    assert _one_error_line(capsys, str(cut)) == (
        f"llmcheck: error: {report}: is cut short: line 4, its last, ends mid-row; "
        f"it holds 2 whole rows of the 10 pairs summary.json counts {AGAIN}"
    )


def test_a_report_with_fewer_rows_than_the_summary_counts_is_refused(atb_compare: Path, tmp_path: Path, capsys) -> None:
    short = _copy_of(atb_compare, tmp_path / "cmp")
    report = short / "cmp_report.csv"
    report.write_bytes(b"".join(report.read_bytes().splitlines(keepends=True)[:-1]))  # cut at a line end
    assert _one_error_line(capsys, str(short)) == (
        f"llmcheck: error: {report}: holds 9 rows, but summary.json counts 10 pairs {AGAIN}"
    )


def test_a_file_that_is_no_compare_report_is_refused_naming_the_missing_columns(
    atb_compare: Path, tmp_path: Path, capsys
) -> None:
    garbage = _copy_of(atb_compare, tmp_path / "cmp")
    report = garbage / "cmp_report.csv"
    report.write_text("garbage\n")
    assert _one_error_line(capsys, str(garbage)) == (
        f"llmcheck: error: {report}: lacks the columns name, io, call_index, verdict: not an llmcheck "
        "compare report (give the folder `llmcheck compare -o` wrote)"
    )
    report.write_text("")
    assert _one_error_line(capsys, str(garbage)) == f"llmcheck: error: {report}: is empty {AGAIN}"


def test_an_unknown_verdict_is_refused_naming_its_line(atb_compare: Path, tmp_path: Path, capsys) -> None:
    edited = _copy_of(atb_compare, tmp_path / "cmp")
    report = edited / "cmp_report.csv"
    with report.open(newline="") as handle:
        table = list(csv.reader(handle))
    table[3][table[0].index("verdict")] = "bogus"  # line 4 of the file
    with report.open("w", newline="") as handle:
        csv.writer(handle).writerows(table)
    assert _one_error_line(capsys, str(edited)) == (
        f"llmcheck: error: {report}: line 4 has the verdict 'bogus', which is none of pass, warn, fail, error {AGAIN}"
    )


def test_a_compare_folder_moved_away_from_its_dumps_names_the_dump_paths_not_found(
    atb_compare: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    moved = _copy_of(atb_compare, tmp_path / "elsewhere" / "cmp")
    summary = json.loads((moved / "summary.json").read_text())
    # summary.json keeps a dump path as compare was given it (torch: relative to where compare ran)
    summary["golden"]["path"], summary["my"]["path"] = "golden", "my"
    (moved / "summary.json").write_text(json.dumps(summary))
    monkeypatch.chdir(tmp_path)
    assert _one_error_line(capsys, "elsewhere/cmp") == (
        "llmcheck: error: elsewhere/cmp/summary.json: the golden dump golden and the my dump my it names are not "
        f"found relative to {tmp_path}, {moved.parent}, {moved} "
        "(run from the folder `llmcheck compare` ran in, or give the graph with --graph)"
    )
    # what the hint says works: run from where compare ran, or give the graph explicitly
    monkeypatch.chdir(atb_compare.parent)
    assert main(["export", "model-explorer", str(moved), "-o", str(tmp_path / "me")]) == 0
    assert "2 of 2 graph nodes have pairs, 1 not passing" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    graph = atb_compare.parent / "golden/layer/4242/Decoder_layer_0.onnx"
    assert main(["export", "model-explorer", "elsewhere/cmp", "--graph", str(graph)]) == 0
    assert "2 of 2 graph nodes have pairs, 1 not passing" in capsys.readouterr().out
