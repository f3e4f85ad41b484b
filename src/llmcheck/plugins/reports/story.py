"""The story of a compare in one sentence: what was compared, the verdict, the culprit, the output effect.

The report's first line. A user should not have to read a table to learn whether the runs
agree, where the error starts and whether the output changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from llmcheck.plugin_api import (
    IO_OUTPUT,
    ComparisonRow,
    LlmcheckError,
    TensorData,
    describe,
    error_measure,
    given_other_inputs,
    is_float_dtype,
    measure_text,
    row_error,
    row_field,
    rows_at,
)

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.plugin_api import CompareResult


def final_output(result: CompareResult) -> ComparisonRow | None:
    """Return the last output compared in the last step (the model's output: logits, or the last layer's)."""
    golden = row_field(result.rows, "golden")
    outputs = (position for position, record in enumerate(golden) if record.key.io == IO_OUTPUT)
    last = max(outputs, key=lambda position: (golden[position].key.step, golden[position].order), default=None)
    return None if last is None else rows_at(result.rows, [last])[0]


def next_tokens(row: ComparisonRow) -> tuple[int, int] | None:
    """Return the arg-max over the last axis at the last position of both sides (the next token, for logits).

    Only the last position's row is read: the data is memory-mapped, so a long sequence's logits cost one row.
    """
    if (
        row.golden.data is None
        or row.my.data is None
        or len(row.golden.shape) < 2
        or row.golden.shape[-1] < 2
        or row.golden.shape != row.my.shape
    ):
        return None
    if not (is_float_dtype(row.golden.dtype) and is_float_dtype(row.my.dtype)) or "complex" in row.golden.dtype:
        return None
    width = row.golden.shape[-1]
    try:
        return int(_last_row(row.golden.data, width).argmax()), int(_last_row(row.my.data, width).argmax())
    except (LlmcheckError, OSError, ValueError, RuntimeError):
        return None


def _last_row(data: TensorData, width: int) -> np.ndarray:
    """Return the last ``width`` values of a tensor as float64, decoded with numpy (no torch import for a report)."""
    from llmcheck.plugin_api import ChunkReader

    def scratch(name: str, size: int, dtype: np.dtype) -> np.ndarray:
        return np.empty(size, dtype=dtype)

    with ChunkReader(data) as reader:
        return reader.read(reader.size - width, np.empty(width), scratch)


def output_effect(result: CompareResult) -> str:
    """Return what the difference does at the output, in words."""
    row = final_output(result)
    if row is None:
        return ""
    measure = error_measure(result.metric_specs)
    error = row_error(row, measure)
    label = row.golden.key.label()
    if error is not None and measure is not None:
        text = f"at the output ({label}) the runs differ by {measure.name} {describe(error)} ({row.verdict})"
    else:
        text = f"the output ({label}) is judged {row.verdict}"
    key = row.golden.key
    holds_logits = "logits" in key.position or key.name.endswith("lm_head")  # HF's output field, or the head module
    tokens = next_tokens(row) if holds_logits else None
    if tokens is not None:
        golden_token, my_token = tokens
        text += (
            f" and the next token is the same (id {golden_token})"
            if golden_token == my_token
            else f" and the next token changes from id {golden_token} to id {my_token}"
        )
    return text


def story(result: CompareResult) -> str:
    """Return the compare in one sentence."""
    counts = result.counts()
    compared = (
        f"Compared my run {result.my.root.name} ({result.my.source}) with golden {result.golden.root.name} "
        f"({result.golden.source}), {counts['pairs']} pair{'' if counts['pairs'] == 1 else 's'}"
    )
    if not result.rows:
        return compared + ": no pair was formed, so nothing could be judged."
    introduced, first = result.first_introduced, result.first_divergence
    if first is None:
        verdict = (
            "every pair is within its thresholds"
            if not counts["errors"]
            else f"no pair fails, but {counts['errors']} could not be measured"
        )
        culprit = ""
    else:
        verdict = f"{counts['failures']} fail"
        culprit_row = introduced or first
        op_type = culprit_row.golden.op_type
        where = culprit_row.golden.key.label() + (f" ({op_type})" if op_type else "")
        evidence = culprit_row.evidence or measure_text(culprit_row)
        suspects = result.suspects.sentence()
        other_inputs = (
            f"; the runs were given other values at {first.golden.key.label()}, so every later step compares "
            "other inputs (a generating run picked other tokens)"
            if given_other_inputs(first)
            else ""
        )
        if introduced is not None:
            inputs = ", while its inputs agree" if introduced.fed_by else ""
            culprit = f"; the error is introduced at {where}: {evidence}{inputs}"
        elif suspects:
            culprit = f"; the first failing tensor is {where}, fed by operations only one run executes"
        else:
            culprit = f"; the first failing tensor is {where}: {evidence} (where it is introduced is unknown)"
        culprit = other_inputs + culprit
        if suspects:
            culprit += f"; suspects: {suspects}"
    effect = output_effect(result)
    return f"{compared}: {verdict}{culprit}" + (f"; {effect}" if effect else "") + "."
