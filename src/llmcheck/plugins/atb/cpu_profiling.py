"""ATB cpu profiling (``--type cpu_profiling``): the probe's text lines turned into one CSV per execution.

The probe appends ``[<opName>]:<key>:<value>, <key>:<value>, ...`` lines to
``cpu_profiling/{pid}/operation_statistic_{executeCount}.txt``: *setup* lines (they carry
``runnerSetupTime``) and *execute* lines (they carry ``kernelExecuteTime``), times in µs.
After the run each file becomes ``operation_statistic_{executeCount}.csv`` with a column
``opname`` and the sorted ``execute_<key>`` / ``setup_<key>`` columns, one row per op, the
last setup and execute line of each op kept -- as the seed tool does. Unlike it, the text
file is kept next to the CSV: the raw record is never deleted.
"""

from __future__ import annotations

import csv
import io
import logging
import re
from pathlib import Path

from llmcheck.plugin_api import DumpFormatError, LlmcheckError, read_dump_file

log = logging.getLogger("llmcheck.atb")

TEXT_NAME = re.compile(r"^operation_statistic_(\d+)\.txt$")
_LINE = re.compile(r"^\[([A-Za-z0-9_]*)\]:(.*)$")
EXECUTE_MARKER = "kernelExecuteTime"
SETUP_MARKER = "runnerSetupTime"


def parse_cpu_profiling_text(path: Path, dump_root: Path | None = None) -> dict[str, dict[str, str]]:
    """Return ``{opname: {"execute_<key>"|"setup_<key>": value}}`` of one probe text file, ops in first-seen order.

    ``dump_root`` is the dump the file belongs to (``None``: a file named alone).
    """
    path = Path(path)
    try:
        text = read_dump_file(path, dump_root).decode("utf-8")
    except FileNotFoundError as exc:
        raise DumpFormatError("no such cpu profiling file", where=path, hint="check the path") from exc
    except UnicodeDecodeError as exc:
        raise DumpFormatError("cpu profiling file is not UTF-8 text", where=path, offset=exc.start) from None
    latest: dict[str, dict[str, str]] = {}
    offset = 0
    for line in text.splitlines(keepends=True):
        line_offset, offset = offset, offset + len(line.encode())
        match = _LINE.match(line.strip())
        if match is None:
            continue  # the probe's file holds only these lines; anything else is a log line left by a crash
        op_name, body = match.groups()
        statistics: dict[str, str] = {}
        for pair in body.split(","):
            if not pair.strip():
                continue
            key, separator, value = pair.strip().partition(":")
            if not separator or not key:
                raise DumpFormatError(
                    f"statistic {pair.strip()!r} of op {op_name} is not 'key:value'", where=path, offset=line_offset
                )
            statistics[key.strip()] = value.strip()
        if EXECUTE_MARKER in statistics:
            prefix = "execute_"
        elif SETUP_MARKER in statistics:
            prefix = "setup_"
        else:
            continue
        columns = latest.setdefault(op_name, {})
        for stale in [name for name in columns if name.startswith(prefix)]:
            del columns[stale]  # the last line of a kind wins, whole
        columns.update({prefix + key: value for key, value in statistics.items()})
    return latest


def cpu_profiling_csv_text(by_op: dict[str, dict[str, str]]) -> str:
    """Return the CSV text (``opname`` then sorted ``execute_*``/``setup_*`` columns) for parsed profiling."""
    columns = sorted({name for statistics in by_op.values() for name in statistics})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["opname", *columns])
    for op_name, statistics in by_op.items():
        writer.writerow([op_name, *(statistics.get(name, "") for name in columns)])
    return buffer.getvalue()


def convert_cpu_profiling(folder: Path) -> list[Path]:
    """Write ``operation_statistic_{n}.csv`` beside every ``.txt`` under ``folder`` and return the CSVs written.

    A CSV that already exists is left as it is (never overwritten) and not returned.
    """
    written = []
    for text_path in sorted(Path(folder).rglob("operation_statistic_*.txt")):
        if not TEXT_NAME.match(text_path.name):
            continue
        csv_path = text_path.with_suffix(".csv")
        content = cpu_profiling_csv_text(parse_cpu_profiling_text(text_path, folder))
        try:
            with open(csv_path, "x", encoding="utf-8", newline="") as handle:
                handle.write(content)
        except FileExistsError:
            log.info("%s exists already; left as it is", csv_path)
            continue
        except OSError as exc:
            raise LlmcheckError(f"cannot write the cpu profiling CSV: {exc.strerror}", where=csv_path) from exc
        csv_path.chmod(0o640)
        written.append(csv_path)
    return written


def read_cpu_profiling_csv(path: Path, dump_root: Path | None = None) -> dict[str, dict[str, float]]:
    """Return ``{opname: {column: µs or count}}`` of a converted CSV (empty cells left out)."""
    path = Path(path)
    try:
        text = read_dump_file(path, dump_root).decode("utf-8")
    except FileNotFoundError as exc:
        raise DumpFormatError("no such cpu profiling CSV", where=path, hint="check the path") from exc
    except UnicodeDecodeError as exc:
        raise DumpFormatError("cpu profiling CSV is not UTF-8 text", where=path, offset=exc.start) from None
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    by_op: dict[str, dict[str, float]] = {}
    for row_number, row in enumerate(rows, start=2):
        op_name = row.get("opname")
        if not op_name:
            raise DumpFormatError(f"row {row_number} has no opname", where=path)
        values: dict[str, float] = {}
        for column, cell in row.items():
            if column == "opname" or cell in ("", None):
                continue
            try:
                values[column] = float(cell)
            except (TypeError, ValueError):
                raise DumpFormatError(
                    f"row {row_number} column {column} is not a number: {cell!r}", where=path
                ) from None
        by_op[op_name] = values
    return by_op
