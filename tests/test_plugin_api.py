"""The declared plugin API: built-in plugins use ``llmcheck.plugin_api`` and their own package, nothing else of llmcheck."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import llmcheck.plugin_api as plugin_api

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "src" / "llmcheck" / "plugins"


def _llmcheck_imports(path: Path) -> list[tuple[int, str]]:
    """Return (line, module) for every llmcheck module a file imports, lazy imports inside functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found.extend((node.lineno, module) for module in modules if module.split(".")[0] == "llmcheck")
    return found


def _forbidden_imports() -> list[str]:
    offences = []
    for path in sorted(PLUGINS.rglob("*.py")):
        package = "llmcheck.plugins." + path.relative_to(PLUGINS).parts[0]
        for line, module in _llmcheck_imports(path):
            allowed = (
                module in ("llmcheck", "llmcheck.plugin_api") or module == package or module.startswith(package + ".")
            )
            if not allowed:
                offences.append(f"{path.relative_to(ROOT)}:{line}: imports {module}")
    return offences


def test_built_in_plugins_import_only_the_plugin_api_and_their_own_package() -> None:
    offences = _forbidden_imports()
    assert not offences, (
        "built-in plugins must import llmcheck only through llmcheck.plugin_api "
        "(or their own package):\n" + "\n".join(offences)
    )


def test_the_import_check_names_the_file_and_line_of_a_core_import(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text(
        '"""A plugin module reaching into the core."""\n\ndef f():\n    from llmcheck.core.dumps.store import read_dump\n'
    )
    assert _llmcheck_imports(stray) == [(4, "llmcheck.core.dumps.store")]


def test_every_name_the_api_declares_can_be_imported() -> None:
    missing = [name for name in plugin_api.__all__ if getattr(plugin_api, name, None) is None]
    assert missing == []
    assert len(plugin_api.__all__) == len(set(plugin_api.__all__))


def test_importing_the_api_does_not_import_torch() -> None:
    script = "import sys, llmcheck.plugin_api; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_every_name_loaded_on_first_use_is_declared() -> None:
    lazy = set(plugin_api._LOADED_ON_FIRST_USE)
    assert lazy <= set(plugin_api.__all__), sorted(lazy - set(plugin_api.__all__))
