"""ATB's ElewiseOperation (every ``elewiseType``) and ActivationOperation, in float64.

Binary element-wise types broadcast like torch. Comparisons and logical types give int8
0/1 as ATB does. Quantisation follows Ascend's convention: ``QUANT`` is
``round(x * inputScale + inputOffset)``, ``QUANT_PER_CHANNEL`` ``round(x / scale) + offset``,
``DEQUANT_PER_CHANNEL`` ``(y - offset) * scale``, ``DYNAMIC_QUANT`` the per-row
``round(x / (max|x| / 127))`` with the scale as a second output; int8 results saturate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from llmcheck.plugin_api import UnsupportedOpError
from llmcheck.plugins.atb_ops.op_inputs import (
    ACL_DT_UNDEFINED,
    acl_dtype,
    param,
    positional,
    require,
    round_to_int8,
    sub_params,
    wide,
)

_Unary = Callable[[torch.Tensor], torch.Tensor]
_Binary = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_UNARY: dict[int, _Unary] = {3: torch.cos, 4: torch.sin, 5: torch.neg, 20: torch.tanh}
_BINARY: dict[int, _Binary] = {8: torch.add, 9: torch.mul, 10: torch.div, 15: torch.sub}
_PREDICATES: dict[int, _Binary] = {
    11: torch.logical_and,
    12: torch.logical_or,
    13: torch.lt,
    14: torch.gt,
    16: torch.eq,
}
CAST, MULS, QUANT, LOGICAL_NOT = 1, 2, 6, 7
QUANT_PER_CHANNEL, DEQUANT_PER_CHANNEL, DYNAMIC_QUANT = 17, 18, 19


def _int8_flag(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.int8)


def elewise(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the output(s) of an ElewiseOperation."""
    tensors = positional(inputs, at_least=1)
    kind = int(param(params, "elewiseType", 0))
    x = wide(tensors[0])
    if kind in _UNARY:
        return [_UNARY[kind](x)]
    if kind == CAST:
        target = int(param(params, "outTensorType", ACL_DT_UNDEFINED))
        if target == ACL_DT_UNDEFINED or acl_dtype(target, "outTensorType").is_floating_point:
            return [x]  # a float cast's only error is its rounding, which the criterion allows
        return [tensors[0].to(acl_dtype(target, "outTensorType"))]
    if kind == MULS:
        return [x * float(param(sub_params(params, "mulsParam"), "varAttr", params.get("varAttr", 0.0)))]
    if kind == LOGICAL_NOT:
        return [_int8_flag(torch.logical_not(x))]
    if kind == QUANT:
        quant = sub_params(params, "quantParam")
        return [round_to_int8(x * float(param(quant, "inputScale", 1.0)) + float(param(quant, "inputOffset", 0)))]
    if kind == DYNAMIC_QUANT:
        require(
            not bool(param(sub_params(params, "quantParam"), "asymmetric", False)),
            "asymmetric dynamic quantisation is not supported",
        )
        scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
        return [round_to_int8(x / scale), scale.squeeze(-1)]
    require(len(tensors) >= 2, f"elewiseType {kind} needs two inputs")
    y = wide(tensors[1])
    if kind in _BINARY:
        return [_BINARY[kind](x, y)]
    if kind in _PREDICATES:
        return [_int8_flag(_PREDICATES[kind](x, y))]
    if kind == QUANT_PER_CHANNEL:
        offset = wide(tensors[2]) if len(tensors) > 2 and tensors[2].numel() else 0.0
        return [round_to_int8(torch.round(x / y) + offset)]
    if kind == DEQUANT_PER_CHANNEL:
        offset = wide(tensors[2]) if len(tensors) > 2 and tensors[2].numel() else 0.0
        return [(x - offset) * y]
    raise UnsupportedOpError(f"elewiseType {kind} is not supported")


RELU, GELU, FAST_GELU, SWISH, LOG, SWIGLU_FORWARD, SWIGLU_BACKWARD, SIGMOID, FASTER_GELU = range(1, 10)
GELU_TANH_MODE = 0


def _swish(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return x * torch.sigmoid(scale * x)


def activation(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the output of an ActivationOperation."""
    tensors = [wide(tensor) for tensor in positional(inputs, at_least=1)]
    kind = int(param(params, "activationType", 0))
    x = tensors[0]
    dim = int(param(params, "dim", -1))
    if kind == RELU:
        return [torch.relu(x)]
    if kind == GELU:
        mode = int(param(params, "geluMode", GELU_TANH_MODE))
        return [torch.nn.functional.gelu(x, approximate="tanh" if mode == GELU_TANH_MODE else "none")]
    if kind == FAST_GELU:
        return [x * torch.exp(0.851 * (x - x.abs())) / (1.0 + torch.exp(-1.702 * x.abs()))]
    if kind == FASTER_GELU:
        return [x * torch.sigmoid(1.702 * x)]
    if kind == SWISH:
        return [_swish(x, float(param(params, "scale", 1.0)))]
    if kind == LOG:
        return [torch.log(x)]
    if kind == SIGMOID:
        return [torch.sigmoid(x)]
    if kind == SWIGLU_FORWARD:
        gate, up = x.chunk(2, dim=dim)
        return [_swish(gate) * up]
    if kind == SWIGLU_BACKWARD:
        require(len(tensors) >= 2, "SwiGLU backward needs the output gradient and x")
        grad, x = tensors[0], tensors[1]
        gate, up = x.chunk(2, dim=dim)
        sigmoid = torch.sigmoid(gate)
        swish_grad = sigmoid + gate * sigmoid * (1.0 - sigmoid)
        return [torch.cat([grad * up * swish_grad, grad * _swish(gate)], dim=dim)]
    raise UnsupportedOpError(f"activationType {kind} is not supported")
