"""report.html tells the story at a glance, checked in a real browser (headless Chromium).

The page: one sentence at the top, the headline chart of the error along the model's depth
with the culprit named, the module heat map, the per-metric charts folded away (each drawing
only the pairs its metric judged), a table that fits 1280 px with a details drawer per row.
One self-contained file, no console error. A screenshot is saved for CI and the docs.
"""

from __future__ import annotations

import copy
import html
import itertools
import re
import shutil
from pathlib import Path

import pytest
import torch

from compare_runs import capture_run, scaled_weight
from headless_browser import render, screenshot
from llmcheck.core.compare import compare_dumps
from llmcheck.core.plugins import get_plugins
from llmcheck.core.reporting.reporters import write_reports

pytestmark = pytest.mark.slow  # each test starts a browser (a few seconds)

ROOT = Path(__file__).resolve().parent.parent
DEFECT = "model.layers.3.mlp.down_proj"
#: Where the screenshots go: out/ is ignored by git, CI keeps it as an artifact.
SCREENSHOTS = ROOT / "out" / "screenshots"
DOCS_IMAGE = ROOT / "docs" / "images" / "compare-report.png"
#: The demo's heat maps in docs/commands/compare.md: fp32, bf16 with its noise twin, a clean bf16 run; and its depth chart.
DOCS_HEAT_MAPS = ("heat-map-fp32.png", "heat-map-bf16-twin.png", "heat-map-clean-bf16.png", "depth-chart-fp32.png")


def body_attributes(dom: str) -> str:
    """Return the attributes of the rendered page's <body> tag (the page marks success or error there)."""
    match = re.search(r"<body([^>]*)>", dom)
    assert match, dom[:500]
    return match.group(1)


def console_errors(browser_log: str) -> list[str]:
    """Return the console messages and uncaught errors in a Chromium log."""
    return [line for line in browser_log.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def section(dom: str, section_id: str) -> str:
    """Return the rendered HTML of one <section> of the page."""
    return dom.split(f'<section id="{section_id}">', 1)[1].split("</section>", 1)[0]


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory):
    """A six-layer Llama in float32 against its bfloat16 copy whose layer-3 MLP output projection is scaled by 1.05."""
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0, num_layers=6)
    input_ids = torch.tensor([[5, 9, 200, 31, 7, 64, 12, 250]])
    folder = tmp_path_factory.mktemp("html")
    golden = capture_run(model, input_ids, folder / "golden")
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    with scaled_weight(model_bf16, DEFECT, 1.05):
        my = capture_run(model_bf16, input_ids, folder / "my")
    plugins = get_plugins()
    return compare_dumps(plugins.load_tensors(golden), plugins.load_tensors(my), workers=1), folder


@pytest.fixture(scope="module")
def report_page(compared) -> Path:
    result, folder = compared
    return write_reports(result, folder / "report", get_plugins().reporters())["html"]


@pytest.fixture(scope="module")
def rendered(report_page: Path) -> tuple[str, str]:
    return render(report_page)


def test_report_is_one_self_contained_file(report_page: Path) -> None:
    text = report_page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing fetched from a network
    assert "<script src" not in text and "<link" not in text


def test_report_renders_without_console_errors_and_fits_1280_px(rendered: tuple[str, str]) -> None:
    dom, browser_log = rendered
    assert console_errors(browser_log) == []
    attributes = body_attributes(dom)
    assert 'data-rendered="ok"' in attributes and "data-render-error" not in attributes
    width = int(re.search(r'data-page-width="(\d+)"', attributes).group(1))
    assert width <= 1280


def test_the_story_is_one_sentence_at_the_top_naming_the_culprit_and_the_output_effect(compared, rendered) -> None:
    result, _ = compared
    dom, _ = rendered
    story = html.unescape(re.search(r'<p class="story fail" id="story">(.*?)</p>', dom).group(1))
    assert story.count(". ") == 0 and story.endswith(".")
    assert f"{result.counts()['failures']} fail" in story
    assert f"the error is introduced at {DEFECT} step 0 output.0 (Linear)" in story
    assert "while its inputs agree" in story and "at the output (" in story and "next token" in story
    assert dom.count('id="story"') == 1 and "first introduced divergence:" not in dom  # told once


