"""What an existing output file holds, and whether a command may replace it.

Why: an output path is often typed by hand, and a file of the user's that happens to carry
the name (notes called ``model.onnx``, a folder) must never be lost to an export. A command
replaces only what an earlier run of its own kind wrote -- an ONNX model, a JSON file -- or
an empty file, says so, and refuses anything else, naming what the file holds.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from llmcheck.core.errors import UsageError

ONNX_MODEL = "an ONNX model"
JSON_FILE = "JSON"
EMPTY_FILE = "nothing"
#: Above this size a file is not parsed as JSON to tell what it holds (an earlier output is far smaller).
_JSON_PARSE_LIMIT_BYTES = 64 * 1024 * 1024


def check_replaceable(target: Path, replaceable: Collection[str], what: str) -> str:
    """Return what the existing ``target`` holds (one of ``replaceable``); raise a usage error naming it otherwise.

    ``what`` names the file the command writes (``the ONNX file``), for the refusal of a folder.
    """
    hint = "pass another path with -o, or move the file away"
    if target.is_dir():
        raise UsageError(f"is a folder; {what} cannot be written there", where=target, hint=hint)
    held = file_contents(target)
    if held not in replaceable:
        wanted = " or ".join(kind for kind in replaceable if kind != EMPTY_FILE)
        raise UsageError(f"exists and holds {held}, not {wanted}; it is kept", where=target, hint=hint)
    return held


def file_contents(path: Path) -> str:
    """Return what a file holds, in words: ``an ONNX model``, ``JSON``, ``nothing``, ``text (N bytes, starting '...')``."""
    size_bytes = path.stat().st_size
    if size_bytes == 0:
        return EMPTY_FILE
    with path.open("rb") as handle:
        start = handle.read(64)
    if start.lstrip()[:1] in (b"{", b"[") and size_bytes <= _JSON_PARSE_LIMIT_BYTES:
        try:
            json.loads(path.read_bytes())
        except (ValueError, OSError):
            pass
        else:
            return JSON_FILE
    if _is_onnx_model(path):
        return ONNX_MODEL
    try:
        text: str | None = start.decode("utf-8")
    except UnicodeDecodeError as exc:  # a character cut by the 64 bytes read is still text
        text = start[: exc.start].decode("utf-8") if exc.start >= len(start) - 3 else None
    if text is None or not all(char.isprintable() or char.isspace() for char in text):
        return f"{size_bytes} bytes of data"
    first_line = (text.strip().splitlines() or [""])[0]
    return f"text ({size_bytes} bytes, starting {first_line[:40]!r})" if first_line else f"{size_bytes} blank bytes"


def _is_onnx_model(path: Path) -> bool:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # onnx raises DecodeError, OSError, ... for a file that is not a model
        return False
    return bool(model.ir_version > 0 and model.HasField("graph"))
