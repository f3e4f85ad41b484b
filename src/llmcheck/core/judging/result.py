"""What one compare found: both dumps, the pairing, a judged row per pair, and what summary.json says of them.

Why apart from the orchestrator: the reports read a result, and the orchestrator makes one; a
result that lived with the orchestrator tied every report to it (and it back to them).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmcheck.core.dumps.store import AS_DTYPE_FIELD
from llmcheck.core.judging.divergence import (
    INTRODUCED,
    SUSPECT,
    code_owner,
    describe_row,
    first_divergence,
    first_introduced,
    given_other_inputs,
)
from llmcheck.core.judging.row_table import row_field, rows_where
from llmcheck.core.judging.suspects import Suspects, find_suspects
from llmcheck.core.judging.verdicts import (
    ThresholdOverride,
)
from llmcheck.core.pairing.merge import Pairing
from llmcheck.core.records import (
    IO_OUTPUT,
    VERDICT_ERROR,
    VERDICT_FAIL,
    VERDICT_PASS,
    VERDICT_WARN,
    ComparisonRow,
    Dump,
    MetricSpec,
    TensorRecord,
)

SUMMARY_FORMAT = "llmcheck-compare-summary"


@dataclass
class CompareResult:
    """Everything one compare found: both dumps, the pairing, one row per pair, how long it took."""

    golden: Dump
    my: Dump
    pairing: Pairing
    rows: Sequence[ComparisonRow]  # a RowTable as a compare makes it: each row made when read
    metric_specs: list[MetricSpec]
    elapsed_s: float
    tensor_bytes_read: int
    tensor_bytes_compared: int = 0
    noise: Dump | None = None
    threshold_overrides: tuple[ThresholdOverride, ...] = ()  # the --thresholds entries, in file order
    #: How many rows' golden records have a twin record to measure the noise at (the others are judged without).
    rows_with_twin: int = 0
    #: How the twin judged the my-run: its bits ("same program") or only its error ("noise reference").
    twin_mode: str | None = None

    def counts(self) -> dict[str, int]:
        """Return the number of pairs, of rows per verdict, and of unmatched records per side.

        Unmatched records are also counted by kind: ``expected`` ones a pairing rule
        declared legitimately unmatched, ``unexpected`` ones nothing explains (unexpected
        golden records fail a compare unless ``--allow-unmatched``).
        """
        verdicts = row_field(self.rows, "verdict")
        pairing = self.pairing
        expected_golden = sum(item.expected for item in pairing.unmatched_golden)
        expected_my = sum(item.expected for item in pairing.unmatched_my)
        return {
            "pairs": len(self.rows),
            "passes": verdicts.count(VERDICT_PASS),
            "warnings": verdicts.count(VERDICT_WARN),
            "failures": verdicts.count(VERDICT_FAIL),
            "errors": verdicts.count(VERDICT_ERROR),
            "unmatched_golden": len(pairing.unmatched_golden),
            "unmatched_my": len(pairing.unmatched_my),
            "unmatched": len(pairing.unmatched_golden) + len(pairing.unmatched_my),
            "unmatched_golden_expected": expected_golden,
            "unmatched_golden_unexpected": len(pairing.unmatched_golden) - expected_golden,
            "unmatched_my_expected": expected_my,
            "unmatched_my_unexpected": len(pairing.unmatched_my) - expected_my,
        }

    @functools.cached_property
    def first_divergence(self) -> ComparisonRow | None:
        """Return the first failing row in execution order (found once: each reader asks for it)."""
        return first_divergence(self.rows)

    @functools.cached_property
    def first_introduced(self) -> ComparisonRow | None:
        """Return the first row whose error is introduced there (the deepest such module; found once)."""
        return first_introduced(self.rows)

    @property
    def culprit(self) -> TensorRecord | None:
        """Return the record named as where the error starts: the first introduced row, else the first suspect.

        A defect that changes which ops run (an activation swapped for another, a stray scale)
        introduces its error through ops only one run has: no pair is introduced, the rows
        they feed are ``inherited_from_unmatched``, and the first of those ops is the culprit.
        """
        introduced = self.first_introduced
        if introduced is not None:
            return (self._code_owner or introduced).golden
        return self.suspects.first()

    @property
    def culprit_partner(self) -> TensorRecord | None:
        """Return the my-run's record paired with :attr:`culprit` (another name where the runs are laid out apart).

        A serving engine's ``qkv_proj`` is the partner of transformers' ``k_proj``: the report
        names both, so the culprit reads in the my-run's own modules too.
        """
        introduced = self.first_introduced
        if introduced is None:
            return self.suspects.first()
        if introduced.my.key.io == IO_OUTPUT and introduced.golden.key.io != IO_OUTPUT:
            # the golden computes this input in its module's own code; the my-run has a module for it
            # (an engine's attention core, its fused add-and-norm): that module made the error
            return introduced.my
        return (self._code_owner or introduced).my

    @functools.cached_property
    def _code_owner(self) -> ComparisonRow | None:
        """Return the output row of the module whose own code made the first introduced row, if that is an input."""
        introduced = self.first_introduced
        return code_owner(self.rows, introduced) if introduced is not None else None

    @property
    def culprit_seen_at(self) -> TensorRecord | None:
        """Return the introduced input the culprit module's own code made, where :attr:`culprit` names its module."""
        introduced = self.first_introduced
        return introduced.golden if introduced is not None and self._code_owner is not None else None

    @functools.cached_property
    def suspects(self) -> Suspects:
        """Return the operations only one run executes, where the error starts (``core/judging/suspects.py``).

        Where the runs were given other inputs first (a generating run picked another token),
        the operations of that step on compute on them: none is a suspect.
        """
        introduced = self.first_introduced
        anchor = introduced or self.first_divergence
        other_inputs = introduced is None and anchor is not None and given_other_inputs(anchor)
        before = anchor.golden.key.step if anchor is not None and other_inputs else None
        return find_suspects(self.rows, self.pairing, anchor, fed_before_step=before)

    def summary(self) -> dict[str, Any]:
        """Return the content of summary.json."""
        introduced = rows_where(self.rows, "attribution", INTRODUCED.__eq__)
        throughput = self.tensor_bytes_read / self.elapsed_s / 1e9 if self.elapsed_s > 0 else None
        return {
            "format": SUMMARY_FORMAT,
            "format_version": 1,
            "golden": {
                "path": str(self.golden.root),
                "source": self.golden.source,
                "records": len(self.golden.records),
                "cut": self.golden.cut,
            },
            "my": {
                "path": str(self.my.root),
                "source": self.my.source,
                "records": len(self.my.records),
                "cut": self.my.cut,
            },
            "noise": (
                {
                    "path": str(self.noise.root),
                    "source": self.noise.source,
                    "records": len(self.noise.records),
                    "rows_with_twin": self.rows_with_twin,
                    "rows_without_twin": len(self.rows) - self.rows_with_twin,
                    "mode": self.twin_mode,
                    # how the twin was made, when its capture cast the golden program (dump --as-dtype)
                    "as_dtype": self.noise.manifest.get(AS_DTYPE_FIELD),
                }
                if self.noise is not None
                else None
            ),
            "counts": self.counts(),
            "first_divergence": describe_row(self.first_divergence),
            "first_introduced": describe_row(self.first_introduced),
            "suspects": self.suspects.as_json(),
            "culprit": (
                None
                if (culprit := self.culprit) is None
                else {
                    "name": culprit.key.name,
                    # the my-run's partner record: another module where the runs are laid out apart
                    "my_name": partner.key.name if (partner := self.culprit_partner) is not None else None,
                    "io": culprit.key.io,
                    "position": culprit.key.position,
                    "step": culprit.key.step,
                    "call_index": culprit.key.call_index,
                    "one_run_only": self.first_introduced is None,
                    # the module's own code made this input: the first record that shows the error
                    "seen_at": seen_at.key.label() if (seen_at := self.culprit_seen_at) is not None else None,
                }
            ),
            "noise_suspects": [describe_row(row) for row in rows_where(self.rows, "attribution", SUSPECT.__eq__)][:50],
            "introduced": [describe_row(row) for row in introduced[:50]],
            "metrics": [spec.name for spec in self.metric_specs],
            "thresholds": {
                spec.name: {cls: list(limits) for cls, limits in spec.thresholds.items()}
                for spec in self.metric_specs
                if spec.thresholds
            },
            "threshold_overrides": [override.as_json() for override in self.threshold_overrides],
            "elapsed_s": round(self.elapsed_s, 3),
            "tensor_bytes_read": self.tensor_bytes_read,
            "tensor_bytes_compared": self.tensor_bytes_compared,
            "throughput_gb_per_s": round(throughput, 3) if throughput is not None else None,
        }
