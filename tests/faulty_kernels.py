"""Test helpers: a faulty device kernel planted under the capture, and the bug zoo script loaded as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

ZOO_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bug_zoo.py"


class FaultyKernel(TorchDispatchMode):
    """A kernel of ``operator`` that writes every 8th element ``factor`` times off in its ``which``-th call.

    It sits below the capture's own dispatch mode, so the capture records the wrong output
    exactly as a faulty device kernel would have produced it, and the ops after it consume it.
    """

    def __init__(self, operator: Any, which: int, factor: float) -> None:
        super().__init__()
        self.operator = operator
        self.which = which
        self.factor = factor
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is self.operator:
            if self.calls == self.which:
                result = result.clone()
                result.view(-1)[::8] *= self.factor
            self.calls += 1
        return result


def load_bug_zoo() -> ModuleType:
    """Return ``benchmarks/bug_zoo.py`` imported as the module ``bug_zoo``."""
    spec = importlib.util.spec_from_file_location("bug_zoo", ZOO_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bug_zoo"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module
