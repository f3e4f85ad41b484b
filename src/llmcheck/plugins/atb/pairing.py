"""Pairing an ATB dump with a PyTorch dump of the same model, or with another ATB dump.

**ATB <-> torch.** The two runs have different trees (ATB op graphs vs ``nn.Module``s), so
pairs are made structurally, never by model name:

1. *Decoder layers*, found on each side as the largest group of same-type siblings that
   have children (``LlamaDecoderLayer`` x N, ``Decoder_layer`` x N), are matched by order
   -- across steps too, so a prefill and a decode graph dumped under one execute count
   line up with the torch steps they ran.
2. *Inside a matched layer*, operations and modules of the same kind (the table
   :data:`KINDS`: RmsNorm <-> ``*RMSNorm``, Linear <-> ``Linear``, the attention graph <->
   ``*Attention``, the MLP graph <-> ``*MLP``, ...) are matched in order when both sides
   hold the same number of them (a fused QKV linear against three torch linears is left
   unpaired rather than mispaired).
3. *Outside the layers* (embedding, final norm, LM head) the same kinds are matched in
   order when both sides hold as many per forward.
4. The user's ``--mapping`` entries (golden pattern -> my pattern, matched against module
   or op type and name) add kinds of their own, checked before the table.

Outputs are paired position by position; leaf ops (linear, norms, activation) also pair
their first input, so the compare can tell an error introduced by the op from one it
inherited. **ATB <-> ATB** (float vs quantised, two versions): records pair by op id,
step and tensor when the op types agree (quantised types normalised to their float
twins); ops whose ids moved pair by type and order under already-paired parents.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from llmcheck.plugin_api import (
    ROOT_MODULE,
    CallId,
    Dump,
    OpCall,
    Pair,
    PairPriority,
    TensorRecord,
    UserMapping,
    group_op_calls,
    is_op_record_name,
    lies_inside,
    module_ancestors,
    module_parent,
)
from llmcheck.plugins.atb import SOURCE_NAME
from llmcheck.plugins.atb.op_names import op_id_key

log = logging.getLogger("llmcheck.atb")

#: Quantised ATB op types and the float op they stand for (the seed's table).
QUANT_TO_FLOAT = {
    "LinearQuantOperation": "LinearOperation",
    "LinearDequantOnly": "LinearNoQuant",
    "LinearRowParallelNoAdd": "LinearRowParallelAndAdd",
}
#: ATB ``ActivationType`` values whose output is not a plain activation (SwiGLU multiplies in the up projection).
_GATED_ACTIVATIONS = {6, 7}
#: Kinds whose first input is the activation flowing through (weights come after it on both sides).
_LEAF_INPUT_KINDS = {"rms_norm", "layer_norm", "linear", "activation"}


def _lower(text: str) -> str:
    return text.lower()


def _atb_activation_is_plain(node: OpCall) -> bool:
    try:
        return int(node.params.get("activationType", 0)) not in _GATED_ACTIVATIONS
    except (TypeError, ValueError):
        return True


#: kind -> (does this ATB op belong to it, does this torch module belong to it)
KINDS: dict[str, tuple[Callable[[OpCall], bool], Callable[[OpCall], bool]]] = {
    "embedding": (
        lambda n: "embedding" in _lower(n.op_type) and "rot" not in _lower(n.op_type),
        lambda n: _lower(n.op_type).endswith("embedding") and "rotary" not in _lower(n.op_type),
    ),
    "rms_norm": (
        lambda n: not n.has_children and "rmsnorm" in _lower(n.op_type),
        lambda n: _lower(n.op_type).endswith("rmsnorm"),
    ),
    "layer_norm": (
        lambda n: not n.has_children and "layernorm" in _lower(n.op_type) and "rms" not in _lower(n.op_type),
        lambda n: _lower(n.op_type).endswith("layernorm") and "rms" not in _lower(n.op_type),
    ),
    "linear": (
        lambda n: not n.has_children and "linear" in _lower(n.op_type),
        lambda n: n.op_type.endswith("Linear") or n.op_type == "Conv1D",
    ),
    "activation": (
        lambda n: not n.has_children and n.op_type == "ActivationOperation" and _atb_activation_is_plain(n),
        lambda n: (
            any(word in _lower(n.op_type) for word in ("silu", "gelu", "relu", "swish", "sigmoid"))
            or _lower(n.op_type).endswith("activation")
        ),
    ),
    # The attention *graph* (projections included) matches the torch attention module; the
    # core kernel (SelfAttention/PagedAttention, before the output projection) only a core module.
    "attention": (
        lambda n: n.has_children and ("attention" in _lower(n.op_type) or "attn" in _lower(n.op_type)),
        lambda n: _lower(n.op_type).endswith("attention") and not _lower(n.op_type).endswith("coreattention"),
    ),
    "core_attention": (
        lambda n: not n.has_children and "attention" in _lower(n.op_type),
        lambda n: _lower(n.op_type).endswith("coreattention"),
    ),
    "mlp": (lambda n: n.has_children and "mlp" in _lower(n.op_type), lambda n: _lower(n.op_type).endswith("mlp")),
}


# --- building the two trees -------------------------------------------------------------


def _atb_call(record: TensorRecord) -> CallId:
    """Return the ATB op call a record belongs to: an op id runs once per execute count (step)."""
    return CallId(record.key.step, 0, record.key.name, 0)


def _atb_calls(dump: Dump) -> dict[tuple[int, str], OpCall]:
    """Return the ATB op calls by (step, op id), ancestors the dump filtered out included, graph ops marked."""
    calls = {(call.step, call.name): call for call in group_op_calls(dump.records, _atb_call)}
    for record in dump.records:  # ancestors not dumped themselves (filtered by -ids) still shape the tree
        ids: list[str] = []
        for part in str(record.attrs.get("op_path", "")).split("/")[:-1]:
            index, _, op_type = part.partition("_")
            ids.append(index)
            name = "_".join(ids)
            calls.setdefault((record.key.step, name), OpCall(name, op_type, step=record.key.step, order=record.order))
    for step, name in list(calls):
        parent = _atb_parent(name)
        if parent and (step, parent) in calls:
            calls[(step, parent)].has_children = True
    return calls


def _torch_calls(dump: Dump) -> list[OpCall]:
    """Return the module calls of a module-tree dump (op-level records left out), containers marked."""
    modules = [
        record for record in dump.records if record.op_type is not None and not is_op_record_name(record.key.name)
    ]
    calls = group_op_calls(modules)
    containers = {(call.step, ancestor) for call in calls for ancestor in module_ancestors(call.name)}
    for call in calls:
        call.has_children = (call.step, call.name) in containers
    return calls


def _atb_parent(name: str) -> str:
    return name.rpartition("_")[0]


def _torch_parent(name: str) -> str:
    return module_parent(name) or ""


def _find_layers(nodes: Iterable[OpCall], parent_of: Callable[[str], str]) -> list[OpCall]:
    """Return the decoder layers: the largest groups of same-type siblings with children, in run order."""
    groups: dict[tuple[int, str, str], list[OpCall]] = defaultdict(list)
    for node in nodes:
        if node.has_children:
            groups[(node.step, parent_of(node.name), node.op_type)].append(node)
    best_size = max((len(members) for members in groups.values()), default=0)
    if best_size < 2:
        return []
    chosen_types = {key[2] for key, members in groups.items() if len(members) == best_size}
    layers = [
        node for key, members in groups.items() if key[2] in chosen_types and len(members) >= 2 for node in members
    ]
    return sorted(layers, key=lambda node: (node.step, node.order))


def _within(name: str, container: str, separator: str) -> bool:
    return name.startswith(container + separator)


# --- pairing records of two matched nodes ------------------------------------------------


def _outputs(call: OpCall) -> dict[str, TensorRecord]:
    """Return a call's outputs after it ran, or as saved before it where the dump kept only that."""
    return call.outputs or call.outputs_before


