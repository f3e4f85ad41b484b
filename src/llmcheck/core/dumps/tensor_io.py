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

from llmcheck.core.dtypes import DTYPE_ITEMSIZE
from llmcheck.core.errors import DumpFormatError

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
            where=path,
            offset=offset,
        )
    file_size = Path(path).stat().st_size
    if offset < 0 or offset + nbytes > file_size:
        raise DumpFormatError(
            f"tensor bytes {offset}..{offset + nbytes} run past the end of the file ({file_size} bytes)",
            where=path,
            offset=min(max(offset, 0), file_size),
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
    return tensor.reshape(-1).view(torch.uint8).numpy().data.cast("B")


def load_weights_only(path: Path, refused_hint: str | None = None) -> object:
    """Return what a ``torch.save`` file holds, loaded with ``weights_only=True`` (memory-mapped where it can be).

    Only tensors and plain containers are unpickled, so no code in the file ever runs. A file
    that needs more is refused, and an unreadable one is a :class:`DumpFormatError`, both
    naming the file; ``refused_hint`` is what the refusal tells the user to do.
    """
    import pickle

    if Path(path).stat().st_size == 0:
        raise DumpFormatError("is empty (0 bytes), not a torch file", where=path, hint="save the tensor again")
    try:
        try:  # memory-mapped: only the bytes a chunk needs are read
            content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            content = torch.load(path, map_location="cpu", weights_only=True)  # the legacy (non-zip) format
    except pickle.UnpicklingError as exc:
        raise DumpFormatError(
            f"refused: not loadable with weights_only=True ({_first_line(exc)})",
            where=path,
            hint=refused_hint or "llmcheck never unpickles arbitrary objects; save plain tensors or containers of them",
        ) from exc
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise DumpFormatError(f"not a readable torch file: {_first_line(exc)}", where=path) from exc
    _refuse_dataless(content, path, "")
    return content


def _first_line(exc: BaseException) -> str:
    """Return the first line of an exception's message, or its type's name when it has none (an empty file's)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _refuse_dataless(content: object, path: Path, name: str) -> None:
    """Raise naming the first tensor in a loaded file that holds no dense values: a meta or a sparse tensor."""
    if isinstance(content, torch.Tensor):
        which = f"tensor {name!r}" if name else "a tensor"
        if content.is_meta:
            raise DumpFormatError(
                f"holds {which} on the meta device, which has no values (only a shape and a dtype)",
                where=path,
                hint="save the tensor of a real run",
            )
        if content.layout != torch.strided:
            raise DumpFormatError(
                f"holds {which} of layout {content.layout}, not a dense tensor",
                where=path,
                hint="save tensor.to_dense()",
            )
    elif isinstance(content, dict):
        for key, item in content.items():
            _refuse_dataless(item, path, f"{name}.{key}" if name else str(key))
    elif isinstance(content, (list, tuple)):
        for index, item in enumerate(content):
            _refuse_dataless(item, path, f"{name}.{index}" if name else str(index))
