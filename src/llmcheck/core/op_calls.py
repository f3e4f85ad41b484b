"""A dump's records grouped into operator calls: the one definition of "the records of one op call".

Opcheck recomputes each call, the ATB pairing matches calls of two trees, the graph-mode
pairings match GE op calls with FX node calls: all of them need the records that share one
call, sorted by tensor position. A call is identified by its :class:`CallId` (step, graph,
name, call index); the default reads it from the record key, and a source whose call name
lives elsewhere (a GE op name in ``attrs``) passes its own ``call_of``.

Inputs are kept as they were *before* the call (ops that write into their inputs must be
recomputed from the values they read), falling back to the after-state when only that was
dumped; outputs as they are *after* it (an output saved before the call holds stale memory,
kept apart in ``outputs_before``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from llmcheck.core.records import IO_INPUT, MOMENT_BEFORE, TensorRecord


class CallId(NamedTuple):
    """What makes records belong to one call: step, graph (0 in eager mode), call name and call index."""

    step: int
    graph: int
    name: str
    call_index: int

    @classmethod
    def of(cls, record: TensorRecord) -> CallId:
        """Return the call a record belongs to by its key alone (eager dumps, ATB op ids)."""
        return cls(record.key.step, 0, record.key.name, record.key.call_index)


def position_order(position: str) -> tuple[Any, ...]:
    """Return a sort key ordering positions part by part, numbers numerically (``"2"`` before ``"10"``)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in position.split("."))


def _by_position(records: Mapping[str, TensorRecord]) -> dict[str, TensorRecord]:
    return dict(sorted(records.items(), key=lambda item: position_order(item[0])))


@dataclass
class OpCall:
    """The records of one call of one op or module: identity, parameters, tensors by position.

    ``name`` is the op id, module path or graph node name; ``graph`` tells the graphs of a
    graph-mode run apart (0 otherwise); ``order`` is the execution order of the call's first
    record. ``params`` is what the source recorded about the call (``attrs["op_param"]``
    when the source keeps one, else the first record's attrs). ``inputs`` hold the state
    before the call (after-state where only that was dumped), ``inputs_after`` the state
    after it (the result of an op that writes into an input), ``outputs`` the state after
    the call and ``outputs_before`` outputs saved only before it. ``has_children`` is set by
    code that knows the call tree (a module or op graph that runs other calls).
    """

    name: str
    op_type: str
    step: int = 0
    call_index: int = 0
    graph: int = 0
    order: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: dict[str, TensorRecord] = field(default_factory=dict)
    outputs: dict[str, TensorRecord] = field(default_factory=dict)
    inputs_after: dict[str, TensorRecord] = field(default_factory=dict)
    outputs_before: dict[str, TensorRecord] = field(default_factory=dict)
    has_children: bool = False

    @property
    def call_id(self) -> CallId:
        """Return the identity the records of this call share."""
        return CallId(self.step, self.graph, self.name, self.call_index)

    def ordered(self, io: str) -> list[TensorRecord]:
        """Return the inputs or the outputs in position order."""
        return list((self.inputs if io == IO_INPUT else self.outputs).values())

    def records(self) -> list[TensorRecord]:
        """Return every record of the call once, inputs first (before-states, then after-states)."""
        seen: dict[int, TensorRecord] = {}
        for side in (self.inputs, self.inputs_after, self.outputs_before, self.outputs):
            for record in side.values():
                seen.setdefault(id(record), record)
        return list(seen.values())

    def label(self) -> str:
        """Return a short label: ``3_1 LinearOperation`` plus step and call when not zero."""
        extra = "".join(
            part
            for part in (
                f" step {self.step}" if self.step else "",
                f" call {self.call_index}" if self.call_index else "",
            )
        )
        return f"{self.name} {self.op_type}{extra}"


def _params_of(records: Iterable[TensorRecord]) -> Mapping[str, Any]:
    for record in records:
        if record.attrs:
            param = record.attrs.get("op_param")
            return param if isinstance(param, Mapping) else dict(record.attrs)
    return {}


def group_op_calls(
    records: Sequence[TensorRecord], call_of: Callable[[TensorRecord], CallId] = CallId.of
) -> list[OpCall]:
    """Return the op calls the records describe, in the execution order of their first record.

    ``call_of`` names the call a record belongs to (default: :meth:`CallId.of`, by key).
    The call's ``op_type`` is its first record's (``""`` when the source recorded none).
    """
    groups: dict[CallId, list[TensorRecord]] = {}
    for record in records:
        groups.setdefault(call_of(record), []).append(record)
    calls = []
    for call_id, members in groups.items():
        before: dict[str, TensorRecord] = {}
        inputs_after: dict[str, TensorRecord] = {}
        outputs: dict[str, TensorRecord] = {}
        outputs_before: dict[str, TensorRecord] = {}
        for record in members:
            position = record.key.position
            if record.key.io == IO_INPUT:
                (before if record.key.moment == MOMENT_BEFORE else inputs_after)[position] = record
            else:
                (outputs_before if record.key.moment == MOMENT_BEFORE else outputs)[position] = record
        calls.append(
            OpCall(
                name=call_id.name,
                op_type=members[0].op_type or "",
                step=call_id.step,
                call_index=call_id.call_index,
                graph=call_id.graph,
                order=min(record.order for record in members),
                params=_params_of(members),
                inputs=_by_position({**inputs_after, **before}),  # the state before the call wins
                outputs=_by_position(outputs),
                inputs_after=_by_position(inputs_after),
                outputs_before=_by_position(outputs_before),
            )
        )
    return sorted(calls, key=lambda call: call.order)
