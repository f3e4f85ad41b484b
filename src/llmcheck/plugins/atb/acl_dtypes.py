"""The ACL/ATB dtype and format codes, and the names ATB writes for them in CSV files.

An ATB ``.bin`` header says ``dtype=27`` and ``format=29``; the op CSV says ``bf16`` and
``fractal_nz`` (older ATB: ``ACL_BF16``). This module is the one table that turns any of
those spellings into llmcheck's dtype names (torch's, see :mod:`llmcheck.core.records`)
and back, so the reader, the writer, the CSV parser and the ONNX export agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AclDtype:
    """One ``aclDataType`` code: its ATB string name, llmcheck's name and how its bytes are packed.

    ``torch_name`` is ``None`` for kinds torch has no dtype for (string, hifloat8, fp6,
    fp4, uint1): a file of that kind is described but its data is not loaded.
    ``elements_per_byte`` is 2 for the packed 4-bit kinds, else 1 (``itemsize`` bytes each).
    """

    code: int
    atb_name: str
    torch_name: str | None
    itemsize: int
    elements_per_byte: int = 1

    def payload_bytes(self, numel: int) -> int:
        """Return how many bytes ``numel`` elements of this dtype take in a payload."""
        if self.elements_per_byte > 1:
            return -(-numel // self.elements_per_byte)
        return numel * self.itemsize


#: Every code of ``aclDataType`` (== ``Mki::TensorDType``) that a probe can write.
ACL_DTYPES: tuple[AclDtype, ...] = (
    AclDtype(0, "float", "float32", 4),
    AclDtype(1, "float16", "float16", 2),
    AclDtype(2, "int8", "int8", 1),
    AclDtype(3, "int32", "int32", 4),
    AclDtype(4, "uint8", "uint8", 1),
    AclDtype(6, "int16", "int16", 2),
    AclDtype(7, "uint16", "uint16", 2),
    AclDtype(8, "uint32", "uint32", 4),
    AclDtype(9, "int64", "int64", 8),
    AclDtype(10, "uint64", "uint64", 8),
    AclDtype(11, "double", "float64", 8),
    AclDtype(12, "bool", "bool", 1),
    AclDtype(13, "string", None, 1),
    AclDtype(16, "complex64", "complex64", 8),
    AclDtype(17, "complex128", "complex128", 16),
    AclDtype(27, "bf16", "bfloat16", 2),
    # int4 is unpacked to int8 on load (two elements per byte, low nibble first).
    AclDtype(29, "int4", "int8", 1, elements_per_byte=2),
    AclDtype(30, "uint1", None, 1, elements_per_byte=8),
    AclDtype(33, "complex32", "complex32", 4),
    AclDtype(34, "hifloat8", None, 1),
    AclDtype(35, "float8_e5m2", "float8_e5m2", 1),
    AclDtype(36, "float8_e4m3fn", "float8_e4m3fn", 1),
    AclDtype(37, "float8_e8m0", "float8_e8m0fnu", 1),
    AclDtype(38, "float6_e3m2", None, 1),
    AclDtype(39, "float6_e2m3", None, 1),
    AclDtype(40, "float4_e2m1", None, 1, elements_per_byte=2),
    AclDtype(41, "float4_e1m2", None, 1, elements_per_byte=2),
)

DTYPE_BY_CODE: dict[int, AclDtype] = {dtype.code: dtype for dtype in ACL_DTYPES}
DTYPE_BY_ATB_NAME: dict[str, AclDtype] = {dtype.atb_name: dtype for dtype in ACL_DTYPES}
#: The code a writer uses for a torch dtype name (int8 is int8, never int4).
CODE_BY_TORCH_NAME: dict[str, int] = {
    dtype.torch_name: dtype.code for dtype in ACL_DTYPES if dtype.torch_name and dtype.elements_per_byte == 1
}

#: Older ATB wrote the ``aclDataType`` enumerator names (``ACL_FLOAT16``) in CSV files.
_ACL_ENUM_NAMES: dict[str, str] = {
    "ACL_FLOAT": "float",
    "ACL_FLOAT16": "float16",
    "ACL_INT8": "int8",
    "ACL_INT32": "int32",
    "ACL_UINT8": "uint8",
    "ACL_INT16": "int16",
    "ACL_UINT16": "uint16",
    "ACL_UINT32": "uint32",
    "ACL_INT64": "int64",
    "ACL_UINT64": "uint64",
    "ACL_DOUBLE": "double",
    "ACL_BOOL": "bool",
    "ACL_STRING": "string",
    "ACL_COMPLEX64": "complex64",
    "ACL_COMPLEX128": "complex128",
    "ACL_BF16": "bf16",
    "ACL_INT4": "int4",
    "ACL_UINT1": "uint1",
    "ACL_COMPLEX32": "complex32",
}

#: ``aclFormat`` codes and the lower-case names CSV files use.
FORMAT_NAMES: dict[int, str] = {
    0: "nchw",
    1: "nhwc",
    2: "nd",
    3: "nc1hwc0",
    4: "fractal_z",
    12: "nc1hwc0_c04",
    16: "hwcn",
    27: "ndhwc",
    29: "fractal_nz",
    30: "ncdhw",
    32: "ndc1hwc0",
    33: "fractal_z_3d",
    35: "nc",
    47: "ncl",
    50: "fractal_nz_c0_16",
    51: "fractal_nz_c0_32",
}
FORMAT_ND = 2
#: Formats whose bytes are plain row-major data of the stored dims (no tiling to undo).
ROW_MAJOR_FORMATS = frozenset({0, 1, 2, 16, 27, 30, 35, 47})
#: Formats whose bytes are FRACTAL_NZ tiles (converted to ND on load).
NZ_FORMATS = frozenset({29, 50, 51})


def dtype_for_code(code: int) -> AclDtype | None:
    """Return the ACL dtype of a header's ``dtype=`` code, or ``None`` for an unknown code."""
    return DTYPE_BY_CODE.get(code)


def dtype_from_csv_name(name: str) -> AclDtype | None:
    """Return the ACL dtype a CSV cell names (``bf16``, ``float``, ``ACL_FLOAT16``), or ``None``."""
    text = name.strip()
    text = _ACL_ENUM_NAMES.get(text.upper(), text) if text.upper().startswith("ACL_") else text.lower()
    return DTYPE_BY_ATB_NAME.get(text)


def format_name(code: int) -> str:
    """Return the lower-case name of a format code (``29`` -> ``fractal_nz``), or ``format_<code>``."""
    return FORMAT_NAMES.get(code, f"format_{code}")
