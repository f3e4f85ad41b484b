"""Check one operator call: recompute it with its reference from the dumped inputs and judge every dumped output.

Nothing here raises for a bad case: a missing reference, missing data, a reference that
cannot compute the variant, a reference that fails, a shape that does not match -- each
becomes a row with the reason, so one odd op never stops the run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmcheck.core.errors import LlmcheckError, UnsupportedOpError
from llmcheck.core.op_calls import OpCall, position_order
from llmcheck.core.opcheck.criteria import criterion_for
from llmcheck.core.records import OpReference, TensorRecord

log = logging.getLogger("llmcheck.opcheck")

PASS = "PASS"
FAILED = "FAILED"
ADDITION_FAILED = "addition failed"  # the original's word for a case that could not be checked
UNSUPPORTED = "unsupported"


@dataclass(frozen=True, slots=True)
class OpcheckRow:
    """One line of ``opcheck_result.csv``: one dumped output of one op (or one op that could not be checked)."""

    op_id: str
    op_name: str
    op_param: str
    tensor_path: str
    out_tensor_id: str
    precision_standard: str
    precision_result: str
    rel_precision_rate: float | None = None
    max_rel_error: float | None = None
    abs_precision_rate: float | None = None
    max_abs_error: float | None = None
    cosine_similarity: float | None = None
    kl_divergence: float | None = None
    fail_reason: str = ""
    step: int = 0
    call_index: int = 0
    dtype: str = ""
    order: int = 0


def op_param_text(params: Mapping[str, Any]) -> str:
    """Return the op's parameters as the report's one-line JSON ``op_param`` cell."""
    try:
        return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return str(params)


def _case_row(case: OpCall, result: str, reason: str, tensor_path: str = "", out_id: str = "") -> OpcheckRow:
    return OpcheckRow(
        op_id=case.name,
        op_name=case.op_type,
        op_param=op_param_text(case.params),
        tensor_path=tensor_path,
        out_tensor_id=out_id,
        precision_standard="",
        precision_result=result,
        fail_reason=reason,
        step=case.step,
        call_index=case.call_index,
        order=case.order,
    )


def _load(record: TensorRecord, device: str) -> Any:
    if record.data is None:
        raise LlmcheckError(
            f"{record.key.io} {record.key.position} holds no tensor data "
            f"({record.attrs.get('no_data', 'statistics or description only')})",
            where=record.source_path or None,
        )
    return record.data.load().to(device)


def _outputs_to_check(case: OpCall, reference: OpReference) -> dict[str, TensorRecord]:
    if case.outputs:
        return dict(case.outputs)
    # An in-place op's result is the after-state of the inputs it wrote into.
    return {
        str(index): case.inputs_after[str(input_position)]
        for index, input_position in enumerate(reference.inplace_inputs)
        if str(input_position) in case.inputs_after
    }


def _as_positions(computed: Any) -> dict[str, Any]:
    if isinstance(computed, Mapping):
        return {str(position): value for position, value in computed.items()}
    if isinstance(computed, Sequence) and not hasattr(computed, "shape"):
        return {str(index): value for index, value in enumerate(computed)}
    return {"0": computed}


def check_case(
    case: OpCall, reference: OpReference | None, *, device: str = "cpu", precision_metrics: Sequence[str] = ()
) -> list[OpcheckRow]:
    """Return the rows of one op call: one per dumped output, or one saying why the op was not checked."""
    import torch

    if reference is None:
        return [_case_row(case, UNSUPPORTED, f"no reference implementation for op type {case.op_type}")]
    outputs = _outputs_to_check(case, reference)
    if not outputs:
        return [_case_row(case, UNSUPPORTED, "the dump holds no output tensors of this op (dumped with -stp 0?)")]
    try:
        inputs = {position: _load(record, device) for position, record in case.inputs.items()}
        with torch.no_grad():
            computed = _as_positions(reference.compute(inputs, case.params))
    except UnsupportedOpError as exc:
        return [_case_row(case, UNSUPPORTED, exc.what)]
    except LlmcheckError as exc:
        return [_case_row(case, ADDITION_FAILED, exc.one_line())]
    except Exception as exc:  # a reference that breaks on odd inputs must not stop the run
        log.debug("reference for %s failed", case.label(), exc_info=True)
        return [_case_row(case, ADDITION_FAILED, f"reference failed: {type(exc).__name__}: {exc}")]
    as_recorded = _computed_as_recorded(case, reference, inputs)
    rows = []
    for position, record in sorted(outputs.items(), key=lambda item: position_order(item[0])):
        rows.append(
            _check_output(
                case, position, record, computed.get(position), device, precision_metrics, as_recorded.get(position)
            )
        )
    return rows


def _computed_as_recorded(case: OpCall, reference: OpReference, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Return the op's outputs replayed at the recorded precision on the CPU, by position (none when it cannot be).

    Only a measure of the rounding a correct kernel makes: a replay that fails leaves the
    fixed tolerance alone to judge, and says why at debug level.
    """
    import torch

    if reference.compute_as_recorded is None:
        return {}
    try:
        with torch.no_grad():
            replayed = reference.compute_as_recorded(
                {position: tensor.cpu() for position, tensor in inputs.items()}, case.params
            )
    except Exception:  # e.g. a kernel this CPU lacks for the dtype
        log.debug("%s: no replay at the recorded precision", case.label(), exc_info=True)
        return {}
    return {
        position: value
        for position, value in _as_positions(replayed).items()
        if hasattr(value, "is_floating_point") and value.is_floating_point()
    }


