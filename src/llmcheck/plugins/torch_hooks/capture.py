"""In-process PyTorch capture: ``register_hook(model, DumpConfig(...))`` and the session it returns.

Each call makes an independent :class:`CaptureSession` (the original tool's process-wide
singleton made a second model or a second config impossible): forward pre-hooks and
forward hooks on every submodule of the model, a step counter driven by the model's own
forward, and one llmcheck dump written through :class:`~llmcheck.core.store.DumpWriter`.

Record conventions (the compare relies on them): ``name`` is the module path from
``named_modules()`` (``"root"`` for the model), or ``{module path}/{aten overload}`` at op
level; ``step`` counts forwards of the model (HF ``generate``: 0 is the prefill);
``call_index`` counts calls of one name within a step; inputs are saved ``before`` the call
(as an in-place op found them) and outputs ``after``; ``order`` is the global order in which
tensors were seen.

A failure inside capture -- a full disk, a bug -- never breaks the program: every hook
contains its own work, and on the first failure capture stops with one warning, the dump
is closed as cut at its last complete record, and the program runs on as if uncaptured
(``DumpConfig.on_capture_error="raise"`` hands the error to the program after stopping).
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from contextlib import nullcontext
from pathlib import Path
from typing import Any, ContextManager

import torch

from llmcheck.plugin_api import (
    IO_INPUT,
    IO_OUTPUT,
    MOMENT_AFTER,
    MOMENT_BEFORE,
    PARAMETER_ATTR,
    PARAMETER_DIGESTS_ATTR,
    DumpWriter,
    LlmcheckError,
    RecordKey,
    TopologyNode,
    UsageError,
    dtype_name,
    encode_call,
)
from llmcheck.plugins.torch_hooks.config import LEVEL_MODULE, LEVEL_OP, ON_ERROR_RAISE, DumpConfig
from llmcheck.plugins.torch_hooks.cpu_profile import CAPTURE_RANGE, StepProfiler
from llmcheck.plugins.torch_hooks.module_graph_onnx import ONNX_FILE, GraphRecorder, GraphTensor, write_graph_onnx
from llmcheck.plugins.torch_hooks.module_selection import ROOT_NAME, ModuleSelection, parent_name
from llmcheck.plugins.torch_hooks.nested_tensors import call_inputs, call_outputs
from llmcheck.plugins.torch_hooks.op_capture import OpCaptureMode
from llmcheck.plugins.torch_hooks.parameter_digests import ModuleParameterDigests
from llmcheck.plugins.torch_hooks.tensor_sink import TensorSink

log = logging.getLogger("llmcheck.torch")

BACKEND_NAME = "torch"


def process_rank() -> int:
    """Return this process's rank: torch.distributed's when initialised, else ``RANK``, ``LOCAL_RANK``, 0."""
    distributed = getattr(torch, "distributed", None)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank())
    for variable in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(variable)
        if value is not None and value.strip():
            try:
                return int(value)
            except ValueError as exc:
                raise UsageError(f"is not a rank number: {value!r}", where=variable) from exc
    return 0


def model_device(model: torch.nn.Module) -> torch.device:
    """Return the device of the model's first parameter or buffer (CPU for a model with neither)."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def device_label(device: torch.device) -> str:
    """Return a device as it appears in dump folder names: ``cpu``, ``cuda0``, ``npu3``."""
    return device.type if device.index is None else f"{device.type}{device.index}"


def _device_wanted(device: torch.device, device_ids: tuple[str, ...]) -> bool:
    if not device_ids:
        return True
    if device.type == "cpu":
        return "cpu" in device_ids
    index = str(device.index or 0)
    return bool({index, f"{device.type}{index}", f"{device.type}:{index}"} & set(device_ids))


