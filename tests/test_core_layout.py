"""The core's layout holds: no import circles, and the stages never reach for the plugin manager.

docs/plugins.md ("How the core is laid out") promises both. Every import counts, at module
level, inside functions and under ``TYPE_CHECKING``: a deferred import is still an arrow a
reader must follow, and a circle closed by one is still a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import llmcheck.core

CORE = Path(llmcheck.core.__file__).parent
#: The folders a compare goes through; none of them fetches what the plugins register (the commands hand it in).
STAGES = ("dumps", "capture", "pairing", "measuring", "judging", "reporting")
#: The commands that live in a stage's folder: a command may ask the plugin manager.
COMMANDS_IN_STAGES = {"llmcheck.core.capture.dump_command"}
PLUGIN_MANAGER = {"llmcheck.core.plugins", "llmcheck.core.hookspecs"}


def core_modules() -> dict[str, Path]:
    """Return every module of ``llmcheck.core`` by dotted name."""
    modules = {}
    for path in CORE.rglob("*.py"):
        parts = path.relative_to(CORE).with_suffix("").parts
        name = ".".join(("llmcheck", "core", *parts)).removesuffix(".__init__")
        modules[name] = path
    return modules


def import_arrows(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Return, for each core module, the core modules it imports anywhere in its text."""
    arrows: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            arrows[name].update(target for target in targets if target in modules and target != name)
    return arrows


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Return the groups of two or more modules that import each other, directly or through others (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(arrows[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(arrows):
        if module not in index:
            visit(module)
    return found


def test_no_core_module_imports_one_that_imports_it_back() -> None:
    assert circles(import_arrows(core_modules())) == []


def test_the_circle_finder_finds_a_circle_closed_by_a_deferred_import() -> None:
    arrows = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(arrows) == [["a", "b", "c"]]


def test_the_stages_are_handed_what_the_plugins_register_and_never_fetch_it() -> None:
    arrows = import_arrows(core_modules())
    reaching = sorted(
        (module, target)
        for module, targets in arrows.items()
        if module.removeprefix("llmcheck.core.").split(".")[0] in STAGES and module not in COMMANDS_IN_STAGES
        for target in targets & PLUGIN_MANAGER
    )
    assert reaching == []
