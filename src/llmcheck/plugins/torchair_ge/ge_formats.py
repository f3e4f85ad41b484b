"""Ascend storage layouts (FRACTAL_NZ, NC1HWC0) converted to and from the plain row-major layout.

GE dumps a tensor in the layout the device kept it in. A matmul operand in FRACTAL_NZ is
stored as ``(..., N1, M1, M0, N0)`` tiles of a logical ``(..., M, N)`` matrix, padded up to
whole tiles; NC1HWC0 stores channels in blocks of C0. The dump's ``shape`` is the storage
shape and ``original_shape`` the logical one, so both conversions are exact reshapes,
permutations and crops -- no tile size has to be guessed.

The loaders are small picklable classes (not closures) so a compare can hand records to
worker processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmcheck.plugin_api import DumpFormatError

if TYPE_CHECKING:  # pragma: no cover
    import torch

NZ_TILE = 16  # the M0 tile height of FRACTAL_NZ for every dtype


def nz_to_nd(storage: torch.Tensor, original_shape: tuple[int, ...]) -> torch.Tensor:
    """Return the logical ``original_shape`` tensor held by a FRACTAL_NZ storage tensor.

    ``storage`` has shape ``(*batch, N1, M1, M0, N0)``; the result is its tiles put back
    in row-major order and cropped to ``original_shape`` (a 1-D shape ``(N,)`` is read as
    ``(1, N)``).
    """
    if storage.dim() < 4:
        raise ValueError(f"a FRACTAL_NZ tensor has at least 4 storage dims, got {list(storage.shape)}")
    *batch, n1, m1, m0, n0 = storage.shape
    logical = tuple(original_shape) if len(original_shape) >= 2 else (1, *original_shape)
    rows, columns = logical[-2], logical[-1]
    if math.prod(batch) != math.prod(logical[:-2]) or rows > m1 * m0 or columns > n1 * n0:
        raise ValueError(f"FRACTAL_NZ storage {list(storage.shape)} cannot hold original shape {list(original_shape)}")
    matrix = storage.reshape(-1, n1, m1, m0, n0).permute(0, 2, 3, 1, 4).reshape(-1, m1 * m0, n1 * n0)
    return matrix[:, :rows, :columns].reshape(original_shape).contiguous()


def nd_to_nz(tensor: torch.Tensor, column_tile: int = NZ_TILE) -> torch.Tensor:
    """Return the FRACTAL_NZ storage of a row-major tensor (the device's layout; used to write test dumps).

    ``column_tile`` is N0: 16 for 16-bit types, 8 for 32-bit, 32 for 8-bit on Ascend.
    """
    import torch

    logical = tensor if tensor.dim() >= 2 else tensor.reshape(1, -1)
    *batch, rows, columns = logical.shape
    m1, n1 = -(-rows // NZ_TILE), -(-columns // column_tile)
    padded = torch.zeros((*batch, m1 * NZ_TILE, n1 * column_tile), dtype=tensor.dtype)
    padded[..., :rows, :columns] = logical
    tiles = padded.reshape(-1, m1, NZ_TILE, n1, column_tile).permute(0, 3, 1, 2, 4)
    return tiles.reshape(*batch, n1, m1, NZ_TILE, column_tile).contiguous()


def nc1hwc0_to_nchw(storage: torch.Tensor, original_shape: tuple[int, ...]) -> torch.Tensor:
    """Return the NCHW tensor held by an NC1HWC0 storage tensor ``(N, C1, H, W, C0)``, channels cropped."""
    if storage.dim() != 5 or len(original_shape) != 4:
        raise ValueError(
            f"NC1HWC0 needs 5 storage dims and a 4-D original shape, got {list(storage.shape)} "
            f"and {list(original_shape)}"
        )
    n, c1, h, w, c0 = storage.shape
    channels = original_shape[1]
    if channels > c1 * c0 or (n, h, w) != (original_shape[0], original_shape[2], original_shape[3]):
        raise ValueError(f"NC1HWC0 storage {list(storage.shape)} cannot hold original shape {list(original_shape)}")
    return storage.permute(0, 1, 4, 2, 3).reshape(n, c1 * c0, h, w)[:, :channels].contiguous()


@dataclass(frozen=True, slots=True)
class StorageLayoutLoader:
    """Loads a GE payload stored in a device layout and returns it in its logical shape."""

    path: Path
    offset: int
    nbytes: int
    dtype: str
    storage_shape: tuple[int, ...]
    original_shape: tuple[int, ...]
    layout: str  # "FRACTAL_NZ" or "NC1HWC0"

    def __call__(self) -> torch.Tensor:
        from llmcheck.plugin_api import tensor_from_byte_range

        storage = tensor_from_byte_range(self.path, self.offset, self.nbytes, self.dtype, self.storage_shape)
        try:
            if self.layout == "FRACTAL_NZ":
                return nz_to_nd(storage, self.original_shape)
            return nc1hwc0_to_nchw(storage, self.original_shape)
        except ValueError as exc:
            raise DumpFormatError(str(exc), where=self.path, offset=self.offset) from None
