"""Built-in plugin 'reports': the files ``llmcheck compare`` writes, registered as reporters.

Through the same hook a third-party package uses (:func:`~llmcheck.core.hookspecs.llmcheck_register_reporters`):

* ``csv`` -- ``cmp_report.csv``, one row per pair, the seed tool's 24 columns first (default);
* ``summary`` -- ``summary.json``, counts, first divergence, culprit, thresholds (default);
* ``pairs`` -- ``pairs.json``, every pair with its rule and the unmatched records; an edited
  copy is a ``--mapping`` (default);
* ``html`` -- ``report.html``, the self-contained page (default);
* ``junit`` -- ``junit.xml``, one test case per pair, so a CI server shows precision
  regressions as failing tests (``compare --report junit``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from llmcheck.plugin_api import (
    CSV_NAME,
    HTML_NAME,
    PAIRS_NAME,
    SUMMARY_NAME,
    Reporter,
    atomic_write_text,
    hookimpl,
    json_safe,
    write_pairs_json,
)
from llmcheck.plugins.reports.csv_table import write_csv
from llmcheck.plugins.reports.html_page import write_html
from llmcheck.plugins.reports.junit_xml import JUNIT_NAME, write_junit

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.plugin_api import CompareResult


def write_summary(result: CompareResult, path: Path) -> None:
    """Write summary.json (strict JSON: non-finite numbers as strings)."""
    atomic_write_text(path, json.dumps(json_safe(result.summary()), indent=2) + "\n")


def _write_pairs(result: CompareResult, path: Path) -> None:
    """Write pairs.json of the compare's pairing."""
    write_pairs_json(path, result.pairing, result.golden, result.my)


@hookimpl
def llmcheck_register_reporters(register: Callable[[Reporter], None]) -> None:
    register(
        Reporter(
            "csv", "one row per pair: the seed tool's 24 columns, then llmcheck's", CSV_NAME, write_csv, default=True
        )
    )
    register(
        Reporter(
            "summary",
            "counts, first divergence, culprit and thresholds as JSON",
            SUMMARY_NAME,
            write_summary,
            default=True,
        )
    )
    register(
        Reporter(
            "pairs",
            "every pair with its rule, and the unmatched records (edit it, pass it as --mapping)",
            PAIRS_NAME,
            _write_pairs,
            default=True,
        )
    )
    register(Reporter("html", "the self-contained report page", HTML_NAME, write_html, default=True))
    register(
        Reporter(
            "junit",
            "JUnit XML, one test case per pair: CI servers show failing pairs as failing tests",
            JUNIT_NAME,
            write_junit,
        )
    )
