"""Headless Chromium for the tests that render report.html: found on PATH, or the test is skipped.

A fresh machine without a browser still passes the README's test command: the browser
tests skip, saying what to install. CI sets ``LLMCHECK_REQUIRE_BROWSER=1`` (``.ci/run``),
so there a missing browser fails instead of silently skipping the rendering checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
REQUIRE_ENV = "LLMCHECK_REQUIRE_BROWSER"
INSTALL_HINT = "sudo apt-get install -y chromium"


def find_browser() -> str:
    """Return the path of a headless-capable browser; skip the test (fail it under CI's variable) if none."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    reason = f"no headless browser found (Debian's chromium): {INSTALL_HINT}"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1 requires it)")
    pytest.skip(reason)


def browser_command(*arguments: str) -> list[str]:
    """Return the argv that runs the browser headless with ``arguments`` (the page URI last)."""
    return [find_browser(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", *arguments]


def render(page: Path) -> tuple[str, str]:
    """Return the DOM after the scripts ran in a 1280 px window, and the browser's log (console messages included)."""
    completed = subprocess.run(
        browser_command(
            "--window-size=1280,1000", "--enable-logging=stderr", "--v=0", "--dump-dom", page.resolve().as_uri()
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout, completed.stderr


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 1400) -> Path:
    """Save a PNG of the page as a ``width`` x ``height`` window shows it, and return its path."""
    png.parent.mkdir(parents=True, exist_ok=True)
    completed = subprocess.run(
        browser_command(
            f"--window-size={width},{height}",
            f"--screenshot={png.resolve()}",
            "--virtual-time-budget=5000",
            page.resolve().as_uri(),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0 and png.exists(), completed.stderr[-2000:]
    return png
