"""The one table of opcheck's precision criteria: per output dtype, which error, what tolerance, what pass rate.

An op's dumped output passes when the share of its elements whose error is within the
tolerance *meets* the required share (``>=``: a 100 % result meets a 100 % requirement,
which the original tool's ``>`` made impossible for bool outputs). The floating-point
tolerances are the original tool's (``2^-20`` fp32, ``2^-10`` fp16, ``2^-8`` bf16: a
few units of the dtype's rounding); integers are judged by absolute difference (exact for
wide integers, off-by-one rounding allowed for the narrow ones quantised ops produce),
booleans exactly.

The relative error of element ``i`` is ``|my_i - ref_i| / max(|ref_i|, floor)`` where
``floor`` is the smallest normal number of the output dtype: below it the dtype's spacing
is constant, so a value near zero is held to the dtype's resolution there instead of being
ignored (the original counted any error at a reference value under fp32 epsilon as zero).

A fixed relative tolerance cannot judge an accumulation: an fp32 matmul or attention whose
terms cancel to near zero carries the rounding of its large partial sums, far past 2^-20 of
its small result, in a perfectly healthy run. So where the op's reference can replay it at
the recorded run's precision (its inputs in their dumped dtypes, on the CPU) and that replay
itself misses the fixed tolerance somewhere (an accumulation), an element also passes when
its error is within ``RECORDED_ROUNDING_MULTIPLE`` times the error that replay makes at that
element, or within ``RECORDED_NOISE_MULTIPLE`` times the replay's root-mean-square error
over the output, so a kernel adding in another order passes too. An elementwise op's replay
is within its dtype's rounding, so a wrong elementwise kernel is judged by the fixed
tolerance alone.
"""

from __future__ import annotations

from dataclasses import dataclass

RELATIVE = "relative"
ABSOLUTE = "absolute"


@dataclass(frozen=True, slots=True)
class Criterion:
    """How one output dtype is judged: the error kind, its tolerance, and the share of elements that must meet it."""

    error_kind: str
    tolerance: float
    required_pass_percent: float

    def standard_text(self) -> str:
        """Return the report's ``precision_standard`` cell, e.g. ``99.9%(rel_error<=0.0009765625)``."""
        error = "rel_error" if self.error_kind == RELATIVE else "abs_error"
        return f"{self.required_pass_percent:g}%({error}<={self.tolerance:.10g})"

    def passes(self, pass_percent: float) -> bool:
        """Return whether a measured pass rate (in percent) meets the requirement."""
        return pass_percent >= self.required_pass_percent


#: The table: output dtype name -> criterion.
CRITERIA: dict[str, Criterion] = {
    "float64": Criterion(RELATIVE, 2.0**-40, 99.99),
    "float32": Criterion(RELATIVE, 2.0**-20, 99.99),
    "float16": Criterion(RELATIVE, 2.0**-10, 99.9),
    "bfloat16": Criterion(RELATIVE, 2.0**-8, 99.9),
    # One unit in the last place of each fp8 format (3 and 2 mantissa bits).
    "float8_e4m3fn": Criterion(RELATIVE, 2.0**-3, 99.9),
    "float8_e4m3fnuz": Criterion(RELATIVE, 2.0**-3, 99.9),
    "float8_e5m2": Criterion(RELATIVE, 2.0**-2, 99.9),
    "float8_e5m2fnuz": Criterion(RELATIVE, 2.0**-2, 99.9),
    "int64": Criterion(ABSOLUTE, 0.0, 99.99),
    "int32": Criterion(ABSOLUTE, 0.0, 99.99),
    "uint64": Criterion(ABSOLUTE, 0.0, 99.99),
    "uint32": Criterion(ABSOLUTE, 0.0, 99.99),
    "int16": Criterion(ABSOLUTE, 1.0, 99.9),
    "uint16": Criterion(ABSOLUTE, 1.0, 99.9),
    "int8": Criterion(ABSOLUTE, 1.0, 99.9),
    "uint8": Criterion(ABSOLUTE, 1.0, 99.0),
    "bool": Criterion(ABSOLUTE, 0.0, 100.0),
}


#: Where the replay at the recorded precision misses the fixed tolerance, an element passes within this many
#: times the error that replay makes there ...
RECORDED_ROUNDING_MULTIPLE = 2.0
#: ... or within this many times that replay's root-mean-square error over the output.
RECORDED_NOISE_MULTIPLE = 8.0


def criterion_for(dtype: str) -> Criterion | None:
    """Return the criterion of an output dtype name, or ``None`` when opcheck cannot judge that dtype."""
    return CRITERIA.get(dtype)
