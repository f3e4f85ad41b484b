"""Tensors rebuilt from the shards of a tensor-parallel run, and a golden tensor cut into its ranks' parts.

Each function is a :class:`~llmcheck.core.records.TensorLoader` once its arguments are bound
(``functools.partial``), so a gathered record streams through the metric engine like any
record, and worker processes can measure it (the bound handles pickle).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from llmcheck.plugin_api import TensorData

if TYPE_CHECKING:  # pragma: no cover
    import torch


def concatenated(shards: Sequence[TensorData], dim: int) -> torch.Tensor:
    """Return the shards joined along ``dim``, in rank order."""
    import torch

    return torch.cat([shard.load() for shard in shards], dim=dim)


def summed(shards: Sequence[TensorData]) -> torch.Tensor:
    """Return the sum of partial sums (what the all-reduce gives), accumulated in float32 at least, in the shards' dtype."""
    import torch

    tensors = [shard.load() for shard in shards]
    accumulate = (
        torch.promote_types(tensors[0].dtype, torch.float32) if tensors[0].is_floating_point() else tensors[0].dtype
    )
    total = tensors[0].to(accumulate).clone()
    for tensor in tensors[1:]:
        total += tensor.to(accumulate)
    return total.to(tensors[0].dtype)


def part_of(whole: TensorData, dim: int, start: int, length: int) -> torch.Tensor:
    """Return the part of a tensor one rank holds: ``length`` entries from ``start`` along ``dim``."""
    return whole.load().narrow(dim, start, length).contiguous()


def gathered_data(shards: Sequence[TensorData], dtype: str, shape: tuple[int, ...], dim: int | None) -> TensorData:
    """Return a handle to the tensor the shards make: joined along ``dim``, or summed when ``dim`` is None."""
    loader = partial(summed, tuple(shards)) if dim is None else partial(concatenated, tuple(shards), dim)
    return TensorData(dtype=dtype, shape=shape, loader=loader)


def part_data(whole: TensorData, dim: int, start: int, length: int, shape: tuple[int, ...]) -> TensorData:
    """Return a handle to one rank's part of a golden tensor."""
    return TensorData(dtype=whole.dtype, shape=shape, loader=partial(part_of, whole, dim, start, length))
