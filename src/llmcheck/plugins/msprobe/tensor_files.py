"""msprobe's tensor files (``dump_tensor_data/*.pt``), loaded without ever running a pickle.

msprobe saves each tensor with ``torch.save``: a pickle inside a zip. llmcheck loads it with
``torch.load(weights_only=True)``, which unpickles tensors and plain containers only, and
then requires the content to be one tensor: a file holding anything else -- an object whose
unpickling would run code, a dict, a number -- is refused with a one-line error naming the
file. ``.npy`` files (msprobe's numpy arrays) are read with ``allow_pickle=False``.

When a dump is read, each file's dtype and shape are read (memory-mapped, no tensor data)
and held against what ``dump.json`` says: :func:`saved_tensor_description`.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from llmcheck.plugin_api import DumpFormatError

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: Tensor-file suffixes llmcheck reads, each with a loader that executes no pickled code.
TENSOR_SUFFIXES = (".pt", ".npy")
_REFUSED_HINT = "llmcheck loads msprobe tensors with torch.load(weights_only=True) only; re-dump the tensor"


def load_pt_tensor(path: Path) -> torch.Tensor:
    """Return the one tensor a ``.pt`` file holds, loaded with ``weights_only=True``."""
    import torch

    from llmcheck.plugin_api import load_weights_only

    content = load_weights_only(path, refused_hint=_REFUSED_HINT)
    if not isinstance(content, torch.Tensor):
        raise DumpFormatError(
            f"refused: holds a {type(content).__name__}, not a tensor", where=path, hint=_REFUSED_HINT
        )
    return content


def load_npy_tensor(path: Path) -> torch.Tensor:
    """Return the array a ``.npy`` file holds as a tensor, read with ``allow_pickle=False``."""
    import numpy as np
    import torch

    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DumpFormatError(
            f"refused: not a plain .npy array ({str(exc).strip().splitlines()[0]})", where=path
        ) from exc
    return torch.from_numpy(np.ascontiguousarray(array))


def saved_tensor_description(path: Path) -> tuple[str, tuple[int, ...]]:
    """Return the dtype name (``"float32"``) and shape of the tensor a tensor file holds, reading no data."""
    if path.suffix == ".npy":
        import numpy as np

        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise DumpFormatError(
                f"refused: not a plain .npy array ({str(exc).strip().splitlines()[0]})", where=path
            ) from exc
        return str(array.dtype), tuple(int(size) for size in array.shape)
    tensor = load_pt_tensor(path)  # memory-mapped: the bytes stay on disk
    return str(tensor.dtype).removeprefix("torch."), tuple(int(size) for size in tensor.shape)


def tensor_loader(path: Path) -> partial[torch.Tensor]:
    """Return a picklable loader of a tensor file (worker processes measure pairs too)."""
    if path.suffix == ".npy":
        return partial(load_npy_tensor, path)
    return partial(load_pt_tensor, path)
