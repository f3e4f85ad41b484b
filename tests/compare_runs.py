"""Test helper: dump real forward passes with llmcheck's torch capture, and inject plausible defects.

The defects are context managers that change one named module and restore it afterwards,
so the session-wide SmolLM2 fixture is left as it was found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def capture_run(model: torch.nn.Module, input_ids: torch.Tensor, dump_path: Path, **config: Any) -> Path:
    """Run one forward pass under the torch capture (inputs and outputs of every module) and return the dump."""
    from llmcheck import DumpConfig, register_hook

    with register_hook(model, DumpConfig(dump_path=str(dump_path), token_range=[0], tensor_part=2, **config)) as handle:
        with torch.no_grad():
            model(input_ids)
    assert handle.path is not None
    return Path(handle.path)


def capture_generate(model: torch.nn.Module, dump_path: Path, new_tokens: int) -> Path:
    """Run ``generate`` of ``new_tokens`` greedy tokens under the torch capture (every module's inputs and outputs, each step) and return the dump."""
    from llmcheck import DumpConfig, register_hook

    config = DumpConfig(dump_path=str(dump_path), token_range=list(range(new_tokens)), tensor_part=2)
    with register_hook(model, config) as handle, torch.no_grad():
        model.generate(torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]]), max_new_tokens=new_tokens, do_sample=False)
    assert handle.path is not None
    return Path(handle.path)


def module(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """Return the submodule at a dotted path."""
    return dict(model.named_modules())[name]


@contextlib.contextmanager
def wrong_rmsnorm_epsilon(model: torch.nn.Module, name: str, epsilon: float) -> Iterator[None]:
    """Give one RMSNorm the wrong epsilon (a config value mistyped in one layer)."""
    norm = module(model, name)
    original = norm.variance_epsilon
    norm.variance_epsilon = epsilon
    try:
        yield
    finally:
        norm.variance_epsilon = original


@contextlib.contextmanager
def scaled_weight(model: torch.nn.Module, name: str, factor: float) -> Iterator[None]:
    """Scale one module's weight (a quantisation scale a few percent off)."""
    weight = module(model, name).weight
    original = weight.detach().clone()
    with torch.no_grad():
        weight.mul_(factor)
    try:
        yield
    finally:
        with torch.no_grad():
            weight.copy_(original)


@contextlib.contextmanager
def nan_in_output(model: torch.nn.Module, name: str, index: tuple[int, ...]) -> Iterator[None]:
    """Make one module write a NaN into one element of its output (an uninitialised read in a kernel)."""

    def poison(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[index] = float("nan")
        return output

    handle = module(model, name).register_forward_hook(poison, prepend=True)  # before any capture hook
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def linears_in_float64(model: torch.nn.Module) -> Iterator[None]:
    """Make every Linear accumulate in float64 and round once to its dtype: another, more accurate fp32 GEMM library.

    The program is honest: each product differs from PyTorch's by its summation order's
    rounding alone (a few 1e-7 relative), which a deep model adds up.
    """

    def accurate(self: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.double()
        return torch.nn.functional.linear(hidden.double(), self.weight.double(), bias).to(hidden.dtype)

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for linear in linears:
        linear.forward = accurate.__get__(linear)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for linear in linears:
            del linear.forward
