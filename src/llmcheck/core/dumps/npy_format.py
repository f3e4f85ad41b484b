"""The header of an ``.npy`` file, read safely: every reader of ``.npy`` files (FX dumps, single files) uses this.

numpy parses the header by evaluating its text as a Python literal, so a corrupt header can
fail in many ways (``TokenError``, ``SyntaxError``, ``MemoryError``...); each one is turned
into one :class:`~llmcheck.core.errors.DumpFormatError` naming the file, and the data the
header promises is checked against the file's size before anything maps it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmcheck.core.errors import DumpFormatError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """The header of an ``.npy`` file: dtype, shape, order, where the data starts."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    data_offset: int


def read_npy_header(path: Path) -> NpyHeader:
    """Return an ``.npy`` file's header; a truncated or corrupt file is a :class:`DumpFormatError`."""
    import numpy as np
    from numpy.lib import format as npy_format

    try:
        with open(path, "rb") as stream:
            try:
                version = npy_format.read_magic(stream)
                if version == (1, 0):
                    shape, fortran_order, dtype = npy_format.read_array_header_1_0(stream)
                else:
                    shape, fortran_order, dtype = npy_format.read_array_header_2_0(stream)
            except Exception as exc:  # numpy evaluates the header text: any failure of it is a corrupt header
                raise DumpFormatError(
                    f"not a valid .npy file: {type(exc).__name__}: {exc}", where=path, offset=stream.tell()
                ) from None
            data_offset = stream.tell()
    except OSError as exc:
        raise DumpFormatError(f"cannot read the file: {exc.strerror}", where=path) from exc
    header = NpyHeader(np.dtype(dtype), tuple(int(d) for d in shape), bool(fortran_order), data_offset)
    if any(size < 0 for size in header.shape):
        raise DumpFormatError(f"header gives a negative shape {list(header.shape)}", where=path, offset=10)
    if not header.dtype.hasobject:
        needed = math.prod(header.shape) * header.dtype.itemsize
        available = path.stat().st_size - data_offset
        if available < needed:
            raise DumpFormatError(
                f"truncated: {header.dtype} shape {list(header.shape)} needs {needed} bytes "
                f"but the file holds {available}",
                where=path,
                offset=data_offset + available,
            )
    return header