def test_headline_chart_plots_each_layer_and_names_the_culprit(compared, rendered) -> None:
    result, _ = compared
    dom, _ = rendered
    headline = section(dom, "depth")
    ticks = [html.unescape(tick) for tick in re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', headline)]
    assert ticks[:2] == ["embed_tokens", "rotary_emb"] and ticks[-2:] == ["norm", "lm_head"]
    assert [tick for tick in ticks if tick.startswith("layers.")] == [f"layers.{i}" for i in range(6)]
    culprit = re.search(r'<text id="culprit"[^>]*>([^<]*)</text>', headline).group(1)
    assert culprit == f"introduced here: {DEFECT} step 0 output.0"
    assert headline.count("<circle") == len(ticks)
    verdicts = {
        row.golden.key.name: row.verdict
        for row in result.rows
        if row.golden.key.io == "output" and row.golden.key.position == "0"
    }
    failing = [
        name
        for name in verdicts
        if re.fullmatch(r"model\.(layers\.\d+|embed_tokens|norm)|lm_head", name) and verdicts[name] == "fail"
    ]
    assert len(re.findall(r'<circle [^>]*fill="#c62828"', headline)) == len(failing)
    assert re.search(r'<path id="culprit-point"', headline)  # the culprit's own error, in its layer


def test_heat_map_has_layers_down_and_submodule_kinds_across_with_the_culprit_outlined(rendered) -> None:
    dom, _ = rendered
    heat = section(dom, "heat")
    kinds = re.findall(r'<th class="kind"><span>([^<]*)</span>', heat)
    assert kinds[0] == "input_layernorm" and {"self_attn.q_proj", "mlp.down_proj"} <= set(kinds)
    assert re.findall(r"<th>layer (\d+)</th>", heat) == [str(i) for i in range(6)]
    assert heat.count('class="culprit') == 1
    assert heat.count("<td") == 6 * len(kinds)


def heat_cells(dom: str) -> list[tuple[str, str, str]]:
    """Return each heat map cell's (class, background colour, tooltip), row by row."""
    cells = []
    for tag in re.findall(r"<td [^>]*>", section(dom, "heat")):
        attributes = dict(re.findall(r'(\w+)="([^"]*)"', tag))
        colour = re.search(r"background: ([^;]*);", attributes["style"]).group(1)
        cells.append((attributes["class"], colour, html.unescape(attributes.get("title", ""))))
    return cells


#: The heat map's red: a row the verdict says adds error itself.
HOT_RED = "rgb(198, 40, 40)"


def test_the_heat_map_shows_the_defect_as_its_one_hot_cell_and_what_carries_it_not_hot(rendered) -> None:
    cells = heat_cells(rendered[0])
    hot = [(cls, title) for cls, colour, title in cells if colour == HOT_RED]
    assert len(hot) == 1 and hot[0][0] == "culprit hot" and hot[0][1].startswith("layer 3 mlp.down_proj: ")
    assert "(fail, introduced)" in hot[0][1]
    # the rows downstream carry a 5 % error that bf16's table passes: whatever of them fails carries it on
    carried = [title for cls, colour, title in cells if "(fail, " in title and "culprit" not in cls]
    assert all(", encloses)" in title or ", inherited)" in title for title in carried), carried


def test_a_link_opens_the_heat_map_coloured_by_the_error_itself(report_page: Path) -> None:
    dom, _ = render_with_hash(report_page, "heat=error")
    heat = section(dom, "heat")
    assert re.search(r'data-mode="error" aria-pressed="true"', heat)
    assert "it grows with depth, so the layers after a defect are as hot as the defect" in heat
    cells = heat_cells(dom)
    assert [cls for cls, _, _ in cells if cls] == ["culprit"] and all(colour != HOT_RED for _, colour, _ in cells)
    assert all(title.startswith("layer ") and "expected" not in title for _, _, title in cells)


def test_a_clean_bf16_run_shows_no_hot_cell(tmp_path: Path) -> None:
    """The same Llama in bfloat16 without a defect: its rounding noise is what the verdict expects, nothing is red."""
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0, num_layers=6)
    input_ids = torch.tensor([[5, 9, 200, 31, 7, 64, 12, 250]])
    golden = capture_run(model, input_ids, tmp_path / "golden")
    my = capture_run(copy.deepcopy(model).to(torch.bfloat16), input_ids, tmp_path / "my")
    plugins = get_plugins()
    result = compare_dumps(plugins.load_tensors(golden), plugins.load_tensors(my), workers=1)
    assert result.first_introduced is None
    dom, browser_log = render(write_reports(result, tmp_path / "report", get_plugins().reporters())["html"])
    assert console_errors(browser_log) == []
    cells = heat_cells(dom)
    assert len(cells) > 6 * 10 and [title for _, colour, title in cells if colour == HOT_RED] == []
    assert any("expected " in title and "by the repeats" in title for _, _, title in cells)


