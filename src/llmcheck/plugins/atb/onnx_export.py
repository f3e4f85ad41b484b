"""ATB topology JSON -> an ONNX graph for viewing (Netron): the seed's ``atb_json_to_onnx``, done right.

The graph is for looking at, not for running: ATB op types become nodes of the custom
domain :data:`ATB_DOMAIN` (imported in ``opset_import``, so ``onnx.checker`` accepts the
model), op parameters become typed attributes (ints, floats, strings and their lists;
nested objects flattened to ``outer.inner``), and tensor element types and shapes come
from the op CSV written beside the topology (``--type op``), float and bf16 included.
Tensor names are ATB's own; a name written twice (in-place ops such as KV-cache
updates) gets a versioned name for its later values so the graph stays in SSA form.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcheck.plugin_api import (
    EMPTY_FILE,
    ONNX_MODEL,
    RECORD_NAME_KEY,
    LlmcheckError,
    UsageError,
    atomic_output,
    check_replaceable,
)
from llmcheck.plugins.atb.op_csv import CsvTensor, read_op_csv, rows_by_op_name
from llmcheck.plugins.atb.topology import AtbGraphNode, flatten_to_level, read_topology

if TYPE_CHECKING:  # pragma: no cover
    import onnx

log = logging.getLogger("llmcheck.atb")

ATB_DOMAIN = "com.huawei.atb"
ATB_DOMAIN_VERSION = 1
DEFAULT_DOMAIN_OPSET = 17
_INT64_RANGE = (-(2**63), 2**63 - 1)
_OP_CSV_NAME = re.compile(r"^operation_tensors_(\d+)\.csv$")

#: ATB dtype names (as the op CSV spells them) -> ONNX ``TensorProto`` element type names.
_ONNX_ELEMENT_TYPES = {
    "float": "FLOAT",
    "float16": "FLOAT16",
    "bf16": "BFLOAT16",
    "double": "DOUBLE",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "bool": "BOOL",
    "string": "STRING",
    "complex64": "COMPLEX64",
    "complex128": "COMPLEX128",
    "int4": "INT4",
    "float8_e5m2": "FLOAT8E5M2",
    "float8_e4m3fn": "FLOAT8E4M3FN",
    "float8_e8m0": "FLOAT8E8M0",
    "float4_e2m1": "FLOAT4E2M1",
}


def onnx_element_type(atb_dtype: str) -> int:
    """Return the ONNX element type of an ATB dtype name (``bf16`` -> BFLOAT16), UNDEFINED if none."""
    from onnx import TensorProto

    from llmcheck.plugins.atb.acl_dtypes import dtype_from_csv_name

    acl = dtype_from_csv_name(atb_dtype)
    name = _ONNX_ELEMENT_TYPES.get(acl.atb_name if acl else atb_dtype.strip().lower())
    return int(getattr(TensorProto, name, TensorProto.UNDEFINED)) if name else int(TensorProto.UNDEFINED)


def find_op_csv(topology_path: Path) -> Path | None:
    """Return the op CSV of the run that wrote a topology file, or ``None``.

    A topology at ``{dump}/{layer|model}/{pid}/X.json`` has its op CSVs at
    ``{dump}/operation_io_tensors/{pid}/operation_tensors_{n}.csv``; the lowest ``n`` is taken.
    """
    topology_path = Path(topology_path)
    folder = topology_path.parent.parent.parent / "operation_io_tensors" / topology_path.parent.name
    if not folder.is_dir():
        return None
    found = sorted(
        (int(match.group(1)), path) for path in folder.iterdir() if (match := _OP_CSV_NAME.match(path.name)) is not None
    )
    return found[0][1] if found else None


def _flatten_param(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten_param(f"{prefix}.{key}" if prefix else str(key), inner)
    else:
        yield prefix, value


def _is_int(value: Any) -> bool:
    return isinstance(value, (bool, int)) and _INT64_RANGE[0] <= int(value) <= _INT64_RANGE[1]


def param_attributes(param: dict[str, Any] | Any) -> list[onnx.AttributeProto]:
    """Return a node's ONNX attributes for an ATB param object, each with its natural type."""
    from onnx import AttributeProto, helper

    attributes = []
    for name, value in _flatten_param("", param if isinstance(param, dict) else {"param": param}):
        if _is_int(value):
            attribute = helper.make_attribute(name, int(value))
        elif isinstance(value, (float, str)):
            attribute = helper.make_attribute(name, value)
        elif isinstance(value, list) and not value:
            attribute = helper.make_attribute(name, [], attr_type=AttributeProto.INTS)
        elif isinstance(value, list) and all(_is_int(item) for item in value):
            attribute = helper.make_attribute(name, [int(item) for item in value])
        elif isinstance(value, list) and all(
            isinstance(item, (int, float)) and not isinstance(item, bool) for item in value
        ):
            attribute = helper.make_attribute(name, [float(item) for item in value])
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            attribute = helper.make_attribute(name, value)
        else:  # null, out-of-range ints, lists of objects: kept exactly, as JSON text
            attribute = helper.make_attribute(name, json.dumps(value))
        attributes.append(attribute)
    return attributes


