"""Cheap tensor statistics (min, max, mean, L2 norm, NaN and Inf counts), the same everywhere.

Captures call :func:`tensor_stats` so statistics-only dumps and full dumps carry comparable
numbers; :func:`stats_batch` computes them for many tensors on their device and fetches
them to the host in one transfer (one sync per step on an accelerator, not one per tensor).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmcheck.core.records import TensorStats

_FIELDS = 6  # min, max, mean, l2norm, nan_count, inf_count


def stats_vector(tensor: torch.Tensor) -> torch.Tensor:
    """Return the six statistics of one tensor as a float64 vector on the tensor's device.

    Nothing is fetched to the host, so on an accelerator the kernels queue asynchronously:
    a capture computes the vector while the tensor still holds its value and fetches many
    vectors at once later with :func:`stats_from_vectors`.
    """
    device = tensor.device
    if tensor.numel() == 0:
        return torch.full((_FIELDS,), float("nan"), dtype=torch.float64, device=device).index_fill_(
            0, torch.tensor([4, 5], device=device), 0.0
        )
    if tensor.dtype.is_complex:
        tensor = tensor.abs()
    if tensor.dtype == torch.bool or not tensor.dtype.is_floating_point:
        values = tensor.to(torch.float64)
        nan_count = inf_count = torch.zeros((), dtype=torch.float64, device=device)
    else:
        if device.type == "cpu" and tensor.dtype in _CHUNKED_DTYPES:
            finite = _finite_cpu_stats_vector(tensor)
            if finite is not None:
                return finite
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
            return torch.stack(
                [
                    torch.where(empty, nan, low),
                    torch.where(empty, nan, high),
                    torch.where(empty, nan, total / finite_count.clamp(min=1)),
                    torch.where(empty, nan, l2norm),
                    nan_count,
                    inf_count,
                ]
            )
    low, high = torch.aminmax(values)
    total = values.sum(dtype=torch.float64)
    l2norm = torch.linalg.vector_norm(values, dtype=torch.float64)
    mean = total / values.numel()
    return torch.stack([low.to(torch.float64), high.to(torch.float64), mean, l2norm, nan_count, inf_count])


#: CPU floating dtypes measured chunk by chunk (float8 kinds take the general path).
_CHUNKED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
#: Elements per chunk: 1 MiB of float64, so each chunk's conversion stays in cache.
_CHUNK_ELEMENTS = 1 << 17


def _finite_cpu_stats_vector(tensor: torch.Tensor) -> torch.Tensor | None:
    """Return the statistics of a CPU float tensor without NaN or Inf, or ``None`` if it has any.

    Why: converting a whole tensor to float64 for the sum and again for the norm costs two
    large allocations and several passes (seconds per step for a capture). Chunks converted
    in cache give the same float64 sums in one pass; a finite total and sum of squares
    prove there is no NaN or Inf, which the caller otherwise counts the slow way.
    """
    flat = tensor.reshape(-1)
    total = torch.zeros((), dtype=torch.float64)
    squares = torch.zeros((), dtype=torch.float64)
    for start in range(0, flat.numel(), _CHUNK_ELEMENTS):
        part = flat[start : start + _CHUNK_ELEMENTS].to(torch.float64)
        total += part.sum()
        squares += torch.dot(part, part)
    if not (bool(torch.isfinite(total)) and bool(torch.isfinite(squares))):
        return None
    low, high = torch.aminmax(flat)
    zero = torch.zeros((), dtype=torch.float64)
    return torch.stack(
        [low.to(torch.float64), high.to(torch.float64), total / flat.numel(), squares.sqrt(), zero, zero]
    )


def _from_vector(row: Sequence[float]) -> TensorStats:
    low, high, mean, l2norm, nan_count, inf_count = (float(v) for v in row)

    def defined(value: float) -> float | None:
        return None if value != value else value  # NaN marks "undefined" (empty or all non-finite)

    return TensorStats(
        min=defined(low),
        max=defined(high),
        mean=defined(mean),
        l2norm=defined(l2norm),
        nan_count=int(nan_count),
        inf_count=int(inf_count),
    )


def tensor_stats(tensor: torch.Tensor) -> TensorStats:
    """Return the statistics of one tensor (over its finite elements)."""
    with torch.no_grad():
        return _from_vector(stats_vector(tensor.detach()).cpu().tolist())


def stats_json_from_rows(rows: torch.Tensor) -> list[dict[str, float | int | str | None]]:
    """Return the statistics in the rows of a ``[n, 6]`` float64 tensor as :meth:`TensorStats.as_json` writes them.

    Fetched to the host in one copy. Built directly, without a :class:`TensorStats` per
    row: a capture writes thousands of records a step.
    """
    return [
        {
            "min": _json_value(low),
            "max": _json_value(high),
            "mean": _json_value(mean),
            "l2norm": _json_value(l2norm),
            "nan_count": int(nan_count),
            "inf_count": int(inf_count),
        }
        for low, high, mean, l2norm, nan_count, inf_count in rows.cpu().tolist()
    ]


def _json_value(value: float) -> float | str | None:
    """Return a statistic as ``TensorStats.as_json`` holds it: NaN (undefined) as None, an infinity as text."""
    if value - value == 0.0:  # finite
        return value
    return None if value != value else repr(value)


def stats_from_vectors(vectors: Sequence[torch.Tensor]) -> list[TensorStats]:
    """Return the statistics held by :func:`stats_vector` results, fetched in one copy per device."""
    by_device: dict[torch.device, list[int]] = {}
    for i, vector in enumerate(vectors):
        by_device.setdefault(vector.device, []).append(i)
    rows: list[list[float]] = [[] for _ in vectors]
    for indices in by_device.values():
        fetched = torch.stack([vectors[i] for i in indices]).cpu().tolist()
        for i, row in zip(indices, fetched):
            rows[i] = row
    return [_from_vector(row) for row in rows]


def stats_batch(tensors: Sequence[torch.Tensor]) -> list[TensorStats]:
    """Return the statistics of many tensors, computed on their devices and fetched in one copy per device.

    On an accelerator the tensors of one device are measured together by
    :func:`segmented_stats_vectors` (a dozen kernels per distinct tensor size); on the
    CPU each tensor is measured in cache-sized chunks.
    """
    if not tensors:
        return []
    with torch.no_grad():
        vectors: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
        by_device: dict[torch.device, list[int]] = {}
        for i, tensor in enumerate(tensors):
            if tensor.device.type == "cpu":
                vectors[i] = stats_vector(tensor.detach())
            else:
                by_device.setdefault(tensor.device, []).append(i)
        for indices in by_device.values():
            rows = segmented_stats_vectors([tensors[i].detach() for i in indices])
            for row, i in enumerate(indices):
                vectors[i] = rows[row]
        return stats_from_vectors(vectors)


#: Elements of one group measured at a time by :func:`segmented_stats_vectors` (512 KB as float64).
_SEGMENT_CHUNK_ELEMENTS = 1 << 16


def _segment_rows(stacked: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Return the ``[n, 6]`` float64 statistics of the rows of a non-empty ``[n, size]`` tensor."""
    values = (stacked.abs() if stacked.dtype.is_complex else stacked).to(torch.float64)
    if device.type == "cpu":
        # one host read per group, not per tensor: a finite float64 row sum proves the row has no NaN or
        # Inf, and then the masked reductions below equal the plain ones bit for bit, at a tenth of the cost
        total = values.sum(dim=1)
        if bool(torch.isfinite(total).all()):
            zero = torch.zeros_like(total)
            low, high = values.amin(dim=1), values.amax(dim=1)  # aminmax along a dim is ten times slower
            return torch.stack(
                [
                    low,
                    high,
                    total / torch.full_like(total, values.shape[1]),
                    (values * values).sum(dim=1).sqrt(),
                    zero,
                    zero,
                ],
                dim=1,
            )
    finite = torch.isfinite(values)
    finite_count = finite.sum(dim=1, dtype=torch.float64)
    nan_count = torch.isnan(values).sum(dim=1, dtype=torch.float64)
    cleaned = torch.where(finite, values, 0.0)
    some_finite = finite_count > 0
    nan = torch.full_like(finite_count, float("nan"))
    measured = torch.stack(
        [
            torch.where(finite, values, torch.inf).amin(dim=1),
            torch.where(finite, values, -torch.inf).amax(dim=1),
            cleaned.sum(dim=1) / finite_count.clamp(min=1),
            (cleaned * cleaned).sum(dim=1).sqrt(),
        ],
        dim=1,
    )
    return torch.cat(
        [
            torch.where(some_finite[:, None], measured, nan[:, None]),
            nan_count[:, None],
            (values.shape[1] - finite_count - nan_count)[:, None],
        ],
        dim=1,
    )


