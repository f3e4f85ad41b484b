"""A dump's records grouped into operator calls -- opcheck's cases -- and the seed's filters on them.

One case is one call of one op: the records sharing a name, step and call index (an ATB
op id in one execute count; a torch op in one module, step and call). Its inputs are the
input records as they were *before* the call (ops that write into their inputs must be
recomputed from the values they read), falling back to the after-state when only that was
dumped; its outputs are the output records after the call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from llmcheck.core.records import IO_INPUT, IO_OUTPUT, MOMENT_AFTER, MOMENT_BEFORE, TensorRecord

#: How deep below an id given to ``-ids`` a child op may be and still be selected (the seed's limit).
MAX_ID_DEPTH = 20


@dataclass(frozen=True)
class OpCase:
    """One operator call of a dump: its identity, parameters and tensor records by position.

    ``params`` is what the source recorded about the call (``attrs["op_param"]`` when the
    source keeps one, else the record's attrs). ``inputs_after`` holds the inputs' state
    after the call, used for ops that write their result into an input.
    """

    op_id: str
    op_type: str
    step: int
    call_index: int
    order: int
    params: Mapping[str, Any]
    inputs: Mapping[str, TensorRecord]
    outputs: Mapping[str, TensorRecord]
    inputs_after: Mapping[str, TensorRecord] = field(default_factory=dict)

    def label(self) -> str:
        """Return a short label: ``3_1 LinearOperation`` plus step and call when not zero."""
        extra = "".join(part for part in (f" step {self.step}" if self.step else "",
                                          f" call {self.call_index}" if self.call_index else ""))
        return f"{self.op_id} {self.op_type}{extra}"


def position_order(position: str) -> tuple[Any, ...]:
    """Return a sort key ordering positions part by part, numbers numerically (``"2"`` before ``"10"``)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in position.split("."))


def _params_of(records: Iterable[TensorRecord]) -> Mapping[str, Any]:
    for record in records:
        if record.attrs:
            param = record.attrs.get("op_param")
            return param if isinstance(param, Mapping) else dict(record.attrs)
    return {}


def group_op_cases(records: Sequence[TensorRecord]) -> list[OpCase]:
    """Return the op calls the records describe, in the execution order of their first record.

    Records without an ``op_type`` belong to no op and are left out.
    """
    groups: dict[tuple[str, int, int], list[TensorRecord]] = {}
    for record in records:
        if record.op_type is None:
            continue
        groups.setdefault((record.key.name, record.key.step, record.key.call_index), []).append(record)
    cases = []
    for (name, step, call_index), members in groups.items():
        before: dict[str, TensorRecord] = {}
        after_inputs: dict[str, TensorRecord] = {}
        outputs: dict[str, TensorRecord] = {}
        for record in members:
            position = record.key.position
            if record.key.io == IO_INPUT:
                (before if record.key.moment == MOMENT_BEFORE else after_inputs)[position] = record
            elif record.key.io == IO_OUTPUT and record.key.moment == MOMENT_AFTER:
                outputs[position] = record  # an output saved before the call holds stale memory
        inputs = {**after_inputs, **before}  # the state before the call wins
        cases.append(OpCase(
            op_id=name, op_type=str(members[0].op_type), step=step, call_index=call_index,
            order=min(record.order for record in members), params=_params_of(members),
            inputs=dict(sorted(inputs.items(), key=lambda item: position_order(item[0]))),
            outputs=dict(sorted(outputs.items(), key=lambda item: position_order(item[0]))),
            inputs_after=dict(sorted(after_inputs.items(), key=lambda item: position_order(item[0]))),
        ))
    return sorted(cases, key=lambda case: case.order)


def select_op_cases(cases: Sequence[OpCase], operation_ids: Sequence[str],
                    operation_names: Sequence[str]) -> list[OpCase]:
    """Return the cases the seed's ``-ids`` and ``-opname`` filters keep (both must match; empty keeps all).

    An id keeps that op and the ops below it (``24_1`` keeps ``24_1`` and ``24_1_3``); a
    name keeps ops whose type contains it, ignoring case and ATB's ``Operation`` suffix
    (``self`` keeps ``SelfAttentionOperation``; ``rope`` keeps ``RopeOperation`` but not
    ``LinearOperation``, whose full name happens to contain it).
    """
    id_patterns = [re.compile(rf"^{re.escape(op_id)}(_[0-9]+){{0,{MAX_ID_DEPTH}}}$") for op_id in operation_ids]
    names = [name.lower() for name in operation_names]
    return [case for case in cases
            if (not id_patterns or any(pattern.match(case.op_id) for pattern in id_patterns))
            and (not names or any(name in _type_words(case.op_type) for name in names))]


def _type_words(op_type: str) -> str:
    lowered = op_type.lower()
    return lowered.removesuffix("operation") or lowered
