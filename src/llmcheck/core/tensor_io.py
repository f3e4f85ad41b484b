"""Raw bytes <-> torch tensors for every dtype, memory-mapped, exact (bf16 and fp8 included).

Every byte-range format (safetensors, ATB ``.bin``, ``.npy`` payloads, GE dump payloads)
goes through here, so dtype handling lives in one place. Importing this module imports
torch; the CLI only reaches it when a command actually reads tensor data.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from llmcheck.core.errors import DumpFormatError
from llmcheck.core.records import DTYPE_ITEMSIZE

#: numpy dtype with the same item size used to map the bytes before viewing them as torch's dtype.
_CARRIER: dict[int, np.dtype] = {1: np.dtype(np.uint8), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}


def torch_dtype(name: str) -> torch.dtype:
    """Return the torch dtype for a canonical dtype name (``"bfloat16"`` -> ``torch.bfloat16``)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise DumpFormatError(f"unknown dtype {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """Return the canonical name of a torch dtype (``torch.float8_e4m3fn`` -> ``"float8_e4m3fn"``)."""
    return str(dtype).removeprefix("torch.")


def all_torch_dtype_names() -> list[str]:
    """Return the names of every dtype this torch build has that llmcheck can store."""
    return [name for name in DTYPE_ITEMSIZE if isinstance(getattr(torch, name, None), torch.dtype)]


def tensor_from_byte_range(
    path: Path | None, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...]
) -> torch.Tensor:
    """Return the tensor stored as raw little-endian bytes at ``path[offset:offset+nbytes]``.

    The file is memory-mapped copy-on-write: nothing is read until the tensor is used, and
    writing to the tensor never touches the file.
    """
    if path is None:
        raise DumpFormatError("tensor has neither a file nor a loader")
    itemsize = DTYPE_ITEMSIZE.get(dtype)
    if itemsize is None:
        raise DumpFormatError(f"unknown dtype {dtype!r}", where=path)
    numel = math.prod(shape)
    if numel * itemsize != nbytes:
        raise DumpFormatError(
            f"{dtype} shape {list(shape)} needs {numel * itemsize} bytes but the record holds {nbytes}",
            where=path, offset=offset,
        )
    file_size = Path(path).stat().st_size
    if offset < 0 or offset + nbytes > file_size:
        raise DumpFormatError(
            f"tensor bytes {offset}..{offset + nbytes} run past the end of the file ({file_size} bytes)",
            where=path, offset=min(max(offset, 0), file_size),
        )
    target = torch_dtype(dtype)
    if numel == 0:
        return torch.empty(shape, dtype=target)
    carrier = np.dtype(np.bool_) if dtype == "bool" else _CARRIER.get(itemsize, np.dtype("<c16"))
    mapped = np.memmap(path, dtype=carrier, mode="c", offset=offset, shape=(numel,))
    flat = torch.from_numpy(mapped)
    if flat.dtype != target:
        flat = flat.view(target)
    return flat.reshape(shape)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """Return a contiguous CPU tensor's bytes without copying (bf16/fp8/bool as raw bytes)."""
    if tensor.device.type != "cpu":
        raise ValueError("tensor_bytes needs a CPU tensor")
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.numel() == 0:
        return memoryview(b"")
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")
