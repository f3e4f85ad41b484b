"""How far one dumped op output is from its reference: pass rates, largest errors, cosine, KL.

Everything is measured in float64 over flattened chunks, so an output of any size is
measured with a bounded extra memory. Positions where both sides are NaN, or equal
(infinities included), agree; a NaN or infinity on one side only is an infinite error
and is counted in ``nonfinite_mismatch``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from llmcheck.core.measuring.sentinels import sentinel_limit
from llmcheck.core.opcheck.criteria import (
    RECORDED_NOISE_MULTIPLE,
    RECORDED_ROUNDING_MULTIPLE,
    RELATIVE,
    Criterion,
)

#: Elements measured per chunk (32 MiB of float64 per side).
CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True, slots=True)
class OutputMeasure:
    """The measures of one dumped output against its reference.

    Rates are percentages of elements within the criterion's tolerance; ``passed`` applies
    the criterion's error kind (relative for floats, absolute for integers and booleans).
    ``cosine_similarity`` and ``kl_divergence`` are ``None`` unless asked for.
    """

    numel: int
    rel_pass_percent: float
    max_rel_error: float
    abs_pass_percent: float
    max_abs_error: float
    nonfinite_mismatch: int
    passed: bool
    cosine_similarity: float | None = None
    kl_divergence: float | None = None


def relative_floor(dtype: torch.dtype) -> float:
    """Return the magnitude under which relative error is taken against the dtype's resolution instead."""
    if dtype.is_floating_point:
        return float(torch.finfo(dtype).tiny)
    return 1.0