def _record_pairs(golden: OpCall, my: OpCall, rule: str, priority: int, with_input: bool) -> list[Pair]:
    pairs = []
    golden_outputs, my_outputs = _outputs(golden), _outputs(my)
    common = [position for position in my_outputs if position in golden_outputs]
    if not common and len(golden_outputs) == 1 and len(my_outputs) == 1:
        common = [next(iter(my_outputs))]
        golden_outputs = {common[0]: next(iter(golden_outputs.values()))}
    for position in common:
        pairs.append(Pair(golden=golden_outputs[position], my=my_outputs[position], rule=rule, priority=priority))
    if with_input and "0" in golden.inputs and "0" in my.inputs:
        pairs.append(Pair(golden=golden.inputs["0"], my=my.inputs["0"], rule=rule + ", first input", priority=priority))
    return pairs


@dataclass(frozen=True)
class _Kinds:
    """Classifies nodes of both sides: the user's entries first, then :data:`KINDS`.

    ``entries`` are ``(ATB pattern, torch pattern)``, already turned to the ATB side's view.
    """

    entries: tuple[tuple[str, str], ...]

    @classmethod
    def from_mapping(cls, user_mapping: UserMapping | None, atb_is_golden: bool) -> _Kinds:
        entries = tuple(user_mapping.entries) if user_mapping is not None else ()
        return cls(tuple((golden, my) if atb_is_golden else (my, golden) for golden, my in entries))

    def atb_kind(self, node: OpCall) -> str | None:
        for index, (atb_pattern, _) in enumerate(self.entries):
            if any(fnmatchcase(text, atb_pattern) for text in (node.op_type, f"{node.op_type}_{node.name}", node.name)):
                return f"user:{index}"
        return next((kind for kind, (is_atb, _) in KINDS.items() if is_atb(node)), None)

    def torch_kind(self, node: OpCall) -> str | None:
        for index, (_, torch_pattern) in enumerate(self.entries):
            if any(fnmatchcase(text, torch_pattern) for text in (node.op_type, node.name)):
                return f"user:{index}"
        return next((kind for kind, (_, is_torch) in KINDS.items() if is_torch(node)), None)

    def describe(self, kind: str) -> str:
        if kind.startswith("user:"):
            atb_pattern, torch_pattern = self.entries[int(kind[5:])]
            return f"user mapping {torch_pattern!r} <-> {atb_pattern!r}"
        return f"same kind ({kind})"


