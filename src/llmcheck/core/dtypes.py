"""Dtype names and what they mean: bytes per element, floating or not, the class thresholds are kept by.

Why a module of its own: every layer needs these facts (the records, the tensor bytes'
readers, the verdicts) and none of them should import another to get them. Names are
torch's canonical dtype names as strings (``"float32"``, ``"bfloat16"``), so asking costs
no torch import.
"""

from __future__ import annotations

#: Bytes per element of every dtype name llmcheck understands (torch's names).
DTYPE_ITEMSIZE: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "complex32": 4,
}

FLOAT_DTYPES = frozenset(
    {
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    }
)


_DTYPE_CLASSES: dict[str, str] = {}


def is_float_dtype(dtype: str) -> bool:
    """Return whether a dtype name is a floating-point (or complex) type."""
    return dtype in FLOAT_DTYPES or dtype.startswith("complex")


def dtype_class(dtype: str) -> str:
    """Return the threshold class of a dtype name: fp64, fp32, fp16, bf16, fp8, int, bool or complex."""
    known = _DTYPE_CLASSES.get(dtype)  # asked for every metric of every pair
    if known is not None:
        return known
    if dtype.startswith("float8"):
        known = "fp8"
    else:
        known = {
            "float64": "fp64",
            "float32": "fp32",
            "float16": "fp16",
            "bfloat16": "bf16",
            "bool": "bool",
        }.get(dtype, "complex" if dtype.startswith("complex") else "int")
    _DTYPE_CLASSES[dtype] = known
    return known