def expected_line_runs(headline: str) -> list[list[tuple[float, float]]]:
    """Return the depth chart's expected-error line as its runs of (x, y) points."""
    path = re.search(r'<path class="expected" d="([^"]*)"', headline)
    assert path, "no expected-error line"
    return [
        [(float(x), float(y)) for x, y in re.findall(r"([\d.]+) ([\d.]+)", run)]
        for run in path.group(1).split("M")
        if run
    ]


def test_the_expected_error_line_follows_what_the_verdict_expected_without_spikes(compared, rendered) -> None:
    result, _ = compared
    headline = section(rendered[0], "depth")
    runs = expected_line_runs(headline)
    for run in runs:  # left to right, never straight down to the floor and back
        assert len(run) >= 2 and all(b[0] > a[0] for a, b in itertools.pairwise(run)), run
    drawn = sum(len(run) for run in runs)
    points = [row for row in result.rows if row.golden.key.name in LAYER_POINTS and row.golden.key.io == "output"]
    known = [row for row in points if row.golden.key.position == "0" and (row.expected_error or 0) > 0]
    lone_strokes = sum(1 for run in runs if len(run) == 2 and run[0][1] == run[1][1])
    assert drawn - lone_strokes == len(known) > 0
    assert "dashed green line: the error the verdict expected at each output" in headline


#: The depth chart's points of the six-layer Llama: the modules around the layers and each layer.
LAYER_POINTS = {"model.embed_tokens", "model.rotary_emb", "model.norm", "lm_head"} | {
    f"model.layers.{i}" for i in range(6)
}


def test_each_metric_chart_draws_only_the_pairs_it_judged(compared, rendered) -> None:
    result, _ = compared
    dom, _ = rendered
    plots = section(dom, "plots")
    assert '<details class="plots">' in plots  # folded away by default
    judged = {
        spec.name: sum(1 for row in result.rows if row.metrics[spec.name].fail_threshold is not None)
        for spec in result.metric_specs
    }
    titles = [html.unescape(title) for title in re.findall(r'<div class="chart"><h3>([^<]*)</h3>', plots)]
    assert len(titles) == len(result.metric_specs)
    for title in titles:
        name = title.split(" ", 1)[0]
        expected = f"{judged[name]} pairs judged" if judged[name] else "no thresholds: reported, judges no pair"
        assert expected in title, title


def test_each_metric_chart_has_values_on_its_axes_names_its_step_and_marks_the_culprit(compared, rendered) -> None:
    result, _ = compared
    charts = section(rendered[0], "plots").split('<div class="chart">')[1:]
    assert len(charts) == len(result.metric_specs)
    for chart in charts:
        title = html.unescape(re.search(r"<h3>([^<]*)</h3>", chart).group(1))
        y_values = re.findall(r'<text class="ytick"[^>]*>([^<]*)</text>', chart)
        assert len(y_values) >= 3 and len(set(y_values)) == len(y_values), (title, y_values)
        x_ticks = re.findall(r'<text class="xtick"[^>]*>([^<]*)</text>', chart)
        assert x_ticks[0] == "layer 0" and len(x_ticks) >= 3, (title, x_ticks)
        assert "pairs of step 0 in execution order" in chart
        assert '<text class="culprit"' in chart and f"introduced: {DEFECT}</text>" in chart
    relative = next(chart for chart in charts if chart.startswith("<h3>relative_euclidean_distance"))
    assert '<path class="culprit-mark"' in relative and re.search(r'<text class="limit"[^>]*>fail</text>', relative)


