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
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec

from llmcheck.plugin_api import DumpFormatError, atomic_write_text, convert_json, decode_json, read_dump_file

log = logging.getLogger("llmcheck.manual")

METADATA_NAME = "metadata.json"

NonEmptyText = Annotated[str, msgspec.Meta(min_length=1)]
TokenId = Annotated[str, msgspec.Meta(pattern="^[0-9]+$")]


class AtbTensorEntry(msgspec.Struct):
    """A low-level entry: a tensor inside the ATB dump that the recording process wrote."""

    atb_tensor_path: NonEmptyText
    pid: int | str | None = None
    atb_output_dir: str | None = None


#: The declared schema of a metadata.json: ``{data_id: {token_id: entry}}``, entry one of the three shapes.
#: (A constrained ``str`` as a member of the entry union crashes msgspec 0.22 on arrays: the plain
#: path is left unconstrained; an empty one is reported as a missing file.)
MetadataSchema = dict[
    str, Annotated[dict[TokenId, str | tuple[NonEmptyText, NonEmptyText] | AtbTensorEntry], msgspec.Meta(min_length=1)]
]


def parse_metadata(value: Any, where: Path) -> dict[str, dict[str, Any]]:
    """Return a metadata object checked against :data:`MetadataSchema`; the error names the first bad field."""
    if not isinstance(value, Mapping):
        raise DumpFormatError("is not a JSON object {data_id: {token_id: entry}}", where=where)
    convert_json(value, MetadataSchema, where)
    return {str(data_id): dict(tokens) for data_id, tokens in value.items()}


def read_metadata(path: Path) -> dict[str, dict[str, Any]]:
    """Return the mapping stored in a ``metadata.json``."""
    try:
        raw = read_dump_file(Path(path), None)  # a regular file of at most METADATA_LIMIT_BYTES
    except FileNotFoundError as exc:
        raise DumpFormatError("no such metadata file", where=path, hint="check the path") from exc
    return parse_metadata(decode_json(raw, Any, path), path)


def looks_like_metadata(path: Path) -> bool:
    """Return whether a JSON file has the manual mapping's shape (cheap enough to ask of any ``.json``)."""
    try:
        read_metadata(path)
        return True
    except (OSError, DumpFormatError):
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
            log.warning(
                "%s: data_id %s token %s dumped again; the later call replaces %r", path, data_id, token_id, previous
            )
        current.setdefault(data_id, {})[token_id] = entry
        atomic_write_text(path, json.dumps(current, indent=1) + "\n")
    finally:
        os.close(directory)  # closing the descriptor releases the lock
    return path
