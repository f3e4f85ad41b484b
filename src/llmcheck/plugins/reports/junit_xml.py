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
from xml.sax.saxutils import escape

from llmcheck.plugin_api import (
    VERDICT_ERROR,
    VERDICT_FAIL,
    VERDICT_WARN,
    ComparisonRow,
    atomic_write_text,
    carried_origins,
    divergence_line,
    in_golden_order,
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


def _cases_and_carriers(result: CompareResult) -> tuple[list[ComparisonRow], dict[int, list[ComparisonRow]], int]:
    """Return the rows that are test cases in golden order, the rows each one's failure is carried by, and how many carry one."""
    origins = carried_origins(result.rows)
    carriers: dict[int, list[ComparisonRow]] = {}
    cases = []
    for row in in_golden_order(result.rows):
        origin = origins.get(row.index)
        if origin is None:
            cases.append(row)
        else:
            carriers.setdefault(origin.index, []).append(row)
    return cases, carriers, len(origins)


def _suites(
    result: CompareResult, case_count: int, carried_count: int
) -> tuple[ElementTree.Element, ElementTree.Element]:
    """Return the ``<testsuites>`` element, with its suite and the suite's properties but no test case, and the suite."""
    counts = result.counts()
    totals = {
        "tests": str(case_count),
        "failures": str(counts["failures"] - carried_count),
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
        ("carried_failures", carried_count),
        ("unmatched_golden", counts["unmatched_golden"]),
        ("unmatched_my", counts["unmatched_my"]),
        ("culprit", result.culprit.key.label() if result.culprit is not None else ""),
    ):
        ElementTree.SubElement(properties, "property", name=name, value=_text(value))
    return suites, suite


def junit_document(result: CompareResult) -> ElementTree.Element:
    """Return the ``<testsuites>`` element of a compare: one suite, one case per pair but the rows carrying another's failure."""
    cases, carriers, carried_count = _cases_and_carriers(result)
    suites, suite = _suites(result, len(cases), carried_count)
    suite.extend(_testcase(row, carriers.get(row.index, ())) for row in cases)
    return suites


#: Stands in the serialized suite for its test cases, until they are written in its place.
_CASES_STAND_IN = "llmcheck-test-cases"
#: What ElementTree escapes in an attribute value (besides ``&``, done first), and what it writes instead.
_ATTRIBUTE_ENTITIES = {'"': "&quot;", "\r": "&#13;", "\n": "&#10;", "\t": "&#09;"}
#: A text needing more than to be written as it is in an attribute: escaping, or characters XML cannot hold.
_NOT_PLAIN_ATTRIBUTE = re.compile('[&<>"\r\n\t\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]')
#: The indentation ``ElementTree.indent`` gives a test case: the third level.
_CASE_LEVEL = 2
_CASE_SEPARATOR = "\n" + "  " * _CASE_LEVEL
#: The verdicts whose test case holds a child element (:func:`_testcase`): a failure, an error, a warning.
_CASES_WITH_A_CHILD = frozenset({VERDICT_FAIL, VERDICT_ERROR, VERDICT_WARN})


def _attribute_values(values: list[str]) -> list[str]:
    """Return each text as ElementTree writes it in an attribute: characters XML cannot hold replaced, then escaped.

    All of them are looked at at once: names and labels rarely need either.
    """
    if _NOT_PLAIN_ATTRIBUTE.search("".join(values)) is None:
        return values
    return [escape(_text(value), _ATTRIBUTE_ENTITIES) for value in values]


def _cases_text(cases: list[ComparisonRow], carriers: dict[int, list[ComparisonRow]]) -> str:
    """Return the test cases as ElementTree writes them in the indented document, one after the other.

    A 10**5-pair compare passes nearly all of them: a passing case is one empty element,
    written here from its two attribute values; ElementTree built and wrote three objects
    per case, and walked them all once more for namespaces first. A case with a child (a
    failure, an error, a warning) is built as :func:`_testcase` builds it and written by
    ElementTree.
    """
    keys = [row.golden.key for row in cases]
    class_names = _attribute_values([key.name for key in keys])
    names = _attribute_values([key.label() for key in keys])
    texts = [
        f'<testcase classname="{class_name}" name="{name}" time="0" />' for class_name, name in zip(class_names, names)
    ]
    for position, row in enumerate(cases):
        if row.verdict in _CASES_WITH_A_CHILD:
            case = _testcase(row, carriers.get(row.index, ()))
            ElementTree.indent(case, level=_CASE_LEVEL)
            texts[position] = ElementTree.tostring(case, encoding="unicode")
    return _CASE_SEPARATOR.join(texts)


def write_junit(result: CompareResult, path: Path) -> None:
    """Write junit.xml (UTF-8, with the XML declaration CI parsers expect): :func:`junit_document`, indented.

    The suite is serialized by ElementTree with one stand-in for its cases, which
    :func:`_cases_text` writes in its place.
    """
    cases, carriers, carried_count = _cases_and_carriers(result)
    suites, suite = _suites(result, len(cases), carried_count)
    if cases:
        ElementTree.SubElement(suite, _CASES_STAND_IN)
    ElementTree.indent(suites)
    text = ElementTree.tostring(suites, encoding="unicode")
    if cases:
        text = text.replace(f"<{_CASES_STAND_IN} />", _cases_text(cases, carriers), 1)
    atomic_write_text(path, '<?xml version="1.0" encoding="UTF-8"?>\n' + text + "\n")
