"""Write docs/hooks.md, the hook reference, from the hook specifications and the plugin API.

The single source is ``src/llmcheck/core/hookspecs.py`` (each hook's signature, docstring
and example) and ``llmcheck.plugin_api`` (the names a plugin may use, their first docstring
lines, the dtype classes, the accumulator protocols). Run it after changing either:

    python docs/gen_hook_reference.py          # rewrite docs/hooks.md
    python docs/gen_hook_reference.py --check  # exit 1 when docs/hooks.md is stale

``tests/test_hook_docs.py`` fails when the committed page differs from what this writes.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "src"))

from llmcheck import plugin_api  # noqa: E402  (the path above makes the checkout's llmcheck importable)
from llmcheck.core import hookspecs  # noqa: E402

PAGE = DOCS / "hooks.md"
COMMAND = "python docs/gen_hook_reference.py"
_FAMILY = re.compile(r"^# --- (?P<name>[\w ]+?) -+$", re.M)


def markdown(docstring: str) -> str:
    """Return a docstring's reStructuredText as Markdown: roles and literals as code, ``Example::`` as a code block."""
    text = re.sub(r":(?:class|func|data|meth|mod):`~?(?:[\w.]+\.)?([\w]+)`", r"`\1`", docstring)
    text = re.sub(r"``(.+?)``", r"`\1`", text)
    lines, out, in_code = text.split("\n"), [], False
    for line in lines:
        if in_code and line and not line.startswith("    "):
            out.append("```")
            in_code = False
        if line.rstrip().endswith("::") and not in_code:
            heading = line.rstrip()[:-2].rstrip()
            out.extend([f"*{heading}:*" if heading else "", "", "```python"])
            in_code = True
            continue
        out.append(line[4:] if in_code else line)
    if in_code:
        while out and not out[-1].strip():
            out.pop()
        out.append("```")
    return re.sub(r"```python\n\n+", "```python\n", "\n".join(out)).strip() + "\n"


def _overview() -> str:
    """Return the hookspecs module docstring without its title line and the paragraph about this page."""
    paragraphs = (inspect.getdoc(hookspecs) or "").split("\n\n")[1:]
    return markdown("\n\n".join(paragraph for paragraph in paragraphs if "docs/hooks.md" not in paragraph))


def hooks_by_family() -> list[tuple[str, list[object]]]:
    """Return the hook functions grouped under the ``# --- family ---`` comments of hookspecs.py, in file order."""
    source = inspect.getsource(hookspecs)
    marks = [(source[: match.start()].count("\n"), match.group("name").strip()) for match in _FAMILY.finditer(source)]
    families: dict[str, list[object]] = {name: [] for _, name in marks}
    hooks = [
        function
        for name, function in vars(hookspecs).items()
        if name.startswith("llmcheck_") and inspect.isfunction(function)
    ]
    for function in sorted(hooks, key=lambda f: f.__code__.co_firstlineno):
        line = function.__code__.co_firstlineno
        family = [name for mark_line, name in marks if mark_line < line][-1]
        families[family].append(function)
    return [(name, functions) for name, functions in families.items() if functions]


def signature(function: object) -> str:
    """Return ``def name(args) -> ret`` with annotations unquoted, as the reference shows it."""
    return f"def {function.__name__}{inspect.signature(function)}".replace("'", "")  # type: ignore[attr-defined]


def _is_firstresult(function: object) -> bool:
    options = getattr(function, f"{hookspecs.PROJECT_NAME}_spec", {})
    return bool(options.get("firstresult"))


def _hook_section(function: object) -> str:
    call = (
        "`firstresult`: implementations are called until one returns a value other than `None`."
        if _is_firstresult(function)
        else "Every implementation is called."
    )
    return "\n".join(
        [
            f"#### {function.__name__}",
            "",
            "```python",
            signature(function),
            "```",
            "",
            call,
            "",
            markdown(inspect.getdoc(function) or ""),
        ]
    )


def _dtype_classes() -> str:
    classes: dict[str, list[str]] = {}
    for dtype in plugin_api.DTYPE_ITEMSIZE:
        classes.setdefault(plugin_api.dtype_class(dtype), []).append(dtype)
    rows = [f"| `{name}` | {', '.join(f'`{dtype}`' for dtype in dtypes)} |" for name, dtypes in classes.items()]
    return "\n".join(
        ["| class | dtype names |", "|---|---|", *rows, "| `default` | any class a metric lists no thresholds for |"]
    )


def _protocol(cls: type) -> str:
    methods = [
        (name, member) for name, member in vars(cls).items() if inspect.isfunction(member) and not name.startswith("_")
    ]
    body = [f"### {cls.__name__}", "", markdown(inspect.getdoc(cls) or "")]
    for name, member in methods:
        doc = " ".join((inspect.getdoc(member) or "").split())
        body.append(f"- `{name}{inspect.signature(member)}`".replace("'", "") + f": {markdown(doc).strip()}")
    return "\n".join(body)


#: What the API's objects without a docstring of their own are.
_DESCRIBED = {
    "hookimpl": "The marker hook implementations are decorated with: `@hookimpl`, "
    "`@hookimpl(tryfirst=True)`, `@hookimpl(trylast=True)`."
}


def _first_line(value: object) -> str:
    doc = inspect.getdoc(value) if (inspect.isclass(value) or inspect.isroutine(value)) else None
    return markdown(doc.split("\n\n")[0]).replace("\n", " ").strip() if doc else ""


def _api_table() -> str:
    rows = []
    for name in plugin_api.__all__:
        value = getattr(plugin_api, name)
        described = inspect.isclass(value) or inspect.isroutine(value)
        what = _DESCRIBED.get(name) or (
            _first_line(value) if described else f"constant: `{value!r}`" if len(repr(value)) < 40 else "constant"
        )
        rows.append(f"| `{name}` | {what} |")
    return "\n".join(["| name | what it is |", "|---|---|", *rows])


def render() -> str:
    """Return the whole hook reference page."""
    parts = [
        "# Hook reference",
        "",
        f"<!-- Generated by `{COMMAND}` from src/llmcheck/core/hookspecs.py and llmcheck.plugin_api. "
        "Edit those, then run the command; a test fails when this page is stale. -->",
        "",
        "How to write and install a plugin: [plugins.md](plugins.md). This page is the reference: every hook "
        "with its exact signature and an example, then the nouns hooks exchange.",
        "",
        _overview(),
        "## Hooks",
    ]
    for family, functions in hooks_by_family():
        parts.extend(["", f"### {family.capitalize()}", ""])
        parts.extend(_hook_section(function) for function in functions)
    parts.extend(
        [
            "## The nouns",
            "",
            "### Dtype classes",
            "",
            "Thresholds (`MetricSpec.thresholds`) and precision verdicts are keyed by the class of a dtype name "
            "(`dtype_class(name)`):",
            "",
            _dtype_classes(),
            "",
            _protocol(plugin_api.MetricAccumulator),
            "",
            _protocol(plugin_api.ChunkMetricAccumulator),
            "",
            "### PairPriority",
            "",
            markdown(inspect.getdoc(plugin_api.PairPriority) or ""),
            "| level | value |",
            "|---|---|",
            *[f"| `PairPriority.{level.name}` | {level.value} |" for level in plugin_api.PairPriority],
            "",
            "## The plugin API",
            "",
            "A plugin imports from `llmcheck.plugin_api` only; `llmcheck.core` is private and changes without notice.",
            "",
            _api_table(),
            "",
        ]
    )
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    page = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
