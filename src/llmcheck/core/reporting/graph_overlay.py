"""``export model-explorer``: a compare's per-node verdicts laid over the model graph.

Why: the report lists pairs in execution order; on a large model the place where the error
enters is easier to see on the graph. Google's Model Explorer colours a graph's nodes from
*node data* files (``{graph id: {"results": {node id: {"value": number}}, ...}}``); Netron
shows a node's ``doc_string`` and ``metadata_props``. This writes both from a compare folder:
three node-data files (error, verdict, growth) keyed to the ONNX graph llmcheck already writes
(the torch capture's ``model.onnx``, node names are module paths; ``export onnx``'s topology
ONNX for ATB), and a copy of that ONNX with the same values on each node.

A node's values come from its output pairs (its input pairs when it has none): the worst
verdict, the largest error and the largest finite growth. A growth that is infinite (the
error appeared where the feeder had none: introduced here) is left out of the growth data,
whose values must be numbers; the verdict data still marks the node.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmcheck.core.dumps.atomic_files import atomic_output, atomic_write_text
from llmcheck.core.dumps.kept_files import EMPTY_FILE, JSON_FILE, ONNX_MODEL, check_replaceable
from llmcheck.core.errors import DumpFormatError, DumpNotFoundError, UsageError
from llmcheck.core.records import VERDICT_ERROR, VERDICT_FAIL, VERDICT_PASS, VERDICT_WARN
from llmcheck.core.reporting.report import CSV_NAME, SUMMARY_NAME

log = logging.getLogger("llmcheck.export")

#: Verdicts as the numbers Model Explorer colours (node data values must be numbers).
VERDICT_CODES = {VERDICT_PASS: 0, VERDICT_WARN: 1, VERDICT_FAIL: 2, VERDICT_ERROR: 3}
_VERDICT_COLOURS = ((0, "#a5d6a7"), (1, "#fff176"), (2, "#ef5350"), (3, "#b0bec5"))
_WHITE_TO_RED = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#e53935"}]
NODE_DATA_FILES = {
    "error": "node_data_error.json",
    "verdict": "node_data_verdict.json",
    "growth": "node_data_growth.json",
}
#: The cmp_report.csv columns the overlay needs: a row's record (name, call), side and verdict.
REPORT_COLUMNS = ("name", "io", "call_index", "verdict")
META_PREFIX = "llmcheck."
#: Node metadata property naming the records a node stands for, where that is not the node's name
#: (ATB: nodes are named by opName, records by op id). Exporters that know it write it.
RECORD_NAME_KEY = META_PREFIX + "record"


@dataclass
class NodeOverlay:
    """What the compare says about one graph node: its worst verdict, largest error and growth."""

    verdict: str = VERDICT_PASS
    error: float | None = None
    growth: float | None = None
    attribution: str = ""
    pairs: int = 0

    def as_metadata(self) -> dict[str, str]:
        """Return the values as ONNX metadata properties (strings, Netron shows them on the node)."""
        meta = {
            "verdict": self.verdict,
            "error": _text(self.error),
            "growth": _text(self.growth),
            "attribution": self.attribution,
            "pairs": str(self.pairs),
        }
        return {META_PREFIX + key: value for key, value in meta.items()}


@dataclass
class GraphOverlay:
    """The files ``export model-explorer`` wrote, and how many graph nodes got values."""

    graph: Path
    annotated_onnx: Path
    node_data: dict[str, Path]
    graph_id: str
    nodes: dict[str, NodeOverlay] = field(default_factory=dict)
    graph_nodes: int = 0


#: Significant digits of the values in a node's metadata, which a program reads back as numbers.
METADATA_DIGITS = 6
#: Significant digits of the values in a node's doc string line, which a person reads in Netron: three, as in
#: the compare's own messages, so that the last digits a library version or a CPU's kernels leave in a float
#: (a 5 % error read as 0.0499999 on one machine, 0.05 on another) never change the text.
SHOWN_DIGITS = 3


def _text(value: float | None, digits: int = METADATA_DIGITS) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def _number(cell: str | None) -> float | None:
    try:
        value = float(cell) if cell not in (None, "") else None
    except ValueError:
        return None
    return value


def read_compare_folder(compare_dir: Path) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Return summary.json and the checked rows of cmp_report.csv of an ``llmcheck compare -o`` folder."""
    if not compare_dir.is_dir():
        raise DumpNotFoundError(
            "is not a folder", where=compare_dir, hint="give the folder `llmcheck compare -o` wrote"
        )
    summary_path, csv_path = compare_dir / SUMMARY_NAME, compare_dir / CSV_NAME
    for needed in (summary_path, csv_path):
        if not needed.is_file():
            raise DumpNotFoundError(
                f"no {needed.name}: not a compare folder",
                where=compare_dir,
                hint="give the folder `llmcheck compare -o` wrote",
            )
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DumpFormatError(f"cannot be read as JSON: {exc}", where=summary_path) from None
    if not isinstance(summary, dict) or summary.get("format") != "llmcheck-compare-summary":
        raise DumpFormatError(
            "is not an llmcheck compare summary", where=summary_path, hint="give the folder `llmcheck compare -o` wrote"
        )
    counts = summary.get("counts")
    pairs = counts.get("pairs") if isinstance(counts, dict) else None
    if not isinstance(pairs, int) or isinstance(pairs, bool):
        raise DumpFormatError(
            "has no pair count (counts.pairs)",
            where=summary_path,
            hint="copy the compare folder again, or rerun `llmcheck compare`",
        )
    return summary, read_report_rows(csv_path, pairs)


