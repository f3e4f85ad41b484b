"""What one SGLang ``.pt`` file holds, loaded without ever running a pickle.

Every file is read with ``torch.load(weights_only=True)``, which unpickles tensors and plain
containers only: a file that needs more (a pickled object of the engine's classes) is
refused with one error line naming it. Today's dumper saves ``{"value": ..., "meta": {...}}``;
the first dumpers saved the value alone: both are read. A value is a tensor, a list or
tuple of tensors (one record each), or a number (a 0-d tensor); anything else (a string, a
list of request ids) is not a tensor to compare and is left to the caller to name.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from numbers import Number
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcheck.plugin_api import DumpFormatError

if TYPE_CHECKING:  # pragma: no cover
    import torch

_REFUSED_HINT = "llmcheck loads SGLang dumps with torch.load(weights_only=True) only; dump tensors, not objects"
#: The keys of today's dumper file: ``{"value": ..., "meta": {...}}``.
VALUE_KEY = "value"
META_KEY = "meta"
#: Where inside a loaded value a tensor lies: a dict key, then list indexes.
ItemPath = tuple[Any, ...]


def load_saved(path: Path) -> object:
    """Return what a ``.pt`` file holds, loaded with ``weights_only=True`` (memory-mapped)."""
    # imported here, as torch is below: a compare that reads no SGLang dump must not pay for torch
    from llmcheck.plugin_api import load_weights_only

    return load_weights_only(path, refused_hint=_REFUSED_HINT)


def split_value_and_meta(content: object) -> tuple[object, Mapping[str, Any]]:
    """Return a dumper file's value and its meta dict (empty for the first dumpers' bare values)."""
    if isinstance(content, dict) and VALUE_KEY in content and set(content) <= {VALUE_KEY, META_KEY}:
        meta = content.get(META_KEY)
        return content[VALUE_KEY], meta if isinstance(meta, dict) else {}
    return content, {}


def tensor_items(value: object) -> list[tuple[ItemPath, str, tuple[int, ...]]] | None:
    """Return ``(item path, dtype, shape)`` of each tensor a value holds, or None when it holds none to compare."""
    import torch

    from llmcheck.plugin_api import dtype_name

    if isinstance(value, torch.Tensor):
        return [((), dtype_name(value.dtype), tuple(value.shape))]
    if isinstance(value, bool | int | float) and isinstance(value, Number):
        return [((), dtype_name(torch.tensor(value).dtype), ())]
    if isinstance(value, list | tuple) and value and all(isinstance(item, torch.Tensor) for item in value):
        return [((index,), dtype_name(item.dtype), tuple(item.shape)) for index, item in enumerate(value)]
    return None


def picked(value: object, item_path: ItemPath) -> object:
    """Return the part of a loaded value an item path points to."""
    for step in item_path:
        value = value[step]  # type: ignore[index]
    return value


def load_item(path: Path, item_path: ItemPath, unwrap: bool) -> torch.Tensor:
    """Return the tensor at ``item_path`` inside a ``.pt`` file (``unwrap``: inside the dumper's value first)."""
    import torch

    content = load_saved(path)
    if unwrap:
        content, _ = split_value_and_meta(content)
    try:
        item = picked(content, item_path)
    except (KeyError, IndexError, TypeError) as exc:
        raise DumpFormatError(
            f"no longer holds {'/'.join(map(str, item_path)) or 'its value'}",
            where=path,
            hint="the file changed after the dump was read",
        ) from exc
    if isinstance(item, torch.Tensor):
        return item
    if isinstance(item, bool | int | float):
        return torch.tensor(item)
    raise DumpFormatError(
        f"holds a {type(item).__name__} where a tensor was", where=path, hint="the file changed after the dump was read"
    )


def item_loader(path: Path, item_path: ItemPath, unwrap: bool) -> partial[torch.Tensor]:
    """Return a picklable loader of one tensor of a ``.pt`` file (worker processes measure pairs too)."""
    return partial(load_item, path, item_path, unwrap)
