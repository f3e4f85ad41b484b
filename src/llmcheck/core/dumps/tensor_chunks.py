"""A record's data as a stream of float64 chunks: memory-mapped, any dtype, bounded memory.

Comparing two multi-gigabyte dumps must not hold a float64 copy of a tensor, nor even the
whole tensor: a byte range is memory-mapped, decoded chunk by chunk into a reused float64
buffer, and the pages already read are dropped from the process (``MADV_DONTNEED``) so its
resident memory stays near the chunk buffers whatever the tensor size. Decoding is numpy
only -- bf16 by a bit shift, fp8 by a 256-entry table -- so the worker processes that run it
never import torch. Data reached through a loader (pickled ``.pt`` files, formats that need
decoding) is loaded once and streamed from memory the same way.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from llmcheck.core.dtypes import DTYPE_ITEMSIZE
from llmcheck.core.errors import DumpFormatError
from llmcheck.core.records import TensorData

#: Mapped pages are dropped once this many bytes past the last drop have been read.
_DROP_EVERY_BYTES = 8 * 1024 * 1024

Decoder = Callable[[np.ndarray, np.ndarray, "ScratchFn"], None]
ScratchFn = Callable[[str, int, np.dtype], np.ndarray]


def _fp8_table(exponent_bits: int, mantissa_bits: int, bias: int, *, ieee_special: bool, fnuz: bool) -> np.ndarray:
    """Return the float64 value of each of the 256 codes of an 8-bit float format."""
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exponent = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = codes & ((1 << mantissa_bits) - 1)
    fraction = mantissa / float(1 << mantissa_bits)
    normal = sign * (1.0 + fraction) * np.exp2(exponent.astype(np.float64) - bias)
    subnormal = sign * fraction * 2.0 ** (1 - bias)
    values = np.where(exponent == 0, subnormal, normal)
    top = (1 << exponent_bits) - 1
    if fnuz:  # no infinities, no negative zero: 0x80 is the only NaN
        values[0x80] = np.nan
    elif ieee_special:  # e5m2: all-ones exponent is Inf (mantissa 0) or NaN
        values[(exponent == top) & (mantissa == 0)] = np.inf * sign[(exponent == top) & (mantissa == 0)]
        values[(exponent == top) & (mantissa != 0)] = np.nan
    else:  # e4m3fn: no infinities, only S.1111.111 is NaN
        values[(exponent == top) & (mantissa == (1 << mantissa_bits) - 1)] = np.nan
    return values


def _e8m0_table() -> np.ndarray:
    """Return the float64 value of each code of float8_e8m0fnu (a power of two; 0xFF is NaN)."""
    values = np.exp2(np.arange(256, dtype=np.float64) - 127.0)
    values[255] = np.nan
    return values


_FP8_TABLES: dict[str, Callable[[], np.ndarray]] = {
    "float8_e4m3fn": lambda: _fp8_table(4, 3, 7, ieee_special=False, fnuz=False),
    "float8_e5m2": lambda: _fp8_table(5, 2, 15, ieee_special=True, fnuz=False),
    "float8_e4m3fnuz": lambda: _fp8_table(4, 3, 8, ieee_special=False, fnuz=True),
    "float8_e5m2fnuz": lambda: _fp8_table(5, 2, 16, ieee_special=False, fnuz=True),
    "float8_e8m0fnu": _e8m0_table,
}
_table_cache: dict[str, np.ndarray] = {}


def fp8_table(dtype: str) -> np.ndarray:
    """Return the 256-entry float64 decoding table of an fp8 dtype name."""
    table = _table_cache.get(dtype)
    if table is None:
        table = _table_cache[dtype] = _FP8_TABLES[dtype]()
    return table


def _copy(raw: np.ndarray, out: np.ndarray, scratch: ScratchFn) -> None:
    np.copyto(out, raw, casting="unsafe")


def _bfloat16(raw: np.ndarray, out: np.ndarray, scratch: ScratchFn) -> None:
    widened = scratch("bf16_bits", raw.size, np.dtype(np.uint32))
    np.copyto(widened, raw)
    np.left_shift(widened, 16, out=widened)
    np.copyto(out, widened.view(np.float32))


def _table_decoder(dtype: str) -> Decoder:
    def decode(raw: np.ndarray, out: np.ndarray, scratch: ScratchFn) -> None:
        np.take(fp8_table(dtype), raw, out=out)

    return decode


#: dtype name -> (numpy carrier dtype of the stored items, float64 values per element, decoder)
_LAYOUT: dict[str, tuple[np.dtype, int, Decoder]] = {
    "float64": (np.dtype("<f8"), 1, _copy),
    "float32": (np.dtype("<f4"), 1, _copy),
    "float16": (np.dtype("<f2"), 1, _copy),
    "bfloat16": (np.dtype("<u2"), 1, _bfloat16),
    "int64": (np.dtype("<i8"), 1, _copy),
    "int32": (np.dtype("<i4"), 1, _copy),
    "int16": (np.dtype("<i2"), 1, _copy),
    "int8": (np.dtype("i1"), 1, _copy),
    "uint64": (np.dtype("<u8"), 1, _copy),
    "uint32": (np.dtype("<u4"), 1, _copy),
    "uint16": (np.dtype("<u2"), 1, _copy),
    "uint8": (np.dtype("u1"), 1, _copy),
    "bool": (np.dtype("u1"), 1, _copy),
    # complex numbers are compared as their interleaved real and imaginary parts
    "complex128": (np.dtype("<f8"), 2, _copy),
    "complex64": (np.dtype("<f4"), 2, _copy),
    "complex32": (np.dtype("<f2"), 2, _copy),
    **{name: (np.dtype("u1"), 1, _table_decoder(name)) for name in _FP8_TABLES},
}


def streamable(dtype: str) -> bool:
    """Return whether tensors of this dtype can be streamed as float64 values."""
    return dtype in _LAYOUT


def layout(dtype: str, *, strict: bool = True) -> tuple[np.dtype, int, Decoder] | None:
    """Return how a dtype is stored and decoded: carrier dtype, float64 values per element, decoder.

    An unknown dtype raises (``strict``) or gives None.
    """
    described = _LAYOUT.get(dtype)
    if described is None and strict:
        raise DumpFormatError(f"cannot compare tensors of dtype {dtype!r}")
    return described


class ChunkReader:
    """Reads one tensor as float64 values, chunk by chunk, from a mapped byte range or an in-memory buffer."""

    def __init__(self, data: TensorData) -> None:
        self.dtype = data.dtype
        carrier, per_element, self._decode = layout(data.dtype)  # type: ignore[misc]
        self.size = data.numel * per_element
        self._map: mmap.mmap | None = None
        self._map_base = 0
        self._dropped_to = 0
        self._keep_alive: object = None
        if self.size == 0:
            self._raw = np.empty(0, dtype=carrier)
        elif data.loader is not None:
            self._raw = self._from_loader(data, carrier)
        else:
            self._raw = self._from_byte_range(data, carrier)

    def _from_loader(self, data: TensorData, carrier: np.dtype) -> np.ndarray:
        from llmcheck.core.dumps.tensor_io import tensor_bytes

        tensor = data.load().detach().cpu().contiguous()
        self._keep_alive = tensor
        raw = np.frombuffer(tensor_bytes(tensor), dtype=carrier)
        if raw.size != self.size:
            raise DumpFormatError(
                f"loader gave {raw.size} values, the record's shape {list(data.shape)} needs {self.size}",
                where=data.path,
            )
        return raw

    def _from_byte_range(self, data: TensorData, carrier: np.dtype) -> np.ndarray:
        path = Path(data.path)  # type: ignore[arg-type]
        itemsize = DTYPE_ITEMSIZE.get(data.dtype, 0)
        if data.nbytes != data.numel * itemsize:
            raise DumpFormatError(
                f"{data.dtype} shape {list(data.shape)} needs {data.numel * itemsize} bytes but "
                f"the record holds {data.nbytes}",
                where=path,
                offset=data.offset,
            )
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed by the with below; only open() errors caught here
        except FileNotFoundError as exc:
            raise DumpFormatError("tensor data file is missing", where=path) from exc
        with handle:
            file_size = os.fstat(handle.fileno()).st_size
            if data.offset < 0 or data.offset + data.nbytes > file_size:
                raise DumpFormatError(
                    f"tensor bytes {data.offset}..{data.offset + data.nbytes} run past the end "
                    f"of the file ({file_size} bytes)",
                    where=path,
                    offset=min(max(data.offset, 0), file_size),
                )
            aligned = data.offset - data.offset % mmap.ALLOCATIONGRANULARITY
            self._map_base = data.offset - aligned
            self._map = mmap.mmap(
                handle.fileno(), self._map_base + data.nbytes, access=mmap.ACCESS_READ, offset=aligned
            )
        return np.frombuffer(self._map, dtype=carrier, count=self.size, offset=self._map_base)

    def read(self, start: int, out: np.ndarray, scratch: ScratchFn) -> np.ndarray:
        """Decode values ``start .. start+len(out)`` into ``out`` and return it."""
        count = out.size
        self._decode(self._raw[start : start + count], out, scratch)
        if self._map is not None:
            # pages of the chunks before this one: :meth:`float32_source` may still read this one
            self._drop_pages_before(self._map_base + start * self._raw.itemsize)
        return out

    def float32_source(self, start: int, count: int) -> np.ndarray | None:
        """Return values ``start .. start+count`` as the float32 array they are stored as, None for another dtype.

        A view of the mapped file: read it before the next :meth:`read`, which may drop its pages.
        """
        return self._raw[start : start + count] if self.dtype == "float32" else None

    def _drop_pages_before(self, end_byte: int) -> None:
        """Drop already-read pages from this process's resident set (the page cache keeps them)."""
        end_page = end_byte - end_byte % mmap.PAGESIZE
        if end_page - self._dropped_to >= _DROP_EVERY_BYTES and self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED, self._dropped_to, end_page - self._dropped_to)
            self._dropped_to = end_page

    def close(self) -> None:
        """Unmap the file (the reader must not be used afterwards)."""
        self._raw = np.empty(0)
        self._keep_alive = None
        if self._map is not None:
            # a view still alive (an error's traceback holds a chunk) keeps the map until it dies
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None

    def __enter__(self) -> ChunkReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
