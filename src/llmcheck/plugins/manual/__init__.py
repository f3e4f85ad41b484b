"""Built-in plugin 'manual': the seed's ``dump_data`` mappings, read and paired for ``llmcheck compare``.

``llmcheck.dump_data`` (in :mod:`.dump_data`) writes tensors and a ``metadata.json`` that
says which golden tensor goes with which tensor of the run under suspicion. This plugin
reads such a dump as a source named ``manual`` and pairs its records the way the user's
calls said (see ``docs/sources/manual.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmcheck.plugin_api import Dump, Pair, SourceInfo, UserMapping, hookimpl
from llmcheck.plugins.manual.manual_dump import SOURCE_NAME, load_manual_dump
from llmcheck.plugins.manual.manual_pairing import manual_pairs


@hookimpl
def llmcheck_register_sources(register: Callable[[SourceInfo], None]) -> None:
    register(SourceInfo(SOURCE_NAME, "dump_data() mappings: golden_tensor/ or {golden,acl}_tensor/ metadata.json"))


@hookimpl(tryfirst=True)  # a manual dump often sits inside an ATB dump folder (the seed puts both in ait_dump/)
def llmcheck_load_tensors(path: Path, source: str | None) -> Dump | None:
    if source not in (None, SOURCE_NAME):
        return None
    return load_manual_dump(path)


@hookimpl
def llmcheck_map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair] | None:
    return manual_pairs(golden, my)