def _chunks(*tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """Yield the tensors (same number of elements) flattened, chunk by chunk, as float64 on the CPU."""
    flat = [tensor.reshape(-1) for tensor in tensors]
    for start in range(0, flat[0].numel(), CHUNK_ELEMENTS):
        stop = start + CHUNK_ELEMENTS
        yield tuple(part[start:stop].to(device="cpu", dtype=torch.float64) for part in flat)


def recorded_allowance(
    reference: torch.Tensor, as_recorded: torch.Tensor | None, criterion: Criterion, floor: float
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """Return what gives, per chunk, the absolute error each element may have at the recorded run's precision.

    The returned function takes a chunk of the reference and of ``as_recorded`` (the op
    replayed in its recorded dtypes, see ``opcheck/criteria.py``). ``None`` -- the fixed
    tolerance alone judges -- when there is no such replay, the criterion is not relative, or
    the replay is within the tolerance everywhere (an elementwise op, which rounds within it).
    """
    if as_recorded is None or criterion.error_kind != RELATIVE or as_recorded.numel() != reference.numel():
        return None
    square_sum = 0.0
    counted = 0
    misses_tolerance = False
    for golden, replayed in _chunks(reference, as_recorded):
        error = (replayed - golden).abs_()
        if not bool(torch.isfinite(error.sum())):  # rare: leave the NaN/Inf positions out
            finite = torch.isfinite(error)
            error, golden = error[finite], golden[finite]
        square_sum += float(error.square().sum())
        counted += error.numel()
        misses_tolerance = misses_tolerance or bool(
            (error > golden.abs().clamp_(min=floor) * criterion.tolerance).any()
        )
    if not misses_tolerance or not counted:
        return None
    noise = RECORDED_NOISE_MULTIPLE * math.sqrt(square_sum / counted)

    def allowance(golden: torch.Tensor, replayed: torch.Tensor) -> torch.Tensor:
        error = (replayed - golden).abs_().nan_to_num_(nan=0.0, posinf=0.0)
        return (error * RECORDED_ROUNDING_MULTIPLE).clamp_(min=noise)

    return allowance


def _errors(
    golden: torch.Tensor, mine: torch.Tensor, floor: float | torch.Tensor, sentinel: float = math.inf
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Return absolute and relative errors per element, and how many positions disagree on NaN/Inf.

    ``floor``: the magnitude under which an element's error is taken relative to it instead
    of to the reference (a number, or one per element).
    """
    if bool(torch.isfinite(golden.sum())) and bool(torch.isfinite(mine.sum())):
        # Finite sums prove every element finite: the common case skips the NaN/Inf bookkeeping.
        absolute = (mine - golden).abs_()
        return absolute, absolute / torch.maximum(golden.abs(), torch.as_tensor(floor, dtype=golden.dtype)), 0
    # The same NaN, or both at the dumped dtype's infinity sentinel (a mask: -inf, finfo.min), agree.
    agree = (
        (golden == mine)
        | (torch.isnan(golden) & torch.isnan(mine))
        | ((golden <= -sentinel) & (mine <= -sentinel))
        | ((golden >= sentinel) & (mine >= sentinel))
    )
    finite = torch.isfinite(golden) & torch.isfinite(mine)
    absolute = torch.where(agree, 0.0, torch.where(finite, (mine - golden).abs(), math.inf))
    relative = absolute / torch.maximum(golden.abs(), torch.as_tensor(floor, dtype=golden.dtype))
    relative = torch.where(agree, 0.0, torch.where(finite, relative, math.inf))
    return absolute, relative, int((~agree & ~finite).sum())


def measure_output(
    reference: torch.Tensor,
    dumped: torch.Tensor,
    criterion: Criterion,
    *,
    cosine: bool = False,
    kl: bool = False,
    as_recorded: torch.Tensor | None = None,
) -> OutputMeasure:
    """Return the measures of ``dumped`` against ``reference`` (same number of elements, any dtypes).

    ``as_recorded``: the op replayed at the recorded run's precision, whose rounding each
    element is allowed (``opcheck/criteria.py``); a relative error is then taken against the
    larger of the reference and that allowance over the tolerance.
    """
    numel = dumped.numel()
    floor = relative_floor(dumped.dtype)
    sentinel = sentinel_limit(str(dumped.dtype).removeprefix("torch."))
    allowance = recorded_allowance(reference, as_recorded, criterion, floor)
    rel_within = abs_within = mismatches = 0
    max_rel = max_abs = 0.0
    dot = golden_square = mine_square = 0.0
    beside = [] if allowance is None or as_recorded is None else [as_recorded]
    for golden, mine, *replayed in _chunks(reference, dumped, *beside):
        element_floor: float | torch.Tensor = floor
        if allowance is not None:
            element_floor = allowance(golden, replayed[0]).div_(criterion.tolerance).clamp_(min=floor)
        absolute, relative, chunk_mismatches = _errors(golden, mine, element_floor, sentinel)
        mismatches += chunk_mismatches
        rel_within += int(torch.count_nonzero(relative <= criterion.tolerance))
        abs_within += int(torch.count_nonzero(absolute <= criterion.tolerance))
        if absolute.numel():
            max_rel = max(max_rel, float(relative.max()))
            max_abs = max(max_abs, float(absolute.max()))
        if cosine:
            both_finite = torch.isfinite(golden) & torch.isfinite(mine)
            golden_finite, mine_finite = golden[both_finite], mine[both_finite]
            dot += float((golden_finite * mine_finite).sum())
            golden_square += float((golden_finite * golden_finite).sum())
            mine_square += float((mine_finite * mine_finite).sum())
    rel_percent = 100.0 * rel_within / numel if numel else 100.0
    abs_percent = 100.0 * abs_within / numel if numel else 100.0
    decisive = rel_percent if criterion.error_kind == RELATIVE else abs_percent
    cosine_value = None
    if cosine:
        if golden_square == 0.0 and mine_square == 0.0:
            cosine_value = 1.0
        elif golden_square == 0.0 or mine_square == 0.0:
            cosine_value = 0.0
        else:
            cosine_value = dot / math.sqrt(golden_square) / math.sqrt(mine_square)
    return OutputMeasure(
        numel=numel,
        rel_pass_percent=rel_percent,
        max_rel_error=max_rel,
        abs_pass_percent=abs_percent,
        max_abs_error=max_abs,
        nonfinite_mismatch=mismatches,
        passed=criterion.passes(decisive),
        cosine_similarity=cosine_value,
        kl_divergence=kl_divergence(reference, dumped) if kl else None,
    )


def kl_divergence(reference: torch.Tensor, dumped: torch.Tensor) -> float:
    """Return KL(softmax(reference) || softmax(dumped)) over the flattened tensors, as the original tool defines it.

    NaN when either side holds a NaN or infinity (the softmax is undefined).
    """
    if reference.numel() == 0:
        return 0.0
    high_golden = high_mine = -math.inf
    for golden, mine in _chunks(reference, dumped):
        if not (bool(torch.isfinite(golden).all()) and bool(torch.isfinite(mine).all())):
            return math.nan
        high_golden = max(high_golden, float(golden.max()))
        high_mine = max(high_mine, float(mine.max()))
    sum_golden = sum_mine = 0.0
    for golden, mine in _chunks(reference, dumped):
        sum_golden += float(torch.exp(golden - high_golden).sum())
        sum_mine += float(torch.exp(mine - high_mine).sum())
    log_norm_golden = high_golden + math.log(sum_golden)
    log_norm_mine = high_mine + math.log(sum_mine)
    divergence = 0.0
    for golden, mine in _chunks(reference, dumped):
        log_p = golden - log_norm_golden
        log_q = mine - log_norm_mine
        divergence += float((torch.exp(log_p) * (log_p - log_q)).sum())
    return max(divergence, 0.0)
