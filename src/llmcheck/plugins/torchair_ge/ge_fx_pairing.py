"""Graph-mode pairings: GE ops to FX nodes, and fused GE ops to the unfused GE run.

Both work on the nouns only: GE records (source ``"ge"``) carry ``attrs["ge_op_name"]`` and
``attrs["graph_index"]``, the GE graphs come from ``Dump.topology``; FX records (source
``"fx"``, or an llmcheck dump whose manifest names the backend ``"fx"``) carry ``attrs["fx_node"]`` and ``attrs["graph_index"]`` with positions ``"i"`` or
``"i.j"``.

* **GE <-> FX**: each output of a GE op names its FX tensor (``_fx_tensor_name`` =
  ``"{node}-{target}.OUTPUT.{k}"``); every output is paired (the tool this replaces kept
  only the last). Inputs pair with the FX node's inputs by position, falling back to the
  first unused input of the same shape. A fused op (``AutomaticBufferFusionOp``, named by
  concatenating its ops) is split by longest-prefix match against the graph: its inputs
  pair with the external inputs of its ops (the first op's, then any later op's inputs
  from outside the group), its outputs with the last op's outputs.
* **GE fused <-> GE unfused**: same op name pairs input by input and output by output; a
  fused op is expanded through the graph and pairs with the golden inputs of its ops that
  come from outside the group and the golden outputs of its last op.

Every record left without a counterpart gets a pair with one side empty and a note saying
why (a ``Cast``/``TransData`` inserted by the compiler, an FX node inside a fused op, ...).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from llmcheck.plugin_api import (
    IO_INPUT,
    IO_OUTPUT,
    NATIVE_SOURCE,
    CallId,
    Dump,
    OpCall,
    Pair,
    PairPriority,
    TensorRecord,
    TopologyNode,
    group_op_calls,
)
from llmcheck.plugins.torchair_ge import SOURCE_NAME
from llmcheck.plugins.torchair_ge.ge_graph_text import GeGraph, GeGraphOp, dumped_op_name

#: The torchair_fx plugin's source name (and the backend named in its llmcheck dumps' manifest): the dumps
#: this plugin pairs GE ops with.
FX_SOURCE = "fx"
COMPILER_INSERTED_TYPES = ("Cast", "TransData")

RULE_FX_NAME = "ge-fx:fx_tensor_name"
RULE_FX_FUSED_INPUTS = "ge-fx:fused-inputs"
RULE_FX_FUSED_OUTPUTS = "ge-fx:fused-last-outputs"
RULE_FX_UNMATCHED = "ge-fx:no-counterpart"
RULE_GE_NAME = "ge-ge:op-name"
RULE_GE_FUSED_INPUTS = "ge-ge:fused-inputs"
RULE_GE_FUSED_OUTPUTS = "ge-ge:fused-last-outputs"
RULE_GE_UNMATCHED = "ge-ge:no-counterpart"


def _ge_call(record: TensorRecord) -> CallId:
    """Return the GE op call a record belongs to: its op name within its graph, per step and call."""
    op_name = str(record.attrs.get("ge_op_name", record.key.name))
    return CallId(record.key.step, int(record.attrs.get("graph_index", 0)), op_name, record.key.call_index)


def ge_op_calls(dump: Dump) -> list[OpCall]:
    """Return the GE op calls of a GE dump, in record order."""
    return group_op_calls(dump.records, _ge_call)


def graphs_from_topology(topology: TopologyNode | None) -> dict[int, GeGraph]:
    """Return the GE graphs a GE dump's topology holds, by graph index."""
    graphs: dict[int, GeGraph] = {}
    for graph_node in topology.children if topology is not None else ():
        ops = tuple(
            GeGraphOp(
                name=op.name,
                op_type=op.op_type,
                inputs=op.inputs,
                fx_tensor_names=tuple(name or None for name in op.attrs.get("fx_tensor_names", ())),
                position=int(op.attrs.get("position", index)),
            )
            for index, op in enumerate(graph_node.children)
        )
        graphs[int(graph_node.attrs.get("graph_index", len(graphs)))] = GeGraph(graph_node.name, None, ops)
    return graphs


def fx_output_ref(fx_tensor_name: str) -> tuple[str, str] | None:
    """Return ``(fx node, output position)`` named by ``"{node}-{target}.OUTPUT.{k}"``, or ``None``."""
    head, separator, index = fx_tensor_name.rpartition(".OUTPUT.")
    if not separator or not index.isdigit():
        return None
    return head.split("-", 1)[0], index


