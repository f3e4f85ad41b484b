"""Built-in plugin 'native': llmcheck's own dumps, single tensor files, and the built-in pairing rules.

* source ``llmcheck`` reads llmcheck's own dump format (``core/dumps/store.py``). A path may be one
  dump folder, a file inside it, or the folder given to ``llmcheck dump -o`` holding one
  dump, or the ranks of one multi-rank run (one dump per rank, read as one run whose records
  carry their rank in the key); with several dumps of one rank there, the error lists them
  so the user can pick one.
* source ``file`` reads one ``.npy``, ``.pt``/``.pth`` or ``.safetensors`` file, or a
  checkpoint folder of ``.safetensors`` shards (:mod:`llmcheck.plugins.native.single_file`).
* pairing by user mapping, exact key and sequence alignment
  (:mod:`llmcheck.plugins.native.pairing`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from llmcheck.plugin_api import (
    NATIVE_SOURCE,
    Dump,
    DumpNotFoundError,
    Pair,
    SourceInfo,
    UserMapping,
    find_dumps,
    folder_link_reason,
    hookimpl,
    merge_rank_dumps,
    read_dump,
    warn_passed_over,
)
from llmcheck.plugins.native import pairing, single_file

log = logging.getLogger("llmcheck.native")


@hookimpl
def llmcheck_register_sources(register: Callable[[SourceInfo], None]) -> None:
    register(SourceInfo(NATIVE_SOURCE, "llmcheck's own dump format (manifest.json, index.jsonl, safetensors shards)"))
    register(
        SourceInfo(
            single_file.SOURCE_NAME,
            "one tensor file (.npy, .pt/.pth with weights_only, .safetensors) "
            "or a checkpoint folder of .safetensors shards",
        )
    )


@hookimpl
def llmcheck_load_tensors(path: Path, source: str | None) -> Dump | None:
    if source in (None, single_file.SOURCE_NAME):
        if single_file.claims(path):
            return single_file.load_file(path)
        if single_file.claims_checkpoint(path):
            return single_file.load_checkpoint(path)
    if source not in (None, NATIVE_SOURCE):
        return None
    dumps = find_dumps(path)
    links = [folder for folder in dumps if folder != Path(path) and folder.is_symlink()]
    dumps = [folder for folder in dumps if folder not in links]  # a run folder that is a link: named, never entered
    if not dumps:
        return None
    warn_passed_over(log, Path(path), [(link, folder_link_reason(link, path)) for link in links])
    loaded = [read_dump(folder) for folder in dumps]
    for folder, dump in zip(dumps, loaded):
        if dump.cut:
            log.warning("%s: dump is cut short: %s", folder, dump.cut)
    if len(loaded) == 1:
        return loaded[0]
    ranks = [int(dump.manifest.get("rank", 0) or 0) for dump in loaded]
    if len(set(ranks)) < len(ranks):  # two runs, not the ranks of one run
        listing = ", ".join(folder.name for folder in dumps)
        raise DumpNotFoundError(
            f"holds {len(dumps)} dumps: {listing}",
            where=path,
            hint="pass one of them as the path; the ranks of one run are read together",
        )
    return merge_rank_dumps(loaded, ranks, Path(path))


@hookimpl
def llmcheck_map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> Sequence[Pair] | None:
    return pairing.map_pairs(golden, my, user_mapping)
