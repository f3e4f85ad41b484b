"""The op and kernel CSVs (``operation_tensors_{n}.csv``, ``kernel_tensors_{n}.csv``): ``|``-separated, 21 columns.

One row per executed (non-graph) operation or kernel: its name ``Type_id``, its parameter
JSON, and for inputs and outputs the dtype names, format names and shapes (``;`` between
tensors, ``,`` between dims) plus the tensor file paths. ``--type op`` / ``--type kernel``
write them; the ONNX export takes tensor types and shapes from them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import DumpFormatError, read_dump_file
from llmcheck.plugins.atb.acl_dtypes import dtype_from_csv_name
from llmcheck.plugins.atb.op_names import split_op_name

OP_CSV_COLUMNS = (
    "CaseNum",
    "CaseName",
    "OpName",
    "OpParam",
    "InNum",
    "InDType",
    "InFormat",
    "InShape",
    "OutNum",
    "OutDType",
    "OutFormat",
    "OutShape",
    "DataGenType",
    "DataGenRange",
    "InTensorFile",
    "OutTensorFile",
    "TestType",
    "TestLevel",
    "FromModel",
    "SocVersion",
    "ExpectedError",
)
SEPARATOR = "|"


@dataclass(frozen=True, slots=True)
class CsvTensor:
    """One tensor of a CSV row: ATB dtype name, llmcheck dtype name (``None`` if unknown), format, shape, file."""

    atb_dtype: str
    dtype: str | None
    format: str
    shape: tuple[int, ...]
    file: str


@dataclass(frozen=True, slots=True)
class OpCsvRow:
    """One executed operation as the op CSV records it."""

    case_num: int
    op_name: str
    op_type: str
    op_id: str | None
    op_param: Mapping[str, Any]
    inputs: tuple[CsvTensor, ...]
    outputs: tuple[CsvTensor, ...]


def _split_list(text: str) -> list[str]:
    return text.split(";") if text.strip() else []


def _tensors(
    path: Path, offset: int, count: int, dtypes: str, formats: str, shapes: str, files: str, side: str
) -> tuple[CsvTensor, ...]:
    dtype_cells, format_cells, shape_cells = _split_list(dtypes), _split_list(formats), _split_list(shapes)
    file_cells = _split_list(files)
    if not (len(dtype_cells) == len(format_cells) == len(shape_cells) == count):
        raise DumpFormatError(
            f"{side}Num is {count} but the row lists {len(dtype_cells)} dtypes, "
            f"{len(format_cells)} formats, {len(shape_cells)} shapes",
            where=path,
            offset=offset,
        )
    tensors = []
    for index in range(count):
        shape_text = shape_cells[index].strip()
        try:
            shape = tuple(int(size) for size in shape_text.split(",")) if shape_text else ()
        except ValueError:
            raise DumpFormatError(
                f"{side}Shape {shape_text!r} is not comma-separated integers", where=path, offset=offset
            ) from None
        acl = dtype_from_csv_name(dtype_cells[index])
        tensors.append(
            CsvTensor(
                atb_dtype=dtype_cells[index].strip(),
                dtype=acl.torch_name if acl else None,
                format=format_cells[index].strip().lower(),
                shape=shape,
                file=file_cells[index].strip() if index < len(file_cells) else "",
            )
        )
    return tuple(tensors)


def read_op_csv(path: Path, dump_root: Path | None = None) -> list[OpCsvRow]:
    """Return the rows of an op or kernel CSV (of the dump at ``dump_root``, or named alone); a malformed row is an error naming its byte offset."""
    path = Path(path)
    try:
        text = read_dump_file(path, dump_root).decode("utf-8")
    except FileNotFoundError as exc:
        raise DumpFormatError("no such op CSV", where=path, hint="check the path given with -c/--csv-path") from exc
    except UnicodeDecodeError as exc:
        raise DumpFormatError("op CSV is not UTF-8 text", where=path, offset=exc.start) from None
    lines = text.splitlines(keepends=True)
    if not lines:
        raise DumpFormatError("op CSV is empty, expected the 21-column header", where=path, offset=0)
    header = lines[0].rstrip("\r\n").split(SEPARATOR)
    if tuple(header) != OP_CSV_COLUMNS:
        raise DumpFormatError(
            f"header is not the 21 op CSV columns (got {len(header)} columns starting {header[:3]})",
            where=path,
            offset=0,
        )
    rows = []
    offset = len(lines[0].encode())
    for line in lines[1:]:
        line_offset, offset = offset, offset + len(line.encode())
        if not line.strip():
            continue
        fields = line.rstrip("\r\n").split(SEPARATOR)
        if len(fields) != len(OP_CSV_COLUMNS):
            raise DumpFormatError(
                f"row has {len(fields)} columns, expected {len(OP_CSV_COLUMNS)}", where=path, offset=line_offset
            )
        cells = dict(zip(OP_CSV_COLUMNS, fields))
        try:
            case_num, in_num, out_num = int(cells["CaseNum"]), int(cells["InNum"]), int(cells["OutNum"])
        except ValueError:
            raise DumpFormatError(
                "CaseNum, InNum or OutNum is not an integer", where=path, offset=line_offset
            ) from None
        param_text = cells["OpParam"].strip()
        try:
            op_param = json.loads(param_text) if param_text else {}
        except ValueError:
            raise DumpFormatError(f"OpParam is not JSON: {param_text[:60]!r}", where=path, offset=line_offset) from None
        except RecursionError:
            raise DumpFormatError("OpParam is JSON nested too deep to read", where=path, offset=line_offset) from None
        op_type, op_id = split_op_name(cells["OpName"].strip())
        rows.append(
            OpCsvRow(
                case_num=case_num,
                op_name=cells["OpName"].strip(),
                op_type=op_type,
                op_id=op_id,
                op_param=op_param if isinstance(op_param, dict) else {"value": op_param},
                inputs=_tensors(
                    path,
                    line_offset,
                    in_num,
                    cells["InDType"],
                    cells["InFormat"],
                    cells["InShape"],
                    cells["InTensorFile"],
                    "In",
                ),
                outputs=_tensors(
                    path,
                    line_offset,
                    out_num,
                    cells["OutDType"],
                    cells["OutFormat"],
                    cells["OutShape"],
                    cells["OutTensorFile"],
                    "Out",
                ),
            )
        )
    return rows


def rows_by_op_name(rows: list[OpCsvRow]) -> dict[str, OpCsvRow]:
    """Return the first row of each op name (later executions of the same op repeat its shapes)."""
    first: dict[str, OpCsvRow] = {}
    for row in rows:
        first.setdefault(row.op_name, row)
    return first
