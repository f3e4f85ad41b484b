"""Built-in plugin 'msprobe': dumps written by MindStudio Probe (msprobe), read as source ``msprobe``.

* load tensors: an msprobe PyTorch dump tree (``step{N}/rank{R}|proc{PID}/dump.json`` with
  ``construct.json``, ``stack.json`` and, in tensor mode, ``dump_tensor_data/*.pt``), any
  of its levels (``L0`` modules, ``L1`` APIs, ``mix``) and tasks (tensor, statistics, md5);
* map pairs: msprobe ``L0`` modules against another source's modules by module path
  (two msprobe dumps pair by the built-in exact-key rule).

See ``docs/sources/msprobe.md``. Importing this package stays light (no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmcheck.plugin_api import Dump, Pair, SourceInfo, UserMapping, hookimpl

SOURCE_NAME = "msprobe"


@hookimpl
def llmcheck_register_sources(register: Callable[[SourceInfo], None]) -> None:
    """Register the "msprobe" source."""
    register(
        SourceInfo(
            SOURCE_NAME,
            "MindStudio Probe (msprobe) PyTorch dump: step*/rank*/dump.json "
            "(+ construct.json, stack.json, dump_tensor_data/*.pt)",
        )
    )


@hookimpl
def llmcheck_load_tensors(path: Path, source: str | None) -> Dump | None:
    """Return the msprobe dump at ``path``, or None when it holds no msprobe dump.json."""
    if source not in (None, SOURCE_NAME):
        return None
    from llmcheck.plugins.msprobe.dump_tree import load_msprobe_dump

    return load_msprobe_dump(path)


@hookimpl
def llmcheck_map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair] | None:
    """Return msprobe-module-path pairs when exactly one side is an msprobe dump."""
    from llmcheck.plugins.msprobe.pairing import module_path_pairs

    return module_path_pairs(golden, my)
