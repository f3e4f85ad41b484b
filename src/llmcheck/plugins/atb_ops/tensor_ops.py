"""ATB's data-movement and reduction ops: Gather, Concat, Split, Slice, Transpose, Where, Softmax, Reduce.

Data movement is exact, so these references keep the input dtype (any difference is a
real defect, and integer outputs compare exactly); Softmax and Reduce compute in float64.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llmcheck.plugins.atb_ops.op_inputs import param, positional, require, wide

REDUCE_MAX, REDUCE_MIN, REDUCE_SUM = 1, 2, 3


def gather(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return ``x`` gathered along ``axis`` by ``indices`` (output shape x[:axis] + indices + x[axis+1:])."""
    x, indices = positional(inputs, at_least=2)[:2]
    axis = int(param(params, "axis", 0)) % x.dim()
    require(int(param(params, "batchDims", 0)) == 0, "batchDims other than 0 is not supported")
    picked = x.index_select(axis, indices.reshape(-1).to(torch.int64))
    return [picked.reshape(*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :])]


def concat(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the inputs concatenated along ``concatDim``."""
    tensors = positional(inputs, at_least=2)
    dtype = torch.promote_types(tensors[0].dtype, tensors[1].dtype)
    return [torch.cat([tensor.to(dtype) for tensor in tensors], dim=int(param(params, "concatDim", 0)))]


def split(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return ``x`` split along ``splitDim`` into ``splitNum`` equal parts, or into ``splitSizes``."""
    x = positional(inputs, at_least=1)[0]
    dim = int(param(params, "splitDim", 0))
    sizes = [int(size) for size in param(params, "splitSizes", [])]
    if sizes:
        return list(torch.split(x, sizes, dim=dim))
    parts = int(param(params, "splitNum", 2))
    require(parts > 0 and x.shape[dim] % parts == 0, f"dim {dim} of size {x.shape[dim]} does not split into {parts}")
    return list(torch.chunk(x, parts, dim=dim))


def slice_op(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the block of ``x`` at ``offsets`` of ``size`` (-1: to the end; negative offsets count from the end)."""
    x = positional(inputs, at_least=1)[0]
    offsets = [int(value) for value in param(params, "offsets", [])]
    sizes = [int(value) for value in param(params, "size", [])]
    require(len(offsets) == len(sizes) == x.dim(), f"offsets {offsets} and size {sizes} do not match {x.dim()} dims")
    index = []
    for dim, (offset, size) in enumerate(zip(offsets, sizes)):
        start = offset + x.shape[dim] if offset < 0 else offset
        index.append(slice(start, x.shape[dim] if size == -1 else start + size))
    return [x[tuple(index)]]


def transpose(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return ``x`` with its dims permuted by ``perm``."""
    x = positional(inputs, at_least=1)[0]
    return [x.permute(*[int(dim) for dim in param(params, "perm", list(range(x.dim())))])]


def where(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return ``cond ? x : y`` with broadcasting."""
    condition, x, y = positional(inputs, at_least=3)[:3]
    dtype = torch.promote_types(x.dtype, y.dtype)
    return [torch.where(condition.to(torch.bool), x.to(dtype), y.to(dtype))]


def softmax(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the softmax of ``x`` over the consecutive dims ``axes``."""
    x = wide(positional(inputs, at_least=1)[0])
    axes = sorted(int(axis) % x.dim() for axis in param(params, "axes", [-1]))
    require(axes == list(range(axes[0], axes[0] + len(axes))), f"axes {axes} are not consecutive")
    flat = x.flatten(axes[0], axes[-1])
    return [torch.softmax(flat, dim=axes[0]).reshape(x.shape)]


def reduce(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the max, min or sum of ``x`` over ``axis`` (the dims are removed)."""
    x = positional(inputs, at_least=1)[0]
    axes = [int(axis) for axis in param(params, "axis", [])]
    kind = int(param(params, "reduceType", 0))
    require(bool(axes), "reduce needs at least one axis")
    if kind == REDUCE_SUM:
        return [wide(x).sum(dim=axes)]
    require(kind in (REDUCE_MAX, REDUCE_MIN), f"reduceType {kind} is not supported")
    return [x.amax(dim=axes) if kind == REDUCE_MAX else x.amin(dim=axes)]
