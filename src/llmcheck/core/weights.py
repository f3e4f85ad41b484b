"""Weights: a parameter that differs from the golden beyond the rounding to the my-run's dtype is a defect.

Loading or converting weights wrongly (a transposed shard, a wrong scale, a bad quantisation)
is the most common porting defect, and it needs no noise model: a weight is a leaf, so the
my-run's copy must equal the golden's rounded to the my-run's dtype. A source marks a record
that holds a model parameter with ``attrs["parameter"]`` (the torch op-level capture does, for
every op input that is a parameter). Each such pair is checked element by element: a
difference larger than one unit in the last place of the less precise dtype is beyond
rounding (one unit allows another rounding mode, such as truncation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from llmcheck.core.records import DTYPE_ITEMSIZE, ComparisonRow, TensorRecord

#: The attrs key a source sets on a record holding a model parameter (its qualified name).
PARAMETER_ATTR = "parameter"
_PRECISION = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class WeightFinding:
    """A parameter that differs from the golden beyond rounding: how many elements, and what to say."""

    parameter: str
    beyond: int
    total: int
    largest: float
    dtype: str

    @property
    def evidence(self) -> str:
        """Return the sentence a report shows."""
        return (f"weights differ from golden beyond {self.dtype} rounding: {self.beyond} of {self.total} elements "
                f"of {self.parameter} (largest difference {self.largest:.3g})")


def parameter_of(row: ComparisonRow) -> str | None:
    """Return the parameter a row's records hold, or None."""
    return row.golden.attrs.get(PARAMETER_ATTR) or row.my.attrs.get(PARAMETER_ATTR)


def _less_precise(golden: str, my: str) -> str | None:
    if golden not in _PRECISION or my not in _PRECISION:
        return None
    return max(golden, my, key=_PRECISION.index)


def _identity(record: TensorRecord) -> tuple[Any, ...]:
    data = record.data
    assert data is not None
    return (id(data),) if data.loader is not None else (str(data.path), data.offset, data.nbytes)


def check_weights(rows: Sequence[ComparisonRow]) -> dict[int, WeightFinding]:
    """Return, keyed by ``id(row)``, the parameter rows whose my-run weights differ beyond rounding."""
    if not any(parameter_of(row) for row in rows):
        return {}  # most dumps hold no parameters: no torch import for them
    import torch

    findings: dict[int, WeightFinding] = {}
    checked: dict[tuple[Any, ...], WeightFinding | None] = {}
    for row in rows:
        parameter = parameter_of(row)
        golden, my = row.golden, row.my
        target = _less_precise(golden.dtype, my.dtype)
        if (parameter is None or target is None or golden.data is None or my.data is None
                or golden.numel != my.numel or not DTYPE_ITEMSIZE.get(target)):
            continue
        identity = _identity(golden) + _identity(my)
        if identity not in checked:
            dtype = getattr(torch, target)
            golden_values = golden.data.load().reshape(-1).to(dtype).to(torch.float64)
            my_values = my.data.load().reshape(-1).to(dtype).to(torch.float64)
            spacing = torch.finfo(dtype).eps * golden_values.abs().clamp_min(torch.finfo(dtype).tiny)
            difference = (my_values - golden_values).abs()
            beyond = difference > spacing
            beyond = beyond & ~(golden_values.isnan() & my_values.isnan())
            count = int(beyond.sum())
            checked[identity] = (WeightFinding(str(parameter), count, int(golden_values.numel()),
                                               float(difference[beyond].max()), target) if count else None)
        finding = checked[identity]
        if finding is not None:
            findings[id(row)] = finding
    return findings
