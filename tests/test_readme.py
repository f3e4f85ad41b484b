"""README.md's two set-up commands stay true: CI runs exactly its test command, and it installs torch first."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", setup, re.S)]


def test_readme_has_two_set_up_commands_install_and_demo_then_tests() -> None:
    install_and_demo, run_tests = _readme_commands()
    assert install_and_demo.index("torch==2.13.0") < install_and_demo.index("-e '.[test]'")
    assert install_and_demo.endswith("llmcheck demo")
    assert "pytest" in run_tests


def test_ci_script_runs_the_readme_test_command_verbatim() -> None:
    _, run_tests = _readme_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    assert run_tests in ci.splitlines() or any(line.strip() == run_tests for line in ci.splitlines())
    assert ci.index("torch==2.13.0") < ci.index("-e '.[test]'")


def test_readme_names_the_browser_and_its_install_command_and_ci_requires_it() -> None:
    from headless_browser import INSTALL_HINT, REQUIRE_ENV

    readme = (ROOT / "README.md").read_text()
    assert "chromium" in readme and f"`{INSTALL_HINT}`" in readme and REQUIRE_ENV in readme
    ci = (ROOT / ".ci" / "run").read_text()
    _, run_tests = _readme_commands()
    assert ci.index(f"export {REQUIRE_ENV}=1") < ci.index(run_tests)


def test_the_default_output_folders_of_demo_and_compare_are_git_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "llmcheck_demo/" in ignored and "llmcheck_compare/" in ignored
