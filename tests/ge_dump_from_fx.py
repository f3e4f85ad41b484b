"""Test scenario: the GE dump and GE graph text torchair would write for a real FX graph, built on CPU.

No Ascend machine is needed to test the graph-mode story end to end: the FX graph of a real
model is run node by node, and each ATen call is written as the GE op it would become --
one CANN dump file per op (llmcheck's own GE writer; 2-D matmul operands in FRACTAL_NZ as on
the device) and a ``dynamo_original_graph_*.txt`` naming each output's FX tensor. Options
make the GE run defective (one node's output perturbed, so the error propagates downstream
as on a device), fuse two consecutive nodes into one ``AutomaticBufferFusionOp``, and add a
compiler-inserted ``Cast`` with no FX counterpart.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx

from llmcheck.plugins.torchair_ge.ge_dump import GeDumpFileName, payload_from_tensor, write_ge_dump
from llmcheck.plugins.torchair_ge.ge_graph_text import GeGraphOp, write_ge_graph_text

GE_TYPES = {
    "mm": "MatMulV2",
    "bmm": "BatchMatMulV2",
    "add": "Add",
    "mul": "Mul",
    "silu": "Swish",
    "embedding": "GatherV2",
    "rsqrt": "Rsqrt",
    "mean": "ReduceMean",
    "pow": "Pow",
    "view": "Reshape",
    "t": "Transpose",
    "transpose": "Transpose",
    "cat": "ConcatV2",
    "neg": "Neg",
    "softmax": "SoftmaxV2",
    "_softmax": "SoftmaxV2",
    "_to_copy": "Cast",
    "unsqueeze": "Unsqueeze",
    "expand": "BroadcastTo",
}
RUN_TIME_FOLDER = "20240101120000"
MODEL_FOLDER = ("graph_1", "1")


def ge_op_name(node: torch.fx.Node) -> str:
    """Return the GE op name this scenario gives an FX node (capitalised, as GE names read)."""
    return node.name[:1].upper() + node.name[1:]


def ge_op_type(node: torch.fx.Node) -> str:
    """Return the GE op type this scenario gives an FX node's ATen target."""
    op = str(node.target).split(".")[1]
    return GE_TYPES.get(op, "".join(part.capitalize() for part in op.split("_")))


def is_aten_call(node: torch.fx.Node) -> bool:
    """Return whether torchair would dump (and convert) this node: an ATen function call."""
    return node.op == "call_function" and str(node.target).startswith("aten")


@dataclass
class GeScenario:
    """What to make of the graph: a perturbed node, a fused pair, an extra Cast."""

    perturb_node: str | None = None
    fuse: tuple[str, str] | None = None
    add_cast: bool = False
    framed: bool = True


@dataclass
class _Pending:
    inputs: list[torch.Tensor]
    input_sources: list[str]


@dataclass
class _GraphRecorder:
    ops: dict[str, GeGraphOp] = field(default_factory=dict)


