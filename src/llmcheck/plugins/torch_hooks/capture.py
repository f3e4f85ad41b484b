"""In-process PyTorch capture: ``register_hook(model, DumpConfig(...))`` and the session it returns.

Each call makes an independent :class:`CaptureSession` (the original tool's process-wide
singleton made a second model or a second config impossible): forward pre-hooks and
forward hooks on every submodule of the model, a step counter driven by the model's own
forward, and one llmcheck dump written through :class:`~llmcheck.core.dumps.store.DumpWriter`.

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
A dump the disk refuses from the start (no room even for its manifest) leaves no folder:
one warning says capture could not start, and the program runs uncaptured. A capture that
closes empty because no step of ``token_range`` ran says so, naming the steps that did.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmcheck.plugin_api import (
    AS_DTYPE_FIELD,
    IO_INPUT,
    IO_OUTPUT,
    MODEL_DTYPES_FIELD,
    MOMENT_AFTER,
    MOMENT_BEFORE,
    PARAMETER_DIGESTS_ATTR,
    BatchLayout,
    DumpWriter,
    LlmcheckError,
    NullSink,
    RecordKey,
    TensorSink,
    TopologyNode,
    UsageError,
    dtype_name,
    module_depth,
)
from llmcheck.plugins.torch_hooks.config import (
    ENDED_ENV,
    LEFT_OUT_ENV,
    LEVEL_MODULE,
    LEVEL_OP,
    NOT_STARTED_ENV,
    ON_ERROR_RAISE,
    STARTED_ENV,
    UNCLOSED_ENV,
    DumpConfig,
    step_runs,
)
from llmcheck.plugins.torch_hooks.cpu_profile import CAPTURE_RANGE, StepProfiler
from llmcheck.plugins.torch_hooks.dtype_cast import ModelCast
from llmcheck.plugins.torch_hooks.module_graph_onnx import ONNX_FILE, GraphRecorder, write_graph_onnx
from llmcheck.plugins.torch_hooks.module_selection import ROOT_NAME, ModuleSelection, parent_name
from llmcheck.plugins.torch_hooks.module_topology import ModuleTopology
from llmcheck.plugins.torch_hooks.nested_tensors import call_inputs, call_outputs
from llmcheck.plugins.torch_hooks.op_capture import OpRecorder
from llmcheck.plugins.torch_hooks.parameter_digests import ModuleParameterDigests

log = logging.getLogger("llmcheck.torch")

BACKEND_NAME = "torch"

_NO_SCOPE = nullcontext()  # reusable: the capture scope of every call when not profiling


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
    for parameter in model.parameters():
        return parameter.device
    for buffer in model.buffers():
        return buffer.device
    return torch.device("cpu")


def device_label(device: torch.device) -> str:
    """Return a device as it appears in dump folder names: ``cpu``, ``cuda0``, ``npu3``."""
    return device.type if device.index is None else f"{device.type}{device.index}"


def _device_wanted(device: torch.device, device_ids: Sequence[str]) -> bool:
    if not device_ids:
        return True
    if device.type == "cpu":
        return "cpu" in device_ids
    index = str(device.index or 0)
    return bool({index, f"{device.type}{index}", f"{device.type}:{index}"} & set(device_ids))


def _note_for_parent(variable: str, line: str) -> None:
    """Tell ``llmcheck dump`` (the parent) one line through the notes file named by ``variable``, when it asked."""
    notes = os.environ.get(variable)
    if not notes:
        return
    with suppress(OSError), open(notes, "a", encoding="utf-8") as out:  # on failure the parent only loses a reason
        out.write(line.replace("\n", " ") + "\n")


def steps_text(steps: Sequence[int]) -> str:
    """Return sorted step numbers as runs: ``0-2, 5, 7-9``."""
    return ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in step_runs(steps))


@dataclass(frozen=True, slots=True)
class _ModuleSite:
    """What the hooks of one module need, resolved once at attach time (no lookups per call)."""

    name: str
    op_type: str
    parent: str | None
    is_root: bool
    records_inputs_before: bool
    records_after: bool
    leaf: bool
    #: levels below the model: a step whose depth (``step_depths``) is smaller does not record it
    depth: int


class CaptureSession:
    """A capture running on one model: its hooks, its step counter and the dump it writes.

    Returned by :func:`register_hook`. ``path`` is the dump folder (``None`` when the
    ``device_ids`` filter leaves this process out, or when the dump could not be created --
    ``failure`` then says why: the session then writes into a :class:`NullSink`). ``close()`` -- or leaving a ``with`` block, or :func:`remove_hook`
    -- removes the hooks, writes what is pending and closes the dump. Not thread-safe: one
    model is run by one thread at a time.

    The parts: module hooks and the step counter here; the op level in
    :class:`~.op_capture.OpRecorder`; the module tree in :class:`~.module_topology.ModuleTopology`;
    copies, statistics and the writer behind the sink (``TensorSink``, shared through ``plugin_api``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: DumpConfig,
        *,
        outside_steps: bool = False,
        manifest_fields: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        #: Steps begin and end where the caller says (:meth:`begin_outside_step`), not at the model's
        #: forward: a serving engine's step runs the forward and then the logits, and its warm-up
        #: forwards are no step at all.
        self.outside_steps = outside_steps
        self.config = config
        self._cast = ModelCast(model, config.as_dtype) if config.as_dtype is not None else None
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
        self._root_depth = 0
        self._dumping = False
        self._depth_now = sys.maxsize  # how deep the running step records modules (step_depths)
        self._stack: list[tuple[str, int]] = []  # (module path, call index or -1) of the calls running now
        self._call_counts: dict[str, int] = {}
        self.topology_order = ModuleTopology(model, self.selection.ids)
        self._ops = OpRecorder(self) if LEVEL_OP in config.levels else None
        self._weight_digests = (
            ModuleParameterDigests(model, self.selection.module_selected, ROOT_NAME)
            if LEVEL_MODULE in config.levels and config.weight_digests
            else None
        )
        self._graph: GraphRecorder | None = None  # the first dumped step's calls, for --type onnx
        self._graph_open = False
        self.writer: DumpWriter | None = None
        self.path: Path | None = None
        self._profiler: StepProfiler | None = None
        self.sink: TensorSink | NullSink = NullSink()
        if not self.enabled:
            log.warning("not capturing on %s: device_ids %s leave it out", device, ", ".join(config.device_ids))
            _note_for_parent(LEFT_OUT_ENV, self.device)
        else:
            try:
                self.writer = DumpWriter(
                    Path(config.dump_path),
                    BACKEND_NAME,
                    config=config.as_json(),
                    command_line=None if config.command_line is None else list(config.command_line),
                    rank=self.rank,
                    device=self.device,
                    dir_suffix=f"rank{self.rank}_{self.device}",
                    extra_fields={
                        MODEL_DTYPES_FIELD: self._model_dtypes(),
                        **(manifest_fields or {}),
                        **({AS_DTYPE_FIELD: self._cast.manifest_entry()} if self._cast is not None else {}),
                    },
                )
            except UsageError:  # a dump_path no dump can go in: the call is wrong, not the disk
                raise
            except LlmcheckError as exc:  # a full disk refused the new dump (it removed its folder)
                self._not_started(exc)
        if self.writer is not None:
            self.path = self.writer.path
            _note_for_parent(STARTED_ENV, str(self.path))
            if config.profile_cpu:
                self._profiler = StepProfiler(self.path / "cpu_profiling")
            self.sink = TensorSink(
                self.writer,
                rank=self.rank,
                statistics_only=config.statistics_only,
                max_pending_bytes=config.max_pending_bytes,
            )
        self._hooks: list[Any] = []
        self._root_after_hook: Any = None  # kept after a failure mid-step, to leave the op mode at the step's end
        if self.failure is None:
            self._attach_all()
        if self._cast is not None:  # after the capture's hooks, before digests or a forward; even uncaptured
            self._cast.apply()
        self_ref = weakref.ref(self)

        def close_at_exit() -> None:
            session = self_ref()
            if session is not None:
                session.close_at_exit()

        self._atexit = close_at_exit
        atexit.register(self._atexit)
        if self.path is not None:
            log.info("capturing %s into %s", type(model).__name__, self.path)

    def _model_dtypes(self) -> dict[str, int]:
        """Return how many floating parameters the model runs in each dtype (after ``as_dtype``), for the manifest.

        A dump of the model's outputs only does not show the precision the model ran at (a
        model may return float32 logits from bfloat16 layers); ``llmcheck hunt`` reads it here.
        """
        target = self._cast.manifest_entry()["to"] if self._cast is not None else None
        counts: dict[str, int] = {}
        for parameter in self.model.parameters():
            if parameter.is_floating_point():
                name = target or dtype_name(parameter.dtype).removeprefix("torch.")
                counts[name] = counts.get(name, 0) + 1
        return counts

    # --- public ---

    def __enter__(self) -> CaptureSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def records_written(self) -> int:
        """Return how many records the dump holds so far (handed to the writer)."""
        return self.sink.records_added

    def topology(self) -> TopologyNode:
        """Return the module tree: class names, module ids, children in first-execution order."""
        return self.topology_order.tree()

    def close(self) -> None:
        """Remove the hooks, write every pending record and the module tree, and close the dump.

        A failure here stops capture as one inside a hook does (see the module docstring).
        """
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self._atexit)
        self._remove_hooks(keep_root_after=False)
        if self._cast is not None:
            self._cast.detach()
        self._leave_op_mode()
        if self.failure is not None:
            return
        try:
            if self._profiler is not None and self._profiler.running:
                self._profiler.stop(self.step)
            self.sink.close(self.topology_order.changed_tree())
            if self._graph is not None and self.path is not None:
                write_graph_onnx(self._graph, self.path / ONNX_FILE, type(self.model).__name__)
        except Exception as exc:
            self.contain(exc)
            return
        self._warn_if_no_step_dumped()

    def _warn_if_no_step_dumped(self) -> None:
        """Warn when the dump closed empty because no step the config selects ran (compare would find no pairs)."""
        config = self.config
        if not self.enabled or not config.levels or self.steps_dumped:
            return
        selected = (
            "token_range None (every step)"
            if config.token_range is None
            else f"token_range [{steps_text(config.token_range)}]"
        )
        ran = (
            "the model ran no forward under capture"
            if self.step < 0
            else f"the program ran step{'s 0-' if self.step > 0 else ' '}{self.step} only"
        )
        log.warning("%s: %s; nothing was dumped into %s", selected, ran, self.path)

    def close_at_exit(self) -> None:
        """Close the dump as the process exits; never raises (no forward is left to hand an error to)."""
        with suppress(Exception):  # already reported by the warning of _stop_after_failure
            self.close()

    # --- what the op level asks of its session ---

    def current_module(self) -> str:
        """Return the path of the innermost module running now (``"root"`` outside any)."""
        return self._stack[-1][0] if self._stack else ROOT_NAME

    def next_call_index(self, name: str) -> int:
        """Return the call index of a new call of ``name`` in this step and count it."""
        call_index = self._call_counts.get(name, 0)
        self._call_counts[name] = call_index + 1
        return call_index

    def open_graph(self) -> GraphRecorder | None:
        """Return the graph recording this step's calls (``--type onnx``, first dumped step), else ``None``."""
        return self._graph if self._graph_open else None

    def capture_scope(self) -> AbstractContextManager[Any]:
        """Return the profiler range that marks capture's own work (a no-op unless profiling)."""
        if self._profiler is not None and self._profiler.running:
            return torch.profiler.record_function(CAPTURE_RANGE)
        return _NO_SCOPE

    # --- failures ---

    def contain(self, exc: Exception) -> None:
        """Handle a failure of capture's own work: stop capturing, then raise it only under ``on_capture_error="raise"``."""
        self._stop_after_failure(exc)
        if self._raises:
            raise exc

    def _not_started(self, exc: LlmcheckError) -> None:
        """Handle a dump that could not be created: warn once and run uncaptured, or raise under ``"raise"``."""
        reason = exc.one_line()
        _note_for_parent(NOT_STARTED_ENV, reason)
        if self._raises:
            raise exc
        self.failure = reason
        log.warning("capture could not start: %s; no dump was written, the program runs on without capture", reason)

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
            with suppress(Exception):  # the profile is lost with the rest of the capture
                self._profiler.stop(self.step)
        kept, unclosed = self.sink.close_cut(reason)
        policy = "the error is raised into the program" if self._raises else "the program runs on"
        if unclosed is None:
            outcome = f"is closed as cut with its {kept} complete records"
        else:
            _note_for_parent(UNCLOSED_ENV, f"{self.path}\t{unclosed}")
            outcome = (
                f"keeps its {kept} complete records, but its closing manifest could not be written ({unclosed}): "
                "it reads as a dump its writer did not close"
            )
        log.warning("capture stopped: %s; the dump %s %s, %s", reason, self.path, outcome, policy)

    def _remove_hooks(self, *, keep_root_after: bool) -> None:
        for handle in self._hooks:
            if not (keep_root_after and handle is self._root_after_hook):
                handle.remove()
        self._hooks = [self._root_after_hook] if keep_root_after else []

    # --- hooks ---

    def _attach_all(self) -> None:
        """Hook every submodule, each with its :class:`_ModuleSite` resolved now.

        Per-module hooks, not torch's global module hooks: a global forward pre-hook is not
        given the call's keyword arguments (HF passes ``hidden_states=`` by keyword), and a
        global hook would put every module of the process -- other models too -- on
        torch's slow hooked call path. The work per call is constant either way.
        """
        config = self.config
        module_level = LEVEL_MODULE in config.levels
        op_level = self._ops is not None
        for name, module in self.model.named_modules():
            name = name or ROOT_NAME
            selected = module_level and self.selection.module_selected(name)
            site = _ModuleSite(
                name=name,
                op_type=type(module).__name__,
                parent=parent_name(name),
                is_root=module is self.model,
                records_inputs_before=selected and config.saves_inputs_before,
                records_after=selected and (config.saves_inputs_after or config.saves_outputs),
                leaf=not op_level and next(module.children(), None) is None,
                depth=module_depth(name),
            )
            self._attach(site, module)

    def _attach(self, site: _ModuleSite, module: torch.nn.Module) -> None:
        name, is_root = site.name, site.is_root
        first_run = self.topology_order.first_run
        stack = self._stack

        def before(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            try:
                if is_root and self.outside_steps and self._root_depth == 0:
                    return None  # a forward outside the engine's steps (warm-up, profiling)
                if is_root:
                    self._root_depth += 1
                    if self._root_depth == 1:
                        self._begin_step()
                elif self._root_depth == 0:
                    return None  # called outside a forward of the model: not part of any step
                if name not in first_run:
                    first_run[name] = len(first_run)
                if not self._dumping or site.depth > self._depth_now:
                    stack.append((name, -1))
                    return None
                call_index = self.next_call_index(name)
                stack.append((name, call_index))
                if site.records_inputs_before:
                    self._save(site, call_inputs(args, kwargs), IO_INPUT, call_index, MOMENT_BEFORE)
            except Exception as exc:  # capture's own failure: the program's forward must not see it
                self.contain(exc)
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
            matched = bool(stack) and stack[-1][0] == name
            if not matched and not is_root:
                return None  # a call whose start this session did not see
            call_index = stack.pop()[1] if matched else -1
            try:
                if call_index >= 0 and len(rest) == 2 and site.records_after:
                    kwargs, output = rest
                    config = self.config
                    digests = (
                        self._weight_digests.of(name) if self._weight_digests is not None and call_index == 0 else None
                    )
                    if config.saves_inputs_after:
                        self._save(
                            site,
                            call_inputs(args, kwargs),
                            IO_INPUT,
                            call_index,
                            MOMENT_AFTER,
                            None if config.saves_outputs else digests,
                        )
                    if config.saves_outputs:
                        self._save(site, call_outputs(output), IO_OUTPUT, call_index, MOMENT_AFTER, digests)
                if is_root and self._root_depth == 1:
                    self._end_step()
            except Exception as exc:  # capture's own failure: the program's forward must not see it
                self.contain(exc)
            finally:
                if is_root:
                    self._root_depth -= 1
                    if self._root_depth == 0 and self.failure is not None:
                        self._leave_op_mode()
                        self._remove_hooks(keep_root_after=False)
                    self._end_program_if_done()
            return None

        self._hooks.append(module.register_forward_pre_hook(before, with_kwargs=True))
        after_hook = module.register_forward_hook(after, with_kwargs=True, always_call=True)
        self._hooks.append(after_hook)
        if is_root:
            self._root_after_hook = after_hook

    def _save(
        self,
        site: _ModuleSite,
        tensors: list[tuple[str, torch.Tensor]],
        io: str,
        call_index: int,
        moment: str,
        digests: dict[str, Any] | None = None,
    ) -> None:
        """Record a call's inputs or outputs; the first record carries the module's parameter digests, if any."""
        if not tensors:
            return
        name, op_type, parent = site.name, site.op_type, site.parent
        graph = self._graph if self._graph_open and site.leaf else None
        sink = self.sink
        step = self.step
        previous, self.busy = self.busy, True
        try:
            with self.capture_scope():
                sink.settle_versions()
                for position, tensor in tensors:
                    attrs = {PARAMETER_DIGESTS_ATTR: digests} if digests else None
                    digests = None
                    identity = sink.add(
                        (name, io, position, step, call_index, moment),
                        tensor,
                        op_type=op_type,
                        parent=parent,
                        attrs=attrs,
                    )
                    if graph is not None:
                        graph.add_record(
                            RecordKey(name, io, position, step, call_index, moment),
                            identity,
                            dtype_name(tensor.dtype),
                            tuple(tensor.shape),
                            op_type,
                            parent or ROOT_NAME,
                            None,
                            inputs_read_before=self.config.saves_inputs_before,
                        )
        finally:
            self.busy = previous

    # --- steps ---

    def begin_outside_step(self) -> None:
        """Begin a step the caller drives (``outside_steps``): the module calls until :meth:`end_outside_step` make it."""
        if self.closed or self.failure is not None:
            return
        try:
            self._root_depth += 1
            if self._root_depth == 1:
                self._begin_step()
        except Exception as exc:
            self.contain(exc)

    def end_outside_step(self, layout: BatchLayout | None = None) -> None:
        """End the step :meth:`begin_outside_step` began; ``layout`` is its rows' bookkeeping, kept when it was dumped."""
        if self.closed or self._root_depth == 0:
            return
        try:
            if self.failure is None and self._root_depth == 1:
                dumped = self._dumping
                self._end_step()
                if dumped and layout is not None and self.writer is not None:
                    self.writer.add_batch_layout(layout)
        except Exception as exc:
            self.contain(exc)
        finally:
            self._root_depth -= 1
            if self._root_depth == 0 and self.failure is not None:
                self._leave_op_mode()
                self._remove_hooks(keep_root_after=False)
            self._end_program_if_done()

    def _end_program_if_done(self) -> None:
        """End the program once the last step asked for is dumped (``exit_after_range``), its dump closed first.

        The rest of the program would only compute steps nobody records: for a dump of the
        prefill of a long generation that is most of its time. ``os._exit`` skips the program's
        own clean-up, which is what is wanted (no more forwards), after flushing its output;
        the note tells ``llmcheck dump`` this end is the one asked for.
        """
        if self._root_depth != 0 or self.closed or not self.config.ends_program_after(self.step):
            return
        self.close()
        if self.failure is not None:
            return  # the dump is cut: the program runs on, as after any failure inside capture
        _note_for_parent(ENDED_ENV, str(self.step))
        log.info("dumped the last step asked for (%d): ending the program (exit_after_range)", self.step)
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):
                stream.flush()
        os._exit(0)

    def _begin_step(self) -> None:
        self.step += 1
        depth = self.selection.depth_at(self.step)
        self._depth_now = depth if depth is not None else sys.maxsize
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
        if self._dumping and self._ops is not None:
            self._ops.enter_step()

    def _end_step(self) -> None:
        self._leave_op_mode()
        self._graph_open = False
        self._stack.clear()
        if self._profiler is not None and self._profiler.running:
            self._profiler.stop(self.step)
        build_tree = self.topology_order.changed_tree() if self.enabled else None
        if self._dumping:
            self._dumping = False
            self.steps_dumped.append(self.step)
            self.sink.hand_over(finished_step=self.step, build_tree=build_tree)
        elif build_tree is not None:
            self.sink.hand_over(build_tree=build_tree)

    def _leave_op_mode(self) -> None:
        if self._ops is not None:
            self._ops.leave_step()


def register_hook(
    model: torch.nn.Module, config: DumpConfig | None = None, hook_type: str = "dump_data"
) -> CaptureSession:
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
