"""Cheap tensor statistics (min, max, mean, L2 norm, NaN and Inf counts), the same everywhere.

Captures call :func:`tensor_stats` so statistics-only dumps and full dumps carry comparable
numbers; :func:`stats_batch` computes them for many tensors on their device and fetches
them to the host in one transfer (one sync per step on an accelerator, not one per tensor).
"""

from __future__ import annotations

from typing import Sequence

import torch

from llmcheck.core.records import TensorStats

_FIELDS = 6  # min, max, mean, l2norm, nan_count, inf_count


def _stats_vector(tensor: torch.Tensor) -> torch.Tensor:
    """Return the six statistics of one tensor as a float64 vector on the tensor's device."""
    device = tensor.device
    if tensor.numel() == 0:
        return torch.full((_FIELDS,), float("nan"), dtype=torch.float64, device=device).index_fill_(
            0, torch.tensor([4, 5], device=device), 0.0)
    if tensor.dtype.is_complex:
        tensor = tensor.abs()
    if tensor.dtype == torch.bool or not tensor.dtype.is_floating_point:
        values = tensor.to(torch.float64)
        nan_count = inf_count = torch.zeros((), dtype=torch.float64, device=device)
    else:
        values = tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.to(torch.float32)
        nan_mask = torch.isnan(values)
        inf_mask = torch.isinf(values)
        nan_count = nan_mask.sum(dtype=torch.float64)
        inf_count = inf_mask.sum(dtype=torch.float64)
        bad = nan_mask | inf_mask
        # On CPU a cheap check avoids masking in the common all-finite case; on a device the
        # masked form is used unconditionally so no host sync is needed per tensor.
        if device.type != "cpu" or bool(bad.any()):
            finite_count = values.numel() - bad.sum(dtype=torch.float64)
            low = torch.where(bad, torch.inf, values).amin().to(torch.float64)
            high = torch.where(bad, -torch.inf, values).amax().to(torch.float64)
            cleaned = torch.where(bad, 0.0, values)
            total = cleaned.sum(dtype=torch.float64)
            l2norm = torch.linalg.vector_norm(cleaned, dtype=torch.float64)
            nan = torch.full((), float("nan"), dtype=torch.float64, device=device)
            empty = finite_count == 0
            return torch.stack([torch.where(empty, nan, low), torch.where(empty, nan, high),
                                torch.where(empty, nan, total / finite_count.clamp(min=1)),
                                torch.where(empty, nan, l2norm), nan_count, inf_count])
    low, high = torch.aminmax(values)
    total = values.sum(dtype=torch.float64)
    l2norm = torch.linalg.vector_norm(values, dtype=torch.float64)
    mean = total / values.numel()
    return torch.stack([low.to(torch.float64), high.to(torch.float64), mean, l2norm, nan_count, inf_count])


def _from_vector(row: Sequence[float]) -> TensorStats:
    low, high, mean, l2norm, nan_count, inf_count = (float(v) for v in row)

    def defined(value: float) -> float | None:
        return None if value != value else value  # NaN marks "undefined" (empty or all non-finite)

    return TensorStats(min=defined(low), max=defined(high), mean=defined(mean), l2norm=defined(l2norm),
                       nan_count=int(nan_count), inf_count=int(inf_count))


def tensor_stats(tensor: torch.Tensor) -> TensorStats:
    """Return the statistics of one tensor (over its finite elements)."""
    with torch.no_grad():
        return _from_vector(_stats_vector(tensor.detach()).cpu().tolist())


def stats_batch(tensors: Sequence[torch.Tensor]) -> list[TensorStats]:
    """Return the statistics of many tensors, computed on their devices and fetched in one copy per device."""
    if not tensors:
        return []
    with torch.no_grad():
        vectors = [_stats_vector(t.detach()) for t in tensors]
        by_device: dict[torch.device, list[int]] = {}
        for i, vector in enumerate(vectors):
            by_device.setdefault(vector.device, []).append(i)
        rows: list[list[float]] = [[] for _ in tensors]
        for indices in by_device.values():
            fetched = torch.stack([vectors[i] for i in indices]).cpu().tolist()
            for i, row in zip(indices, fetched):
                rows[i] = row
    return [_from_vector(row) for row in rows]