def align_tensors(
    candidates: Sequence[TensorRecord | None], targets: Sequence[TensorRecord]
) -> list[tuple[TensorRecord | None, TensorRecord, str]]:
    """Return each target with the candidate it pairs with, and how they were matched.

    In order of preference: the candidate at the same position with the same shape
    (``"position"``); the first unused candidate with the same shape (``"shape"``: an FX
    argument list also holds non-tensor arguments GE has no input for); the candidate at the
    same position with as many elements (``"position"``: a reshaped view); else none (``""``).
    """
    used: set[int] = set()
    aligned: list[tuple[TensorRecord | None, TensorRecord, str]] = []
    for index, target in enumerate(targets):
        choice: int | None
        at_position = candidates[index] if index < len(candidates) and index not in used else None
        if at_position is not None and tuple(at_position.shape) == tuple(target.shape):
            choice, how = index, "position"
        else:
            choice = next(
                (
                    j
                    for j, other in enumerate(candidates)
                    if j not in used and other is not None and tuple(other.shape) == tuple(target.shape)
                ),
                None,
            )
            how = "shape"
            if choice is None and at_position is not None and math.prod(at_position.shape) == math.prod(target.shape):
                choice, how = index, "position"
        if choice is None:
            aligned.append((None, target, ""))
        else:
            used.add(choice)
            aligned.append((candidates[choice], target, how))
    return aligned


def _best_partner(names: set[str], partner_names: dict[int, set[str]], fallback: int) -> int:
    """Return the partner graph index sharing most names with ``names`` (``fallback`` when none shares any)."""
    scored = [(len(names & other), -abs(index - fallback), index) for index, other in partner_names.items()]
    best = max(scored, default=(0, 0, fallback))
    return best[2] if best[0] else fallback


class _PairList:
    """Collects pairs in golden/my orientation, whichever side the GE records are on."""

    def __init__(self, subject_is_my: bool) -> None:
        self.subject_is_my = subject_is_my
        self.pairs: list[Pair] = []
        self.paired_partners: set[int] = set()

    def add(
        self,
        subject: TensorRecord | None,
        partner: TensorRecord | None,
        rule: str,
        note: str = "",
        expected: bool = False,
    ) -> None:
        """Add a pair, or a lone record (``expected``: it has no counterpart by nature, e.g. a compiler-made op)."""
        golden, my = (partner, subject) if self.subject_is_my else (subject, partner)
        self.pairs.append(
            Pair(golden=golden, my=my, rule=rule, priority=PairPriority.SOURCE_RULE, note=note, expected=expected)
        )
        if partner is not None:
            self.paired_partners.add(id(partner))


# --- GE <-> FX ----------------------------------------------------------------------------


def _fx_call(record: TensorRecord) -> CallId:
    """Return the FX node call a record belongs to: its node within its graph, per step."""
    node = str(record.attrs.get("fx_node", record.key.name))
    return CallId(record.key.step, int(record.attrs.get("graph_index", 0)), node, 0)


def _fx_index(fx: Dump) -> dict[tuple[int, int, str], OpCall]:
    return {(call.step, call.graph, call.name): call for call in group_op_calls(fx.records, _fx_call)}


_NO_CALL = OpCall("", "")


def _fx_node_of(op: GeGraphOp) -> str | None:
    for fx_name in op.fx_tensor_names:
        ref = fx_output_ref(fx_name) if fx_name else None
        if ref is not None:
            return ref[0]
    return None


def _unmatched_ge_note(call: OpCall, graph: GeGraph | None, constituents: list[GeGraphOp]) -> tuple[str, bool]:
    """Return why a GE op has no FX counterpart, and whether that is its nature (expected) rather than a gap."""
    if graph is None:
        return "no dynamo_original_graph_*.txt beside the GE dump, so GE ops cannot be mapped to FX nodes", False
    if any(kind in call.op_type for kind in COMPILER_INSERTED_TYPES) and not constituents:
        return f"{call.op_type} op inserted by the graph compiler, no FX counterpart", True
    if not constituents:
        return "GE op not in the GE graph (added by GE optimisation), no FX counterpart", True
    return "GE op has no _fx_tensor_name (created inside the conversion of an FX node), no FX counterpart", True


