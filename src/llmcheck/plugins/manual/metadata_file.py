"""``metadata.json`` of a manual dump: ``{data_id: {token_id: entry}}``, updated safely by many writers.

Two entry shapes exist, one per seed document:

* ``[golden_path, my_path]`` -- ``golden_tensor/metadata.json`` of
  ``dump_data(token_id, data_id, golden_data, my_path)``: both sides of one pair;
* ``path`` or ``{"atb_tensor_path": ..., "pid": ..., "atb_output_dir": ...}`` --
  ``{golden,acl}_tensor/metadata.json`` of ``dump_data(data_src, data_id, ...)``: one side,
  a saved tensor or a tensor inside the ATB dump of the same process.

Every token of a data id is kept (the original kept only the last). An update takes an
exclusive ``flock`` on the metadata's folder, reads the file, adds the entry and renames a
complete new file into place, so processes writing at once lose nothing and a reader never
sees a half-written file.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

from llmcheck.core.atomic_files import atomic_write_text
from llmcheck.core.errors import DumpFormatError

log = logging.getLogger("llmcheck.manual")

METADATA_NAME = "metadata.json"


def _valid_entry(entry: Any) -> bool:
    if isinstance(entry, str):
        return bool(entry)
    if isinstance(entry, list):
        return len(entry) == 2 and all(isinstance(part, str) and part for part in entry)
    return isinstance(entry, Mapping) and isinstance(entry.get("atb_tensor_path"), str)


def parse_metadata(value: Any, where: Path) -> dict[str, dict[str, Any]]:
    """Return a metadata object checked for shape; a :class:`DumpFormatError` names the first bad entry."""
    if not isinstance(value, Mapping):
        raise DumpFormatError("is not a JSON object {data_id: {token_id: entry}}", where=where)
    checked: dict[str, dict[str, Any]] = {}
    for data_id, tokens in value.items():
        if not isinstance(tokens, Mapping) or not tokens:
            raise DumpFormatError(f"data_id {data_id!r} maps to {tokens!r}, not {{token_id: entry}}", where=where)
        for token_id, entry in tokens.items():
            if not str(token_id).lstrip("-").isdigit():
                raise DumpFormatError(f"data_id {data_id!r}: token id {token_id!r} is not a number", where=where)
            if not _valid_entry(entry):
                raise DumpFormatError(f"data_id {data_id!r} token {token_id}: entry {entry!r} is not a tensor path, "
                                      "a [golden_path, my_path] pair or an ATB tensor reference", where=where)
        checked[str(data_id)] = {str(token_id): entry for token_id, entry in tokens.items()}
    return checked


def read_metadata(path: Path) -> dict[str, dict[str, Any]]:
    """Return the mapping stored in a ``metadata.json``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise DumpFormatError("no such metadata file", where=path, hint="check the path") from exc
    except OSError as exc:
        raise DumpFormatError(f"cannot read: {exc.strerror}", where=path) from exc
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise DumpFormatError(f"is not JSON: {exc}", where=path) from exc
    return parse_metadata(value, path)


def looks_like_metadata(path: Path) -> bool:
    """Return whether a JSON file has the manual mapping's shape (cheap enough to ask of any ``.json``)."""
    try:
        if path.stat().st_size > 64 * 1024 * 1024:
            return False
        parse_metadata(json.loads(path.read_text(encoding="utf-8")), path)
        return True
    except (OSError, ValueError, UnicodeDecodeError, DumpFormatError):
        return False


def record_entry(folder: Path, data_id: str, token_id: str, entry: Any) -> Path:
    """Add ``entry`` for ``(data_id, token_id)`` to ``folder/metadata.json`` under a folder lock; return the file."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / METADATA_NAME
    directory = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        current = read_metadata(path) if path.exists() else {}
        previous = current.get(data_id, {}).get(token_id)
        if previous is not None and previous != entry:
            log.warning("%s: data_id %s token %s dumped again; the later call replaces %r", path, data_id, token_id,
                        previous)
        current.setdefault(data_id, {})[token_id] = entry
        atomic_write_text(path, json.dumps(current, indent=1) + "\n")
    finally:
        os.close(directory)  # closing the descriptor releases the lock
    return path
