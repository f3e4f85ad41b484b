"""Built-in plugin 'torchair_ge': torchair GE graph-mode dumps, the GE graph text, and the graph-mode pairings.

Source ``"ge"`` reads CANN data-dump trees (framed and bare protobuf files, no CANN
needed) with the ``dynamo_original_graph_*.txt`` graphs torchair writes beside them; the
pairings map GE ops to FX nodes (``--golden-source fx --my-source ge``) and fused GE ops to
an unfused GE run (``--golden-source ge --my-source ge``). :mod:`.config` builds torchair
``CompilerConfig`` objects for dumping. See ``docs/sources/torchair-ge.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmcheck.plugin_api import Dump, Pair, SourceInfo, UserMapping, hookimpl

SOURCE_NAME = "ge"


@hookimpl
def llmcheck_register_sources(register: Callable[[SourceInfo], None]) -> None:
    """Register the "ge" source."""
    register(
        SourceInfo(SOURCE_NAME, "torchair GE graph-mode dump: CANN data-dump files and dynamo_original_graph_*.txt")
    )


@hookimpl
def llmcheck_load_tensors(path: Path, source: str | None) -> Dump | None:
    """Return the GE dump at ``path``, or ``None`` when it holds no GE dump file."""
    if source not in (None, SOURCE_NAME):
        return None
    from llmcheck.plugins.torchair_ge.ge_tree import load_ge_dump

    return load_ge_dump(path)


@hookimpl
def llmcheck_map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair] | None:
    """Return GE <-> FX or fused <-> unfused GE pairs, or ``None`` when neither side is a GE dump."""
    from llmcheck.plugins.torchair_ge.ge_fx_pairing import map_graph_pairs

    return map_graph_pairs(golden, my)