def segmented_stats_vectors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Return the statistics of many tensors of one device as a ``[n, 6]`` float64 tensor on that device.

    Why: on an accelerator each small kernel costs a launch, and :func:`stats_vector`
    launches about twenty per tensor -- several times a small model's own forward. Here
    tensors of equal size (most of a model's activations share a few sizes) are stacked
    into one matrix and each statistic is one reduction along its rows: a dozen kernels
    per distinct size, however many tensors. On an accelerator nothing is fetched to the
    host; on the CPU one value per group tells whether it holds NaN or Inf.
    """
    device = tensors[0].device
    rows = torch.full((len(tensors), _FIELDS), float("nan"), dtype=torch.float64, device=device)
    rows[:, 4:] = 0.0  # empty tensors keep NaN statistics and zero counts
    # grouped by shape and dtype, so a group is stacked as it is and converted to float64 in one call
    by_shape: dict[tuple[torch.Size, torch.dtype], list[int]] = {}
    for i, tensor in enumerate(tensors):
        if tensor.numel() > 0:
            by_shape.setdefault((tensor.shape, tensor.dtype), []).append(i)
    on_cpu = device.type == "cpu"
    for (shape, _), indices in by_shape.items():
        # on the CPU a few hundred KB of float64 at a time: temporaries that large are reused, larger ones
        # page-fault (four times slower); an accelerator takes the group whole (fewer kernel launches)
        chunk_rows = max(1, _SEGMENT_CHUNK_ELEMENTS // shape.numel()) if on_cpu else len(indices)
        for start in range(0, len(indices), chunk_rows):
            chunk = indices[start : start + chunk_rows]
            rows[chunk] = _segment_rows(torch.stack([tensors[i] for i in chunk]).reshape(len(chunk), -1), device)
    return rows
