"""Source "file": one tensor file (``.npy``, ``.pt``/``.pth``, ``.safetensors``) read as a small dump.

A checkpoint folder (``config.json`` or ``model.safetensors.index.json`` beside
``*.safetensors`` shards, as Hugging Face writes them) is read the same way, all shards
together, so ``llmcheck compare -gp original/ -mp converted/`` finds which weight a
conversion or quantisation round trip changed -- the seed tool's weight compare.

``llmcheck compare -gp a.npy -mp b.npy`` compares two files directly. A file holding one
tensor gives one record named ``tensor``, so any two such files pair; a file holding many
(a safetensors file, a ``.pt`` state dict) gives one record per tensor, named by its key,
so two checkpoints pair weight by weight. ``.npy`` and ``.safetensors`` are read as byte
ranges (memory-mapped, no copy); ``.pt`` files are loaded with ``torch.load(...,
weights_only=True)`` -- never arbitrary unpickling.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import (
    DTYPE_ITEMSIZE,
    LAYOUT_TENSOR_FILES,
    Dump,
    DumpFormatError,
    RecordKey,
    TensorData,
    TensorRecord,
    inside_dump,
    parse_dump_json,
    read_npy_header,
)

SOURCE_NAME = "file"
SINGLE_TENSOR_NAME = "tensor"
SUFFIXES = (".npy", ".pt", ".pth", ".safetensors")
log = logging.getLogger("llmcheck.file")

#: safetensors dtype codes -> canonical dtype names.
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
}


def claims(path: Path) -> bool:
    """Return whether ``path`` is a tensor file this source reads."""
    return path.is_file() and path.suffix.lower() in SUFFIXES


#: Files that mark a folder as a model checkpoint whose ``*.safetensors`` shards hold its weights.
CHECKPOINT_MARKERS = ("config.json", "model.safetensors.index.json")


def claims_checkpoint(path: Path) -> bool:
    """Return whether ``path`` is a checkpoint folder: a marker file beside ``*.safetensors`` shards."""
    return (
        path.is_dir()
        and any((path / marker).is_file() for marker in CHECKPOINT_MARKERS)
        and any(path.glob("*.safetensors"))
    )


def load_checkpoint(path: Path) -> Dump:
    """Return every weight of a checkpoint folder's safetensors shards, one record per weight, named by its key."""
    records: list[TensorRecord] = []
    seen: dict[str, Path] = {}
    shards = sorted(path.glob("*.safetensors"))
    for shard in shards:
        for record in _safetensors_records(inside_dump(shard, path)):
            if record.key.name in seen:
                raise DumpFormatError(
                    f"weight {record.key.name!r} is in two shards: {seen[record.key.name].name} and {shard.name}",
                    where=path,
                )
            seen[record.key.name] = shard
            records.append(record.with_changes(order=len(records)))
    return Dump(
        source=SOURCE_NAME,
        root=path,
        records=records,
        manifest={"layout": LAYOUT_TENSOR_FILES, "checkpoint": str(path), "files": [shard.name for shard in shards]},
    )


