"""The GE dump's dtype and format enumerations (``toolkit.dumpdata``), mapped to llmcheck's names.

The data-dump proto numbers dtypes its own way -- not ACL's ``aclDataType`` (ACL has
FLOAT16 = 1, here FLOAT = 1, FLOAT16 = 2; BF16 is 27 here). Types with no torch
counterpart (HIFLOAT8, FLOAT6/FLOAT4, UINT1, STRING, ...) keep their GE name and carry no
data handle, so a report shows them instead of misreading their bytes.
"""

from __future__ import annotations

#: GE ``OutputDataType`` number -> GE name (without the ``DT_`` prefix).
GE_DTYPE_NAMES: dict[int, str] = {
    0: "UNDEFINED",
    1: "FLOAT",
    2: "FLOAT16",
    3: "INT8",
    4: "UINT8",
    5: "INT16",
    6: "UINT16",
    7: "INT32",
    8: "INT64",
    9: "UINT32",
    10: "UINT64",
    11: "BOOL",
    12: "DOUBLE",
    13: "STRING",
    14: "DUAL_SUB_INT8",
    15: "DUAL_SUB_UINT8",
    16: "COMPLEX64",
    17: "COMPLEX128",
    18: "QINT8",
    19: "QINT16",
    20: "QINT32",
    21: "QUINT8",
    22: "QUINT16",
    23: "RESOURCE",
    24: "STRING_REF",
    25: "DUAL",
    26: "VARIANT",
    27: "BF16",
    28: "INT4",
    29: "UINT1",
    30: "INT2",
    31: "UINT2",
    32: "COMPLEX32",
    33: "HIFLOAT8",
    34: "FLOAT8_E5M2",
    35: "FLOAT8_E4M3FN",
    36: "FLOAT8_E8M0",
    37: "FLOAT6_E3M2",
    38: "FLOAT6_E2M3",
    39: "FLOAT4_E2M1",
    40: "FLOAT4_E1M2",
}

#: GE dtype number -> canonical torch dtype name, for every type whose bytes torch can hold.
GE_DTYPE_TO_TORCH: dict[int, str] = {
    1: "float32",
    2: "float16",
    3: "int8",
    4: "uint8",
    5: "int16",
    6: "uint16",
    7: "int32",
    8: "int64",
    9: "uint32",
    10: "uint64",
    11: "bool",
    12: "float64",
    16: "complex64",
    17: "complex128",
    18: "int8",
    19: "int16",
    20: "int32",
    21: "uint8",
    22: "uint16",
    27: "bfloat16",
    32: "complex32",
    34: "float8_e5m2",
    35: "float8_e4m3fn",
    36: "float8_e8m0fnu",
}

#: canonical torch dtype name -> GE dtype number (the writer's direction; quantised types excluded).
TORCH_TO_GE_DTYPE: dict[str, int] = {
    name: code for code, name in GE_DTYPE_TO_TORCH.items() if code not in (18, 19, 20, 21, 22)
}

#: GE ``OutputFormat`` number -> name (without the ``FORMAT_`` prefix).
GE_FORMAT_NAMES: dict[int, str] = {
    0: "NCHW",
    1: "NHWC",
    2: "ND",
    3: "NC1HWC0",
    4: "FRACTAL_Z",
    5: "NC1C0HWPAD",
    6: "NHWC1C0",
    7: "FSR_NCHW",
    8: "FRACTAL_DECONV",
    9: "C1HWNC0",
    10: "FRACTAL_DECONV_TRANSPOSE",
    11: "FRACTAL_DECONV_SP_STRIDE_TRANS",
    12: "NC1HWC0_C04",
    13: "FRACTAL_Z_C04",
    14: "CHWN",
    15: "FRACTAL_DECONV_SP_STRIDE8_TRANS",
    16: "HWCN",
    17: "NC1KHKWHWC0",
    18: "BN_WEIGHT",
    19: "FILTER_HWCK",
    20: "HASHTABLE_LOOKUP_LOOKUPS",
    21: "HASHTABLE_LOOKUP_KEYS",
    22: "HASHTABLE_LOOKUP_VALUE",
    23: "HASHTABLE_LOOKUP_OUTPUT",
    24: "HASHTABLE_LOOKUP_HITS",
    25: "C1HWNCoC0",
    26: "MD",
    27: "NDHWC",
    28: "FRACTAL_ZZ",
    29: "FRACTAL_NZ",
    30: "NCDHW",
    31: "DHWCN",
    32: "NDC1HWC0",
    33: "FRACTAL_Z_3D",
    34: "CN",
    35: "NC",
    36: "DHWNC",
    37: "FRACTAL_Z_3D_TRANSPOSE",
    38: "FRACTAL_ZN_LSTM",
    39: "FRACTAL_Z_G",
    40: "RESERVED",
    41: "ALL",
    42: "NULL",
    43: "ND_RNN_BIAS",
    44: "FRACTAL_ZN_RNN",
    45: "YUV",
    46: "YUV_A",
    255: "MAX",
}

FORMAT_ND = 2
FORMAT_NC1HWC0 = 3
FORMAT_FRACTAL_NZ = 29

#: Formats whose bytes are already in the logical row-major order of ``shape``.
PLAIN_FORMATS = frozenset({0, 1, 2, 14, 16, 26, 27, 30, 31, 34, 35, 36, 40, 41, 42})


def ge_dtype_name(code: int) -> str:
    """Return the GE name of a dtype number (``27`` -> ``"BF16"``), or ``"DT_<n>"`` when unknown."""
    return GE_DTYPE_NAMES.get(code, f"DT_{code}")


def ge_format_name(code: int) -> str:
    """Return the GE name of a format number (``29`` -> ``"FRACTAL_NZ"``), or ``"FORMAT_<n>"``."""
    return GE_FORMAT_NAMES.get(code, f"FORMAT_{code}")
