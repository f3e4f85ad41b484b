"""The command examples in docs/ print what the tool prints: a doc that drifts fails here.

An example is a fenced ```console block (the convention is written down for doc writers in
docs/README.md):

* a line starting with ``$ `` is a command, run by bash; it continues on the next line
  after a trailing backslash, and a here-document (``<<'PY'``) continues up to its end word;
* every other line is the output the commands print, stdout and stderr together;
* ``…`` in a line matches any text within that line (timings, paths, dates, pids, sizes),
  and a line holding only ``…`` matches any number of lines (an abridged listing);
* a command ending in ``# exit N`` must exit with N, every other command with 0;
* a code block of another kind whose first line is ``# NAME.EXT`` (``# timed_backend.py``)
  is written to that file, for the console blocks after it.

The blocks of a page run in order in one fresh folder, so a later block may use the files an
earlier one wrote; paths in the examples are relative to that folder. A block opened as
```console slow runs only in the slow test of its page (with the page's other blocks).
The commands run the ``python`` and ``llmcheck`` of this interpreter's environment, offline.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
VARIES = "…"
COMMAND_TIMEOUT_S = 180

# The pages whose examples drift first: each must keep at least one runnable example.
PAGES_WITH_EXAMPLES = [
    "commands/compare.md",
    "commands/dump.md",
    "commands/opcheck.md",
    "commands/export.md",
    "commands/hunt.md",
    "sources/file.md",
    "sources/manual.md",
]


@dataclass
class Command:
    """One ``$`` command of a console block and the output documented for it."""

    text: str
    line: int  # 1-based line of the ``$`` in the page
    expected_exit: int
    expected_lines: list[str]


@dataclass
class ConsoleBlock:
    """A ```console block: its commands in order, each with the output the page shows for it."""

    page: str
    line: int  # 1-based line of the opening fence
    slow: bool
    commands: list[Command]


@dataclass
class ExampleFile:
    """A code block whose first line is ``# NAME.EXT``: the file the console blocks after it use."""

    name: str
    text: str


_FENCE = re.compile(r"^(`{3,})(\S*)(.*)$")
_FILE_NAME = re.compile(r"^# ([\w-]+\.\w+)$")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_EXIT = re.compile(r"#\s*exit\s+(\d+)\b[^#]*$")


def _console_blocks(page: str) -> list[ConsoleBlock]:
    """Return the ```console blocks of a page under docs/, each parsed into commands and expected output."""
    return [example for example in _examples(page) if isinstance(example, ConsoleBlock)]


def _examples(page: str) -> list[ConsoleBlock | ExampleFile]:
    """Return a page's console blocks and named files (```python opening with ``# NAME.py``), in page order."""
    lines = (DOCS / page).read_text().splitlines()
    blocks: list[ConsoleBlock | ExampleFile] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        start = index
        body = []
        index += 1
        while index < len(lines) and lines[index] != fence.group(1):
            body.append(lines[index])
            index += 1
        if index == len(lines):
            raise AssertionError(f"docs/{page}:{start + 1}: the code block is never closed")
        index += 1
        if fence.group(2) == "console":  # any other block, a longer fence around an example included, is text
            blocks.append(
                ConsoleBlock(page, start + 1, "slow" in fence.group(3).split(), _commands(page, start + 2, body))
            )
        elif body and (name := _FILE_NAME.match(body[0])):
            blocks.append(ExampleFile(name.group(1), "\n".join(body) + "\n"))
    return blocks


def _commands(page: str, first_line: int, body: list[str]) -> list[Command]:
    commands: list[Command] = []
    position = 0
    while position < len(body):
        line = body[position]
        if not line.startswith("$ "):
            if not commands:
                raise AssertionError(f"docs/{page}:{first_line + position}: a console block starts with a `$ ` command")
            commands[-1].expected_lines.append(line)
            position += 1
            continue
        start = position
        text = [line[2:]]
        position += 1
        while text[-1].endswith("\\") and position < len(body):
            text.append(body[position])
            position += 1
        exit_code = _EXIT.search(text[-1])
        ends = [match.group(2) for piece in text for match in _HEREDOC.finditer(piece)]
        for end in ends:
            while position < len(body) and body[position] != end:
                text.append(body[position])
                position += 1
            if position == len(body):
                raise AssertionError(f"docs/{page}:{first_line + start}: the here-document never reaches {end}")
            text.append(body[position])
            position += 1
        commands.append(Command("\n".join(text), first_line + start, int(exit_code.group(1)) if exit_code else 0, []))
    return commands


def _expected_pattern(expected_lines: list[str]) -> re.Pattern[str]:
    """Return a regex for the whole output: ``…`` is any text within a line, a lone ``…`` line any lines."""
    parts = []
    for line in expected_lines:
        if line.strip() == VARIES:
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append("[^\n]*?".join(re.escape(piece) for piece in line.rstrip().split(VARIES)) + r"[ \t]*\n")
    return re.compile("".join(parts))


def _as_printed(expected_lines: list[str], actual_lines: list[str]) -> list[str]:
    """Return the documented lines with each ``…`` line that matches a printed one replaced by it, for a readable diff."""
    shown = []
    position = 0
    for line in expected_lines:
        if VARIES in line and line.strip() != VARIES:
            pattern = _expected_pattern([line])
            match = next(
                (at for at in range(position, len(actual_lines)) if pattern.fullmatch(actual_lines[at] + "\n")), None
            )
            if match is not None:
                shown.append(actual_lines[match])
                position = match + 1
                continue
        shown.append(line)
    return shown


