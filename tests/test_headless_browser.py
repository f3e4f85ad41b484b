"""A machine without a browser skips the rendering tests with the install command; CI fails instead."""

from __future__ import annotations

import pytest

from headless_browser import INSTALL_HINT, REQUIRE_ENV, find_browser


def test_no_browser_skips_with_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=INSTALL_HINT):
        find_browser()


def test_no_browser_fails_when_ci_requires_one(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ENV}=1"):
        find_browser()


def test_a_browser_on_path_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_browser() == str(fake)
