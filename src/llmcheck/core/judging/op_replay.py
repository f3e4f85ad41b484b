"""Replaying an op the judge would name: does the my-run's op compute what it was given?

At op level a row can fail the dtype table, or grow its error past its siblings', with no
defect of its own. Squaring doubles a relative error: SmolLM2's final norm, in bf16, takes
3.7 % into ``aten.pow`` and gives 11.7 %, past bf16's 10 %. A sum that nearly cancels makes
its parts' small errors large against it: layer 28's residual ``aten.add`` takes 0.9 % and
gives 3.0 %, 3.3x where its siblings grow at most 1.35x. The module-level rules bound such a
sum by its children; an op has no children, but it has a recorded call, and whether the op
itself is right is a question that call answers. Opcheck's reference replays it from the
my-run's own inputs in float64 and holds the my-run's outputs against that within the
output dtype's criterion: an op that passes computes what it is given, and its error came in
with its inputs.

A replay speaks for the kernel, not for what it was given: a wrong scalar argument (an
epsilon of 1e-2, a softmax scale x1.1) replays as faithfully as a right one. So a call
whose arguments differ from the golden call's is never cleared here, nor one the compare
cannot pair with a golden call; the judge also asks that each input was produced by a
recorded op or agrees with the golden's within rounding (a wrong weight is an input).

A statistics-only dump keeps no tensor to replay, but it keeps each tensor's min and max,
and both are elements of it. A pointwise op (its reference says so: PyTorch tags the ATen
ones) maps those two elements to two of its output's; where the output's recorded max (or
min) is what the reference gives from them, the op computed that extreme element from what
it was given. On statistics alone, that is the error that decides: the L2 norm of
``x ** 2`` holds the massive activations to the fourth power, so in SmolLM2's final norm a
bf16 run's 6 % error at the largest activation (4704 against 4427) is 12 % after squaring,
past bf16's 10 %, while the input's norm differs by 2 %. One element speaks for the kernel
less than a whole replay: only a call of one tensor input and one output, its arguments the
golden's, is replayed so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from llmcheck.core.op_calls import CallId, OpCall, group_op_calls
from llmcheck.core.records import OpReference, TensorRecord

log = logging.getLogger("llmcheck.compare")


class OpReplay:
    """Replays op calls of the my-run on demand, by their recorded inputs and arguments (a few calls a compare).

    The records are grouped into calls when the first row asks, and each call is replayed
    once: a compare of module outputs, whose op types no reference answers, never groups.
    """

    def __init__(
        self,
        golden: Iterable[TensorRecord],
        my: Iterable[TensorRecord],
        reference_of: Callable[[str], OpReference | None],
    ) -> None:
        self._sides = (golden, my)
        self._reference_of = reference_of
        self._calls: tuple[dict[CallId, list[TensorRecord]], dict[CallId, list[TensorRecord]]] | None = None
        self._answers: dict[CallId, str | None] = {}

    def computes_its_inputs(self, golden: TensorRecord, my: TensorRecord) -> str | None:
        """Return why ``my``'s op call computes its own inputs correctly (the evidence), or None where it does not or cannot tell.

        ``golden`` is the record paired with ``my``: its call's arguments must be the my call's.
        """
        if not my.op_type or (my.data is None and my.stats is None):
            return None
        reference = self._reference_of(my.op_type)
        if reference is None or (my.data is None and not reference.pointwise):
            return None
        call_id = CallId.of(my)
        if call_id not in self._answers:
            self._answers[call_id] = self._replay(reference, CallId.of(golden), call_id, on_statistics=my.data is None)
        return self._answers[call_id]

    def _replay(self, reference: OpReference, golden_id: CallId, my_id: CallId, on_statistics: bool) -> str | None:
        from llmcheck.core.opcheck.case_check import PASS, check_case

        if self._calls is None:
            self._calls = (_by_call(self._sides[0]), _by_call(self._sides[1]))
        golden_call, my_call = _call(self._calls[0].get(golden_id)), _call(self._calls[1].get(my_id))
        if golden_call is None or my_call is None or golden_call.op_type != my_call.op_type:
            return None
        if golden_call.params != my_call.params:
            return None  # a replay cannot judge arguments: they are the my-run's own
        if on_statistics:
            return _replay_extremes(my_call, reference)
        try:
            checked = check_case(my_call, reference)
        except Exception:  # no torch, a reference that breaks: the judge then decides without it
            log.debug("%s: no replay", my_call.label(), exc_info=True)
            return None
        if not checked or any(row.precision_result != PASS for row in checked):
            return None
        worst = max((row.max_rel_error or 0.0) for row in checked)
        return (
            f"replayed from the my-run's own inputs and arguments (the golden's), {my_call.op_type} gives its "
            f"outputs within {checked[0].precision_standard} (relative error {worst:.3g} at most): it computes "
            "what it is given"
        )


def _replay_extremes(call: OpCall, reference: OpReference) -> str | None:
    """Return why a pointwise call computes its recorded input's extremes into its output's (the evidence), else None."""
    from llmcheck.core.opcheck.criteria import RELATIVE, criterion_for

    if len(call.inputs) != 1 or len(call.outputs) != 1:
        return None
    ((position, source),) = call.inputs.items()
    (output,) = call.outputs.values()
    given, made = source.stats, output.stats
    if given is None or made is None or given.min is None or given.max is None:
        return None
    if given.nan_count or given.inf_count or made.nan_count or made.inf_count:
        return None  # recorded over the finite values only: the extremes then are not the whole story
    criterion = criterion_for(output.dtype)
    if criterion is None or criterion.error_kind != RELATIVE:
        return None
    ends = _computed_ends(reference, position, (given.min, given.max), call.params)
    if ends is None:
        return None
    for extreme, recorded, expected in (("max", made.max, max(ends)), ("min", made.min, min(ends))):
        if recorded is None:
            continue
        error = abs(recorded - expected) / max(abs(expected), _TINY)
        if error <= criterion.tolerance:
            return (
                f"replayed on its recorded extremes, {call.op_type} of the my-run input's min and max "
                f"({given.min:.6g}, {given.max:.6g}) gives its output's {extreme} {recorded:.6g} (relative error "
                f"{error:.3g}, within {output.dtype}'s {criterion.tolerance:.4g}): it computes what it is given"
            )
    return None


#: Below this magnitude an extreme's relative error is taken against it (a zero max, a zero min).
_TINY = 1e-30


def _computed_ends(
    reference: OpReference, position: str, ends: tuple[float, float], params: Mapping[str, Any]
) -> tuple[float, float] | None:
    """Return what the reference computes from two elements (an input's min and max), or None where it cannot."""
    import torch

    try:
        computed = reference.compute({position: torch.tensor(ends, dtype=torch.float64)}, params)
    except Exception:  # a variant the reference cannot compute: no replay, the judge decides without it
        log.debug("%s: no replay on statistics", reference.op_type, exc_info=True)
        return None
    first = computed.get("0") if isinstance(computed, Mapping) else (computed[0] if computed else None)
    if first is None or first.numel() != 2 or not bool(torch.isfinite(first).all()):
        return None
    low, high = (float(value) for value in first.to(torch.float64).flatten())
    return low, high


def _by_call(records: Iterable[TensorRecord]) -> dict[CallId, list[TensorRecord]]:
    calls: dict[CallId, list[TensorRecord]] = {}
    for record in records:
        calls.setdefault(CallId.of(record), []).append(record)
    return calls


def _call(records: Sequence[TensorRecord] | None) -> OpCall | None:
    return group_op_calls(records)[0] if records else None