def read_report_rows(csv_path: Path, pairs: int) -> list[dict[str, str]]:
    """Return the rows of cmp_report.csv, checked whole against the ``pairs`` that summary.json counts.

    Why so strict: a report cut short (an interrupted copy) or edited by hand would otherwise
    draw a graph with nodes silently missing, or coloured pass where the report says nothing.
    A report the compare wrote has the overlay's columns, one row per pair, a known verdict
    in every row and a line end after its last row.
    """
    again = "copy the compare folder again, or rerun `llmcheck compare`"
    try:
        with csv_path.open("rb") as raw:
            size_bytes = raw.seek(0, 2)
            raw.seek(max(size_bytes - 1, 0))
            ends_with_line_end = raw.read(1) == b"\n"
        with csv_path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            numbered_rows = [(reader.line_num, fields) for fields in reader]
            last_line = reader.line_num
    except UnicodeDecodeError as exc:
        raise DumpFormatError(
            "is not UTF-8 text", where=csv_path, offset=exc.start, hint="give the folder `llmcheck compare -o` wrote"
        ) from None
    except (OSError, csv.Error) as exc:
        raise DumpFormatError(f"cannot be read as CSV: {exc}", where=csv_path, hint=again) from None
    if size_bytes == 0:
        raise DumpFormatError("is empty", where=csv_path, hint=again)
    if not ends_with_line_end:
        raise DumpFormatError(
            f"is cut short: line {last_line}, its last, ends mid-row; it holds "
            f"{max(len(numbered_rows) - 1, 0)} whole rows of the {pairs} pairs summary.json counts",
            where=csv_path,
            hint=again,
        )
    missing = [column for column in REPORT_COLUMNS if column not in header]
    if missing:
        raise DumpFormatError(
            f"lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}: not an llmcheck compare report",
            where=csv_path,
            hint="give the folder `llmcheck compare -o` wrote",
        )
    verdict_column = header.index("verdict")
    for line, fields in numbered_rows:
        if len(fields) != len(header):
            raise DumpFormatError(
                f"line {line} has {len(fields)} fields, the header {len(header)}", where=csv_path, hint=again
            )
        if fields[verdict_column] not in VERDICT_CODES:
            raise DumpFormatError(
                f"line {line} has the verdict {fields[verdict_column]!r}, which is none of {', '.join(VERDICT_CODES)}",
                where=csv_path,
                hint=again,
            )
    if len(numbered_rows) != pairs:
        raise DumpFormatError(
            f"holds {len(numbered_rows)} rows, but summary.json counts {pairs} pairs",
            where=csv_path,
            hint=again,
        )
    return [dict(zip(header, fields)) for _, fields in numbered_rows]


def _dump_path(recorded: str, compare_dir: Path) -> Path | None:
    """Return where a dump path summary.json records is found, or ``None`` when it is nowhere."""
    path = Path(recorded)
    # compare records the path as given: relative to where it ran, usually beside or above the folder
    for candidate in (path, compare_dir.parent / path, compare_dir / path):
        if candidate.exists():
            return candidate
    return None


