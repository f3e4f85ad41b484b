"""Built-in plugin 'torchair_fx': torchair FX ``.npy`` dumps (source "fx") and FX capture on any machine.

``torch.compile(model, backend=llmcheck.plugins.torchair_fx.fx_dump_backend)`` (or
``make_fx_dump_backend(dump_path)``) dumps every ATen call of the compiled graphs on CPU or
CUDA, into llmcheck's own dump format (the fast default, read by the ``llmcheck`` source)
or, with ``layout="torchair"``, as torchair's ``.npy`` files (read by the ``fx`` source);
``dump_exported_program`` does the same for a ``torch.export`` program. They are imported
lazily so loading the plugin never imports torch. See ``docs/sources/torchair-fx.md``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import Dump, SourceInfo, hookimpl

SOURCE_NAME = "fx"

_LAZY = {
    name: "llmcheck.plugins.torchair_fx.fx_backend"
    for name in (
        "fx_dump_backend",
        "make_fx_dump_backend",
        "dump_exported_program",
        "FxDumpBackend",
        "FxDumpInterpreter",
        "LAYOUT_LLMCHECK",
        "LAYOUT_TORCHAIR",
    )
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module_name), name)


@hookimpl
def llmcheck_register_sources(register: Callable[[SourceInfo], None]) -> None:
    """Register the "fx" source."""
    register(SourceInfo(SOURCE_NAME, "torchair FX dump: {node}-{target}.INPUT|OUTPUT.i.ts.npy per ATen call"))


@hookimpl
def llmcheck_load_tensors(path: Path, source: str | None) -> Dump | None:
    """Return the FX dump at ``path``, or ``None`` when it holds no FX dump file."""
    if source not in (None, SOURCE_NAME):
        return None
    from llmcheck.plugins.torchair_fx.fx_dump import load_fx_dump

    return load_fx_dump(path)
