"""Weights: a parameter that differs from the golden beyond the rounding to the my-run's dtype is a defect.

Loading or converting weights wrongly (a transposed shard, a wrong scale, a bad quantisation)
is the most common porting defect, and it needs no noise model: a weight is a leaf, so the
my-run's copy must equal the golden's rounded to the my-run's dtype. A source marks a record
that holds a model parameter with ``attrs["parameter"]`` (the torch op-level capture does, for
every op input that is a parameter). Each such pair is checked element by element: a
difference larger than one unit in the last place of the less precise dtype is beyond
rounding (one unit allows another rounding mode, such as truncation).

A module-level capture holds no weights, only their digests: the record of a module call
carries ``attrs["parameter_digests"]``, for each of the module's own parameters its dtype
and a digest of its values rounded to every dtype less precise than it (the capture cannot
know the my-run's dtype). The my-run's digest at its own dtype must then equal the golden's
at that dtype, bit for bit: a cheap test of exactly the same rule, minus the one unit of
slack and the count of elements (a digest only says *that* they differ).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmcheck.core.dtypes import DTYPE_ITEMSIZE
from llmcheck.core.judging.row_table import ROWS_PER_BATCH, field_blocks
from llmcheck.core.records import ComparisonRow, TensorRecord

#: The attrs key a source sets on a record holding a model parameter (its qualified name).
PARAMETER_ATTR = "parameter"
#: The attrs key of a record carrying its module's parameter digests:
#: ``{parameter: {"dtype": name, "shape": [sizes], "rounded": {dtype name: hex digest}}}``.
PARAMETER_DIGESTS_ATTR = "parameter_digests"
_PRECISION = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class WeightFinding:
    """A parameter that differs from the golden beyond rounding: how many elements, and what to say."""

    parameter: str
    beyond: int | None  # None: known from digests, which count no elements
    total: int | None
    largest: float | None
    dtype: str
    parameters_differing: int = 1

    @property
    def count(self) -> float:
        """Return the value reported for the finding: elements beyond rounding, or parameters differing."""
        return float(self.beyond if self.beyond is not None else self.parameters_differing)

    @property
    def evidence(self) -> str:
        """Return the sentence a report shows."""
        if self.beyond is None:
            return (
                f"weights differ from golden beyond {self.dtype} rounding: {self.parameter} "
                "(the digests of their values differ)"
            )
        return (
            f"weights differ from golden beyond {self.dtype} rounding: {self.beyond} of {self.total} elements "
            f"of {self.parameter} (largest difference {self.largest:.3g})"
        )


def _parameter(golden: TensorRecord, my: TensorRecord) -> str | None:
    """Return the parameter a row's records hold, or None."""
    return golden.attrs.get(PARAMETER_ATTR) or my.attrs.get(PARAMETER_ATTR)


def _less_precise(golden: str, my: str) -> str | None:
    if golden not in _PRECISION or my not in _PRECISION:
        return None
    return max(golden, my, key=_PRECISION.index)


def check_weights(rows: Sequence[ComparisonRow]) -> dict[int, WeightFinding]:
    """Return, keyed by the row's ``index``, the parameter rows whose my-run weights differ beyond rounding.

    Only the rows' records are read (their columns, where ``rows`` is a table), a batch of rows
    at a time: no row is made, and no list of every row's records is held (a tuple a pair was
    the peak of a statistics-only compare's judging).
    """
    findings: dict[int, WeightFinding] = {}
    with_parameters = False
    for index, golden, my in _sides(rows):
        digest_finding = _digest_finding(golden, my)
        if digest_finding is not None:
            findings[index] = digest_finding
        with_parameters = with_parameters or bool(_parameter(golden, my))
    if not with_parameters:
        return findings  # most dumps hold no parameters: no torch import for them
    import torch

    checked: dict[tuple[Any, ...], WeightFinding | None] = {}
    for index, golden, my in _sides(rows):
        parameter = _parameter(golden, my)
        target = _less_precise(golden.dtype, my.dtype)
        if (
            parameter is None
            or target is None
            or golden.data is None
            or my.data is None
            or golden.numel != my.numel
            or not DTYPE_ITEMSIZE.get(target)
        ):
            continue
        identity = golden.data.identity() + my.data.identity()
        if identity not in checked:
            dtype = getattr(torch, target)
            golden_values = golden.data.load().reshape(-1).to(dtype).to(torch.float64)
            my_values = my.data.load().reshape(-1).to(dtype).to(torch.float64)
            spacing = torch.finfo(dtype).eps * golden_values.abs().clamp_min(torch.finfo(dtype).tiny)
            difference = (my_values - golden_values).abs()
            beyond = difference > spacing
            beyond = beyond & ~(golden_values.isnan() & my_values.isnan())
            count = int(beyond.sum())
            checked[identity] = (
                WeightFinding(
                    str(parameter), count, int(golden_values.numel()), float(difference[beyond].max()), target
                )
                if count
                else None
            )
        finding = checked[identity]
        if finding is not None:
            findings[index] = finding
    return findings


def _sides(rows: Sequence[ComparisonRow]) -> Iterator[tuple[int, TensorRecord, TensorRecord]]:
    """Yield each row's index and its golden and my records, in row order, read a batch of rows at a time."""
    for fields in field_blocks(rows, ROWS_PER_BATCH):
        yield from zip(fields.index, fields.golden, fields.my)


def _digest_finding(golden: TensorRecord, my: TensorRecord) -> WeightFinding | None:
    """Return what a row's parameter digests say: the parameters whose my-run values are not the golden's rounded."""
    golden_digests = golden.attrs.get(PARAMETER_DIGESTS_ATTR)
    my_digests = my.attrs.get(PARAMETER_DIGESTS_ATTR)
    if not isinstance(golden_digests, Mapping) or not isinstance(my_digests, Mapping):
        return None
    differing: list[str] = []
    targets: list[str] = []
    for parameter, golden_entry in golden_digests.items():
        my_entry = my_digests.get(parameter)
        if (
            not isinstance(golden_entry, Mapping)
            or not isinstance(my_entry, Mapping)
            or golden_entry.get("shape") != my_entry.get("shape")
        ):
            continue  # a parameter only one run has, or a shard of it (tensor parallel), is not comparable whole
        target = _less_precise(str(golden_entry.get("dtype")), str(my_entry.get("dtype")))
        golden_digest = (golden_entry.get("rounded") or {}).get(target)
        my_digest = (my_entry.get("rounded") or {}).get(target)
        if target is None or golden_digest is None or my_digest is None:
            continue  # not comparable at one dtype (an integer parameter, a dtype newer than the capture)
        if golden_digest != my_digest:
            differing.append(f"{golden.key.name}.{parameter}")
            targets.append(target)
    if not differing:
        return None
    return WeightFinding(", ".join(differing), None, None, None, max(targets, key=_PRECISION.index), len(differing))