class GeDumpingInterpreter(torch.fx.Interpreter):
    """Runs an FX graph and writes, per ATen call, the GE dump file the device would write."""

    def __init__(self, module: torch.fx.GraphModule, step_folder: Path, scenario: GeScenario) -> None:
        super().__init__(module)
        self.step_folder = step_folder
        self.scenario = scenario
        self.task_id = 0
        self.timestamp_us = 1_700_000_000_000_000
        self.fused_first: _Pending | None = None
        self.output_counts: dict[str, int] = {}

    def _next_name(self, op_type: str, op_name: str) -> GeDumpFileName:
        self.task_id += 1
        self.timestamp_us += 7
        return GeDumpFileName(op_type, op_name, self.task_id, 0, self.timestamp_us)

    @staticmethod
    def _tensor_args(node: torch.fx.Node, args: tuple[Any, ...]) -> tuple[list[torch.Tensor], list[str]]:
        tensors, sources = [], []
        for arg_node, value in zip(node.args, args):
            nodes = arg_node if isinstance(arg_node, (list, tuple)) else [arg_node]
            values = value if isinstance(value, (list, tuple)) else [value]
            for item_node, item in zip(nodes, values):
                if isinstance(item_node, torch.fx.Node) and isinstance(item, torch.Tensor):
                    tensors.append(item)
                    sources.append(graph_input_source(item_node))
        return tensors, sources

    def _payloads(self, node: torch.fx.Node, tensors: list[torch.Tensor]) -> list[Any]:
        matmul = str(node.target).startswith(("aten.mm", "aten.linear"))
        return [
            payload_from_tensor(t, layout="FRACTAL_NZ" if matmul and t.dim() == 2 and t.is_floating_point() else "ND")
            for t in tensors
        ]

    def run_node(self, node: torch.fx.Node) -> Any:
        if not is_aten_call(node):
            return super().run_node(node)
        with self._set_current_node(node):
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            result = self.call_function(node.target, args, kwargs)
        if node.name == self.scenario.perturb_node:
            generator = torch.Generator().manual_seed(0)
            result = result * 1.25 + 0.5 * result.std() * torch.randn(result.shape, generator=generator)
        outputs = [
            t for t in (result if isinstance(result, (list, tuple)) else [result]) if isinstance(t, torch.Tensor)
        ]
        self.output_counts[node.name] = len(outputs)
        inputs, sources = self._tensor_args(node, args)
        fuse = self.scenario.fuse
        if fuse is not None and node.name == fuse[0]:
            self.fused_first = _Pending(inputs, sources)
            return result
        if fuse is not None and node.name == fuse[1] and self.fused_first is not None:
            first = self.fused_first
            outside = [(t, s) for t, s in zip(inputs, sources) if not s.startswith(ge_op_name_by_fx(fuse[0]) + ":")]
            fused_inputs = first.inputs + [t for t, _ in outside]
            name = self._next_name("AutomaticBufferFusionOp", ge_op_name_by_fx(fuse[0]) + ge_op_name(node))
            write_ge_dump(
                self.step_folder,
                name,
                self._payloads(node, fused_inputs),
                self._payloads(node, outputs),
                framed=self.scenario.framed,
            )
            return result
        write_ge_dump(
            self.step_folder,
            self._next_name(ge_op_type(node), ge_op_name(node)),
            self._payloads(node, inputs),
            self._payloads(node, outputs),
            framed=self.scenario.framed,
        )
        if self.scenario.add_cast and node.name == self.scenario.perturb_node:
            cast_name = self._next_name("Cast", "trans_Cast_inserted")
            write_ge_dump(
                self.step_folder,
                cast_name,
                [payload_from_tensor(outputs[0])],
                [payload_from_tensor(outputs[0].half())],
                framed=self.scenario.framed,
            )
        return result


def ge_op_name_by_fx(fx_node_name: str) -> str:
    """Return the GE op name of an FX node given by name."""
    return fx_node_name[:1].upper() + fx_node_name[1:]


def graph_input_source(node: torch.fx.Node) -> str:
    """Return the GE ``input`` entry (``"src:index"``) for a value produced by ``node``."""
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        return f"{ge_op_name(node.args[0])}:{node.args[1]}"
    if node.op in ("placeholder", "get_attr"):
        return f"Data_{node.name}:0"
    return f"{ge_op_name(node)}:0"


def ge_graph_ops(module: torch.fx.GraphModule, output_counts: dict[str, int]) -> list[GeGraphOp]:
    """Return the GE graph torchair would dump for the module: Data ops, then one op per ATen call."""
    ops = []
    for node in module.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            ops.append(GeGraphOp(f"Data_{node.name}", "Data", (), (None,)))
        elif is_aten_call(node) and node.name in output_counts:
            sources = []
            for arg in node.args:
                for item in arg if isinstance(arg, (list, tuple)) else [arg]:
                    if isinstance(item, torch.fx.Node):
                        sources.append(graph_input_source(item))
            fx_names = tuple(f"{node.name}-{node.target}.OUTPUT.{k}" for k in range(output_counts[node.name]))
            ops.append(GeGraphOp(ge_op_name(node), ge_op_type(node), tuple(sources), fx_names))
    return [GeGraphOp(op.name, op.op_type, op.inputs, op.fx_tensor_names, index) for index, op in enumerate(ops)]


def write_ge_scenario(module: torch.fx.GraphModule, args: tuple[Any, ...], root: Path, scenario: GeScenario) -> Path:
    """Run ``module`` on ``args`` and write its GE dump tree and graph text under ``root``; return ``root``."""
    step_folder = root / "worldsize1_global_rank0" / RUN_TIME_FOLDER / "0" / MODEL_FOLDER[0] / MODEL_FOLDER[1] / "0"
    interpreter = GeDumpingInterpreter(module, step_folder, scenario)
    with torch.no_grad():
        interpreter.run(*args)
    write_ge_graph_text(root, "graph_1", ge_graph_ops(module, interpreter.output_counts), graph_id=1, rank=0, pid=4242)
    return root