def pair_ge_with_fx(ge: Dump, fx: Dump, ge_is_my: bool) -> list[Pair]:
    """Return the GE <-> FX pairs (every GE and FX record appears once, paired or with a note)."""
    graphs = graphs_from_topology(ge.topology)
    fx_nodes = _fx_index(fx)
    fx_names_by_graph: dict[int, set[str]] = defaultdict(set)
    for _, graph_index, node in fx_nodes:
        fx_names_by_graph[graph_index].add(node)
    fx_graph_of = {
        index: _best_partner(
            {ref[0] for op in graph.ops for name in op.fx_tensor_names if name and (ref := fx_output_ref(name))},
            fx_names_by_graph,
            index,
        )
        for index, graph in graphs.items()
    }
    collected = _PairList(subject_is_my=ge_is_my)
    fused_inside: dict[tuple[int, int, str], str] = {}
    for call in ge_op_calls(ge):
        graph = graphs.get(call.graph)
        constituents = graph.constituents(call.name) if graph is not None else []
        fx_graph = fx_graph_of.get(call.graph, call.graph)
        named = [op for op in constituents if _fx_node_of(op) is not None]
        if not named:
            note, expected = _unmatched_ge_note(call, graph, constituents)
            for record in call.records():
                collected.add(record, None, RULE_FX_UNMATCHED, note, expected)
            continue
        fused = len(constituents) > 1
        first, last = named[0], named[-1]
        candidates: list[TensorRecord | None] = []
        if fused:
            inside = {op.name for op in constituents}
            for op in named:
                fused_inside[(call.step, fx_graph, _fx_node_of(op) or "")] = call.name
            for op in named:
                node_records = fx_nodes.get((call.step, fx_graph, _fx_node_of(op) or ""), _NO_CALL)
                fx_inputs = node_records.ordered(IO_INPUT)
                for index, source in enumerate(op.input_sources()):
                    if source not in inside:
                        candidates.append(fx_inputs[index] if index < len(fx_inputs) else None)
            input_rule, note = RULE_FX_FUSED_INPUTS, f"fused op of {' + '.join(op.name for op in constituents)}"
        else:
            node_records = fx_nodes.get((call.step, fx_graph, _fx_node_of(first) or ""), _NO_CALL)
            candidates.extend(node_records.ordered(IO_INPUT))
            input_rule, note = RULE_FX_NAME, ""
        for fx_record, ge_record, how in align_tensors(candidates, call.ordered(IO_INPUT)):
            if fx_record is None:
                collected.add(ge_record, None, RULE_FX_UNMATCHED, "no FX input of matching size at this position")
            else:
                collected.add(
                    ge_record,
                    fx_record,
                    input_rule,
                    "; ".join(filter(None, [note, "paired by shape" if how == "shape" else ""])),
                )
        output_rule = RULE_FX_FUSED_OUTPUTS if fused else RULE_FX_NAME
        for position_text, ge_record in call.outputs.items():
            position = int(position_text)  # GE numbers each output of an op
            fx_name = last.fx_tensor_names[position] if position < len(last.fx_tensor_names) else None
            ref = fx_output_ref(fx_name) if fx_name else None
            fx_record = fx_nodes.get((call.step, fx_graph, ref[0]), _NO_CALL).outputs.get(ref[1]) if ref else None
            if fx_record is None:
                why = (
                    f"FX tensor {fx_name} is not in the FX dump (step {call.step})"
                    if ref
                    else f"output {position} has no _fx_tensor_name in the GE graph"
                )
                collected.add(ge_record, None, RULE_FX_UNMATCHED, why, expected=ref is None)
            else:
                collected.add(ge_record, fx_record, output_rule, note)
    for (step, graph_index, node), node_records in fx_nodes.items():
        records = node_records.records()
        fused_op = fused_inside.get((step, graph_index, node))
        expected = True
        if fused_op is not None:
            why = f"inside fused GE op {fused_op}"
        elif any(id(record) in collected.paired_partners for record in records):
            why = "FX argument with no GE input (a non-tensor argument, or one GE folded into a constant)"
        elif not node_records.outputs:
            why = "FX node with no output tensor (a check such as _assert_tensor_metadata), no GE op computes it"
        else:
            why, expected = "no GE op dumped for this FX node (or its GE op lost its _fx_tensor_name)", False
        for record in records:
            if id(record) not in collected.paired_partners:
                collected.add(None, record, RULE_FX_UNMATCHED, why, expected)
    return collected.pairs


# --- GE fused <-> GE unfused ------------------------------------------------------------------