def find_graph(summary: dict[str, Any], compare_dir: Path) -> Path:
    """Return the ONNX graph of the compared dumps: the golden dump's, else the my-dump's."""
    searched: list[str] = []
    not_found: list[str] = []
    for side in ("golden", "my"):
        recorded = (summary.get(side) or {}).get("path")
        if not recorded:
            continue
        dump = _dump_path(str(recorded), compare_dir)
        if dump is None:
            not_found.append(f"the {side} dump {recorded}")
            continue
        searched.append(str(dump))
        if dump.is_file() and dump.suffix == ".onnx":
            return dump
        root = dump if dump.is_dir() else dump.parent
        if (root / "model.onnx").is_file():
            return root / "model.onnx"
        found = sorted(root.rglob("*.onnx"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise DumpNotFoundError(
                f"holds {len(found)} ONNX graphs", where=root, hint="name the one to draw with --graph"
            )
    if not_found:
        # the paths are as compare was given them: a folder copied elsewhere, or a run from another folder
        held = f"; {', '.join(searched)} holds no ONNX graph" if searched else ""
        looked_from = dict.fromkeys(
            str(folder) for folder in (Path.cwd(), compare_dir.parent.resolve(), compare_dir.resolve())
        )
        raise DumpNotFoundError(
            f"{' and '.join(not_found)} it names {'are' if len(not_found) > 1 else 'is'} not found "
            f"relative to {', '.join(looked_from)}{held}",
            where=compare_dir / SUMMARY_NAME,
            hint="run from the folder `llmcheck compare` ran in, or give the graph with --graph",
        )
    where = ", ".join(searched) or compare_dir / SUMMARY_NAME
    raise DumpNotFoundError(
        "no ONNX graph in the compared dumps: export model-explorer draws the graph a torch dump holds only "
        "when made with --type onnx",
        where=where,
        hint="dump the golden run again with llmcheck dump --type tensor onnx (DumpConfig(export_onnx=True)) "
        "and compare again; for ATB run `llmcheck export onnx` on its topology; or give the graph with --graph",
    )


def node_overlays(rows: list[dict[str, str]], node_of_record: dict[str, str]) -> dict[str, NodeOverlay]:
    """Return the overlay of every graph node that has pairs, keyed by node name.

    ``node_of_record`` maps a record name to its node's name. A row belongs to record
    ``name`` (its first call) or ``name[k]`` (call ``k``), as the torch capture names the
    graph's nodes.
    """
    by_node: dict[str, dict[str, list[dict[str, str]]]] = {}
    for row in rows:
        call = int(_number(row.get("call_index")) or 0)
        node = node_of_record.get(f"{row['name']}[{call}]" if call else row["name"])
        if node is not None:
            by_node.setdefault(node, {}).setdefault(row.get("io", ""), []).append(row)
    overlays = {}
    for node, by_io in by_node.items():
        chosen = by_io.get("output") or next(iter(by_io.values()))
        overlay = NodeOverlay(pairs=len(chosen))
        for row in chosen:
            verdict = row.get("verdict", "")
            if VERDICT_CODES.get(verdict, -1) > VERDICT_CODES[overlay.verdict]:
                overlay.verdict = verdict
                overlay.attribution = row.get("attribution", "")
            error, growth = _number(row.get("error")), _number(row.get("growth"))
            if error is not None and math.isfinite(error) and (overlay.error is None or error > overlay.error):
                overlay.error = error
            if growth is not None and math.isfinite(growth) and (overlay.growth is None or growth > overlay.growth):
                overlay.growth = growth
            if growth is not None and math.isinf(growth) and row.get("attribution") == "introduced":
                overlay.attribution = "introduced"
        overlays[node] = overlay
    return overlays


def node_data(graph_id: str, overlays: dict[str, NodeOverlay]) -> dict[str, dict[str, Any]]:
    """Return Model Explorer's node data for the error, verdict and growth, each as one file's content."""
    errors = {node: {"value": o.error} for node, o in overlays.items() if o.error is not None}
    verdicts = {node: {"value": VERDICT_CODES.get(o.verdict, 3)} for node, o in overlays.items()}
    growths = {node: {"value": o.growth} for node, o in overlays.items() if o.growth is not None}
    thresholds = [{"value": value, "bgColor": colour} for value, colour in _VERDICT_COLOURS]
    return {
        "error": {graph_id: {"name": "llmcheck error", "results": errors, "gradient": _WHITE_TO_RED}},
        "verdict": {
            graph_id: {
                "name": "llmcheck verdict (0 pass, 1 warn, 2 fail, 3 error)",
                "results": verdicts,
                "thresholds": thresholds,
            }
        },
        "growth": {graph_id: {"name": "llmcheck growth", "results": growths, "gradient": _WHITE_TO_RED}},
    }


def export_graph_overlay(compare_dir: Path, output_dir: Path | None = None, graph: Path | None = None) -> GraphOverlay:
    """Write the node data files and the annotated ONNX for ``compare_dir``; return what was written."""
    import onnx

    summary, rows = read_compare_folder(compare_dir)
    if graph is not None and not graph.is_file():
        raise DumpNotFoundError("no such ONNX graph", where=graph, hint="check the --graph path")
    graph = graph if graph is not None else find_graph(summary, compare_dir)
    try:
        model = onnx.load(str(graph))
    except Exception as exc:  # onnx raises DecodeError, OSError, ... for a file that is not a model
        raise DumpFormatError(f"cannot be read as ONNX: {exc}", where=graph) from None
    node_of_record = {}
    for node in model.graph.node:
        if node.name:
            recorded = {prop.key: prop.value for prop in node.metadata_props}.get(RECORD_NAME_KEY)
            node_of_record[recorded or node.name] = node.name
    if not node_of_record:
        raise DumpFormatError("the graph has no named nodes to lay the compare over", where=graph)
    overlays = node_overlays(rows, node_of_record)
    graph_id = model.graph.name or "<main>"  # the id Model Explorer's ONNX adapter gives the main graph
    output_dir = output_dir if output_dir is not None else compare_dir / "model_explorer"
    output_dir.mkdir(parents=True, exist_ok=True)
    annotated = output_dir / graph.name
    if annotated.resolve() == graph.resolve():
        raise UsageError("would overwrite the graph it reads", where=annotated, hint="write elsewhere with -o")
    _check_outputs(annotated, [output_dir / name for name in NODE_DATA_FILES.values()])
    for node in model.graph.node:
        overlay = overlays.get(node.name)
        if overlay is None:
            continue
        # an annotated copy given again as --graph: its old values are replaced, not repeated
        kept = [
            (prop.key, prop.value)
            for prop in node.metadata_props
            if not prop.key.startswith(META_PREFIX) or prop.key == RECORD_NAME_KEY
        ]
        del node.metadata_props[:]
        for key, value in [*kept, *overlay.as_metadata().items()]:
            node.metadata_props.add(key=key, value=value)
        own_doc = "\n".join(line for line in node.doc_string.splitlines() if not line.startswith("llmcheck: "))
        summary_line = (
            f"llmcheck: {overlay.verdict}, error {_text(overlay.error, SHOWN_DIGITS) or '-'}, growth "
            f"{_text(overlay.growth, SHOWN_DIGITS) or '-'}{', ' + overlay.attribution if overlay.attribution else ''}"
        )
        node.doc_string = f"{own_doc}\n{summary_line}" if own_doc else summary_line
    with atomic_output(annotated, "wb") as handle:
        handle.write(model.SerializeToString())
    written = {}
    for quantity, content in node_data(graph_id, overlays).items():
        written[quantity] = output_dir / NODE_DATA_FILES[quantity]
        atomic_write_text(written[quantity], json.dumps(content, indent=2) + "\n")
    return GraphOverlay(
        graph=graph,
        annotated_onnx=annotated,
        node_data=written,
        graph_id=graph_id,
        nodes=overlays,
        graph_nodes=len(node_of_record),
    )


def _check_outputs(annotated: Path, node_data_files: list[Path]) -> None:
    """Refuse to write over a file of the user's; say which earlier views are replaced.

    Before anything is written, so a refusal leaves the folder as it was.
    """
    replaced = []
    for path, kind in [(annotated, ONNX_MODEL), *((path, JSON_FILE) for path in node_data_files)]:
        if path.exists() and check_replaceable(path, (kind, EMPTY_FILE), f"the {path.name} view") != EMPTY_FILE:
            replaced.append(path.name)
    if replaced:
        log.warning("%s: replacing the previous views (%s)", annotated.parent, ", ".join(replaced))
