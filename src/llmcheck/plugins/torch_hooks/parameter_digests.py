"""Digests of each module's own parameters: wrongly loaded weights found without storing them.

A module-level dump holds activations, not weights, yet a weight loaded or converted wrongly
is the most common porting defect, and in bf16 its effect on the activations can hide under
rounding noise. So the capture hashes every parameter of the modules it records, once per
dump (again only when a parameter is replaced, moved or updated in place), and the first
record of each module call carries the digests (see :mod:`llmcheck.core.judging.weights` for the
rule compare applies). The capture cannot know the other run's dtype, so a parameter is
hashed at its own dtype and rounded to every less precise one (float32 weights also as
float16 and bfloat16): the digest of an honest bf16 copy equals the golden's bf16 digest.

The work is done at the start of a dumped step, outside the modules' hooks: one host copy
per parameter and dtype, about a second per gigabyte of weights on a CPU. Turn it off with
``DumpConfig(weight_digests=False)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch

from llmcheck.plugin_api import dtype_name, version_counter

#: The dtypes a parameter's values are hashed at: its own, then each less precise one.
ROUNDED_TO: dict[torch.dtype, tuple[torch.dtype, ...]] = {
    torch.float64: (torch.float64, torch.float32, torch.float16, torch.bfloat16),
    torch.float32: (torch.float32, torch.float16, torch.bfloat16),
    torch.float16: (torch.float16, torch.bfloat16),
    torch.bfloat16: (torch.bfloat16,),
}


def value_digest(tensor: torch.Tensor) -> str:
    """Return a digest of a tensor's values in its dtype (its bytes in row-major order, not its strides)."""
    host = tensor.detach().reshape(-1).contiguous().cpu()
    return hashlib.blake2b(host.view(torch.uint8).numpy().data, digest_size=16).hexdigest()


def parameter_digests(parameter: torch.Tensor) -> dict[str, Any]:
    """Return one parameter's entry: its dtype, shape and digests rounded to each dtype it can be compared at."""
    with torch.no_grad():
        rounded = {dtype_name(dtype): value_digest(parameter.to(dtype)) for dtype in ROUNDED_TO[parameter.dtype]}
    return {"dtype": dtype_name(parameter.dtype), "shape": list(parameter.shape), "rounded": rounded}


def _state(parameter: torch.Tensor) -> tuple[Any, ...]:
    """Return what changes when a parameter's values may have: its storage, dtype, shape and version."""
    return parameter.data_ptr(), parameter.dtype, tuple(parameter.shape), version_counter(parameter)


class ModuleParameterDigests:
    """The digests of the recorded modules' own floating-point parameters, kept up to date step by step."""

    def __init__(self, model: torch.nn.Module, selected: Callable[[str], bool], root_name: str) -> None:
        self._modules = [
            (name or root_name, module) for name, module in model.named_modules() if selected(name or root_name)
        ]
        self._cache: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def refresh(self) -> None:
        """Hash the parameters that are new or changed since the last call (none, in an inference loop)."""
        for name, module in self._modules:
            parameters = [
                (parameter_name, parameter)
                for parameter_name, parameter in module.named_parameters(recurse=False)
                if parameter.dtype in ROUNDED_TO and parameter.layout == torch.strided and not parameter.is_meta
            ]
            if not parameters:
                continue
            state = tuple(_state(parameter) for _, parameter in parameters)
            cached = self._cache.get(name)
            if cached is None or cached[0] != state:
                self._cache[name] = (
                    state,
                    {parameter_name: parameter_digests(parameter) for parameter_name, parameter in parameters},
                )

    def of(self, module_name: str) -> dict[str, Any] | None:
        """Return a module's digests by parameter name, or None when it has no floating-point parameters."""
        cached = self._cache.get(module_name)
        return cached[1] if cached is not None else None