def test_table_lists_every_pair_with_a_details_drawer(compared, report_page: Path, tmp_path: Path) -> None:
    result, _ = compared
    opened = tmp_path / "opened.html"
    introduced = result.first_introduced
    shutil.copy(report_page, opened)
    dom, _ = render(opened)
    rows = re.findall(r'<tr class="row-(\w+)', dom)
    assert len(rows) == len(result.rows) and rows.count("fail") == result.counts()["failures"]
    assert dom.count("<button") >= len(result.rows)
    dom_with_drawer, _ = render_with_hash(opened, f"details-{introduced.index}")
    drawer = dom_with_drawer.split(f'id="drawer-{introduced.index}"', 1)[1].split("</tr>", 1)[0]
    assert "<dt>op type</dt><dd>Linear</dd>" in drawer and "<dt>fed by</dt>" in drawer


def render_with_hash(page: Path, fragment: str) -> tuple[str, str]:
    """Render the page opened at ``#fragment`` (the page opens that row's drawer)."""
    import subprocess

    from headless_browser import browser_command

    completed = subprocess.run(
        browser_command("--dump-dom", page.resolve().as_uri() + "#" + fragment),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout, completed.stderr


def test_screenshot_of_the_report_is_saved_for_ci_and_the_docs(report_page: Path) -> None:
    png = screenshot(report_page, SCREENSHOTS / "compare-report.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 1400) and len(data) > 50_000  # a drawn page, not a blank one
    docs = (ROOT / "docs" / "commands" / "compare.md").read_text()
    for image in (DOCS_IMAGE.name, *DOCS_HEAT_MAPS):
        assert (DOCS_IMAGE.parent / image).exists() and f"images/{image}" in docs


def test_the_console_check_catches_a_broken_page(report_page: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text(report_page.read_text().replace('"use strict";', '"use strict"; notDefinedAnywhere();', 1))
    dom, browser_log = render(broken)
    assert 'data-rendered="ok"' not in body_attributes(dom)
    assert any("notDefinedAnywhere" in line for line in console_errors(browser_log))


def test_a_report_of_two_tensor_files_without_layers_renders_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    from llmcheck.core.cli import main

    np.save(tmp_path / "golden.npy", np.linspace(-1, 1, 4096, dtype=np.float32))
    np.save(tmp_path / "my.npy", np.linspace(-1, 1, 4096, dtype=np.float32) * 1.01)
    assert (
        main(
            [
                "compare",
                "-gp",
                str(tmp_path / "golden.npy"),
                "-mp",
                str(tmp_path / "my.npy"),
                "-o",
                str(tmp_path / "report"),
            ]
        )
        == 3
    )
    capsys.readouterr()
    dom, browser_log = render(tmp_path / "report" / "report.html")
    assert console_errors(browser_log) == [] and 'data-rendered="ok"' in body_attributes(dom)
    story = html.unescape(re.search(r'id="story">(.*?)</p>', dom).group(1))
    assert story.startswith(
        "Compared my run my.npy (file) with golden golden.npy (file), 1 pair: 1 fail; "
        "the first failing tensor is tensor step 0 output.0: relative_euclidean_distance 0.0099"
    )
    assert section(dom, "depth").count("<circle") == 1
    assert "no repeated layers found in the record names" in section(dom, "heat")


def test_the_page_written_in_parts_is_the_data_encoded_at_once(compared, monkeypatch) -> None:
    """The table rows go into the page a few thousand at a time (never 50 MB at once): the same bytes, the same data."""
    import json

    import msgspec

    from llmcheck.plugins.reports import html_page

    result, _ = compared
    monkeypatch.setattr(html_page, "_ROWS_PER_PART", 7)  # many parts, a short last one
    page = html_page.render_html(result)
    data = html_page.report_data(result)
    assert len(data["rows"]) > 3 * 7
    head, _, tail = (
        html_page.resources.files(html_page.__package__)
        .joinpath(html_page.TEMPLATE_NAME)
        .read_bytes()
        .partition(html_page.DATA_PLACEHOLDER.encode())
    )
    assert page == head + html_page._script_safe(msgspec.json.encode(data)) + tail
    embedded = page[len(head) : len(page) - len(tail)]
    assert json.loads(embedded)["rows"] == json.loads(json.dumps(data["rows"]))
