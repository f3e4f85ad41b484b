"""Op-level capture: every ATen operator call seen under a ``TorchDispatchMode``.

The mode sits below autograd, so it sees the operators that actually run (``aten.mm.default``,
``aten._scaled_dot_product_flash_attention_for_cpu.default``, ...), each with its exact
arguments. It only observes: it calls the operator exactly as asked and returns its result,
so the run takes the same code path as without capture.

Work per operator call is constant: the op's name and selection are looked up in dicts
filled on first sight, and a model parameter is recognised by one dict lookup on its
storage address, shape, strides and dtype (a transposed view of a square weight is not the
weight). A weight read by several operators of one step is stored once: its later records
point at the data of the first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from llmcheck.plugin_api import (
    IO_INPUT,
    IO_OUTPUT,
    MOMENT_AFTER,
    MOMENT_BEFORE,
    PARAMETER_ATTR,
    RecordKey,
    dtype_name,
    encode_call,
)
from llmcheck.plugins.torch_hooks.nested_tensors import call_outputs

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.plugins.torch_hooks.capture import CaptureSession

_ParameterKey = tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype]


class OpCaptureMode(TorchDispatchMode):
    """Hands every operator call to its recorder, except the session's own work (copies, statistics)."""

    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(
        self, func: torch._ops.OpOverload, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if self.recorder.session.busy:
            return func(*args, **(kwargs or {}))
        return self.recorder.capture_op(func, args, kwargs or {})


class OpRecorder:
    """Records the operator calls of the dumped steps of one session (the op level of a capture)."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session
        self._mode: OpCaptureMode | None = None
        self._op_names: dict[Any, str] = {}
        self._parameter_names: dict[_ParameterKey, str] | None = None  # rebuilt each step: weights may move

    def enter_step(self) -> None:
        """Start recording the operators of the step that begins (the mode stays until :meth:`leave_step`)."""
        self._parameter_names = None
        self._mode = OpCaptureMode(self)
        self._mode.__enter__()

    def leave_step(self) -> None:
        """Stop recording operators (idempotent: a failure may leave the step early)."""
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def capture_op(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one ATen operator call and record its inputs and outputs (called by the op mode).

        The operator itself runs outside any containment: its own errors are the program's.
        """
        session = self.session
        if session.failure is not None:
            return func(*args, **kwargs)
        try:
            recorded = self._record_inputs(func, args, kwargs)
        except Exception as exc:  # capture's own failure: the program's forward must not see it
            session.contain(exc)
            recorded = None
        result = func(*args, **kwargs)
        if recorded is None or session.failure is not None:
            return result
        try:
            self._record_outputs(result, *recorded)
        except Exception as exc:
            session.contain(exc)
        return result

    def _record_inputs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """Record an operator's inputs before it runs; return what its outputs' records need (None: not selected)."""
        session = self.session
        module_name = session.current_module()
        op_type = self._op_names.get(func)
        if op_type is None:
            op_type = self._op_names[func] = str(func)
        if not session.selection.op_selected(module_name, op_type):
            return None
        name = f"{module_name}/{op_type}"
        call_index = session.next_call_index(name)
        config = session.config
        session.busy = True
        try:
            with session.capture_scope():
                session.sink.settle_versions()
                attrs, inputs = encode_call(args, kwargs)
                if config.saves_inputs_before:
                    self._save(name, inputs, IO_INPUT, call_index, MOMENT_BEFORE, op_type, module_name, attrs)
        finally:
            session.busy = False
        return name, call_index, inputs, op_type, module_name, attrs

    def _record_outputs(
        self,
        result: Any,
        name: str,
        call_index: int,
        inputs: list[tuple[str, torch.Tensor]],
        op_type: str,
        module_name: str,
        attrs: dict[str, Any],
    ) -> None:
        """Record an operator's outputs (and, with save_time 1 or 2, its inputs as they are after it ran)."""
        session = self.session
        config = session.config
        session.busy = True
        try:
            with session.capture_scope():
                if config.saves_inputs_after:
                    self._save(name, inputs, IO_INPUT, call_index, MOMENT_AFTER, op_type, module_name, attrs)
                if config.saves_outputs:
                    self._save(
                        name, call_outputs(result), IO_OUTPUT, call_index, MOMENT_AFTER, op_type, module_name, attrs
                    )
        finally:
            session.busy = False

    def parameter_name(self, tensor: torch.Tensor) -> str | None:
        """Return the model parameter a tensor is (same storage, shape, strides and dtype), or None.

        Op-level records of weights carry it as ``attrs["parameter"]``: compare checks them
        against the golden weights rounded to the my-run's dtype, since loading or converting
        weights wrongly is the most common porting defect.
        """
        if self._parameter_names is None:
            self._parameter_names = {
                (p.data_ptr(), tuple(p.shape), p.stride(), p.dtype): n for n, p in self.session.model.named_parameters()
            }
        return self._parameter_names.get((tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype))

    def _save(
        self,
        name: str,
        tensors: list[tuple[str, torch.Tensor]],
        io: str,
        call_index: int,
        moment: str,
        op_type: str,
        module_name: str,
        attrs: dict[str, Any],
    ) -> None:
        session = self.session
        sink = session.sink
        graph = session.open_graph()
        step = session.step
        strided = torch.strided
        for position, tensor in tensors:
            key = (name, io, position, step, call_index, moment)
            parameter = self.parameter_name(tensor) if io == IO_INPUT and tensor.layout == strided else None
            if parameter:
                identity = sink.add(
                    key,
                    tensor,
                    op_type=op_type,
                    parent=module_name,
                    attrs={**attrs, PARAMETER_ATTR: parameter},
                    same_data=(PARAMETER_ATTR, parameter),
                )
            else:
                identity = sink.add(
                    key, tensor, op_type=op_type, parent=module_name, attrs=attrs, op_output=io == IO_OUTPUT
                )
            if graph is not None:
                graph.add_record(
                    RecordKey(*key),
                    identity,
                    dtype_name(tensor.dtype),
                    tuple(tensor.shape),
                    op_type,
                    module_name,
                    attrs,
                    inputs_read_before=session.config.saves_inputs_before,
                )
