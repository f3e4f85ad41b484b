"""``dump_data``: the seed's manual mapping call, placed by hand in a model script; both of its signatures.

* ``dump_data(token_id, data_id, golden_data, my_path, output_path="./")`` -- saves
  ``golden_data`` to ``{output_path}/ait_dump/{pid}_{device}/golden_tensor/{token_id}/
  {data_id}_tensor.safetensors`` and records, in that ``golden_tensor/metadata.json``, that
  it pairs with ``my_path`` (a tensor file of the run under suspicion, usually an ATB
  ``.bin``). Compare with ``llmcheck compare -gp {output_path}/ait_dump/{pid}_{device} -mp
  ANY``.
* ``dump_data(data_src, data_id, data_val=None, tensor_path=None, token_id=0)`` with
  ``data_src`` ``"golden"`` or ``"acl"`` -- one side per call, written under
  ``./{pid}_cmp_dump_data/{data_src}_tensor/``: *high level* saves ``data_val``;
  *low level* records ``tensor_path``, the path of a tensor inside the ATB dump this same
  process writes (``0_Model/1_Layer/6_NormOpsRunner/after/outTensor0.bin``, relative to
  the execute-count folder ``token_id``). Compare the two ``metadata.json`` files with
  ``llmcheck compare -gp .../golden_tensor/metadata.json -mp .../acl_tensor/metadata.json``.

Tensors are saved as safetensors (no pickle; bf16 and fp8 exact). Every token of a
``data_id`` is kept, and processes writing at once lose nothing (see ``metadata_file``).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from llmcheck.plugin_api import PathOutsideDumpError, UsageError, atomic_write_with, write_failed
from llmcheck.plugins.manual.metadata_file import record_entry

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger("llmcheck.manual")

GOLDEN, ACL = "golden", "acl"
MAPPED_ROOT = "ait_dump"
GOLDEN_FOLDER = "golden_tensor"
TENSOR_SUFFIX = "_tensor.safetensors"
TENSOR_KEY = "tensor"
#: Layouts whose tensors ``.to_dense()`` turns into one dump_data can save.
_SPARSE_LAYOUTS = ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
#: File names longer than this (in bytes) are shortened to a prefix and a hash of the whole data id.
MAX_FILE_NAME_BYTES = 200


def _mapped_signature(
    token_id: int,
    data_id: Any,
    golden_data: Any,
    my_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str] = "./",
) -> None:
    """The first seed document's signature."""


def _sided_signature(
    data_src: str,
    data_id: Any,
    data_val: Any = None,
    tensor_path: str | None = None,
    token_id: int = 0,
    *,
    output_path: str | os.PathLike[str] = "./",
) -> None:
    """The second seed document's signature (``output_path`` added: the folder ``{pid}_cmp_dump_data`` goes in)."""


def dump_data(*args: Any, **kwargs: Any) -> Path:
    """Return the ``metadata.json`` updated by one manual dump call (either seed signature, see the module doc)."""
    first = kwargs.get("data_src", args[0] if args else None)
    sided = "data_src" in kwargs or isinstance(first, str)
    signature = inspect.signature(_sided_signature if sided else _mapped_signature)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise UsageError(f"dump_data{signature}: {exc}", where="dump_data") from None
    bound.apply_defaults()
    if sided:
        return _dump_side(**bound.arguments)
    return _dump_mapped(**bound.arguments)


def _token(token_id: Any) -> str:
    if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
        raise UsageError(f"token_id must be an int >= 0, got {token_id!r}", where="dump_data")
    return str(token_id)


def _data_id(data_id: Any) -> str:
    if isinstance(data_id, bool) or not isinstance(data_id, (int, str)) or str(data_id) in ("", "-1"):
        raise UsageError(f"data_id must be a non-empty str or an int (not -1), got {data_id!r}", where="dump_data")
    return str(data_id)


def tensor_file_name(data_id: str) -> str:
    """Return the file a data id's tensor is saved in: distinct data ids always get distinct names.

    Percent-encoding keeps letters, digits and ``_.-~`` and escapes everything else
    (``/`` and ``%`` included), so ``layer.0/out`` and ``layer.0_out`` no longer meet.
    """
    stem = quote(data_id, safe="")
    if len(stem) > MAX_FILE_NAME_BYTES:
        stem = f"{stem[: MAX_FILE_NAME_BYTES - 17]}~{hashlib.sha256(data_id.encode()).hexdigest()[:16]}"
    return f"{stem}{TENSOR_SUFFIX}"


