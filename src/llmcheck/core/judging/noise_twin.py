"""The noise twin read: the golden program run at the my-run's precision, measured against both runs, says what noise each tensor carries.

The orchestrator measures the twin against the golden and the my-run; this reads what those
two compares say -- the twin's error at each golden tensor, how much of the golden it covers,
whether it is the my-run's very program (its bits) or only its noise -- and warns where the
twin says nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from llmcheck.core.dtypes import is_float_dtype
from llmcheck.core.errors import LlmcheckError
from llmcheck.core.judging.divergence import (
    TWIN_NOISE_ONLY,
    ErrorMeasure,
    NoiseTwin,
    twin_mode,
)
from llmcheck.core.judging.result import CompareResult
from llmcheck.core.measuring.pairing_jobs import shape_problem, shape_text
from llmcheck.core.records import (
    VERDICT_ERROR,
    Dump,
    TensorRecord,
    metric_value,
)

log = logging.getLogger("llmcheck.compare")


#: A twin's hint, wherever it says nothing about the noise.
TWIN_HINT = "give --noise-path the golden program run on the same input at the my-run's precision"


def twin_coverage(
    golden: Dump, noise: Dump, against_golden: CompareResult, paired_golden: Sequence[TensorRecord]
) -> int:
    """Return how many paired golden records have a twin record to measure against; raise when none has."""
    measured = {id(row.golden) for row in against_golden.rows if row.verdict != VERDICT_ERROR}
    missing = [record for record in paired_golden if id(record) not in measured]
    if not missing:
        return len(paired_golden)
    if len(missing) < len(paired_golden):
        shown = ", ".join(record.key.label() for record in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        log.warning(
            "%s: %d of the %d golden records have no twin record: %s%s "
            "(their verdicts use the repeats and the dtype table instead)",
            noise.root,
            len(missing),
            len(paired_golden),
            shown,
            more,
        )
        return len(paired_golden) - len(missing)
    raise LlmcheckError(
        f"no golden record has a twin record to measure the noise at: {_why_nothing_pairs(golden, noise, against_golden)}",
        where=noise.root,
        hint=TWIN_HINT,
    )


def _why_nothing_pairs(golden: Dump, noise: Dump, against_golden: CompareResult) -> str:
    """Return why no golden record pairs with a measurable twin record: the names differ, or the shapes, or else."""
    if not against_golden.rows:
        first_golden = golden.records[0].key.label() if golden.records else "none"
        first_twin = noise.records[0].key.label() if noise.records else "none"
        return (
            f"none of its {len(noise.records)} records pairs with one of the golden's {len(golden.records)} "
            f"(the names differ: golden {first_golden}, twin {first_twin})"
        )
    failed = [row for row in against_golden.rows if row.verdict == VERDICT_ERROR]
    if not failed:
        return "its records pair only with golden records that have no my-run counterpart"
    first = failed[0]
    if shape_problem(first.golden, first.my) is not None:
        return (
            f"{len(failed)} records pair by name but the shapes differ "
            f"(golden {first.golden.key.label()} {shape_text(first.golden.shape)}, twin {shape_text(first.my.shape)})"
        )
    return f"{len(failed)} records pair by name but none can be measured ({first.golden.key.label()}: {first.reason})"


def _identical_tensors(result: CompareResult, measure: ErrorMeasure) -> int:
    """Return how many float tensors the two runs share when every one agrees exactly, else 0."""
    errors = [
        metric_value(row.metrics, measure.metric)
        for row in result.rows
        if row.verdict != VERDICT_ERROR and is_float_dtype(row.golden.dtype) and is_float_dtype(row.my.dtype)
    ]
    return len(errors) if errors and all(error == 0.0 for error in errors) else 0


def read_noise_twin(
    my: Dump, noise: Dump, measure: ErrorMeasure, against_golden: CompareResult, against_my: CompareResult
) -> NoiseTwin:
    """Return the noise twin's error at each golden tensor and the my-run judged against the twin.

    ``against_golden`` is the twin measured against the golden, ``against_my`` the my-run
    against the twin. Warn when the twin is identical to the my-run or to the golden: it then
    says nothing about the noise.
    """
    errors = {id(row.golden): error for row in against_golden.rows if (error := measure.of(row)) is not None}
    for run, result in (("the my-run", against_my), ("the golden run", against_golden)):
        tensors = _identical_tensors(result, measure)
        if tensors:
            consequence = (
                "every row under the dtype table's fail line passes against it, so it tells no defect from "
                "the rounding noise, unless the my-run is the golden program itself at this precision"
                if run == "the my-run"
                else "it shows no rounding noise, so every row that differs by more than rounding fails against it"
            )
            log.warning(
                "%s: the noise twin is identical to %s (all %d float tensors they share agree exactly): %s (%s)",
                noise.root,
                run,
                tensors,
                consequence,
                TWIN_HINT,
            )
    if bool(my.batches) != bool(noise.batches):
        # a serving engine's batch against a per-request twin (or the reverse): another implementation by its layout
        log.info(
            "%s: the my-run is a serving engine's batch and the noise twin a run of one request: another "
            "implementation than the twin's program, so the twin's error is the expected noise, not its bits",
            noise.root,
        )
        return NoiseTwin(errors=errors, against_my={}, mode=TWIN_NOISE_ONLY)
    mode, differing_calls = twin_mode(against_my.rows)
    if mode == TWIN_NOISE_ONLY:
        log.info(
            "%s: %d calls of the my-run differ from the noise twin behind bit-exact inputs: it is another "
            "implementation than the twin's program, so the twin's error is the expected noise, not its bits",
            noise.root,
            differing_calls,
        )
        return NoiseTwin(errors=errors, against_my={}, mode=mode)
    return NoiseTwin(errors=errors, against_my={id(row.my): row for row in against_my.rows}, mode=mode)
