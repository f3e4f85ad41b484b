"""FRACTAL_NZ <-> ND: undo (and, for tests and tools, redo) the Ascend NZ tiling of a matrix.

ATB dumps a tensor's device buffer as it is, so an NZ tensor's bytes are tiles and its
``dims`` are the storage dims. ATB's NZ storage is ``[..., n1, m, n0]``: the ND matrix
``[..., m, n]`` with ``m`` padded to a multiple of 16 and ``n`` cut into ``n1`` column
blocks of ``n0`` (16, or 32 for int8), each block stored row by row
(``TransdataOperation`` in ascend-transformer-boost gives ``[b, n1, m16, n0]``). The
``.bin`` file does not record the unpadded ND shape, so the ND tensor keeps the
alignment padding: shape ``[..., m16, n1 * n0]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: Rows of one NZ tile.
NZ_ROWS = 16


def nd_shape_of_nz(storage_dims: Sequence[int]) -> tuple[int, ...]:
    """Return the ND shape ``[..., m, n1 * n0]`` of NZ storage dims ``[..., n1, m, n0]``.

    Raises ``ValueError`` for fewer than three storage dims (no NZ layout has that).
    """
    dims = tuple(int(d) for d in storage_dims)
    if len(dims) < 3:
        raise ValueError(f"FRACTAL_NZ storage needs at least 3 dims [.., n1, m, n0], got {list(dims)}")
    *leading, n1, m, n0 = dims
    return (*leading, m, n1 * n0)


def nz_to_nd(storage: torch.Tensor) -> torch.Tensor:
    """Return the ND matrix held by an NZ-tiled tensor of storage shape ``[..., n1, m, n0]``."""
    if storage.dim() < 3:
        raise ValueError(f"FRACTAL_NZ storage needs at least 3 dims [.., n1, m, n0], got {list(storage.shape)}")
    nd_shape = nd_shape_of_nz(storage.shape)
    return storage.transpose(-3, -2).contiguous().reshape(nd_shape)


def nd_to_nz(matrix: torch.Tensor, block_columns: int = 16) -> torch.Tensor:
    """Return ``matrix`` ``[..., m, n]`` tiled as NZ storage ``[..., n1, m16, n0]`` (zero padded).

    A 2-D matrix gets a leading batch dim of 1, as ATB's transdata gives it.
    ``block_columns`` is ``n0``: 16 for 16-bit types, 32 for int8.
    """
    import torch

    if matrix.dim() < 2:
        raise ValueError("nd_to_nz needs a matrix of at least 2 dims")
    if matrix.dim() == 2:
        matrix = matrix.unsqueeze(0)
    *leading, m, n = matrix.shape
    m_padded = -(-m // NZ_ROWS) * NZ_ROWS
    n_padded = -(-n // block_columns) * block_columns
    padded = torch.zeros((*leading, m_padded, n_padded), dtype=matrix.dtype)
    padded[..., :m, :n] = matrix
    blocks = padded.reshape(*leading, m_padded, n_padded // block_columns, block_columns)
    return blocks.transpose(-3, -2).contiguous()
