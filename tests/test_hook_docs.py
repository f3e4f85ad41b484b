"""Every hook is documented with its exact signature and has a test (datasette-style meta-tests)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from llmcheck.core import hookspecs

ROOT = Path(__file__).resolve().parent.parent
HOOKS = {name: function for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
         if name.startswith("llmcheck_")}


def _signature(function) -> str:
    """Return ``def name(args) -> ret`` as it is written in docs/plugins.md (annotations unquoted)."""
    return f"def {function.__name__}{inspect.signature(function)}".replace("'", "")


def test_there_are_hooks_of_every_family() -> None:
    assert {"llmcheck_register_capture_backends", "llmcheck_load_tensors", "llmcheck_map_pairs",
            "llmcheck_register_metrics"} <= set(HOOKS)


@pytest.mark.parametrize("hook_name", sorted(HOOKS))
def test_plugin_hooks_are_documented_with_their_exact_signature(hook_name: str) -> None:
    docs = (ROOT / "docs" / "plugins.md").read_text()
    assert f"#### {hook_name}" in docs
    assert _signature(HOOKS[hook_name]) in docs


@pytest.mark.parametrize("hook_name", sorted(HOOKS))
def test_plugin_hooks_have_docstrings(hook_name: str) -> None:
    assert len(inspect.getdoc(HOOKS[hook_name]) or "") > 80


@pytest.mark.parametrize("hook_name", sorted(HOOKS))
def test_plugin_hooks_have_tests(hook_name: str) -> None:
    test_sources = "\n".join(path.read_text() for path in (ROOT / "tests").rglob("test_*.py"))
    assert re.search(rf"def test_hook_{hook_name}\b", test_sources), f"no test named test_hook_{hook_name}"
