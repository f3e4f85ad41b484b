"""``--type onnx`` for torch: the captured graph of one step as an ONNX model to view in Netron.

Why not ``torch.onnx.export``: it re-traces the model and fails on ordinary LLM code
(``aten::diff`` in HF Llama has no ONNX mapping; the newer exporter needs onnxscript). The
capture already saw the real dataflow, so this writes that: one node per leaf-module call
(module level) or per ATen operator call (op level) of the first dumped step, edges where
one call's output tensor is another's input (the same data, seen by the capture), shapes
and element types on every edge. Like the seed's topology ONNX it has no weights and is
for viewing, not running: node types live in the custom domain ``llmcheck.torch``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import IO_INPUT, MOMENT_AFTER, RecordKey

log = logging.getLogger("llmcheck.torch")

DOMAIN = "llmcheck.torch"
ONNX_FILE = "model.onnx"


@dataclass
class GraphTensor:
    """One tensor of a call: its dataflow identity and how it is shown."""

    identity: int
    label: str
    dtype: str
    shape: tuple[int, ...]


@dataclass
class GraphCall:
    """One call seen in the step: becomes one ONNX node."""

    name: str
    op_type: str
    module: str
    inputs: list[GraphTensor] = field(default_factory=list)
    outputs: list[GraphTensor] = field(default_factory=list)
    arguments: dict[str, Any] | None = None


class GraphRecorder:
    """Collects the calls of one step, in the order they began."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], GraphCall] = {}

    def add(
        self,
        name: str,
        call_index: int,
        op_type: str,
        module: str,
        io: str,
        tensor: GraphTensor,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        """Note that call ``(name, call_index)`` read (``io="input"``) or wrote ``tensor``."""
        call = self.calls.get((name, call_index))
        if call is None:
            node_name = f"{name}[{call_index}]" if call_index else name
            call = self.calls[(name, call_index)] = GraphCall(node_name, op_type, module, arguments=arguments)
        (call.inputs if io == "input" else call.outputs).append(tensor)

    def add_record(
        self,
        key: RecordKey,
        identity: int,
        dtype: str,
        shape: tuple[int, ...],
        op_type: str,
        module: str,
        arguments: dict[str, Any] | None,
        *,
        inputs_read_before: bool,
    ) -> None:
        """Note a captured record as an edge of its call; ``identity`` is the sink's id of the data.

        With ``inputs_read_before`` a call's inputs as they are after it ran are skipped: the
        node reads them as they were before it ran.
        """
        if key.io == IO_INPUT and key.moment == MOMENT_AFTER and inputs_read_before:
            return
        label = f"{key.name}.{key.io}.{key.position}"
        self.add(
            key.name, key.call_index, op_type, module, key.io, GraphTensor(identity, label, dtype, shape), arguments
        )


def _elem_type(dtype: str) -> int:
    from onnx import TensorProto

    names = {
        "float64": "DOUBLE",
        "float32": "FLOAT",
        "float16": "FLOAT16",
        "bfloat16": "BFLOAT16",
        "int64": "INT64",
        "int32": "INT32",
        "int16": "INT16",
        "int8": "INT8",
        "uint8": "UINT8",
        "uint16": "UINT16",
        "uint32": "UINT32",
        "uint64": "UINT64",
        "bool": "BOOL",
        "complex64": "COMPLEX64",
        "complex128": "COMPLEX128",
        "float8_e4m3fn": "FLOAT8E4M3FN",
        "float8_e5m2": "FLOAT8E5M2",
        "float8_e4m3fnuz": "FLOAT8E4M3FNUZ",
        "float8_e5m2fnuz": "FLOAT8E5M2FNUZ",
    }
    return int(getattr(TensorProto, names.get(dtype, "UNDEFINED"), TensorProto.UNDEFINED))


def write_graph_onnx(recorder: GraphRecorder, path: Path, graph_name: str) -> Path | None:
    """Write the recorded calls as an ONNX model at ``path`` and return it (``None`` if nothing was recorded)."""
    import onnx
    from onnx import helper

    calls = list(recorder.calls.values())
    if not calls:
        log.warning("%s: no calls were captured, so no ONNX graph was written", path.parent)
        return None
    edge_of: dict[int, str] = {}  # identity -> name of the edge that holds its latest value
    used_names: set[str] = set()
    infos: dict[str, Any] = {}
    graph_inputs: list[str] = []
    consumed: set[str] = set()
    produced: list[str] = []

    def fresh(tensor: GraphTensor) -> str:
        name, suffix = tensor.label, 1
        while name in used_names:
            suffix += 1
            name = f"{tensor.label}#{suffix}"
        used_names.add(name)
        infos[name] = helper.make_tensor_value_info(name, _elem_type(tensor.dtype), list(tensor.shape))
        return name

    nodes = []
    for call in calls:
        inputs = []
        for tensor in call.inputs:
            if tensor.identity not in edge_of:
                edge_of[tensor.identity] = fresh(tensor)
                graph_inputs.append(edge_of[tensor.identity])
            inputs.append(edge_of[tensor.identity])
            consumed.add(edge_of[tensor.identity])
        outputs = []
        for tensor in call.outputs:
            edge_of[tensor.identity] = fresh(tensor)  # single assignment: a rewritten tensor gets a new edge
            outputs.append(edge_of[tensor.identity])
            produced.append(edge_of[tensor.identity])
        attributes: dict[str, Any] = {"module": call.module}
        if call.arguments is not None:
            attributes["arguments"] = json.dumps(call.arguments, separators=(",", ":"))
        nodes.append(helper.make_node(call.op_type, inputs, outputs, name=call.name, domain=DOMAIN, **attributes))
    graph_outputs = [name for name in produced if name not in consumed]
    graph = helper.make_graph(
        nodes,
        graph_name,
        [infos[name] for name in graph_inputs],
        [infos[name] for name in graph_outputs],
        value_info=[infos[name] for name in produced if name not in graph_outputs],
    )
    model = helper.make_model(
        graph, producer_name="llmcheck", opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