def _tensor_types(root: AtbGraphNode, csv_path: Path | None) -> dict[str, CsvTensor]:
    """Return the CSV description of every tensor name a leaf of the topology reads or writes."""
    if csv_path is None:
        return {}
    rows = rows_by_op_name(read_op_csv(csv_path))
    described: dict[str, CsvTensor] = {}
    for node in root.walk():
        row = rows.get(node.op_name)
        if row is None or node.children:
            continue
        for names, tensors in ((node.inputs, row.inputs), (node.outputs, row.outputs)):
            for name, tensor in zip(names, tensors):
                described.setdefault(name, tensor)
    return described


def _boundary(nodes: list[AtbGraphNode]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return the tensors a node sequence reads from outside and those it leaves unread."""
    produced: dict[str, None] = {}
    read_from_outside: dict[str, None] = {}
    consumed: set[str] = set()
    for node in nodes:
        for name in node.inputs:
            consumed.add(name)
            if name not in produced:
                read_from_outside.setdefault(name)
        for name in node.outputs:
            produced.setdefault(name)
    return tuple(read_from_outside), tuple(name for name in produced if name not in consumed)


def _value_info(name: str, described: CsvTensor | None) -> onnx.ValueInfoProto:
    from onnx import TensorProto, helper

    if described is None:
        info = helper.make_tensor_value_info(name, TensorProto.UNDEFINED, [])
        info.doc_string = "element type and shape unknown (no op CSV row describes this tensor; dump with --type op)"
        return info
    return helper.make_tensor_value_info(name, onnx_element_type(described.atb_dtype), list(described.shape))


def build_onnx_model(
    root: AtbGraphNode, level: int, described: dict[str, CsvTensor], title: str = ""
) -> onnx.ModelProto:
    """Return the checked ONNX model of ``root`` flattened to ``level`` (tensor types from ``described``)."""
    import onnx
    from onnx import helper

    from llmcheck import __version__

    nodes = flatten_to_level(root, level)
    if len(nodes) == 1 and nodes[0] is root and not (root.inputs or root.outputs) and root.children:
        inputs, outputs = _boundary(flatten_to_level(root, -1))
        nodes = [AtbGraphNode(root.op_name, root.op_type, root.op_id, root.param, inputs, outputs)]
    current: dict[str, str] = {}  # ATB tensor name -> its latest SSA name
    taken: set[str] = set()
    origin: dict[str, str] = {}  # SSA name -> ATB tensor name
    graph_inputs: list[str] = []
    node_names: set[str] = set()
    onnx_nodes = []
    for node in nodes:
        input_names = []
        for name in node.inputs:
            if name not in current:
                current[name] = name
                taken.add(name)
                origin[name] = name
                graph_inputs.append(name)
            input_names.append(current[name])
        output_names = []
        for name in node.outputs:
            ssa_name, version = name, 1
            while ssa_name in taken:
                version += 1
                ssa_name = f"{name}@{version}"
            taken.add(ssa_name)
            origin[ssa_name] = name
            current[name] = ssa_name
            output_names.append(ssa_name)
        node_name, copy = node.op_name, 1
        while node_name in node_names:
            copy += 1
            node_name = f"{node.op_name}#{copy}"
        node_names.add(node_name)
        onnx_node = helper.make_node(
            node.op_type or "Unknown",
            input_names,
            output_names,
            name=node_name,
            domain=ATB_DOMAIN,
            doc_string=f"ATB {node.op_type} {node.op_name}",
        )
        onnx_node.attribute.extend(param_attributes(dict(node.param)))
        if node.op_id:  # the name of its records in a dump, so export model-explorer finds its pairs
            onnx_node.metadata_props.add(key=RECORD_NAME_KEY, value=node.op_id)
        onnx_nodes.append(onnx_node)
    consumed = {name for onnx_node in onnx_nodes for name in onnx_node.input}
    if root.outputs and any(name in current for name in root.outputs):
        graph_outputs = [current[name] for name in root.outputs if name in current]
    else:
        graph_outputs = [name for onnx_node in onnx_nodes for name in onnx_node.output if name not in consumed]
    graph_outputs = list(dict.fromkeys(graph_outputs))
    intermediate = [
        name
        for onnx_node in onnx_nodes
        for name in onnx_node.output
        if name not in graph_outputs and origin[name] in described
    ]
    graph = helper.make_graph(
        onnx_nodes,
        root.op_name,
        [_value_info(name, described.get(origin[name])) for name in graph_inputs],
        [_value_info(name, described.get(origin[name])) for name in graph_outputs],
        value_info=[_value_info(name, described[origin[name]]) for name in intermediate],
        doc_string=title,
    )
    model = helper.make_model(
        graph,
        producer_name="llmcheck",
        producer_version=__version__,
        opset_imports=[
            helper.make_opsetid("", DEFAULT_DOMAIN_OPSET),
            helper.make_opsetid(ATB_DOMAIN, ATB_DOMAIN_VERSION),
        ],
    )
    model.doc_string = "visualisation of an ATB topology; ATB ops are nodes of domain " + ATB_DOMAIN
    onnx.checker.check_model(model)
    return model


def atb_json_to_onnx(
    atb_json_path: str | Path,
    model_level: int = -1,
    output_path: str | Path | None = None,
    op_csv_path: str | Path | None = None,
) -> Path:
    """Convert an ATB layer/model topology JSON to ONNX and return the ``.onnx`` path written.

    ``model_level`` is the depth shown (``-1``: every leaf operation; ``0``: the whole
    graph as one node; ``N``: nodes ``N`` levels below the root). ``output_path`` defaults
    to the JSON's path with ``.onnx``; ``op_csv_path`` to the op CSV found beside the dump
    (see :func:`find_op_csv`), which gives tensor element types and shapes. An ONNX model (or
    an empty file) already at the output is replaced with a warning; anything else there is
    kept and a :class:`UsageError` names what it holds (:func:`~llmcheck.core.dumps.kept_files.check_replaceable`).
    """
    json_path = Path(atb_json_path)
    if model_level < -1:
        raise UsageError(f"invalid level {model_level}", where="--level", hint="use -1 (all leaves), 0 or more")
    root = read_topology(json_path)
    csv_path = Path(op_csv_path) if op_csv_path is not None else find_op_csv(json_path)
    described = _tensor_types(root, csv_path)
    title = f"ATB topology {json_path.name}, level {model_level}" + (
        f", tensor types from {csv_path.name}" if csv_path else ""
    )
    try:
        model = build_onnx_model(root, model_level, described, title)
    except Exception as exc:  # onnx.checker rejected what we built: a bug, reported with the file
        raise LlmcheckError(
            f"the ONNX graph built from this topology is invalid: {exc}",
            where=json_path,
            hint="please report it with the JSON file",
        ) from exc
    target = Path(output_path) if output_path is not None else json_path.with_suffix(".onnx")
    if target.exists():
        held = check_replaceable(target, (ONNX_MODEL, EMPTY_FILE), "the ONNX file")
        log.warning("%s: replacing %s", target, "the previous ONNX model" if held == ONNX_MODEL else "an empty file")
    with atomic_output(target, "wb") as handle:
        handle.write(model.SerializeToString())
    log.debug("wrote %s (%d nodes)", target, len(model.graph.node))
    return target
