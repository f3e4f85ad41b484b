"""Replay one recorded ATen call on the reference device, floating inputs widened to float64.

Widening changes no op's meaning: an op that names its output dtype (``_to_copy`` to
bf16) still rounds to it, and every other op computes and returns float64, which opcheck
then holds the dumped low-precision output against. Calls whose result a dump cannot
reproduce -- random ops, uninitialised memory, views into storage the dump did not keep --
are reported unsupported with that reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from llmcheck.plugin_api import DumpFormatError, UnsupportedOpError, decode_call

#: Namespaces of the operator overloads replayed (``torch.ops.<namespace>``).
NAMESPACES = ("aten", "prims")
#: Ops whose output is uninitialised memory or depends on a storage layout a dump does not keep.
UNREPLAYABLE = {
    "empty": "its output is uninitialised memory",
    "empty_like": "its output is uninitialised memory",
    "empty_strided": "its output is uninitialised memory",
    "new_empty": "its output is uninitialised memory",
    "new_empty_strided": "its output is uninitialised memory",
    "resize_": "its output is uninitialised memory",
    "as_strided": "it reads its input's storage, which the dump keeps only as a contiguous copy",
    "set_": "it rebinds storage, which the dump does not keep",
}


def operator_named(op_type: str) -> torch._ops.OpOverload | None:
    """Return the operator overload ``namespace.name.overload`` names, or ``None`` when torch has none."""
    namespace, _, rest = op_type.partition(".")
    name, _, overload = rest.rpartition(".")
    if namespace not in NAMESPACES or not name or not overload:
        return None
    try:
        operator = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        return None
    return operator if isinstance(operator, torch._ops.OpOverload) else None


def _widened(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if tensor.dtype.is_complex:
        return tensor.to(device=device, dtype=torch.complex128)
    if tensor.dtype.is_floating_point:
        return tensor.to(device=device, dtype=torch.float64)
    return tensor.to(device=device).clone()  # in-place ops write into their inputs


def _tensors_in(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path or "0", value
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _tensors_in(item, f"{path}.{index}" if path else str(index))


def _draws_random(operator: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any]) -> bool:
    """Return whether this call uses randomness: a seeded op, unless its dropout is off (``p`` 0 or not training)."""
    if torch.Tag.nondeterministic_seeded not in operator.tags:
        return False
    values = {
        argument.name: argument.default_value for argument in operator._schema.arguments if argument.has_default_value()
    }
    values.update({argument.name: value for argument, value in zip(operator._schema.arguments, args)})
    values.update(kwargs)
    if values.get("train") is False:
        return False
    probability = values.get("dropout_p", values.get("p"))
    return not (isinstance(probability, (int, float)) and probability == 0)


@dataclass(frozen=True, slots=True)
class AtenReplay:
    """The reference of one ATen overload: ``compute(inputs, params)`` replays the recorded call.

    ``widen`` ``False`` replays it in the recorded dtypes instead (each input copied, as an
    in-place op writes into it): what a correct kernel of the recorded precision gives.
    """

    op_type: str
    widen: bool = True

    def __call__(self, inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        operator = operator_named(self.op_type)
        if operator is None:
            raise UnsupportedOpError(f"this torch build has no operator {self.op_type}")
        name = operator._schema.name.split("::")[-1]
        if name in UNREPLAYABLE:
            raise UnsupportedOpError(f"{self.op_type} cannot be replayed: {UNREPLAYABLE[name]}")
        device = next(iter(inputs.values())).device if inputs else torch.device("cpu")
        widened = {
            position: _widened(tensor, device) if self.widen else tensor.to(device).clone()
            for position, tensor in inputs.items()
        }

        def tensor_at(position: str) -> torch.Tensor:
            if position not in widened:
                raise UnsupportedOpError(f"tensor argument {position} is not in the dump")
            return widened[position]

        try:
            args, kwargs = decode_call(params, tensor_at, device)
        except DumpFormatError as exc:
            raise UnsupportedOpError(exc.what) from exc
        if _draws_random(operator, args, kwargs):
            raise UnsupportedOpError(f"{self.op_type} draws random numbers; its output cannot be recomputed")
        result = operator(*args, **kwargs)
        return dict(_tensors_in(result, ""))