def pair_fused_with_unfused(golden: Dump, my: Dump) -> list[Pair]:
    """Return the pairs of a fused GE run (my) against an unfused one (golden), expanding fused ops."""
    graphs = graphs_from_topology(golden.topology) or graphs_from_topology(my.topology)
    golden_calls = {c.call_id: c for c in ge_op_calls(golden)}
    golden_names: dict[int, set[str]] = defaultdict(set)
    for _, graph_index, op_name, _ in golden_calls:
        golden_names[graph_index].add(op_name)
    my_calls = ge_op_calls(my)
    my_names: dict[int, set[str]] = defaultdict(set)
    for call in my_calls:
        my_names[call.graph].add(call.name)
    golden_graph_of = {index: _best_partner(names, golden_names, index) for index, names in my_names.items()}
    collected = _PairList(subject_is_my=True)
    fused_inside: dict[tuple[int, int, str, int], str] = {}
    for call in my_calls:
        golden_graph = golden_graph_of[call.graph]
        same = golden_calls.get(CallId(call.step, golden_graph, call.name, call.call_index))
        if same is not None:
            for io in (IO_INPUT, IO_OUTPUT):
                for golden_record, my_record, how in align_tensors(same.ordered(io), call.ordered(io)):
                    collected.add(
                        my_record,
                        golden_record,
                        RULE_GE_NAME if golden_record else RULE_GE_UNMATCHED,
                        ""
                        if how == "position"
                        else "paired by shape"
                        if how
                        else "no golden tensor of matching size at this position",
                    )
            continue
        graph = graphs.get(golden_graph) or graphs.get(call.graph)
        constituents = graph.constituents(call.name) if graph is not None else []
        parts = [
            golden_calls.get(CallId(call.step, golden_graph, dumped_op_name(op.name), call.call_index))
            for op in constituents
        ]
        if len(constituents) < 2 or parts[-1] is None:
            why = (
                "no golden GE op of this name"
                if graph is not None
                else "no golden GE op of this name, and no GE graph to expand fused ops"
            )
            for record in call.records():
                collected.add(record, None, RULE_GE_UNMATCHED, why)
            continue
        inside = {op.name for op in constituents}
        note = f"fused op of {' + '.join(op.name for op in constituents)}"
        candidates: list[TensorRecord | None] = []
        for op, part in zip(constituents, parts):
            part_inputs = part.ordered(IO_INPUT) if part is not None else []
            for index, source in enumerate(op.input_sources()):
                if source not in inside:
                    candidates.append(part_inputs[index] if index < len(part_inputs) else None)
            if part is not None:
                fused_inside[(call.step, golden_graph, part.name, call.call_index)] = call.name
        for golden_record, my_record, _ in align_tensors(candidates, call.ordered(IO_INPUT)):
            collected.add(
                my_record,
                golden_record,
                RULE_GE_FUSED_INPUTS if golden_record else RULE_GE_UNMATCHED,
                note if golden_record else "no golden input of matching size at this position",
            )
        last_part = parts[-1]
        for golden_record, my_record, _ in align_tensors(last_part.ordered(IO_OUTPUT), call.ordered(IO_OUTPUT)):
            collected.add(
                my_record,
                golden_record,
                RULE_GE_FUSED_OUTPUTS if golden_record else RULE_GE_UNMATCHED,
                note if golden_record else "no golden output of matching size at this position",
            )
    for key, golden_call in golden_calls.items():
        inside_of = fused_inside.get(key)
        why = f"inside fused GE op {inside_of} of the my run" if inside_of else "no op of this name in the my run"
        for record in golden_call.records():
            if id(record) not in collected.paired_partners:
                collected.add(None, record, RULE_GE_UNMATCHED, why, expected=inside_of is not None)
    return collected.pairs


def is_fx_dump(dump: Dump) -> bool:
    """Return whether a dump holds FX node records: torchair's ``.npy`` layout, or an llmcheck dump of the FX backend."""
    return dump.source == FX_SOURCE or (dump.source == NATIVE_SOURCE and dump.manifest.get("backend") == FX_SOURCE)


def map_graph_pairs(golden: Dump, my: Dump) -> list[Pair] | None:
    """Return the graph-mode pairs for these two dumps, or ``None`` when neither side is a GE dump."""
    if my.source == SOURCE_NAME and is_fx_dump(golden):
        return pair_ge_with_fx(ge=my, fx=golden, ge_is_my=True)
    if golden.source == SOURCE_NAME and is_fx_dump(my):
        return pair_ge_with_fx(ge=golden, fx=my, ge_is_my=False)
    if golden.source == SOURCE_NAME and my.source == SOURCE_NAME:
        return pair_fused_with_unfused(golden, my)
    return None
