"""What every ATB reference needs: its inputs in position order, float64 copies, parameters with ATB's defaults.

ATB numbers an op's tensors ``intensor0, intensor1, ...``; references take them as a list.
Parameters are read from ``op_param.json`` with the defaults of the parameter structs in
``atb/infer_op_params.h``, since older dumps omit fields newer ATB versions added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llmcheck.plugin_api import UnsupportedOpError

#: aclDataType codes a parameter can name (``outDataType``, ``outTensorType``), as torch dtypes.
ACL_DTYPES: dict[int, torch.dtype] = {
    0: torch.float32,
    1: torch.float16,
    2: torch.int8,
    3: torch.int32,
    4: torch.uint8,
    6: torch.int16,
    9: torch.int64,
    11: torch.float64,
    12: torch.bool,
    27: torch.bfloat16,
}
#: ``ACL_DT_UNDEFINED``: the output keeps the input's dtype.
ACL_DT_UNDEFINED = -1


def positional(inputs: Mapping[str, torch.Tensor], at_least: int = 0) -> list[torch.Tensor]:
    """Return the inputs as ``[intensor0, intensor1, ...]``; fewer than ``at_least`` is an unsupported layout."""
    ordered = [inputs[str(index)] for index in range(len(inputs)) if str(index) in inputs]
    if len(ordered) != len(inputs):
        raise UnsupportedOpError(f"input positions {sorted(inputs)} are not 0..{len(inputs) - 1}")
    if len(ordered) < at_least:
        raise UnsupportedOpError(f"needs at least {at_least} inputs, the dump holds {len(ordered)}")
    return ordered


def wide(tensor: torch.Tensor) -> torch.Tensor:
    """Return a float64 copy of a tensor (integers and booleans too: every value they hold is exact in float64)."""
    return tensor.to(torch.float64)


def param(params: Mapping[str, Any], name: str, default: Any) -> Any:
    """Return ``params[name]``, or the ATB default when the dump's op_param.json lacks it."""
    value = params.get(name, default)
    return default if value is None else value


def sub_params(params: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """Return a nested parameter struct (``normParam``), empty when absent."""
    value = params.get(name)
    return value if isinstance(value, Mapping) else {}


def require(condition: bool, reason: str) -> None:
    """Raise :class:`UnsupportedOpError` with ``reason`` unless ``condition`` holds."""
    if not condition:
        raise UnsupportedOpError(reason)


def acl_dtype(code: int, what: str) -> torch.dtype:
    """Return the torch dtype of an aclDataType code named by a parameter."""
    dtype = ACL_DTYPES.get(int(code))
    if dtype is None:
        raise UnsupportedOpError(f"{what}={code} names an aclDataType this reference does not handle")
    return dtype


def round_to_int8(values: torch.Tensor) -> torch.Tensor:
    """Return float values rounded half to even and saturated to int8's range, as Ascend's quantisation does."""
    return torch.clamp(torch.round(values), -128, 127).to(torch.int8)


def int32_bits_as_float(scale: torch.Tensor) -> torch.Tensor:
    """Return a dequantisation scale ATB passes as integers holding float32 bits (low 32 bits) as float64 values."""
    if scale.dtype.is_floating_point:
        return wide(scale)
    low_bits = (scale.to(torch.int64) & 0xFFFFFFFF).to(torch.int64)
    signed = torch.where(low_bits >= 2**31, low_bits - 2**32, low_bits).to(torch.int32)
    return signed.view(torch.float32).to(torch.float64)
