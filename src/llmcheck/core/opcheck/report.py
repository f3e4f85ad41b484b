"""opcheck's report: ``opcheck_result.csv`` (and ``.xlsx`` when openpyxl is installed) and the terminal summary.

The CSV keeps the original tool's columns in its order -- ``op_id, op_name, op_param,
tensor_path, out_tensor_id, precision_standard, precision_result, rel_precision_rate(%),
max_rel_error``, the ``-metric`` columns, ``fail_reason`` -- so scripts that read its
reports keep working, then adds ``step``, ``call_index`` and ``dtype``. Files are written
to a temporary name and renamed, so a report on disk is always complete.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmcheck.core.dumps.atomic_files import atomic_output, atomic_write_with
from llmcheck.core.errors import LlmcheckError
from llmcheck.core.opcheck.case_check import ADDITION_FAILED, FAILED, PASS, UNSUPPORTED, OpcheckRow

CSV_NAME = "opcheck_result.csv"
XLSX_NAME = "opcheck_result.xlsx"
#: Spreadsheet programs run a cell starting with one of these as a formula.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: Failed rows listed in the terminal summary.
SUMMARY_ROWS = 15


def columns(precision_metrics: Sequence[str]) -> list[str]:
    """Return the report's column names for the ``-metric`` choices, in the original tool's order."""
    names = [
        "op_id",
        "op_name",
        "op_param",
        "tensor_path",
        "out_tensor_id",
        "precision_standard",
        "precision_result",
        "rel_precision_rate(%)",
        "max_rel_error",
    ]
    if "abs" in precision_metrics:
        names += ["abs_precision_rate(%)", "max_abs_error"]
    if "cos_sim" in precision_metrics:
        names.append("cosine_similarity")
    if "kl" in precision_metrics:
        names.append("kl_divergence")
    return [*names, "fail_reason", "step", "call_index", "dtype"]


def row_cells(row: OpcheckRow, precision_metrics: Sequence[str]) -> list[Any]:
    """Return one row's cells in :func:`columns` order (numbers as numbers, ``None`` where not measured)."""
    cells: list[Any] = [
        row.op_id,
        row.op_name,
        row.op_param,
        row.tensor_path,
        row.out_tensor_id,
        row.precision_standard,
        row.precision_result,
        row.rel_precision_rate,
        row.max_rel_error,
    ]
    if "abs" in precision_metrics:
        cells += [row.abs_precision_rate, row.max_abs_error]
    if "cos_sim" in precision_metrics:
        cells.append(row.cosine_similarity)
    if "kl" in precision_metrics:
        cells.append(row.kl_divergence)
    return [_guarded(cell) for cell in [*cells, row.fail_reason, row.step, row.call_index, row.dtype]]


def _guarded(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else value


def write_reports(rows: Sequence[OpcheckRow], output_dir: Path, precision_metrics: Sequence[str]) -> list[Path]:
    """Write the CSV (and the XLSX when openpyxl is installed) into ``output_dir`` and return the paths."""
    output_dir = Path(output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LlmcheckError(f"cannot create the output folder: {exc.strerror}", where=output_dir) from exc
    header = columns(precision_metrics)
    table = [row_cells(row, precision_metrics) for row in rows]
    written = [_write_csv(output_dir / CSV_NAME, header, table)]
    try:
        import openpyxl  # noqa: F401
    except ImportError:
        return written
    written.append(_write_xlsx(output_dir / XLSX_NAME, header, table, rows))
    return written


def _write_csv(path: Path, header: list[str], table: list[list[Any]]) -> Path:
    with atomic_output(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows([_csv_cell(cell) for cell in cells] for cells in table)
    return path


def _write_xlsx(path: Path, header: list[str], table: list[list[Any]], rows: Sequence[OpcheckRow]) -> Path:
    """Write sheets ``opcheck_result`` (checked outputs) and ``addition_failed_cases`` (the rest), as the original."""
    import openpyxl

    book = openpyxl.Workbook()
    checked = book.active
    checked.title = "opcheck_result"
    checked.append(header)
    not_checked = book.create_sheet("addition_failed_cases")
    not_checked.append(header)
    for row, cells in zip(rows, table):
        sheet = checked if row.precision_result in (PASS, FAILED) else not_checked
        sheet.append(cells)
    atomic_write_with(path, book.save)
    return path


def result_counts(rows: Sequence[OpcheckRow]) -> Counter[str]:
    """Return how many rows have each ``precision_result``."""
    return Counter(row.precision_result for row in rows)


def print_summary(rows: Sequence[OpcheckRow], written: Sequence[Path], elapsed_s: float) -> None:
    """Print the counts, the failed outputs, and the ops not checked grouped by type and reason."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    counts = result_counts(rows)
    ops = len({(row.op_id, row.step, row.call_index) for row in rows})
    console.print(
        f"[bold]opcheck[/bold]: {ops} ops, {counts[PASS] + counts[FAILED]} outputs checked in "
        f"{elapsed_s:.1f} s: [green]{counts[PASS]} passed[/green], [red]{counts[FAILED]} failed[/red], "
        f"{counts[ADDITION_FAILED]} could not be checked, {counts[UNSUPPORTED]} unsupported"
    )
    failed = [row for row in rows if row.precision_result == FAILED]
    if failed:
        table = Table(title=f"failed outputs ({len(failed)})")
        for name in ("op_id", "op type", "out", "standard", "rel rate %", "max rel err"):
            table.add_column(name, overflow="fold")
        for row in failed[:SUMMARY_ROWS]:
            # A torch op id is "{module}/{op type}": the type has its own column.
            table.add_row(
                row.op_id.removesuffix(f"/{row.op_name}"),
                row.op_name,
                row.out_tensor_id,
                row.precision_standard,
                "" if row.rel_precision_rate is None else f"{row.rel_precision_rate:.4f}",
                "" if row.max_rel_error is None else f"{row.max_rel_error:.3g}",
            )
        console.print(table)
        if len(failed) > SUMMARY_ROWS:
            console.print(f"... and {len(failed) - SUMMARY_ROWS} more in the report")
    not_checked = Counter(
        (row.op_name, row.precision_result, row.fail_reason)
        for row in rows
        if row.precision_result in (ADDITION_FAILED, UNSUPPORTED)
    )
    if not_checked:
        table = Table(title="ops not checked")
        for name in ("op type", "ops", "result", "reason"):
            table.add_column(name)
        for (op_name, result, reason), count in not_checked.most_common(SUMMARY_ROWS):
            table.add_row(op_name, str(count), result, reason)
        console.print(table)
        if len(not_checked) > SUMMARY_ROWS:
            console.print(f"... and {len(not_checked) - SUMMARY_ROWS} more kinds in the report")
    for path in written:
        console.print(f"llmcheck: wrote {path}")
