"""The tensors inside a call's arguments or result, each with its path in the structure.

Positions are the record keys' ``position``: ``"0"`` for the first positional argument or
a single result, ``"1.0"`` inside a tuple, ``"past_key_values.0"`` for a keyword argument,
``"logits"`` for a field of an HF ``ModelOutput`` (a dict). Only tuples, lists and mappings
are entered; other objects (an HF ``Cache``, a config) hold no captured tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

#: How deep nested containers are followed; deeper values are not captured.
MAX_DEPTH = 8


def tensors_in(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(position, tensor)`` for every tensor inside ``value``, which sits at ``path``."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif depth >= MAX_DEPTH:
        return
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from tensors_in(item, f"{path}.{index}" if path else str(index), depth + 1)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from tensors_in(item, f"{path}.{key}" if path else str(key), depth + 1)


def call_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """Return the tensors of a call's arguments: positional ones at ``"0"``, ``"1"``, keywords by name."""
    if not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):
        return [("0", args[0])]  # the common call, without walking the structure
    found = list(tensors_in(args, ""))
    if kwargs:
        found.extend(tensors_in(kwargs, ""))
    return found


def call_outputs(result: Any) -> list[tuple[str, torch.Tensor]]:
    """Return the tensors of a call's result: a single tensor at ``"0"``, containers by index or key."""
    if isinstance(result, torch.Tensor):
        return [("0", result)]
    return list(tensors_in(result, ""))