def _by_kind(nodes: list[OpCall], classify: Callable[[OpCall], str | None]) -> dict[str, list[OpCall]]:
    grouped: dict[str, list[OpCall]] = defaultdict(list)
    for node in nodes:
        kind = classify(node)
        if kind is not None:
            grouped[kind].append(node)
    return grouped


def _atb_torch_pairs(atb: Dump, torch_dump: Dump, atb_is_golden: bool, user_mapping: UserMapping | None) -> list[Pair]:
    atb_nodes = sorted(_atb_calls(atb).values(), key=lambda n: (n.step, op_id_key(n.name)))
    torch_nodes = sorted(_torch_calls(torch_dump), key=lambda n: (n.step, n.order))
    kinds = _Kinds.from_mapping(user_mapping, atb_is_golden)
    atb_layers = _find_layers(atb_nodes, _atb_parent)
    torch_layers = _find_layers(torch_nodes, _torch_parent)
    pairs: list[Pair] = []

    def add(atb_node: OpCall, torch_node: OpCall, rule: str, priority: int, with_input: bool = False) -> None:
        golden, my = (atb_node, torch_node) if atb_is_golden else (torch_node, atb_node)
        pairs.extend(_record_pairs(golden, my, "atb-torch: " + rule, priority, with_input))

    def match_kinds(
        atb_side: list[OpCall], torch_side: list[OpCall], where: str, density: tuple[int, int] | None
    ) -> None:
        atb_groups = _by_kind(atb_side, kinds.atb_kind)
        torch_groups = _by_kind(torch_side, kinds.torch_kind)
        for kind, atb_members in atb_groups.items():
            torch_members = torch_groups.get(kind, [])
            if not torch_members:
                continue
            if density is None:
                matched = len(atb_members) == len(torch_members)
            else:  # per-forward counts must agree; the common prefix of forwards is paired
                atb_forwards, torch_forwards = density
                matched = len(atb_members) * torch_forwards == len(torch_members) * atb_forwards
            if not matched:
                log.debug("%s: %d ATB %s vs %d torch, not paired", where, len(atb_members), kind, len(torch_members))
                continue
            priority = PairPriority.USER_KIND if kind.startswith("user:") else PairPriority.SOURCE_RULE
            for number, (atb_node, torch_node) in enumerate(zip(atb_members, torch_members)):
                add(
                    atb_node,
                    torch_node,
                    f"{kinds.describe(kind)} #{number} {where}",
                    priority,
                    with_input=kind in _LEAF_INPUT_KINDS,
                )

    for number, (atb_layer, torch_layer) in enumerate(zip(atb_layers, torch_layers)):
        add(atb_layer, torch_layer, f"decoder layer #{number} (layers matched in order)", PairPriority.SOURCE_RULE)
        atb_inside = [n for n in atb_nodes if n.step == atb_layer.step and _within(n.name, atb_layer.name, "_")]
        torch_inside = [
            n
            for n in torch_nodes
            if n.step == torch_layer.step
            and n.call_index == torch_layer.call_index
            and lies_inside(n.name, torch_layer.name)
        ]
        match_kinds(atb_inside, torch_inside, f"in layer #{number}", None)

    def outside(nodes: list[OpCall], layers: list[OpCall], separator: str) -> list[OpCall]:
        names = {(layer.step, layer.name) for layer in layers}
        found = []
        for node in nodes:
            same_step = [name for step, name in names if step == node.step]
            if (
                any(
                    node.name == name or _within(node.name, name, separator) or _within(name, node.name, separator)
                    for name in same_step
                )
                or node.name == ROOT_MODULE
            ):
                continue
            found.append(node)
        return found

    torch_steps = sorted({layer.step for layer in torch_layers})
    per_forward = sum(1 for layer in torch_layers if layer.step == torch_steps[0]) if torch_steps else 0
    if per_forward and len(atb_layers) % per_forward == 0 and atb_layers:
        density = (len(atb_layers) // per_forward, len(torch_steps))
        match_kinds(
            outside(atb_nodes, atb_layers, "_"), outside(torch_nodes, torch_layers, "."), "outside the layers", density
        )
    elif not atb_layers and not torch_layers:
        match_kinds(atb_nodes, [n for n in torch_nodes if n.name != ROOT_MODULE], "(no layers found)", None)
    return pairs


# --- ATB <-> ATB ----------------------------------------------------------------------------


def _float_type(op_type: str | None) -> str:
    return QUANT_TO_FLOAT.get(op_type or "", op_type or "")


def _atb_atb_pairs(golden: Dump, my: Dump) -> list[Pair]:
    if golden.is_tensor_files and my.is_tensor_files:
        return [
            Pair(
                golden=golden.records[0],
                my=my.records[0],
                rule="atb-atb: the two given .bin files",
                priority=PairPriority.SOURCE_RULE,
            )
        ]
    golden_by_key = {record.key: record for record in golden.records}
    pairs = []
    paired_ops: set[tuple[int, str, str]] = set()
    for record in my.records:
        match = golden_by_key.get(record.key)
        if match is not None and _float_type(match.op_type) == _float_type(record.op_type):
            pairs.append(
                Pair(
                    golden=match,
                    my=record,
                    rule="atb-atb: same op id, step, tensor and op type",
                    priority=PairPriority.SOURCE_RULE,
                )
            )
            paired_ops.add((record.key.step, match.key.name, record.key.name))
    pairs.extend(_atb_atb_by_structure(golden, my, paired_ops))
    return pairs


def _atb_atb_by_structure(golden: Dump, my: Dump, paired_ops: set[tuple[int, str, str]]) -> list[Pair]:
    """Pair ops whose ids differ (a graph changed) by type and order under parents already paired."""
    golden_nodes, my_nodes = _atb_calls(golden), _atb_calls(my)
    if not my_nodes:
        return []
    matched_names = {(step, my_name): golden_name for step, golden_name, my_name in paired_ops}
    pairs: list[Pair] = []

    def children(nodes: dict[tuple[int, str], OpCall], step: int, parent: str) -> list[OpCall]:
        return sorted(
            (node for (node_step, name), node in nodes.items() if node_step == step and _atb_parent(name) == parent),
            key=lambda n: op_id_key(n.name),
        )

    def descend(step: int, golden_parent: str, my_parent: str) -> None:
        golden_children, my_children = children(golden_nodes, step, golden_parent), children(my_nodes, step, my_parent)
        golden_by_type: dict[str, list[OpCall]] = defaultdict(list)
        my_by_type: dict[str, list[OpCall]] = defaultdict(list)
        for node in golden_children:
            golden_by_type[_float_type(node.op_type)].append(node)
        for node in my_children:
            my_by_type[_float_type(node.op_type)].append(node)
        for op_type, my_members in my_by_type.items():
            golden_members = golden_by_type.get(op_type, [])
            if len(golden_members) != len(my_members):
                continue
            for golden_node, my_node in zip(golden_members, my_members):
                if (step, my_node.name) not in matched_names:
                    for output in (True, False):
                        side_g = _outputs(golden_node) if output else golden_node.inputs
                        side_m = _outputs(my_node) if output else my_node.inputs
                        for position, my_record in side_m.items():
                            if position in side_g:
                                pairs.append(
                                    Pair(
                                        golden=side_g[position],
                                        my=my_record,
                                        rule=f"atb-atb: same op type {op_type} and order under a paired parent",
                                        priority=PairPriority.STRUCTURAL,
                                    )
                                )
                descend(step, golden_node.name, my_node.name)

    for step in sorted({step for step, _ in my_nodes}):
        descend(step, "", "")
    return pairs


# --- entry point ------------------------------------------------------------------------------


def _is_module_dump(dump: Dump) -> bool:
    """Return whether a non-ATB dump describes a module tree (records carry module class names)."""
    return dump.source != SOURCE_NAME and any(
        record.op_type and not is_op_record_name(record.key.name) for record in dump.records
    )


def map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair] | None:
    """Return the ATB pairs for these two dumps, or ``None`` when neither is an ATB dump."""
    golden_is_atb, my_is_atb = golden.source == SOURCE_NAME, my.source == SOURCE_NAME
    if golden_is_atb and my_is_atb:
        return _atb_atb_pairs(golden, my)
    if my_is_atb and _is_module_dump(golden):
        return _atb_torch_pairs(my, golden, atb_is_golden=False, user_mapping=user_mapping)
    if golden_is_atb and _is_module_dump(my):
        return _atb_torch_pairs(golden, my, atb_is_golden=True, user_mapping=user_mapping)
    return None
