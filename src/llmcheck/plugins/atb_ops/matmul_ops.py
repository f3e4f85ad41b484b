"""ATB's LinearOperation and MatmulOperation, recomputed in float64 (exact for int8 operands).

Linear inputs: ``x``, ``weight``, then ``bias`` when ``hasBias``, then the dequantisation
scale ``deqScale`` for a quantised linear (``outDataType`` set, int8 operands), or the
accumulator when ``enAccum``. ``transposeA``/``transposeB`` transpose the last two dims.
A FRACTAL_NZ weight reaches the reference already converted to ND by the loader, with a
leading batch dim of 1 and its alignment padding: the padding on the reduced dim is cut to
``x``'s size, the padding on the output dim to the bias's size when there is a bias.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llmcheck.plugins.atb_ops.op_inputs import (
    ACL_DT_UNDEFINED,
    int32_bits_as_float,
    param,
    positional,
    require,
    wide,
)


def _matmul(x: torch.Tensor, weight: torch.Tensor, transpose_a: bool, transpose_b: bool) -> torch.Tensor:
    x, weight = wide(x), wide(weight)
    if transpose_a:
        x = x.transpose(-1, -2)
    if weight.dim() == 3 and weight.shape[0] == 1 and x.dim() == 2:
        weight = weight[0]
    if transpose_b:
        weight = weight.transpose(-1, -2)
    reduced = x.shape[-1]
    require(
        weight.shape[-2] >= reduced,
        f"x {list(x.shape)} and weight {list(weight.shape)} do not multiply (transposeA={transpose_a}, "
        f"transposeB={transpose_b})",
    )
    return x @ weight[..., :reduced, :]


def linear(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return ``x @ weight (+ bias) (* deqScale) (+ accum)`` of a LinearOperation."""
    tensors = positional(inputs, at_least=2)
    require(int(param(params, "matmulType", 0)) == 0, "matmulType EIN_SUM is not supported")
    require(int(param(params, "quantMode", 0)) == 0, f"quantMode {params.get('quantMode')} is not supported")
    has_bias = bool(param(params, "hasBias", True))
    quantised = int(param(params, "outDataType", ACL_DT_UNDEFINED)) != ACL_DT_UNDEFINED
    accumulate = bool(param(params, "enAccum", False))
    result = _matmul(
        tensors[0], tensors[1], bool(param(params, "transposeA", False)), bool(param(params, "transposeB", True))
    )
    extra = 2
    if has_bias:
        require(len(tensors) > extra, "hasBias is set but the dump holds no bias input")
        bias = wide(tensors[extra]).reshape(-1)
        result = result[..., : bias.numel()] + bias
        extra += 1
    if quantised:
        require(len(tensors) > extra, "outDataType asks for a quantised linear but the dump holds no deqScale input")
        scale = int32_bits_as_float(tensors[extra]).reshape(-1)
        result = result[..., : scale.numel()] * scale
        extra += 1
    if accumulate:
        require(len(tensors) > extra, "enAccum is set but the dump holds no accumulator input")
        result = result + wide(tensors[extra])
    return [result]


def matmul(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return ``a @ b`` of a MatmulOperation (the deprecated plain matmul)."""
    tensors = positional(inputs, at_least=2)
    return [
        _matmul(
            tensors[0], tensors[1], bool(param(params, "transposeA", False)), bool(param(params, "transposeB", False))
        )
    ]
