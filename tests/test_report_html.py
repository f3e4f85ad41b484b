"""report.html renders in a real browser (headless Chromium): summary, charts, table, no console error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from compare_runs import capture_run, wrong_rmsnorm_epsilon
from headless_browser import render
from llmcheck.core.compare import compare_dumps
from llmcheck.core.plugins import get_plugins
from llmcheck.core.report import write_reports

pytestmark = pytest.mark.slow  # each test starts a browser (a few seconds)

def body_attributes(dom: str) -> str:
    """Return the attributes of the rendered page's <body> tag (the page marks success or error there)."""
    match = re.search(r"<body([^>]*)>", dom)
    assert match, dom[:500]
    return match.group(1)


def console_errors(browser_log: str) -> list[str]:
    """Return the console messages and uncaught errors in a Chromium log."""
    return [line for line in browser_log.splitlines() if "CONSOLE" in line or "Uncaught" in line]


@pytest.fixture(scope="module")
def report_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0)
    input_ids = torch.tensor([[5, 9, 200, 31, 7, 64]])
    folder = tmp_path_factory.mktemp("html")
    golden = capture_run(model, input_ids, folder / "golden")
    with wrong_rmsnorm_epsilon(model, "model.layers.1.input_layernorm", 0.5):
        my = capture_run(model, input_ids, folder / "my")
    plugins = get_plugins()
    result = compare_dumps(plugins.load_tensors(golden), plugins.load_tensors(my), workers=1)
    return write_reports(result, folder / "report")["html"]


def test_report_is_one_self_contained_file(report_page: Path) -> None:
    html = report_page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched from a network
    assert "<script src" not in html and "<link" not in html


def test_report_renders_in_headless_chromium_without_console_errors(report_page: Path) -> None:
    dom, browser_log = render(report_page)
    assert console_errors(browser_log) == []
    assert 'data-rendered="ok"' in body_attributes(dom) and "data-render-error" not in body_attributes(dom)
    rows = re.findall(r'<tr class="row-(\w+)', dom)
    assert len(rows) == len(get_plugins().load_tensors(next((report_page.parent.parent / "golden").iterdir())).records)
    assert rows.count("fail") > 0 and rows.count("pass") > 0  # failing rows carry their highlight class
    assert dom.count('<div class="chart">') == 9 and dom.count('class="series"') == 9  # one curve per metric
    assert "first introduced divergence: </span>model.layers.1.input_layernorm step 0 output.0" in dom


def test_the_console_check_catches_a_broken_page(report_page: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text(report_page.read_text().replace('"use strict";', '"use strict"; notDefinedAnywhere();', 1))
    dom, browser_log = render(broken)
    assert 'data-rendered="ok"' not in body_attributes(dom)
    assert any("notDefinedAnywhere" in line for line in console_errors(browser_log))
