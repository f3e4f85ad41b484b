"""llmcheck: find where an LLM's numbers go wrong.

Public API (imported lazily, so ``import llmcheck`` stays cheap and torch-free):

* ``hookimpl`` -- the marker plugin authors decorate hook implementations with;
* ``DumpConfig``, ``register_hook``, ``remove_hook`` -- in-process PyTorch capture;
* ``dump_data`` -- manual golden/my tensor mapping;
* the nouns of :mod:`llmcheck.core.records`, ``BackendOption`` (a ``dump`` flag a backend declares) and
  ``Reporter`` (a ``compare`` output format).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it (imported on first access)
_LAZY: dict[str, str] = {
    "hookimpl": "llmcheck.core.hookspecs",
    "TensorRecord": "llmcheck.core.records",
    "RecordKey": "llmcheck.core.records",
    "TensorStats": "llmcheck.core.records",
    "TensorData": "llmcheck.core.records",
    "Dump": "llmcheck.core.records",
    "Pair": "llmcheck.core.records",
    "MetricSpec": "llmcheck.core.records",
    "MetricResult": "llmcheck.core.records",
    "SourceInfo": "llmcheck.core.records",
    "CaptureRequest": "llmcheck.core.records",
    "OpReference": "llmcheck.core.records",
    "BackendOption": "llmcheck.core.capture.backend_options",
    "Reporter": "llmcheck.core.reporting.reporters",
    "UnsupportedOpError": "llmcheck.core.errors",
    "DumpWriter": "llmcheck.core.dumps.store",
    "read_dump": "llmcheck.core.dumps.store",
    "DumpConfig": "llmcheck.plugins.torch_hooks.config",
    "register_hook": "llmcheck.plugins.torch_hooks.capture",
    "remove_hook": "llmcheck.plugins.torch_hooks.capture",
    "dump_data": "llmcheck.plugins.manual.dump_data",
}

__all__ = ["__version__", *_LAZY]


def lazy_attributes(module: str, table: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """Return a module ``__getattr__`` that imports each name of ``table`` from its module on first access.

    ``table`` maps a public name to the module defining it; the value is then cached in
    ``namespace`` (the module's globals), so the import happens once.
    """

    def __getattr__(name: str) -> Any:
        module_name = table.get(name)
        if module_name is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        namespace[name] = value
        return value

    return __getattr__


__getattr__ = lazy_attributes(__name__, _LAZY, globals())