def _check_output(
    case: OpCall,
    position: str,
    record: TensorRecord,
    reference_output: Any,
    device: str,
    precision_metrics: Sequence[str],
    as_recorded: Any = None,
) -> OpcheckRow:
    from llmcheck.core.opcheck.measures import measure_output

    base = _case_row(case, ADDITION_FAILED, "", tensor_path=record.source_path, out_id=position)
    criterion = criterion_for(record.dtype)
    if criterion is None:
        return _replace(base, fail_reason=f"no precision criterion for output dtype {record.dtype}", dtype=record.dtype)
    base = _replace(base, precision_standard=criterion.standard_text(), dtype=record.dtype)
    if reference_output is None:
        return _replace(base, fail_reason=f"the reference gives no output {position}")
    if not hasattr(reference_output, "shape"):
        return _replace(
            base, fail_reason=f"the reference's output {position} is a {type(reference_output).__name__}, not a tensor"
        )
    try:
        dumped = _load(record, device)
    except LlmcheckError as exc:
        return _replace(base, fail_reason=exc.one_line())
    if tuple(reference_output.shape) != tuple(dumped.shape) and reference_output.numel() != dumped.numel():
        return _replace(
            base,
            precision_result=FAILED,
            fail_reason=f"shape mismatch: reference {list(reference_output.shape)}, dumped {list(dumped.shape)}",
        )
    try:
        measure = measure_output(
            reference_output,
            dumped,
            criterion,
            cosine="cos_sim" in precision_metrics,
            kl="kl" in precision_metrics,
            as_recorded=as_recorded,
        )
    except (RuntimeError, TypeError, ValueError) as exc:  # e.g. a complex reference for a real output
        return _replace(base, fail_reason=f"cannot measure output {position}: {type(exc).__name__}: {exc}")
    reasons = []
    if not measure.passed:
        rate = measure.rel_pass_percent if criterion.error_kind == "relative" else measure.abs_pass_percent
        reasons.append(
            f"{rate:.4f}% of {measure.numel} elements within {criterion.error_kind} error "
            f"{criterion.tolerance:.10g}, {criterion.required_pass_percent:g}% required"
        )
    if measure.nonfinite_mismatch:
        reasons.append(f"{measure.nonfinite_mismatch} NaN/Inf where the reference differs")
    with_abs = "abs" in precision_metrics
    return _replace(
        base,
        precision_result=PASS if measure.passed else FAILED,
        rel_precision_rate=measure.rel_pass_percent,
        max_rel_error=measure.max_rel_error,
        abs_precision_rate=measure.abs_pass_percent if with_abs else None,
        max_abs_error=measure.max_abs_error if with_abs else None,
        cosine_similarity=measure.cosine_similarity,
        kl_divergence=measure.kl_divergence,
        fail_reason="; ".join(reasons),
    )


def _replace(row: OpcheckRow, **changes: Any) -> OpcheckRow:
    from dataclasses import replace

    return replace(row, **changes)
