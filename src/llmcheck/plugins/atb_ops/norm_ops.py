"""ATB's RmsNormOperation and LayerNormOperation in their NORM, PRENORM and POSTNORM forms, in float64.

``layerType`` picks the form and the parameter struct (``normParam``, ``preNormParam``,
``postNormParam``) that holds ``epsilon`` and ``quantType``. Inputs, in ATB's order:

* NORM: ``x, gamma`` (RmsNorm; LayerNorm adds ``beta``); int8 quantisation appends
  ``beta, scale, offset`` (RmsNorm) -- output ``round(norm / scale + offset)``; dynamic
  quantisation outputs the int8 tensor and the per-row scale ``max|y| / 127``.
* PRENORM: ``x, residual, [bias], gamma (, beta)`` -- outputs the norm of ``x + residual``
  and that sum.
* POSTNORM: ``x, residual, [bias], gamma (, beta)`` -- outputs the norm of the sum.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from llmcheck.plugins.atb_ops.op_inputs import param, positional, require, round_to_int8, sub_params, wide

NORM, PRENORM, POSTNORM = 1, 2, 3
QUANT_INT8 = 2
DYNAMIC_SYMMETRIC, DYNAMIC_ASYMMETRIC = 1, 2
GEMMA_MODEL = 1
_STRUCT = {NORM: "normParam", PRENORM: "preNormParam", POSTNORM: "postNormParam"}


class _NormForm(NamedTuple):
    """What both norm ops read from their parameters: the layer type and its sub-struct's common fields."""

    layer_type: int
    params: Mapping[str, Any]
    epsilon: float
    quant: int
    dynamic: int


def _form(params: Mapping[str, Any]) -> _NormForm:
    layer_type = int(param(params, "layerType", 0))
    require(layer_type in _STRUCT, f"layerType {layer_type} is not NORM, PRENORM or POSTNORM")
    form = sub_params(params, _STRUCT[layer_type])
    return _NormForm(
        layer_type,
        form,
        float(param(form, "epsilon", 1e-5)),
        int(param(form, "quantType", 0)),
        int(param(form, "dynamicQuantType", 0)),
    )


def _rms(x: torch.Tensor, gamma: torch.Tensor, epsilon: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + epsilon) * gamma.reshape(-1)


def _dynamic_quant(values: torch.Tensor, kind: int) -> list[torch.Tensor]:
    if kind == DYNAMIC_SYMMETRIC:
        scale = values.abs().amax(dim=-1, keepdim=True) / 127.0
        return [round_to_int8(values / scale), scale.squeeze(-1)]
    high, low = values.amax(dim=-1, keepdim=True), values.amin(dim=-1, keepdim=True)
    scale = (high - low) / 255.0
    offset = -(high + low) / (2.0 * scale)
    return [round_to_int8(values / scale + offset), scale.squeeze(-1), offset.squeeze(-1)]


def rms_norm(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the outputs of an RmsNormOperation."""
    tensors = [wide(tensor) for tensor in positional(inputs, at_least=2)]
    layer_type, form, epsilon, quant, dynamic = _form(params)

    def gamma_of(tensor: torch.Tensor) -> torch.Tensor:
        return 1.0 + tensor if int(param(form, "modelType", 0)) == GEMMA_MODEL else tensor

    if layer_type == NORM:
        x, gamma = tensors[0], gamma_of(tensors[1])
        if bool(param(form, "rstd", False)):
            rstd = torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + epsilon)
            return [x * rstd * gamma.reshape(-1), rstd]
        normed = _rms(x, gamma, epsilon)
        if quant != QUANT_INT8:
            return [normed]
        if dynamic:
            beta = tensors[2].reshape(-1) if len(tensors) > 2 else 0.0
            return _dynamic_quant(normed + beta, dynamic)
        require(len(tensors) >= 5, "int8 RmsNorm needs inputs x, gamma, beta, scale, offset")
        beta, scale, offset = tensors[2].reshape(-1), tensors[3].reshape(-1), tensors[4].reshape(-1)
        return [round_to_int8((normed + beta) / scale + offset)]
    has_bias = bool(param(form, "hasBias", False))
    summed = tensors[0] + tensors[1]
    next_input = 2
    if has_bias:
        summed = summed + tensors[2].reshape(-1)
        next_input = 3
    require(len(tensors) > next_input, f"layerType {layer_type} needs a gamma input after x and residual")
    normed = _rms(summed, gamma_of(tensors[next_input]), epsilon)
    if layer_type == POSTNORM:
        return [normed]
    if quant == QUANT_INT8:
        require(len(tensors) >= next_input + 4, "int8 PRENORM RmsNorm needs gamma, beta, scale, offset inputs")
        beta, scale, offset = (tensors[next_input + i].reshape(-1) for i in (1, 2, 3))
        return [round_to_int8((normed + beta) / scale + offset), summed]
    return [normed, summed]


def layer_norm(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the outputs of a LayerNormOperation."""
    tensors = [wide(tensor) for tensor in positional(inputs, at_least=3)]
    layer_type, form, epsilon, quant, dynamic = _form(params)
    if layer_type == NORM:
        x, gamma, beta = tensors[:3]
        begin = int(param(form, "beginNormAxis", 0))
        normed = torch.nn.functional.layer_norm(
            x, x.shape[begin:], gamma.reshape(x.shape[begin:]), beta.reshape(x.shape[begin:]), epsilon
        )
        if quant != QUANT_INT8:
            return [normed]
        require(dynamic != 0, "static int8 LayerNorm is not supported (only dynamic quantisation)")
        return _dynamic_quant(normed, dynamic)
    require(len(tensors) >= 4, f"layerType {layer_type} needs x, residual, gamma, beta")
    require(quant != QUANT_INT8, f"int8 quantisation with layerType {layer_type} is not supported")
    zoom = float(param(form, "zoomScaleValue", 1.0))
    summed = tensors[0] + zoom * tensors[1]
    size = summed.shape[-1:]
    normed = torch.nn.functional.layer_norm(summed, size, tensors[2].reshape(size), tensors[3].reshape(size), epsilon)
    return [normed, summed] if layer_type == PRENORM else [normed]
