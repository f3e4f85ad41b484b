"""``as_dtype``: run an unchanged program at another precision -- the noise twin for one flag.

A noise twin (``compare --noise-path``) is the golden program run at the my-run's precision.
With ``llmcheck dump --as-dtype bf16`` (``DumpConfig(as_dtype="bf16")``) the capture makes
it from the golden program itself: when the capture starts -- before the model's first
forward runs -- the model's floating parameters and buffers are cast with ``model.to(dtype)``,
exactly what a program written for that precision would do, so the weight digests equal
an honest ``model.to(dtype)`` run's. The buffers the model computes itself (non-persistent
ones, such as a rotary embedding's ``inv_freq``) keep their dtype, as ``from_pretrained(dtype=...)``
leaves them (:func:`computed_buffers`). Every call of the model then gets its floating tensor
arguments cast to the dtype (the program still passes its own), and floating results of
that dtype are handed back to the program in the model's original dtype when that dtype
holds every value of the cast one (bf16 or fp16 in fp32, anything in fp64): a program that
calls ``.numpy()`` on float32 logits keeps working, and a result fed back in (a legacy
tuple KV cache) is cast back to the very same bits. Otherwise (a cast up, fp32 -> fp64; or
fp16 <-> bf16) results stay in the cast dtype, as rounding them would change what the
program computes next. The dump records the results as the model computed them, at the
cast dtype.

What the cast cannot reproduce is a program that chooses by dtype itself: autocast regions,
kernels or code paths it picks from its own dtype setting (kernels torch picks from the
tensors' dtype are the cast's honest ones), integer or quantised weights (never cast),
tensors the forward creates at a fixed dtype, or state the program built from the model
before its first forward (a static KV cache allocated at the original dtype).

The model stays cast when the capture closes (undoing it would need a copy of the weights);
the casting of arguments and results ends then.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import MutableMapping
from typing import Any

import torch

from llmcheck.plugin_api import dtype_name
from llmcheck.plugins.torch_hooks.nested_tensors import MAX_DEPTH

#: (cast dtype, model dtype) pairs where the model's dtype holds every value of the cast one:
#: results handed back in it are cast again to the very same bits.
_HOLDS_EVERY_VALUE = frozenset(
    {
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float64),
        (torch.float16, torch.float64),
        (torch.float32, torch.float64),
    }
)


def cast_floats(value: Any, source: torch.dtype | None, target: torch.dtype, *, in_place: bool, depth: int = 0) -> Any:
    """Return ``value`` with every floating tensor inside it of dtype ``source`` (any, when ``None``) cast to ``target``.

    Tuples and lists are rebuilt; a mapping holding a tensor to cast is changed in place when
    ``in_place`` (a result the model just made, such as an HF ``ModelOutput``), else copied
    first (an argument the program still holds). Other objects (an HF ``Cache``) are left as
    they are, as the capture leaves them unrecorded.
    """
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.dtype != target and (source is None or value.dtype == source):
            return value.to(target)
        return value
    if depth >= MAX_DEPTH:
        return value
    if isinstance(value, (tuple, list)):
        items = [cast_floats(item, source, target, in_place=in_place, depth=depth + 1) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a namedtuple, or a tuple
    if isinstance(value, MutableMapping):
        changed = {
            key: new
            for key, item in value.items()
            if (new := cast_floats(item, source, target, in_place=in_place, depth=depth + 1)) is not item
        }
        if changed:
            value = value if in_place else copy.copy(value)
            for key, new in changed.items():  # item by item: an HF ModelOutput refuses update()
                value[key] = new
    return value


def computed_buffers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """Return the floating buffers a module computes itself rather than loads: (module, name, buffer).

    A non-persistent buffer (outside the state dict: a rotary embedding's ``inv_freq``) is
    made by the model's own code, not loaded from a checkpoint; ``from_pretrained(dtype=bf16)``
    leaves it at the dtype that code chose (fp32), while ``model.to(bf16)`` would round it -- a
    real defect of such a cast (rotary angles off by up to a radian at position 600), not the
    noise of a bf16 run. The cast keeps these as a loader does.
    """
    kept = []
    for module in model.modules():
        for name in getattr(module, "_non_persistent_buffers_set", ()):
            buffer = module._buffers.get(name)
            if buffer is not None and buffer.is_floating_point():
                kept.append((module, name, buffer))
    return kept


class ModelCast:
    """A model cast to another floating dtype for the life of a capture: what it was, the cast, its two hooks.

    Made before the capture starts (its manifest entry is written with the dump's first
    manifest); :meth:`apply` casts.
    """

    def __init__(self, model: torch.nn.Module, dtype: str) -> None:
        self.model = model
        self.dtype: torch.dtype = getattr(torch, dtype)
        kept = {id(buffer) for _, _, buffer in computed_buffers(model)}
        floating = [
            tensor.dtype
            for tensor in (*model.parameters(), *model.buffers())
            if tensor.is_floating_point() and id(tensor) not in kept
        ]
        self.cast_from = Counter(dtype_name(dtype) for dtype in floating)
        model_dtype = Counter(floating).most_common(1)[0][0] if floating else None
        #: What floating results of the cast dtype go back to: the dtype most of the model's floats had, when it
        #: holds every value of the cast dtype (else None: results stay in the cast dtype).
        self.results_to: torch.dtype | None = (
            model_dtype if model_dtype is not None and (self.dtype, model_dtype) in _HOLDS_EVERY_VALUE else None
        )
        self._hooks: list[Any] = []

    def manifest_entry(self) -> dict[str, Any]:
        """Return what the dump's manifest says of the cast: the dtype, the floats cast from each dtype, the results' dtype."""
        returned = self.results_to if self.results_to is not None else self.dtype
        return {
            "to": dtype_name(self.dtype),
            "from": dict(self.cast_from),
            "outputs_returned_as": dtype_name(returned),
        }

    def apply(self) -> None:
        """Cast the model; from now on cast its arguments before any other hook sees them, and its results after.

        Call it once the capture's own hooks are attached, before the model runs: the
        capture then records the arguments as the cast model gets them and the results as
        it computed them.
        """
        target, results_to = self.dtype, self.results_to
        kept = computed_buffers(self.model)
        with torch.no_grad():
            self.model.to(target)
            for module, name, buffer in kept:  # as from_pretrained(dtype=...) leaves them
                setattr(module, name, buffer)

        def cast_arguments(
            module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            return cast_floats(args, None, target, in_place=False), cast_floats(kwargs, None, target, in_place=False)

        self._hooks.append(self.model.register_forward_pre_hook(cast_arguments, with_kwargs=True, prepend=True))
        if results_to is not None:

            def cast_results(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
                return cast_floats(output, target, results_to, in_place=True)

            self._hooks.append(self.model.register_forward_hook(cast_results))

    def detach(self) -> None:
        """Stop casting the model's arguments and results (the model itself stays cast)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
