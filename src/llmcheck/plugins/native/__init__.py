"""Built-in plugin: reads llmcheck's own dump format (``core/store.py``).

A path may be one dump folder, a file inside it, or the folder given to ``llmcheck dump -o``
holding exactly one dump; with several dumps there, the error lists them so the user can
pick one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from llmcheck.core.errors import DumpNotFoundError
from llmcheck.core.hookspecs import hookimpl
from llmcheck.core.records import Dump, SourceInfo
from llmcheck.core.store import find_dumps, read_dump

SOURCE_NAME = "llmcheck"
log = logging.getLogger("llmcheck.native")


@hookimpl
def llmcheck_register_sources(register: Callable[[SourceInfo], None]) -> None:
    register(SourceInfo(SOURCE_NAME, "llmcheck's own dump format (manifest.json, index.jsonl, safetensors shards)"))


@hookimpl
def llmcheck_load_tensors(path: Path, source: str | None) -> Dump | None:
    if source not in (None, SOURCE_NAME):
        return None
    dumps = find_dumps(path)
    if not dumps:
        return None
    if len(dumps) > 1:
        listing = ", ".join(dump.name for dump in dumps)
        raise DumpNotFoundError(f"holds {len(dumps)} dumps: {listing}", where=path,
                                hint="pass one of them as the path")
    dump = read_dump(dumps[0])
    if dump.cut:
        log.warning("%s: dump is cut short: %s", dumps[0], dump.cut)
    return dump
