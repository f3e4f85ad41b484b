"""Suspects: operations only one run executes, found where the error starts.

When the suspect run executes extra operations (a stray scale, a cast, an extra add), an
op-level capture records them but they have no golden counterpart: they stay unmatched and
are never measured, and the blame would land downstream. So the records one run has alone
are named as suspects when they sit where the error starts -- between the last agreeing pair
and the first introduced (else the first failing) row, in that run's execution order -- or
when they produced the input of a row labelled ``inherited_from_unmatched``. The same holds
for golden-only records (an operation the my-run skips).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmcheck.core.judging.row_table import row_field, rows_where
from llmcheck.core.pairing.merge import Pairing
from llmcheck.core.records import VERDICT_PASS, VERDICT_WARN, ComparisonRow, TensorRecord

#: Where a row's feeder was a record only the my-run has, its label ends with this.
MY_ONLY_SUFFIX = " (my-run only)"
#: The attribution of a failing row whose input an op only the my-run has produced.
INHERITED_FROM_UNMATCHED = "inherited_from_unmatched"
#: Op types that only convert a dtype: a run at another precision executes them legitimately,
#: so they are named among the suspects but are the culprit only when nothing else is.
CAST_OP_MARKERS = ("_to_copy", "aten.to.", "aten.to_", "type_as", "Cast")


@dataclass(frozen=True)
class Suspects:
    """The one-sided records named as suspects, per side, in execution order."""

    my_only: tuple[TensorRecord, ...] = ()
    golden_only: tuple[TensorRecord, ...] = ()

    def first(self) -> TensorRecord | None:
        """Return the suspect named as the culprit: the first that is not a mere dtype cast, else the first."""
        records = self.my_only or self.golden_only
        return next(
            (
                record
                for record in records
                if not any(marker in (record.op_type or record.key.name) for marker in CAST_OP_MARKERS)
            ),
            next(iter(records), None),
        )

    def operations(self, side: str) -> list[str]:
        """Return the distinct operations (name and call) of one side's suspects, in order."""
        records = self.my_only if side == "my" else self.golden_only
        seen: dict[tuple[str, int], str] = {}
        for record in records:
            call = f"[{record.key.call_index}]" if record.key.call_index else ""
            seen.setdefault((record.key.name, record.key.call_index), record.key.name + call)
        return list(seen.values())

    def sentence(self) -> str:
        """Return what a user reads: which operations one run executes here and the other does not."""
        parts = []
        for side, other, verb in (("my", "golden", "executes"), ("golden", "my", "executes")):
            operations = self.operations(side)
            if operations:
                shown = ", ".join(operations[:5]) + (", ..." if len(operations) > 5 else "")
                parts.append(
                    f"the {side}-run {verb} {len(operations)} operation{'s' if len(operations) != 1 else ''} "
                    f"here that the {other} run does not: {shown}"
                )
        return "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        """Return the suspects as summary.json shows them."""

        def describe(record: TensorRecord) -> dict[str, Any]:
            key = record.key
            return {
                "name": key.name,
                "io": key.io,
                "position": key.position,
                "step": key.step,
                "call_index": key.call_index,
                "op_type": record.op_type,
            }

        return {
            "sentence": self.sentence(),
            "my_only": [describe(r) for r in self.my_only],
            "golden_only": [describe(r) for r in self.golden_only],
        }


def find_suspects(
    rows: Sequence[ComparisonRow], pairing: Pairing, anchor: ComparisonRow | None, fed_before_step: int | None = None
) -> Suspects:
    """Return the one-sided records where the error starts (before ``anchor``) or that fed a row.

    ``fed_before_step``: only records of earlier steps count as having fed a row (the runs
    were given other inputs from that step on).
    """
    if anchor is None:
        return Suspects()
    agreeing = [verdict in (VERDICT_PASS, VERDICT_WARN) for verdict in row_field(rows, "verdict")]
    fed_labels = {
        label.removesuffix(MY_ONLY_SUFFIX)
        for row in rows_where(rows, "attribution", INHERITED_FROM_UNMATCHED.__eq__)
        for label in row.fed_by
        if label.endswith(MY_ONLY_SUFFIX)
    }

    def window(records: Sequence[TensorRecord], anchor_record: TensorRecord, side: str) -> tuple[TensorRecord, ...]:
        last_agreeing = max(
            (
                record.order
                for record, agrees in zip(row_field(rows, side), agreeing)
                if agrees and record.order < anchor_record.order and record.key.step == anchor_record.key.step
            ),
            default=-1,
        )
        return tuple(
            record
            for record in records
            if (last_agreeing < record.order < anchor_record.order and record.key.step == anchor_record.key.step)
            or (
                side == "my"
                and record.key.label() in fed_labels
                and (fed_before_step is None or record.key.step < fed_before_step)
            )
        )

    return Suspects(
        # a record a pairing rule declared legitimately unmatched (an engine's own bookkeeping, its fused
        # norm's residual input) is no operation only one run executes
        my_only=window([item.record for item in pairing.unmatched_my if not item.expected], anchor.my, "my"),
        golden_only=window(
            [item.record for item in pairing.unmatched_golden if not item.expected], anchor.golden, "golden"
        ),
    )
