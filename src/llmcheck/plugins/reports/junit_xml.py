"""``junit.xml``: a compare as a JUnit test report, so CI servers show precision regressions as failing tests.

Why JUnit: Jenkins, GitLab, GitHub Actions and Azure all draw it without a plugin. One
test case per compared pair, in golden execution order: ``classname`` is the golden
record's name (the module or op path, how CI groups cases), ``name`` its label (call,
step, input/output, position). A ``fail`` pair carries a ``<failure>`` whose message names
the deciding metric against its threshold and the attribution; an ``error`` pair (it could
not be measured) an ``<error>`` with its reason; a ``warn`` pair passes with the warning in
``<system-out>``. The suite's ``tests``, ``failures`` and ``errors`` equal summary.json's
``pairs``, ``failures`` and ``errors``. Unmatched records are no test cases; the suite's
properties count them (``pairs.json`` lists them).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llmcheck.plugin_api import (
    VERDICT_ERROR,
    VERDICT_FAIL,
    VERDICT_WARN,
    ComparisonRow,
    atomic_write_text,
    carried_origins,
    divergence_line,
)

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.plugin_api import CompareResult

JUNIT_NAME = "junit.xml"
SUITE_NAME = "llmcheck compare"
#: Characters XML 1.0 cannot hold at all, even escaped (a record name read from a binary dump might).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: object) -> str:
    return _NOT_XML.sub("\ufffd", str(value))


def _details(row: ComparisonRow, carriers: Sequence[ComparisonRow] = ()) -> str:
    """Return the lines a CI page shows under a failing case: where, the rule that paired it, why, what carries it."""
    lines = [
        f"golden: {row.golden.key.label()} ({row.golden.dtype} {list(row.golden.shape)})",
        f"my: {row.my.key.label()} ({row.my.dtype} {list(row.my.shape)})",
        f"pairing rule: {row.rule}",
    ]
    lines += [
        f"{what}: {value}"
        for what, value in (("attribution", row.attribution), ("reason", row.reason), ("evidence", row.evidence))
        if value
    ]
    if carriers:
        lines.append(
            f"{len(carriers)} later failing {_rows(len(carriers))} carry this error on (not test cases of their own):"
        )
        lines += [f"  {divergence_line(carrier)}" for carrier in carriers]
    return "\n".join(lines)


def _rows(count: int) -> str:
    return "row" if count == 1 else "rows"


def _testcase(row: ComparisonRow, carriers: Sequence[ComparisonRow]) -> ElementTree.Element:
    case = ElementTree.Element(
        "testcase", classname=_text(row.golden.key.name), name=_text(row.golden.key.label()), time="0"
    )
    if row.verdict == VERDICT_FAIL:
        failure = ElementTree.SubElement(case, "failure", message=_text(divergence_line(row)), type="precision")
        failure.text = _text(_details(row, carriers))
    elif row.verdict == VERDICT_ERROR:
        error = ElementTree.SubElement(case, "error", message=_text(row.reason or "not measured"), type="unmeasurable")
        error.text = _text(_details(row))
    elif row.verdict == VERDICT_WARN:
        ElementTree.SubElement(case, "system-out").text = _text(f"warn: {divergence_line(row)}")
    return case


def junit_document(result: CompareResult) -> ElementTree.Element:
    """Return the ``<testsuites>`` element of a compare: one suite, one case per pair but the rows carrying another's failure."""
    counts = result.counts()
    origins = carried_origins(result.rows)
    carriers: dict[int, list[ComparisonRow]] = {}
    cases = []
    for row in sorted(result.rows, key=lambda row: row.golden.order):
        origin = origins.get(row.index)
        if origin is None:
            cases.append(row)
        else:
            carriers.setdefault(origin.index, []).append(row)
    totals = {
        "tests": str(len(cases)),
        "failures": str(counts["failures"] - len(origins)),
        "errors": str(counts["errors"]),
        "skipped": "0",
        "time": f"{result.elapsed_s:.3f}",
    }
    suites = ElementTree.Element("testsuites", {"name": SUITE_NAME, **totals})
    suite = ElementTree.SubElement(suites, "testsuite", {"name": SUITE_NAME, **totals})
    properties = ElementTree.SubElement(suite, "properties")
    for name, value in (
        ("golden", result.golden.root),
        ("golden_source", result.golden.source),
        ("my", result.my.root),
        ("my_source", result.my.source),
        ("failing_pairs", counts["failures"]),
        ("carried_failures", len(origins)),
        ("unmatched_golden", counts["unmatched_golden"]),
        ("unmatched_my", counts["unmatched_my"]),
        ("culprit", result.culprit.key.label() if result.culprit is not None else ""),
    ):
        ElementTree.SubElement(properties, "property", name=name, value=_text(value))
    suite.extend(_testcase(row, carriers.get(row.index, ())) for row in cases)
    return suites


def write_junit(result: CompareResult, path: Path) -> None:
    """Write junit.xml (UTF-8, with the XML declaration CI parsers expect)."""
    document = junit_document(result)
    ElementTree.indent(document)
    atomic_write_text(
        path, '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(document, encoding="unicode") + "\n"
    )