def _save_tensor(tensor: Any, folder: Path, token_id: str, data_id: str, what: str) -> str:
    """Save one tensor as safetensors and return its path relative to ``folder``.

    Threads and processes saving the same data id at once each write their own temporary
    file; the last rename wins whole. A failed write (a full disk) raises
    :class:`~llmcheck.core.errors.WriteFailedError` naming the file and leaves nothing behind.
    """
    from safetensors.torch import save_file

    _check_tensor(tensor, what, data_id)
    relative = Path(token_id) / tensor_file_name(data_id)
    target = folder / relative
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_failed(target.parent, exc, "cannot create the folder") from exc
    saved = tensor.detach().cpu().contiguous()
    atomic_write_with(target, lambda temporary: save_file({TENSOR_KEY: saved}, temporary))
    return relative.as_posix()


def _check_tensor(tensor: Any, what: str, data_id: str) -> None:
    """Raise a usage error naming the data id unless ``tensor`` is a dense tensor that holds values."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise UsageError(
            f"data_id {data_id!r}: {what} must be a torch.Tensor, got {type(tensor).__name__}", where="dump_data"
        )
    if tensor.is_meta:
        raise UsageError(
            f"data_id {data_id!r}: {what} is a meta tensor, which holds no values (only a shape and a dtype)",
            where="dump_data",
            hint="give the tensor of a real run, on the CPU or an accelerator",
        )
    if tensor.layout != torch.strided:
        sparse = str(tensor.layout).removeprefix("torch.") in _SPARSE_LAYOUTS
        raise UsageError(
            f"data_id {data_id!r}: {what} is a {'sparse' if sparse else 'non-dense'} tensor ({tensor.layout})",
            where="dump_data",
            hint=f"give a dense tensor: {what}.to_dense()" if sparse else "give a dense (strided) tensor",
        )


def _device_index(tensor: torch.Tensor) -> int:
    return tensor.get_device() if tensor.device.type != "cpu" else -1


def _dump_mapped(
    token_id: int, data_id: Any, golden_data: Any, my_path: str | os.PathLike[str], output_path: str | os.PathLike[str]
) -> Path:
    token, name = _token(token_id), _data_id(data_id)
    _check_tensor(golden_data, "golden_data", name)
    if not str(my_path).strip():
        raise UsageError("my_path is empty: give the path of the tensor file to compare against", where="dump_data")
    mine = Path(my_path).absolute()
    if not mine.is_file():
        log.warning("dump_data: my_path %s does not exist yet; compare will need it", mine)
    folder = Path(output_path) / MAPPED_ROOT / f"{os.getpid()}_{_device_index(golden_data)}" / GOLDEN_FOLDER
    saved = _save_tensor(golden_data, folder, token, name, "golden_data")
    return record_entry(folder, name, token, [saved, str(mine)])


def _atb_tensor_path(tensor_path: str) -> str:
    path = PurePosixPath(str(tensor_path).replace("\\", "/"))
    if not str(path).strip() or path.is_absolute() or ".." in path.parts:
        raise PathOutsideDumpError(
            f"tensor_path {tensor_path!r} must be relative to the ATB dump's execute-count folder, without '..'",
            where="dump_data",
            hint="e.g. 0_Model/0_Layer/6_NormOpsRunner/after/outTensor0.bin",
        )
    return path.as_posix()


def _dump_side(
    data_src: str,
    data_id: Any,
    data_val: Any,
    tensor_path: str | None,
    token_id: int,
    output_path: str | os.PathLike[str],
) -> Path:
    if data_src not in (GOLDEN, ACL):
        raise UsageError(f"data_src must be 'golden' or 'acl', got {data_src!r}", where="dump_data")
    if (data_val is None) == (tensor_path is None):
        raise UsageError(
            "give data_val (high level: the tensor) or tensor_path (low level: a tensor of the ATB dump), exactly one",
            where="dump_data",
        )
    token, name = _token(token_id), _data_id(data_id)
    folder = Path(output_path) / f"{os.getpid()}_cmp_dump_data" / f"{data_src}_tensor"
    if data_val is not None:
        entry: Any = _save_tensor(data_val, folder, token, name, "data_val")
    else:
        entry = {
            "atb_tensor_path": _atb_tensor_path(str(tensor_path)),
            "pid": os.getpid(),
            "atb_output_dir": os.environ.get("ATB_OUTPUT_DIR"),
        }
    return record_entry(folder, name, token, entry)
