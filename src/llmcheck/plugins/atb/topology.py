"""ATB topology JSON: layer graphs (``layer/{pid}/{opName}.json``) and model graphs (``model/{pid}/{model}.json``).

A layer JSON is one graph operation: ``opName`` (``Type_id``), ``opType``, ``param``,
``inTensors``/``outTensors``/``internalTensors`` (names, consistent across the whole file
so the flattened nodes form a dataflow graph) and ``nodes`` (children, recursively). A
model JSON has ``modelName`` in place of ``opName``/``opType`` and the layers as
``nodes``. Both become one :class:`AtbGraphNode` tree here; :func:`flatten_to_level` gives
the nodes at a depth (the seed's ``model_level``), :func:`to_topology_node` the
backend-neutral :class:`~llmcheck.core.records.TopologyNode`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import DumpFormatError, TopologyNode, parse_dump_json, read_dump_file
from llmcheck.plugins.atb.op_names import split_op_name

#: Deeper than this is a corrupt or cyclic file, not a real graph.
MAX_DEPTH = 1000


@dataclass(frozen=True, slots=True)
class AtbGraphNode:
    """One operation of an ATB topology: names, parameters, tensors it reads and writes, children."""

    op_name: str
    op_type: str
    op_id: str | None
    param: Mapping[str, Any]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    internals: tuple[str, ...] = ()
    children: tuple[AtbGraphNode, ...] = ()
    is_model: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def walk(self) -> list[AtbGraphNode]:
        """Return this node and all its descendants, depth first, in child order."""
        found = [self]
        for child in self.children:
            found.extend(child.walk())
        return found


def looks_like_topology(document: Any) -> bool:
    """Return whether a parsed JSON document has the shape of an ATB layer or model topology."""
    if not isinstance(document, dict):
        return False
    if "modelName" in document:
        return isinstance(document.get("nodes", []), list)
    return isinstance(document.get("opName"), str) and "opType" in document


def _names(path: Path, node: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = node.get(key, [])
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise DumpFormatError(f"{where}: {key} must be a list of tensor names", where=path)
    return tuple(value)


def _param(path: Path, node: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    value = node.get("param", {})
    if value in ("", None):
        return {}
    if isinstance(value, str):  # some ATB versions store the param JSON as a string
        try:
            value = json.loads(value)
        except ValueError:
            return {"param": value}
        except RecursionError:
            raise DumpFormatError(f"{where}: param is JSON nested too deep to read", where=path) from None
    if not isinstance(value, dict):
        raise DumpFormatError(f"{where}: param must be an object, got {type(value).__name__}", where=path)
    return value


def _node(path: Path, node: Any, depth: int) -> AtbGraphNode:
    if depth > MAX_DEPTH:
        raise DumpFormatError(f"nodes nest deeper than {MAX_DEPTH} levels", where=path)
    if not isinstance(node, dict):
        raise DumpFormatError(f"a node is a {type(node).__name__}, expected an object", where=path)
    is_model = "modelName" in node and "opName" not in node
    if is_model:
        op_name = node["modelName"]
        op_type = op_name
    else:
        op_name, op_type = node.get("opName"), node.get("opType", "")
    if not isinstance(op_name, str) or not op_name or not isinstance(op_type, str):
        raise DumpFormatError("a node has no string opName/opType", where=path)
    where = f"node {op_name}"
    children = node.get("nodes", [])
    if not isinstance(children, list):
        raise DumpFormatError(f"{where}: nodes must be a list", where=path)
    _, op_id = split_op_name(op_name)
    return AtbGraphNode(
        op_name=op_name,
        op_type=op_type or split_op_name(op_name)[0],
        op_id=None if is_model else op_id,
        param=_param(path, node, where),
        inputs=_names(path, node, "inTensors", where),
        outputs=_names(path, node, "outTensors", where),
        internals=_names(path, node, "internalTensors", where),
        children=tuple(_node(path, child, depth + 1) for child in children),
        is_model=is_model,
        extra={key: node[key] for key in ("weightTensors", "kCacheTensors", "vCacheTensors") if key in node},
    )


def parse_topology(document: Any, path: Path) -> AtbGraphNode:
    """Return the tree of an already-parsed topology document (``path`` names it in errors)."""
    if not looks_like_topology(document):
        raise DumpFormatError("not an ATB topology (no opName/opType or modelName)", where=path)
    return _node(Path(path), document, 0)


def read_topology(path: Path, dump_root: Path | None = None) -> AtbGraphNode:
    """Return the tree of an ATB layer or model topology JSON file (of the dump at ``dump_root``, or named alone)."""
    path = Path(path)
    try:
        document = parse_dump_json(read_dump_file(path, dump_root), path)
    except FileNotFoundError as exc:
        raise DumpFormatError("no such topology file", where=path, hint="check the path") from exc
    return parse_topology(document, path)


def flatten_to_level(root: AtbGraphNode, level: int) -> list[AtbGraphNode]:
    """Return the nodes a graph of depth ``level`` shows, in execution order.

    ``0`` (or a root without children) gives the root alone; ``-1`` every leaf; ``N``
    the nodes at depth ``N`` below the root, and the leaves that end above it.
    """
    if level < -1:
        raise ValueError(f"level must be -1 or more, got {level}")
    if level == 0 or not root.children:
        return [root]
    found: list[AtbGraphNode] = []

    def visit(node: AtbGraphNode, depth: int) -> None:
        if not node.children or (level != -1 and depth >= level):
            found.append(node)
            return
        for child in node.children:
            visit(child, depth + 1)

    for child in root.children:
        visit(child, 1)
    return found


def depth_of(root: AtbGraphNode) -> int:
    """Return the depth of the deepest leaf below ``root`` (0 for a root without children)."""
    if not root.children:
        return 0
    return 1 + max(depth_of(child) for child in root.children)


def to_topology_node(node: AtbGraphNode) -> TopologyNode:
    """Return the backend-neutral tree; a node is named by its op id (as records are) where it has one."""
    attrs: dict[str, Any] = {"op_name": node.op_name}
    if node.param:
        attrs["op_param"] = dict(node.param)
    return TopologyNode(
        name=node.op_id or node.op_name,
        op_type=node.op_type,
        children=tuple(to_topology_node(child) for child in node.children),
        inputs=node.inputs,
        outputs=node.outputs,
        attrs=attrs,
    )
