"""ATB's two spellings of an operation: ``LinearOperation_3_4_0`` (JSON, CSV) and ``4_LinearOperation`` (folders).

An op id is the ``_``-joined chain of node indices from the top operation down
(``3_4_0``: child 0 of child 4 of top operation 3). Topology JSON, op CSVs and cpu
profiling name an op ``{Type}_{id}`` (ATB's ``GenerateOperationName``); the tensor tree
names each level ``{index}_{Type}``. Both are split here, once.
"""

from __future__ import annotations

import re

_OP_NAME = re.compile(r"^(?P<type>.*?)_(?P<ids>\d+(?:_\d+)*)$")
_FOLDER = re.compile(r"^(?P<index>\d+)_(?P<type>.+)$")


def split_op_name(op_name: str) -> tuple[str, str | None]:
    """Return ``(op type, op id)`` of ``LinearOperation_3_4_0`` -> ``("LinearOperation", "3_4_0")``.

    A name without a trailing id gives ``(name, None)``.
    """
    match = _OP_NAME.match(op_name)
    if match is None or not match.group("type"):
        return op_name, None
    return match.group("type"), match.group("ids")


def split_op_folder(folder_name: str) -> tuple[int, str] | None:
    """Return ``(index, op type)`` of a tensor-tree folder ``4_LinearOperation``, or ``None`` if it is not one."""
    match = _FOLDER.match(folder_name)
    if match is None:
        return None
    return int(match.group("index")), match.group("type")


def op_id_key(op_id: str) -> tuple[int, ...]:
    """Return an op id as a tuple of ints, for numeric ordering (``"3_10"`` after ``"3_9"``)."""
    return tuple(int(part) for part in op_id.split("_"))