class CaptureSession:
    """A capture running on one model: its hooks, its step counter and the dump it writes.

    Returned by :func:`register_hook`. ``path`` is the dump folder (``None`` when the
    ``device_ids`` filter leaves this process out). ``close()`` -- or leaving a ``with``
    block, or :func:`remove_hook` -- removes the hooks, writes what is pending and closes
    the dump. Not thread-safe: one model is run by one thread at a time.
    """

    def __init__(self, model: torch.nn.Module, config: DumpConfig) -> None:
        self.model = model
        self.config = config
        self.selection = ModuleSelection(model, config)
        self.rank = config.rank if config.rank is not None else process_rank()
        device = model_device(model)
        self.device = device_label(device)
        self.enabled = _device_wanted(device, config.device_ids)
        self.step = -1
        self.steps_dumped: list[int] = []
        self.busy = False  # True while the session does its own tensor work (the op mode lets it pass)
        self.closed = False
        self.failure: str | None = None  # why capture stopped early; None while it runs or ended normally
        self._raises = config.on_capture_error == ON_ERROR_RAISE
        self._module_level = LEVEL_MODULE in config.levels
        self._op_level = LEVEL_OP in config.levels
        self._root_depth = 0
        self._dumping = False
        self._stack: list[tuple[str, int]] = []  # (module path, call index or -1) of the calls running now
        self._call_counts: dict[str, int] = {}
        self._first_run: dict[str, int] = {}
        self._topology_size_written = -1
        self._op_mode: OpCaptureMode | None = None
        self._op_names: dict[Any, str] = {}
        self._parameter_names: tuple[int, dict[tuple[int, tuple[int, ...], Any], str]] | None = None
        self._parents = {name: parent_name(name) for name in self.selection.ids}
        self._leaf_modules = {name or ROOT_NAME for name, module in model.named_modules()
                              if next(module.children(), None) is None}
        self._weight_digests = (ModuleParameterDigests(model, self.selection.module_selected, ROOT_NAME)
                                if self._module_level and config.weight_digests else None)
        self._graph: GraphRecorder | None = None  # the first dumped step's calls, for --type onnx
        self._graph_open = False
        self.writer: DumpWriter | None = None
        self.path: Path | None = None
        self._profiler: StepProfiler | None = None
        if not self.enabled:
            log.warning("not capturing on %s: device_ids %s leave it out", device, ", ".join(config.device_ids))
        else:
            self.writer = DumpWriter(
                config.dump_path, BACKEND_NAME, config=config.as_json(),
                command_line=None if config.command_line is None else list(config.command_line),
                rank=self.rank, device=self.device, dir_suffix=f"rank{self.rank}_{self.device}",
            )
            self.path = self.writer.path
            if config.profile_cpu:
                self._profiler = StepProfiler(self.path / "cpu_profiling")
        self.sink = TensorSink(self.writer, rank=self.rank, statistics_only=config.statistics_only,
                               max_pending_bytes=config.max_pending_bytes) if self.writer else None
        self._hooks: list[Any] = []
        self._root_after_hook: Any = None  # kept after a failure mid-step, to leave the op mode at the step's end
        for name, module in model.named_modules():
            self._attach(name or ROOT_NAME, module)
        self_ref = weakref.ref(self)
        self._atexit = lambda: (session := self_ref()) is not None and session.close_at_exit()
        atexit.register(self._atexit)
        if self.path is not None:
            log.info("capturing %s into %s", type(model).__name__, self.path)

    # --- public ---

    def __enter__(self) -> "CaptureSession":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def records_written(self) -> int:
        """Return how many records the dump holds so far (handed to the writer)."""
        return self.sink.records_added if self.sink is not None else 0

    def topology(self) -> TopologyNode:
        """Return the module tree: class names, module ids, children in first-execution order.

        A container that never runs itself (``ModuleList``) takes the place of its first
        child to run; modules that never ran keep their definition order, after the others.
        """
        ids = self.selection.ids
        never_run = len(self._first_run)

        def node(name: str, module: torch.nn.Module) -> tuple[TopologyNode, int]:
            children = []
            for child_name, child in module.named_children():
                path = child_name if name == ROOT_NAME else f"{name}.{child_name}"
                if path in ids:
                    children.append(node(path, child))
            children.sort(key=lambda item: item[1])  # stable: unrun ones keep definition order
            first = min([self._first_run.get(name, never_run), *(rank for _, rank in children)])
            attrs = {"id": ids[name]} if ids.get(name) else {}
            return TopologyNode(name=name, op_type=type(module).__name__,
                                children=tuple(child for child, _ in children), attrs=attrs), first

        return node(ROOT_NAME, self.model)[0]

    def close(self) -> None:
        """Remove the hooks, write every pending record and the module tree, and close the dump.

        A failure here stops capture as one inside a hook does (see the module docstring).
        """
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self._atexit)
        self._remove_hooks(keep_root_after=False)
        self._leave_op_mode()
        if self.writer is None or self.sink is None or self.failure is not None:
            return
        try:
            if self._profiler is not None and self._profiler.running:
                self._profiler.stop(self.step)
            self.sink.hand_over()
            self._write_topology()
            self.writer.close()
            self.sink.finish()
            if self._graph is not None:
                write_graph_onnx(self._graph, self.path / ONNX_FILE, type(self.model).__name__)  # type: ignore[operator]
        except Exception as exc:
            self._contain(exc)

    def close_at_exit(self) -> None:
        """Close the dump as the process exits; never raises (no forward is left to hand an error to)."""
        try:
            self.close()
        except Exception:
            pass  # already reported by the warning of _stop_after_failure

    # --- failures ---

    def _contain(self, exc: Exception) -> None:
        """Handle a failure of capture's own work: stop capturing, then raise it only under ``on_capture_error="raise"``."""
        self._stop_after_failure(exc)
        if self._raises:
            raise exc

    def _stop_after_failure(self, exc: BaseException) -> None:
        """Stop capturing after a failure inside capture: warn once, close the dump as cut, go dormant."""
        if self.failure is not None:
            return
        reason = exc.one_line() if isinstance(exc, LlmcheckError) else f"{type(exc).__name__}: {exc}"
        self.failure = reason
        log.debug("capture failed", exc_info=exc)  # the traceback, for a report of a bug in capture
        self._dumping = False
        self._remove_hooks(keep_root_after=self._root_depth > 0)
        if self._root_depth == 0:
            self._leave_op_mode()
        if self._profiler is not None and self._profiler.running:
            try:
                self._profiler.stop(self.step)
            except Exception:
                pass  # the profile is lost with the rest of the capture
        if self.sink is not None:
            self.sink.finish()  # the progress display ends with the capture
        kept = 0
        if self.writer is not None:
            self.writer.close_cut(reason)
            kept = self.writer.records_written
        policy = "the error is raised into the program" if self._raises else "the program runs on"
        log.warning("capture stopped: %s; the dump %s is closed as cut with its %d complete records, %s",
                    reason, self.path, kept, policy)

    def _remove_hooks(self, *, keep_root_after: bool) -> None:
        for handle in self._hooks:
            if not (keep_root_after and handle is self._root_after_hook):
                handle.remove()
        self._hooks = [self._root_after_hook] if keep_root_after else []

    # --- hooks ---

    def _attach(self, name: str, module: torch.nn.Module) -> None:
        is_root = module is self.model

        def before(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            try:
                return start_call(module, args, kwargs)
            except Exception as exc:  # capture's own failure: the program's forward must not see it
                self._contain(exc)
                return None

        def start_call(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if is_root:
                self._root_depth += 1
                if self._root_depth == 1:
                    self._begin_step()
            elif self._root_depth == 0:
                return None  # called outside a forward of the model: not part of any step
            if name not in self._first_run:
                self._first_run[name] = len(self._first_run)
            if not self._dumping:
                self._stack.append((name, -1))
                return None
            call_index = self._call_counts.get(name, 0)
            self._call_counts[name] = call_index + 1
            self._stack.append((name, call_index))
            if self._module_level and self.config.saves_inputs_before and self.selection.module_selected(name):
                self._save(name, module, call_inputs(args, kwargs), IO_INPUT, call_index, MOMENT_BEFORE)
            return None

        def after(module: torch.nn.Module, args: tuple[Any, ...], *rest: Any) -> None:
            # rest is (kwargs, output); an always-called hook after an exception gets (output,) only
            if self._root_depth == 0:
                return None
            if self.failure is not None:  # only the root's hook is left: leave the op mode at the step's end
                self._root_depth -= 1
                if self._root_depth == 0:
                    self._leave_op_mode()
                    self._remove_hooks(keep_root_after=False)
                return None
            matched = bool(self._stack) and self._stack[-1][0] == name
            if not matched and not is_root:
                return None  # a call whose start this session did not see
            call_index = self._stack.pop()[1] if matched else -1
            try:
                if call_index >= 0 and len(rest) == 2 and self._module_level and self.selection.module_selected(name):
                    kwargs, output = rest
                    digests = (self._weight_digests.of(name)
                               if self._weight_digests is not None and call_index == 0 else None)
                    if self.config.saves_inputs_after:
                        self._save(name, module, call_inputs(args, kwargs), IO_INPUT, call_index, MOMENT_AFTER,
                                   None if self.config.saves_outputs else digests)
                    if self.config.saves_outputs:
                        self._save(name, module, call_outputs(output), IO_OUTPUT, call_index, MOMENT_AFTER, digests)
                if is_root and self._root_depth == 1:
                    self._end_step()
            except Exception as exc:  # capture's own failure: the program's forward must not see it
                self._contain(exc)
            finally:
                if is_root:
                    self._root_depth -= 1
                    if self._root_depth == 0 and self.failure is not None:
                        self._leave_op_mode()
                        self._remove_hooks(keep_root_after=False)
            return None

        self._hooks.append(module.register_forward_pre_hook(before, with_kwargs=True))
        after_hook = module.register_forward_hook(after, with_kwargs=True, always_call=True)
        self._hooks.append(after_hook)
        if is_root:
            self._root_after_hook = after_hook

    def _save(self, name: str, module: torch.nn.Module, tensors: list[tuple[str, torch.Tensor]], io: str,
              call_index: int, moment: str, digests: dict[str, Any] | None = None) -> None:
        """Record a call's inputs or outputs; the first record carries the module's parameter digests, if any."""
        if not tensors:
            return
        op_type = type(module).__name__
        parent = self._parents[name]
        graph = self._graph if self._graph_open and not self._op_level and name in self._leaf_modules else None
        previous, self.busy = self.busy, True
        try:
            with self._capture_scope():
                self.sink.settle_versions()  # type: ignore[union-attr]
                for position, tensor in tensors:
                    key = RecordKey(name=name, io=io, position=position, step=self.step, call_index=call_index,
                                    moment=moment)
                    attrs = {PARAMETER_DIGESTS_ATTR: digests} if digests else None
                    digests = None
                    identity = self.sink.add(key, tensor, op_type=op_type, parent=parent,  # type: ignore[union-attr]
                                             attrs=attrs)
                    if graph is not None:
                        self._add_to_graph(graph, key, identity, tensor, op_type, parent or ROOT_NAME, None)
        finally:
            self.busy = previous

    def capture_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one ATen operator call and record its inputs and outputs (called by the op mode).

        The operator itself runs outside any containment: its own errors are the program's.
        """
        if self.failure is not None:
            return func(*args, **kwargs)
        try:
            recorded = self._record_op_inputs(func, args, kwargs)
        except Exception as exc:  # capture's own failure: the program's forward must not see it
            self._contain(exc)
            recorded = None
        result = func(*args, **kwargs)
        if recorded is None or self.failure is not None:
            return result
        try:
            self._record_op_outputs(result, *recorded)
        except Exception as exc:
            self._contain(exc)
        return result

    def _record_op_inputs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """Record an operator's inputs before it runs; return what its outputs' records need (None: not selected)."""
        module_name = self._stack[-1][0] if self._stack else ROOT_NAME
        op_type = self._op_names.get(func)
        if op_type is None:
            op_type = self._op_names[func] = str(func)
        if not self.selection.op_selected(module_name, op_type):
            return None
        name = f"{module_name}/{op_type}"
        call_index = self._call_counts.get(name, 0)
        self._call_counts[name] = call_index + 1
        config = self.config
        self.busy = True
        try:
            with self._capture_scope():
                self.sink.settle_versions()  # type: ignore[union-attr]
                attrs, inputs = encode_call(args, kwargs)
                if config.saves_inputs_before:
                    self._save_op(name, inputs, IO_INPUT, call_index, MOMENT_BEFORE, op_type, module_name, attrs)
        finally:
            self.busy = False
        return name, call_index, inputs, op_type, module_name, attrs

    def _record_op_outputs(self, result: Any, name: str, call_index: int, inputs: list[tuple[str, torch.Tensor]],
                           op_type: str, module_name: str, attrs: dict[str, Any]) -> None:
        """Record an operator's outputs (and, with save_time 1 or 2, its inputs as they are after it ran)."""
        config = self.config
        self.busy = True
        try:
            with self._capture_scope():
                if config.saves_inputs_after:
                    self._save_op(name, inputs, IO_INPUT, call_index, MOMENT_AFTER, op_type, module_name, attrs)
                if config.saves_outputs:
                    self._save_op(name, call_outputs(result), IO_OUTPUT, call_index, MOMENT_AFTER, op_type,
                                  module_name, attrs)
        finally:
            self.busy = False

    def _parameter_name(self, tensor: torch.Tensor) -> str | None:
        """Return the model parameter a tensor is (same storage, shape and dtype), or None.

        Op-level records of weights carry it as ``attrs["parameter"]``: compare checks them
        against the golden weights rounded to the my-run's dtype, since loading or converting
        weights wrongly is the most common porting defect.
        """
        if self._parameter_names is None or self._parameter_names[0] != self.step:
            self._parameter_names = (self.step, {(p.data_ptr(), tuple(p.shape), p.dtype): n
                                                 for n, p in self.model.named_parameters()})
        return self._parameter_names[1].get((tensor.data_ptr(), tuple(tensor.shape), tensor.dtype))

    def _save_op(self, name: str, tensors: list[tuple[str, torch.Tensor]], io: str, call_index: int, moment: str,
                 op_type: str, module_name: str, attrs: dict[str, Any]) -> None:
        graph = self._graph if self._graph_open else None
        for position, tensor in tensors:
            key = RecordKey(name=name, io=io, position=position, step=self.step, call_index=call_index, moment=moment)
            parameter = self._parameter_name(tensor) if io == IO_INPUT and tensor.layout == torch.strided else None
            record_attrs = {**attrs, PARAMETER_ATTR: parameter} if parameter else attrs
            identity = self.sink.add(key, tensor, op_type=op_type, parent=module_name, attrs=record_attrs,  # type: ignore[union-attr]
                                     op_output=io == IO_OUTPUT)
            if graph is not None:
                self._add_to_graph(graph, key, identity, tensor, op_type, module_name, attrs)

    def _add_to_graph(self, graph: GraphRecorder, key: RecordKey, identity: int, tensor: torch.Tensor, op_type: str,
                      module_name: str, arguments: dict[str, Any] | None) -> None:
        if key.io == IO_INPUT and key.moment == MOMENT_AFTER and self.config.saves_inputs_before:
            return  # the node reads its inputs as they were before it ran
        label = f"{key.name}.{key.io}.{key.position}"
        graph.add(key.name, key.call_index, op_type, module_name, key.io,
                  GraphTensor(identity, label, dtype_name(tensor.dtype), tuple(tensor.shape)), arguments)

    # --- steps ---

    def _capture_scope(self) -> ContextManager[Any]:
        if self._profiler is not None and self._profiler.running:
            return torch.profiler.record_function(CAPTURE_RANGE)
        return nullcontext()

    def _begin_step(self) -> None:
        self.step += 1
        self._call_counts.clear()
        dumps_step = self.enabled and self.config.dumps_step(self.step)
        self._dumping = dumps_step and bool(self.config.levels)
        if self._profiler is not None and dumps_step:
            self._profiler.start()
        if self._dumping and self.config.export_onnx and self._graph is None:
            self._graph = GraphRecorder()
            self._graph_open = True
        if self._dumping and self._weight_digests is not None:
            self._weight_digests.refresh()  # once per dump: weights rarely change between steps
        if self._dumping and self._op_level:
            self._op_mode = OpCaptureMode(self)
            self._op_mode.__enter__()

    def _end_step(self) -> None:
        self._leave_op_mode()
        self._graph_open = False
        self._stack.clear()
        if self._profiler is not None and self._profiler.running:
            self._profiler.stop(self.step)
        if self._dumping:
            self._dumping = False
            self.steps_dumped.append(self.step)
            self.sink.hand_over(finished_step=self.step)  # type: ignore[union-attr]
        if self.writer is not None:
            self._write_topology()

    def _leave_op_mode(self) -> None:
        if self._op_mode is not None:
            mode, self._op_mode = self._op_mode, None
            mode.__exit__(None, None, None)

    def _write_topology(self) -> None:
        """Write ``topology.json`` when modules ran for the first time since it was last written."""
        if len(self._first_run) != self._topology_size_written:
            self.writer.write_topology(self.topology())  # type: ignore[union-attr]
            self._topology_size_written = len(self._first_run)


def register_hook(model: torch.nn.Module, config: DumpConfig | None = None,
                  hook_type: str = "dump_data") -> CaptureSession:
    """Return a running capture of ``model`` (the seed API); close it to finish the dump.

    ``config`` defaults to ``DumpConfig()`` (step 0, every module, inputs and outputs, in
    ``./``). ``hook_type`` is kept for the seed's signature; only ``"dump_data"`` exists.
    Use it as a context manager or call :func:`remove_hook` / ``close()`` when done.
    """
    if hook_type != "dump_data":
        raise UsageError(f"unknown hook_type {hook_type!r}", where="register_hook", hint="only 'dump_data' exists")
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"needs a torch.nn.Module, got {type(model).__name__}", where="register_hook")
    return CaptureSession(model, config if config is not None else DumpConfig())


def remove_hook(handle: CaptureSession) -> None:
    """Stop a capture started by :func:`register_hook`: remove its hooks, flush and close its dump."""
    handle.close()
