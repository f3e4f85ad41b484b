"""An ATen call's arguments as exact JSON, and back: what lets opcheck replay an op from the dump alone.

This encoding is part of the record contract (like :mod:`llmcheck.core.records`): the torch
capture writes it, the ATen replay of opcheck reads it, and neither imports the other.

Op-level records carry ``attrs = {"args": [...], "kwargs": {...}}``. Non-tensor values are
kept exactly: ``None``, booleans, ints, floats (``{"float": "inf"}`` for non-finite ones),
strings and lists as themselves; ``{"dtype": "bfloat16"}``, ``{"device": "cuda:0"}``,
``{"layout": "strided"}``, ``{"memory_format": "contiguous_format"}``,
``{"complex": [re, im]}``. A tensor argument is ``{"tensor": "1.0"}``: the ``position`` of
the op call's own input record that holds it (key: same name, step and call index,
``io="input"``), plus ``"stride": [...]`` when it was not contiguous -- kernels may take
another path (and round differently) for another memory layout, so a replay restores it.
A value that cannot be written exactly is
``{"unsupported": "Generator", "repr": "..."}`` and makes the call unreplayable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from llmcheck.core.dumps.tensor_io import dtype_name, torch_dtype
from llmcheck.core.errors import DumpFormatError, UsageError

#: The JSON object keys that mark an encoded non-JSON value.
_TAGS = ("tensor", "float", "complex", "dtype", "device", "layout", "memory_format", "unsupported")


def encode_call(
    args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
    """Return the call's arguments as JSON-safe ``{"args", "kwargs"}`` and its tensors with their positions."""
    tensors: list[tuple[str, torch.Tensor]] = []

    def encode(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append((path, value))
            if value.layout == torch.strided and not value.is_contiguous():
                return {"tensor": path, "stride": list(value.stride())}
            return {"tensor": path}
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else {"float": repr(value)}
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return encode({torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)](value), path)
        if isinstance(value, complex):
            return {"complex": [encode(value.real, path), encode(value.imag, path)]}
        if isinstance(value, torch.dtype):
            return {"dtype": dtype_name(value)}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        if isinstance(value, torch.layout):
            return {"layout": str(value).removeprefix("torch.")}
        if isinstance(value, torch.memory_format):
            return {"memory_format": str(value).removeprefix("torch.")}
        if isinstance(value, (list, tuple)):
            return [encode(item, f"{path}.{index}") for index, item in enumerate(value)]
        return {"unsupported": type(value).__name__, "repr": repr(value)[:200]}

    encoded_args = [encode(value, str(index)) for index, value in enumerate(args)]
    encoded_kwargs = {key: encode(value, key) for key, value in kwargs.items()}
    return {"args": encoded_args, "kwargs": encoded_kwargs}, tensors


def _in_layout(loaded: torch.Tensor, stride: list[int], device: torch.device) -> torch.Tensor:
    """Return a copy of ``loaded`` on ``device`` in the recorded ``stride``.

    A stride of 0 is a broadcast (``expand``, as grouped-query attention repeats its KV
    heads): one element stands for the whole dimension, so the copy holds it once and is
    expanded again -- memory in which several elements are one cannot be copied into.
    """
    broadcast = [dim for dim, step in enumerate(stride) if step == 0 and loaded.shape[dim] > 1]
    if not broadcast:
        return torch.empty_strided(loaded.shape, stride, dtype=loaded.dtype, device=device).copy_(loaded)
    held = loaded
    for dim in broadcast:
        held = held.narrow(dim, 0, 1)
    base_stride = [1 if dim in broadcast else step for dim, step in enumerate(stride)]
    base = torch.empty_strided(held.shape, base_stride, dtype=loaded.dtype, device=device).copy_(held)
    return base.expand(loaded.shape)


def decode_call(
    attrs: Mapping[str, Any],
    tensor_at: Callable[[str], torch.Tensor],
    device: str | torch.device = "cpu",
) -> tuple[list[Any], dict[str, Any]]:
    """Return ``(args, kwargs)`` rebuilt from a record's ``attrs``, tensors fetched by position.

    ``device`` replaces every recorded device, so a call made on an accelerator replays on
    the CPU; tensors are copied there in their recorded layout. Raises
    :class:`DumpFormatError` for a malformed or unreplayable encoding.
    """
    target_device = torch.device(device)

    def decode(value: Any) -> Any:
        if isinstance(value, list):
            return [decode(item) for item in value]
        if not isinstance(value, dict):
            return value
        tag = next((name for name in _TAGS if name in value), None)
        if tag == "tensor":
            # Fresh, aligned memory in the recorded layout: kernels round differently for
            # another layout or a misaligned (memory-mapped) buffer.
            loaded = tensor_at(str(value["tensor"]))
            stride = value.get("stride") or torch.empty(loaded.shape, device="meta").stride()
            return _in_layout(loaded, list(stride), target_device)
        if tag == "float":
            return float(value["float"])
        if tag == "complex":
            real, imag = (decode(part) for part in value["complex"])
            return complex(real, imag)
        if tag == "dtype":
            return torch_dtype(value["dtype"])
        if tag == "device":
            return target_device
        if tag == "layout":
            return getattr(torch, value["layout"])
        if tag == "memory_format":
            return getattr(torch, value["memory_format"])
        if tag == "unsupported":
            raise DumpFormatError(
                f"argument of type {value['unsupported']} was not recorded exactly ({value.get('repr')})",
                hint="this call cannot be replayed",
            )
        raise DumpFormatError(f"unknown argument encoding {value!r}")

    if "args" not in attrs:
        raise DumpFormatError("record has no recorded arguments (not an op-level torch record)")
    return [decode(value) for value in attrs["args"]], {
        key: decode(value) for key, value in attrs.get("kwargs", {}).items()
    }


def resolve_op(op_type: str) -> torch._ops.OpOverload:
    """Return the ATen operator overload named ``op_type`` (``"aten.mm.default"``)."""
    namespace, _, rest = op_type.partition(".")
    op_name, _, overload = rest.rpartition(".")
    try:
        overload_op: torch._ops.OpOverload = getattr(getattr(getattr(torch.ops, namespace), op_name), overload)
    except (AttributeError, RuntimeError) as exc:
        raise UsageError(f"no such operator in this torch build: {op_type!r}") from exc
    return overload_op


def replay_call(
    op_type: str, attrs: Mapping[str, Any], tensor_at: Callable[[str], torch.Tensor], device: str | torch.device = "cpu"
) -> Any:
    """Return the result of running the recorded call again on ``device`` from its dumped inputs."""
    operator = resolve_op(op_type)
    args, kwargs = decode_call(attrs, tensor_at, device)
    return operator(*args, **kwargs)
