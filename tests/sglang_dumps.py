"""Test helper: dumps of a real torch model named exactly as SGLang's debug utilities name them.

SGLang's dumper (``sglang/srt/debug_utils/dumper.py``) and forward-hook dumper
(``tensor_dump_forward_hook.py``) cannot be imported without SGLang's runtime: the
dumper imports ``zmq``, ``sglang.srt.managers.io_struct`` and ``sglang.srt.utils`` (which
pull in orjson, pybase64, triton, PIL, ...), the forward-hook dumper the engine's
``ForwardBatch`` (checked with sglang 0.5.23 from PyPI). So these writers follow their
published behaviour, written anew here (no SGLang code is copied):

* :class:`Dumper`: each ``dump(name, value, **fields)`` is one ``torch.save`` to
  ``{base}/{exp_name}/{k=v joined by ___}.pt``; today's dumper names the fields ``step``,
  ``rank``, ``dump_index``, ``name``, ``recompute_status``, the call's keywords, the context
  (``layer_id``), and saves ``{"value": value, "meta": {fields..., world_rank, world_size,
  <framework>_parallel_info}}``; the first dumpers named ``forward_pass_id`` (from 1),
  ``rank``, ``name``, ``dump_index``, keywords, context, and saved the value alone. Its
  module hooks (non-intrusive mode ``all``) name ``non_intrusive__{module}.inputs.{i}`` and
  ``non_intrusive__{module}.output[.{i}]``, and set ``layer_id`` inside ``*.layers.{i}``;
* :func:`forward_hook_dump`: ``TP{t}_PP{p}_Rank{r}_pid{pid}/Pass{id:05d}.pt`` dicts of leaf
  module outputs, written when the top-level ``model`` finishes, before its own output
  (which, like ``lm_head``'s, lands in the next pass's dict).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

MODULE_PREFIX = "non_intrusive__"
_LAYER = re.compile(r"(?:.+\.)?layers\.(\d+)\Z")


class Dumper:
    """SGLang's dumper as a Megatron or SGLang process runs it (one rank)."""

    def __init__(
        self, base: Path, exp_name: str, *, rank: int = 0, framework: str = "sglang", first_version: bool = False
    ):
        self.folder = Path(base) / exp_name
        self.rank, self.framework, self.first_version = rank, framework, first_version
        self.step_id = 1 if first_version else 0  # the first dumpers counted on_forward_pass_start() from 1
        self.dump_index = 0
        self.ctx: dict[str, Any] = {}

    def step(self) -> None:
        self.step_id += 1

    def set_ctx(self, **fields: Any) -> None:
        self.ctx = {k: v for k, v in (self.ctx | fields).items() if v is not None}

    def dump(self, name: str, value: Any, **fields: Any) -> Path:
        self.dump_index += 1
        if self.first_version:
            full = dict(forward_pass_id=self.step_id, rank=self.rank, name=name, dump_index=self.dump_index)
            full |= fields | self.ctx
        else:
            tags = dict(name=name, recompute_status="disabled", **fields, **self.ctx)
            full = dict(step=self.step_id, rank=self.rank, dump_index=self.dump_index, **tags)
        path = self.folder / ("___".join(f"{k}={v}" for k, v in full.items()) + ".pt")
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
        if not self.first_version:
            meta = dict(**full, world_rank=self.rank, world_size=1)
            meta[f"{self.framework}_parallel_info"] = {"tp_rank": self.rank, "tp_size": 1}
            value = {"value": value, "meta": meta}
        torch.save(value, path)
        return path

    @contextmanager
    def module_hooks(self, model: torch.nn.Module) -> Iterator[None]:
        """Dump every module's inputs and output as the dumper's non-intrusive mode ``all`` does."""
        handles = []
        for module_name, module in model.named_modules():
            match = _LAYER.fullmatch(module_name)
            if match:
                layer = {"layer_id": int(match.group(1))}
                handles.append(module.register_forward_pre_hook(lambda *_, ctx=layer: self.set_ctx(**ctx)))
                handles.append(module.register_forward_hook(lambda *_, ctx=layer: self.set_ctx(**dict.fromkeys(ctx))))
            handles.append(module.register_forward_pre_hook(self._inputs_hook(module_name), with_kwargs=True))
            handles.append(module.register_forward_hook(self._output_hook(module_name)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _inputs_hook(self, module_name: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            for index, item in enumerate(args):
                self._dump_value(module_name, f"inputs.{index}", item)
            for keyword, item in kwargs.items():
                self._dump_value(module_name, f"inputs.{keyword}", item)

        return hook

    def _output_hook(self, module_name: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if output is not None:
                self._dump_value(module_name, "output", output)

        return hook

    def _dump_value(self, module_name: str, sub_name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            parts = {"": value}
        elif isinstance(value, tuple | list):
            tensors = [item for item in value if isinstance(item, torch.Tensor)]
            parts = {"": tensors[0]} if len(tensors) == 1 else {str(i): t for i, t in enumerate(tensors)}
        else:
            parts = {}  # model outputs, caches: the dumper's framework plugins know only the engine's types
        for key, item in parts.items():
            self.dump(MODULE_PREFIX + ".".join(p for p in (module_name, sub_name, key) if p), item)


def sglang_batch(
    dumper: Dumper, input_ids: torch.Tensor, prefix_lens: list[int], request_ids: list[str] | None = None
) -> None:
    """Dump a step's ForwardBatch fields as SGLang's plugin of the dumper does (its core fields, under bare names)."""
    lengths = (
        [int(n) for n in torch.as_tensor([len(row) for row in input_ids])] if input_ids.dim() == 2 else [len(input_ids)]
    )
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, lengths)])
    dumper.dump("input_ids", input_ids.flatten())
    dumper.dump("seq_lens", torch.tensor([p + n for p, n in zip(prefix_lens, lengths)]))
    dumper.dump("positions", positions)
    dumper.dump("req_pool_indices", torch.arange(len(lengths)))
    if request_ids is not None:
        dumper.dump("rids", request_ids)


def megatron_batch(dumper: Dumper, input_ids: torch.Tensor, lengths: list[int]) -> None:
    """Dump a packed (thd) batch's fields as the dumper's Megatron plugin does."""
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    dumper.dump("input_ids", input_ids.reshape(1, -1))
    dumper.dump("position_ids", torch.cat([torch.arange(n) for n in lengths]).reshape(1, -1))
    dumper.dump("cu_seqlens_q", starts)
    dumper.dump("cu_seqlens_kv", starts)
    dumper.dump("qkv_format", "thd")


@contextmanager
def layer_dumps(dumper: Dumper, model: torch.nn.Module) -> Iterator[None]:
    """Dump each decoder layer's attention, MLP and layer output under free names, as model code calling dumper.dump does."""
    handles = []
    for layer_id, layer in enumerate(model.model.layers):

        def dump(name: str, layer_id: int = layer_id) -> Callable[..., None]:
            def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
                tensor = output[0] if isinstance(output, tuple) else output
                fields = {} if "layer_id" in dumper.ctx else {"layer_id": layer_id}  # the context already says it
                dumper.dump(name, tensor.reshape(-1, tensor.shape[-1]), **fields)  # [tokens, hidden]

            return hook

        handles += [
            layer.self_attn.register_forward_hook(dump("attn_output")),
            layer.mlp.register_forward_hook(dump("mlp_output")),
            layer.register_forward_hook(dump("layer_output")),
        ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def forward_hook_dump(model: torch.nn.Module, folder: Path, prompts: list[torch.Tensor], *, rank: int = 0) -> Path:
    """Run each prompt as one forward pass under SGLang's forward-hook dumper and return the rank folder."""
    process_dir = Path(folder) / f"TP{rank}_PP0_Rank{rank}_pid{os.getpid()}"
    process_dir.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"pass": 0, "tensors": {}, "batch": None}

    def add(name: str, output: Any) -> None:
        if isinstance(output, tuple | list):
            tensors = [t.detach().cpu().clone() for t in output if t is not None]
            state["tensors"][name] = tensors[0] if len(tensors) == 1 else tensors
        elif isinstance(output, torch.Tensor):
            state["tensors"][name] = output.detach().cpu().clone()
        # any other type: the dumper logs "Unsupported type" and keeps nothing

    def hook(name: str, top: bool) -> Callable[..., None]:
        def inner(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if top:
                for field, value in state["batch"].items():
                    state["tensors"][f"{name}.forward_batch_info.{field}"] = value
                if state["tensors"]:
                    torch.save(state["tensors"], process_dir / f"Pass{state['pass']:05d}.pt")
                    state["tensors"], state["pass"] = {}, state["pass"] + 1
            if output is not None:
                add(name, output)

        return inner

    handles = [
        module.register_forward_hook(hook(name, name == "model"))
        for name, module in model.named_modules()
        if name and (name == "model" or not list(module.children()))
    ]
    try:
        with torch.no_grad():
            for prompt in prompts:
                length = prompt.shape[-1]
                state["batch"] = {
                    "input_ids": prompt.flatten(),
                    "seq_lens": torch.tensor([length]),
                    "positions": torch.arange(length),
                }
                model(prompt)
    finally:
        for handle in handles:
            handle.remove()
    return process_dir