def load_file(path: Path) -> Dump:
    """Return the tensors of one file as a dump, one record per tensor in file order."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        records = [_npy_record(path)]
    elif suffix == ".safetensors":
        records = _safetensors_records(path)
    else:
        records = _torch_records(path)
    return Dump(
        source=SOURCE_NAME, root=path, records=records, manifest={"layout": LAYOUT_TENSOR_FILES, "file": str(path)}
    )


def _record(name: str, order: int, data: TensorData, path: Path, where: str) -> TensorRecord:
    return TensorRecord(
        key=RecordKey(name=name), dtype=data.dtype, shape=data.shape, order=order, data=data, source_path=where
    )


# --- .npy -------------------------------------------------------------------------------------


def _npy_record(path: Path) -> TensorRecord:
    import numpy as np

    header = read_npy_header(path)
    dtype, shape, fortran_order, data_offset = header.dtype, header.shape, header.fortran_order, header.data_offset
    if dtype.hasobject:
        raise DumpFormatError("holds Python objects, not numbers", where=path, hint="save a numeric array")
    name = _numpy_dtype_name(dtype, path)
    nbytes = math.prod(shape) * dtype.itemsize
    if (fortran_order and len(shape) > 1) or dtype.byteorder == ">":

        def load() -> Any:
            import torch

            array = np.load(path, mmap_mode="r")
            return torch.from_numpy(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")))

        data = TensorData(dtype=name, shape=shape, path=path, loader=load)
    else:
        data = TensorData(dtype=name, shape=shape, path=path, offset=data_offset, nbytes=nbytes)
    return _record(SINGLE_TENSOR_NAME, 0, data, path, path.name)


def _numpy_dtype_name(dtype: Any, path: Path) -> str:
    kind_names = {"f": "float", "i": "int", "u": "uint", "c": "complex"}
    if dtype.kind == "b":
        return "bool"
    prefix = kind_names.get(dtype.kind)
    name = f"{prefix}{dtype.itemsize * 8}" if prefix else ""
    if name not in DTYPE_ITEMSIZE:
        raise DumpFormatError(f"unsupported array dtype {dtype.str!r}", where=path)
    return name


# --- .safetensors -------------------------------------------------------------------------------


def _safetensors_records(path: Path) -> list[TensorRecord]:
    file_size = os.path.getsize(path)
    with open(path, "rb") as handle:
        size_bytes = handle.read(8)
        if len(size_bytes) < 8:
            raise DumpFormatError("shorter than the 8-byte header length", where=path, offset=0)
        header_size = int.from_bytes(size_bytes, "little")
        if header_size > file_size - 8:
            raise DumpFormatError(
                f"header length {header_size} exceeds the file ({file_size} bytes)", where=path, offset=0
            )
        header = parse_dump_json(handle.read(header_size), path, "header")
    if not isinstance(header, dict):
        raise DumpFormatError("header is not a JSON object", where=path, offset=8)
    raw_dtypes = _raw_dtypes(header, path)
    data_start = 8 + header_size
    entries = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(v) for v in entry["data_offsets"])
            code, shape = entry["dtype"], tuple(int(v) for v in entry["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DumpFormatError(f"tensor {name!r} has a malformed header entry", where=path, offset=8) from exc
        entries.append((begin, end, name, code, shape))
    records = []
    for order, (begin, end, name, code, shape) in enumerate(sorted(entries, key=lambda entry: entry[0])):
        dtype = raw_dtypes.get(name) or (_SAFETENSORS_DTYPES.get(code) if isinstance(code, str) else None)
        if dtype is None:
            raise DumpFormatError(f"tensor {name!r} has unsupported dtype {code!r}", where=path, offset=8)
        if name in raw_dtypes:  # stored as raw bytes; the true shape is not recoverable beyond its size
            shape = (math.prod(shape) // DTYPE_ITEMSIZE[dtype],)
        if data_start + end > file_size or begin > end:
            raise DumpFormatError(
                f"tensor {name!r} bytes {begin}..{end} run past the end of the file",
                where=path,
                offset=data_start + begin,
            )
        data = TensorData(dtype=dtype, shape=shape, path=path, offset=data_start + begin, nbytes=end - begin)
        records.append(_record(name, order, data, path, f"{path.name}:{name}"))
    return records


def _raw_dtypes(header: dict[str, Any], path: Path) -> dict[str, str]:
    """Return ``{tensor name: dtype}`` of the tensors llmcheck stored as raw bytes (``__metadata__.llmcheck_raw_dtypes``)."""
    metadata = header.get("__metadata__", {})
    text = metadata.get("llmcheck_raw_dtypes", "{}") if isinstance(metadata, dict) else None
    raw_dtypes = parse_dump_json(text, path, "__metadata__.llmcheck_raw_dtypes") if isinstance(text, str) else None
    if not isinstance(raw_dtypes, dict) or not all(
        isinstance(dtype, str) and dtype in DTYPE_ITEMSIZE for dtype in raw_dtypes.values()
    ):
        raise DumpFormatError(
            "__metadata__.llmcheck_raw_dtypes is not a JSON object of {tensor name: dtype name}",
            where=path,
            offset=8,
        )
    return raw_dtypes


# --- .pt / .pth ------------------------------------------------------------------------------------


def _torch_records(path: Path) -> list[TensorRecord]:
    import torch

    from llmcheck.plugin_api import dtype_name, load_weights_only

    content = load_weights_only(path)
    tensors: list[tuple[str, Any]] = []
    skipped: list[str] = []
    _collect_tensors(content, "", tensors, skipped, torch.is_tensor)
    if skipped:
        log.info(
            "%s: %d entries are not tensors and are not compared: %s",
            path,
            len(skipped),
            ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""),
        )
    if not tensors:
        raise DumpFormatError("holds no tensor", where=path)
    records = []
    for order, (name, tensor) in enumerate(tensors):
        data = TensorData(
            dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape), path=path, loader=_loader_of(tensor)
        )
        records.append(
            _record(name or SINGLE_TENSOR_NAME, order, data, path, f"{path.name}:{name}" if name else path.name)
        )
    return records


def _loader_of(tensor: Any) -> Callable[[], Any]:
    return lambda: tensor


def _collect_tensors(
    value: Any, prefix: str, found: list[tuple[str, Any]], skipped: list[str], is_tensor: Callable[[Any], bool]
) -> None:
    if is_tensor(value):
        found.append((prefix, value))
    elif isinstance(value, dict):
        for key, item in value.items():
            _collect_tensors(item, f"{prefix}.{key}" if prefix else str(key), found, skipped, is_tensor)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _collect_tensors(item, f"{prefix}.{index}" if prefix else str(index), found, skipped, is_tensor)
    else:
        skipped.append(prefix or type(value).__name__)