def _normalised(output: str) -> str:
    lines = [line.rstrip() for line in output.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "".join(line + "\n" for line in lines)


def _environment() -> dict[str, str]:
    import llmcheck

    env = {key: value for key, value in os.environ.items() if not key.startswith("LLMCHECK_")}
    src = str(Path(llmcheck.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"  # stdout and stderr interleave as they were written
    env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"  # never the network
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # save_pretrained's bar is redrawn at its own pace
    env["COLUMNS"] = "120"
    return env


def _run_block(block: ConsoleBlock, folder: Path) -> None:
    env = _environment()
    for command in block.commands:
        done = subprocess.run(
            ["bash", "-c", command.text],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        where = f"docs/{block.page}:{command.line}"
        actual = _normalised(done.stdout)
        expected = _normalised("\n".join(command.expected_lines))
        if not _expected_pattern(expected.splitlines()).fullmatch(actual):
            diff = "\n".join(
                difflib.unified_diff(
                    _as_printed(expected.splitlines(), actual.splitlines()),
                    actual.splitlines(),
                    "documented",
                    "printed now",
                    lineterm="",
                )
            )
            raise AssertionError(f"{where}: the command prints other output than the page shows\n{diff}")
        if done.returncode != command.expected_exit:
            raise AssertionError(
                f"{where}: exit code {done.returncode}, the page says {command.expected_exit}"
                f" (end the command with `# exit N` when it should fail)\n{done.stdout}"
            )


def _pages() -> list[str]:
    return sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))


def _run_page(page: str, tmp_path: Path, *, slow: bool) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(ROOT / "tests" / "data")  # the sample dumps, as from the repo's root
    for example in _examples(page):
        if isinstance(example, ExampleFile):
            (tmp_path / example.name).write_text(example.text)
        elif slow or not example.slow:
            _run_block(example, tmp_path)


@pytest.mark.parametrize("page", [page for page in _pages() if any(not b.slow for b in _console_blocks(page))])
def test_page_examples_print_what_the_page_shows(page: str, tmp_path: Path) -> None:
    _run_page(page, tmp_path, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("page", [page for page in _pages() if any(b.slow for b in _console_blocks(page))])
def test_page_slow_examples_print_what_the_page_shows(page: str, tmp_path: Path) -> None:
    _run_page(page, tmp_path, slow=True)


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES)
def test_pages_most_likely_to_drift_show_runnable_examples(page: str) -> None:
    blocks = _console_blocks(page)
    assert blocks, f"docs/{page} has no ```console example: its output would drift unseen"
    assert all(block.commands for block in blocks)


def test_console_convention_matches_varying_parts_only() -> None:
    pattern = _expected_pattern(["compared 78 pairs (… of tensors read) in … s", "…", "wrote report/cmp_report.csv"])
    assert pattern.fullmatch("compared 78 pairs (0.1 MB of tensors read) in 0.04 s\nwrote report/cmp_report.csv\n")
    assert pattern.fullmatch("compared 78 pairs (1 MB of tensors read) in 2 s\na\nb\nwrote report/cmp_report.csv\n")
    assert not pattern.fullmatch("compared 77 pairs (0.1 MB of tensors read) in 0.04 s\nwrote report/cmp_report.csv\n")
    assert not pattern.fullmatch("compared 78 pairs (0.1 MB\nof tensors read) in 0.04 s\nwrote report/cmp_report.csv\n")


def test_console_blocks_parse_commands_heredocs_and_exit_codes(tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```console\n"
        "$ python - <<'PY'\nprint('hello')\nPY\nhello\n"
        "$ llmcheck compare -gp a \\\n    -mp b  # exit 3\nerror line\n"
        "```\n\n```python\n# tool.py\nprint('a tool')\n```\n\n````markdown\n```console\n$ not run\n```\n````\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tmp_path)
    block, tool = _examples("page.md")
    assert tool == ExampleFile("tool.py", "# tool.py\nprint('a tool')\n")  # the console block inside ```` is text
    first, second = block.commands
    assert first.text == "python - <<'PY'\nprint('hello')\nPY" and first.expected_lines == ["hello"]
    assert second.expected_exit == 3 and second.expected_lines == ["error line"] and second.line == 6


def test_a_drifted_example_fails_with_a_diff_of_the_drifted_lines_only(tmp_path: Path) -> None:
    printing = "echo 'compared in 0.5 s'; echo 'evidence: new words'"
    block = ConsoleBlock("page.md", 1, False, [Command(printing, 2, 0, ["compared in … s", "evidence: old words"])])
    with pytest.raises(AssertionError) as failure:
        _run_block(block, tmp_path)
    message = str(failure.value)
    assert message.startswith("docs/page.md:2: the command prints other output than the page shows")
    assert "-evidence: old words\n+evidence: new words" in message
    assert "-compared" not in message  # the line matched, its varying part included


def test_an_example_that_exits_otherwise_than_documented_fails(tmp_path: Path) -> None:
    block = ConsoleBlock("page.md", 1, False, [Command("echo out; exit 3", 2, 0, ["out"])])
    with pytest.raises(AssertionError, match=r"docs/page\.md:2: exit code 3, the page says 0"):
        _run_block(block, tmp_path)
    _run_block(ConsoleBlock("page.md", 1, False, [Command("echo out; exit 3  # exit 3", 2, 3, ["out"])]), tmp_path)
