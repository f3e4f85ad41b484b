"""The FX backend's fast path: each ATen graph rewritten once to record its calls into an llmcheck dump.

Why not the interpreter (:class:`~.fx_backend.FxDumpInterpreter`, the torchair layout): it
runs the graph node by node in Python and writes one ``.npy`` per tensor synchronously,
about 15 plain forwards. Here the graph is rewritten once, when it is compiled: before
each ATen call a call of :meth:`FxGraphRecorder.record_inputs` with the call's positional
arguments, after it a call of :meth:`FxGraphRecorder.record_outputs` with its result. The
graph is recompiled and runs as ordinary generated code. The recorder hands each tensor
to the :class:`TensorSink` the torch capture uses, which only copies it on the forward;
statistics and writing happen on the dump writer's thread. A tensor that is the same
object, unchanged, as one already recorded in the step (an output that is the next call's
input, a weight two calls read) is copied and stored once.

The records are those the ``fx`` source reads from a torchair-layout dump of the same
graph: ``RecordKey(name=node name, io, position "i" or "i.j", step)``, ``op_type`` the ATen
target, attrs ``fx_node``, ``fx_target``, ``graph_index``. A non-tensor argument is
recorded as torchair saves it (``np.array(value)``) when that gives numbers; when it gives
text (a dtype, a device) it is counted in the manifest (``non_numeric_arguments``), as the
``fx`` source counts such files. Constant arguments are converted once, at rewrite time.
Each call of a compiled graph is one step of that graph. The first graph's names are the
node names; later graphs of the same dump (graph breaks) are prefixed ``graph{k}/``.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.fx

from llmcheck.plugin_api import (
    IO_INPUT,
    IO_OUTPUT,
    MOMENT_AFTER,
    DumpWriter,
    KeyFields,
    LlmcheckError,
    TensorSink,
    TopologyNode,
)
from llmcheck.plugins.torchair_fx import SOURCE_NAME
from llmcheck.plugins.torchair_fx.fx_backend import (
    TENSOR_PART_BOTH,
    TENSOR_PART_INPUTS,
    TENSOR_PART_OUTPUTS,
    as_saved_array,
    check_tensor_part,
    rank_and_world_size,
)

log = logging.getLogger("llmcheck.fx")

#: Host memory the step's pending copies may hold before they are handed to the writer mid-step.
DEFAULT_MAX_PENDING_BYTES = 512 * 1024 * 1024


def is_aten_call(node: torch.fx.Node) -> bool:
    """Return whether a graph node calls an ATen operator (the nodes torchair's dumper saves)."""
    return node.op == "call_function" and str(node.target).startswith("aten")


def _holds_node(argument: Any) -> bool:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg(argument, lambda node: found.append(node) or node)  # type: ignore[func-returns-value]
    return bool(found)


def argument_array(value: Any) -> np.ndarray | None:
    """Return a non-tensor argument as torchair saves it; ``None`` when torchair saves its text."""
    array = as_saved_array(value)
    return None if array.dtype.kind in "USO" else array


def argument_tensor(value: Any) -> torch.Tensor | None:
    """Return a non-tensor argument as torchair saves it, as a tensor; ``None`` when torchair saves its text."""
    array = argument_array(value)
    return None if array is None else torch.from_numpy(array)


@dataclass(slots=True)
class _Argument:
    """One positional argument of a call: its position and, when it holds no value of the graph, its constant.

    A constant is kept as the array torchair saves (``text``: torchair saves its text) and
    made a tensor at the first run: the graph is rewritten under the compiler's fake-tensor
    mode, where a tensor made would be fake.
    """

    position: str
    array: np.ndarray | None = None
    constant: torch.Tensor | None = None
    text: bool = False


@dataclass(frozen=True, slots=True)
class _CallPlan:
    """What the recorder needs of one ATen call, worked out when the graph is rewritten."""

    name: str  # record name: the node name, prefixed graph{k}/ after the first graph
    target: str
    attrs: Mapping[str, Any]
    arguments: tuple[_Argument, ...]


class FxGraphRecorder:
    """Records the ATen calls of one graph into its dump's sink; the graph calls it (see :meth:`rewrite`)."""

    def __init__(self, sink: TensorSink, graph_index: int) -> None:
        self.sink = sink
        self.graph_index = graph_index
        self.prefix = f"graph{graph_index}/" if graph_index else ""
        self.step = 0
        self.non_numeric_arguments = 0
        self.nodes: dict[str, str] = {}  # node name -> ATen target, in graph order (the dump's topology)
        self._plans: list[_CallPlan] = []

    def rewrite(self, module: torch.fx.GraphModule, *, inputs: bool, outputs: bool) -> None:
        """Insert the recorder's calls around every ATen call of ``module``'s graph and recompile it."""
        graph = module.graph
        for node in list(graph.nodes):
            if not is_aten_call(node):
                continue
            target = str(node.target)
            self.nodes[node.name] = target
            plan_index = len(self._plans)
            arguments = []
            graph_values = []
            for position, argument in enumerate(node.args):
                if _holds_node(argument):
                    arguments.append(_Argument(str(position)))
                    graph_values.append(argument)
                else:
                    array = argument_array(argument)
                    arguments.append(_Argument(str(position), array, text=array is None))
            self._plans.append(
                _CallPlan(
                    self.prefix + node.name,
                    target,
                    {"fx_node": node.name, "fx_target": target, "graph_index": self.graph_index},
                    tuple(arguments),
                )
            )
            if inputs:
                with graph.inserting_before(node):
                    graph.call_function(self.record_inputs, (plan_index, tuple(graph_values)))
            if outputs:
                with graph.inserting_after(node):
                    graph.call_function(self.record_outputs, (plan_index, node))
        module.recompile()

    def record_inputs(self, plan_index: int, graph_values: tuple[Any, ...]) -> None:
        """Record one call's positional arguments as they are before it (called by the rewritten graph)."""
        plan = self._plans[plan_index]
        values = iter(graph_values)
        for argument in plan.arguments:
            if argument.array is not None:
                if argument.constant is None:
                    argument.constant = torch.from_numpy(argument.array)
                self._add(plan, IO_INPUT, argument.position, argument.constant)
            elif argument.text:
                self.non_numeric_arguments += 1
            else:
                value = next(values)
                if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
                    for item_index, item in enumerate(value):
                        self._record(plan, IO_INPUT, f"{argument.position}.{item_index}", item)
                else:
                    self._record(plan, IO_INPUT, argument.position, value)

    def record_outputs(self, plan_index: int, result: Any) -> None:
        """Record one call's results (called by the rewritten graph right after the call)."""
        plan = self._plans[plan_index]
        if isinstance(result, (list, tuple)):
            for position, item in enumerate(result):
                self._record(plan, IO_OUTPUT, str(position), item)
        else:
            self._record(plan, IO_OUTPUT, "0", result)

    def _record(self, plan: _CallPlan, io: str, position: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self._add(plan, io, position, value)
            return
        tensor = argument_tensor(value)
        if tensor is None:
            self.non_numeric_arguments += 1
        else:
            self._add(plan, io, position, tensor)

    def _add(self, plan: _CallPlan, io: str, position: str, tensor: torch.Tensor) -> None:
        key: KeyFields = (plan.name, io, position, self.step, 0, MOMENT_AFTER)
        self.sink.add(key, tensor, op_type=plan.target, parent=None, attrs=plan.attrs)

    def run_step(self, graph_call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run the rewritten graph once (one step) and hand the step's records to the writer."""
        try:
            return graph_call(*args, **kwargs)
        finally:
            self.sink.hand_over(finished_step=self.step)
            self.step += 1

    def topology(self) -> TopologyNode:
        """Return this graph as a topology node with its ATen calls as children."""
        return TopologyNode(
            name=f"graph{self.graph_index}",
            op_type="GraphModule",
            attrs={"graph_index": self.graph_index},
            children=tuple(TopologyNode(name=node, op_type=target) for node, target in self.nodes.items()),
        )


class FxDump:
    """One llmcheck-format FX dump: its writer, the sink its graphs record into, and their recorders.

    Created in ``dump_path`` at once (a bad path fails here, not inside ``torch.compile``);
    ``close()`` -- or leaving a ``with`` block, or the process's exit -- writes what is
    pending and closes the dump.
    """

    def __init__(
        self,
        dump_path: str | Path,
        *,
        statistics_only: bool = False,
        tensor_part: int = TENSOR_PART_BOTH,
        rank: int | None = None,
        world_size: int | None = None,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ) -> None:
        check_tensor_part(tensor_part)
        rank, world_size = rank_and_world_size(rank, world_size)
        self.tensor_part = tensor_part
        self.writer = DumpWriter(
            Path(dump_path),
            SOURCE_NAME,
            config={"statistics_only": statistics_only, "tensor_part": tensor_part, "world_size": world_size},
            rank=rank,
            device="unknown",
            dir_suffix=f"fx_rank{rank}",
        )
        self.path = self.writer.path
        self.sink = TensorSink(
            self.writer,
            rank=rank,
            statistics_only=statistics_only,
            max_pending_bytes=max_pending_bytes,
            on_not_captured=_warn_not_captured,
        )
        self.graphs: list[FxGraphRecorder] = []
        self.closed = False
        self_ref = weakref.ref(self)

        def close_at_exit() -> None:  # never raises: no program is left to hand an error to
            dump = self_ref()
            if dump is not None:
                try:
                    dump.close()
                except LlmcheckError as exc:
                    log.warning("FX dump %s not closed at exit: %s", dump.path, exc.one_line())

        self._atexit = close_at_exit
        atexit.register(self._atexit)
        log.info("FX capture into %s", self.path)

    def __enter__(self) -> FxDump:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add_graph(self, module: torch.fx.GraphModule, example_inputs: Sequence[Any] = ()) -> FxGraphRecorder:
        """Rewrite ``module`` (in place) to record into this dump and return its recorder."""
        if not self.graphs:
            devices = [str(value.device) for value in example_inputs if isinstance(value, torch.Tensor)]
            self.writer.manifest["device"] = devices[0] if devices else "unknown"
        recorder = FxGraphRecorder(self.sink, len(self.graphs))
        recorder.rewrite(
            module,
            inputs=self.tensor_part in (TENSOR_PART_INPUTS, TENSOR_PART_BOTH),
            outputs=self.tensor_part in (TENSOR_PART_OUTPUTS, TENSOR_PART_BOTH),
        )
        self.graphs.append(recorder)
        return recorder

    def topology(self) -> TopologyNode:
        """Return the dump's graphs and their ATen calls (``topology.json``)."""
        return TopologyNode(
            name=self.path.name, op_type="FxDump", children=tuple(graph.topology() for graph in self.graphs)
        )

    def close(self) -> None:
        """Write every pending record and the graphs' topology, and close the dump (once)."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self._atexit)
        self.writer.manifest["graphs"] = len(self.graphs)
        self.writer.manifest["non_numeric_arguments"] = sum(graph.non_numeric_arguments for graph in self.graphs)
        self.sink.close(self.topology)


def _warn_not_captured(key: KeyFields, description: str) -> None:
    log.warning(
        "FX dump: %s %s.%s step %d is a %s tensor, which cannot be stored; its record holds its description",
        key[0],
        key[1],
        key[2],
        key[3],
        description,
    )
