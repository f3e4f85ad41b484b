"""The ATB tensor file (``.bin``): a ``name=value`` text header up to ``$End=1``, then raw bytes.

Layout (what ATB's probe writes, see ``docs/sources/atb.md``)::

    $Version=1.0
    $Object.Count=1              0 for description-only and statistics-only files
    $Object.Length=12            payload bytes after the header
    format=2                     aclFormat code (2 = ND, 29 = FRACTAL_NZ)
    dtype=1                      aclDataType code (1 = float16)
    dims=2,3                     storage dims, comma separated, empty for 0-d
    [max=..  min=..  mean=..  l2norm=..]   statistics mode only ("N/A" when not computed)
    [data=<path>]                the bytes live in another file of the dump (deduplicated)
    $Object.data=0,12            offset and length of the tensor inside the payload
    $End=1
    <payload>

The reader reads only the header; the data is a :class:`~llmcheck.core.records.TensorData`
byte range that the core memory-maps (no 2 GB limit, nothing read until used), or a loader
for payloads that need decoding (FRACTAL_NZ tiles, packed int4). Every length is checked
against the file size, so a truncated or corrupt file is one :class:`DumpFormatError`
naming the file and the byte offset. The writer writes exactly that layout and never
appends to or overwrites a file (the probe's ``std::ios::app`` quirk is not repeated).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmcheck.plugin_api import (
    DumpFormatError,
    LlmcheckError,
    PathOutsideDumpError,
    TensorData,
    TensorStats,
    inside_dump,
)
from llmcheck.plugins.atb.acl_dtypes import (
    CODE_BY_TORCH_NAME,
    FORMAT_ND,
    NZ_FORMATS,
    ROW_MAJOR_FORMATS,
    AclDtype,
    dtype_for_code,
    format_name,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger("llmcheck.atb")

END_LINE = b"$End=1\n"
VERSION = "1.0"
#: A header longer than this is not an ATB header (the probe's headers are a few hundred bytes).
MAX_HEADER_BYTES = 1 << 20
_READ_CHUNK_BYTES = 4096
#: How many ``data=<path>`` hops a reader follows before calling it a cycle.
MAX_REFERENCE_HOPS = 8
STAT_NAMES = ("max", "min", "mean", "l2norm")
NOT_AVAILABLE = "N/A"


@dataclass(frozen=True, slots=True)
class BinHeader:
    """A parsed ``.bin`` header: the tensor's description and where its bytes are.

    ``payload_offset`` is the file offset of the first byte after ``$End=1``; object
    offsets in ``objects`` are relative to it. ``attrs`` keeps every header line in file
    order (``$``-prefixed system lines included) for tools that want the raw values.
    """

    path: Path
    attrs: Mapping[str, str]
    payload_offset: int
    payload_bytes: int
    file_size: int
    dtype_code: int
    format_code: int
    dims: tuple[int, ...]
    objects: Mapping[str, tuple[int, int]]
    stats: TensorStats | None
    data_reference: str | None

    @property
    def acl_dtype(self) -> AclDtype:
        """Return the ACL dtype of the header's ``dtype=`` code (validated at parse time)."""
        dtype = dtype_for_code(self.dtype_code)
        assert dtype is not None
        return dtype

    @property
    def format(self) -> str:
        """Return the lower-case format name (``nd``, ``fractal_nz``, ...)."""
        return format_name(self.format_code)

    @property
    def numel(self) -> int:
        """Return the number of elements the storage dims hold."""
        return math.prod(self.dims)

    @property
    def has_payload(self) -> bool:
        """Return whether the tensor's bytes are in this file (not description-only, not a reference)."""
        return bool(self.objects)

    def data_range(self) -> tuple[int, int] | None:
        """Return ``(file offset, byte count)`` of the tensor's bytes in this file, or ``None``."""
        if not self.objects:
            return None
        offset, length = self.objects.get("data") or next(iter(self.objects.values()))
        return self.payload_offset + offset, length


def _fail(path: Path, what: str, offset: int | None, hint: str | None = None) -> DumpFormatError:
    return DumpFormatError(what, where=path, offset=offset, hint=hint)


def _read_header_bytes(path: Path) -> tuple[bytes, int, int]:
    """Return the header text (through ``$End=1\\n``), the payload offset and the file size."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below; only open() errors caught here
    except FileNotFoundError as exc:
        raise _fail(path, "no such file", None, "check the path; ATB tensors are the .bin files of a dump") from exc
    except OSError as exc:
        raise _fail(path, f"cannot open: {exc.strerror}", None) from exc
    with handle:
        file_size = os.fstat(handle.fileno()).st_size
        if file_size == 0:
            raise _fail(path, "file is empty, expected an ATB tensor header", 0)
        buffer = b""
        while len(buffer) < MAX_HEADER_BYTES:
            chunk = handle.read(_READ_CHUNK_BYTES)
            if not chunk:
                break
            search_from = max(0, len(buffer) - len(END_LINE))
            buffer += chunk
            end = _find_end_line(buffer, search_from)
            if end >= 0:
                header_end = end + len(END_LINE)
                return buffer[:header_end], header_end, file_size
        raise _fail(
            path,
            "no '$End=1' line ends the header (truncated file, or not an ATB tensor file)",
            min(len(buffer), file_size),
        )


def _find_end_line(buffer: bytes, start: int) -> int:
    """Return the offset of a ``$End=1`` line that starts a line, or -1."""
    position = buffer.find(END_LINE, start)
    while position >= 0:
        if position == 0 or buffer[position - 1 : position] == b"\n":
            return position
        position = buffer.find(END_LINE, position + 1)
    return -1


def _parse_int(path: Path, name: str, value: str, offset: int) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise _fail(path, f"header field {name!r} is not an integer: {value!r}", offset) from None


def _parse_stat(path: Path, name: str, value: str, offset: int) -> float | None:
    if value.strip() == NOT_AVAILABLE:
        return None
    try:
        return float(value)
    except ValueError:
        raise _fail(path, f"statistic {name!r} is not a number: {value!r}", offset) from None


def read_bin_header(path: Path) -> BinHeader:
    """Return the parsed header of an ATB ``.bin`` file, every length checked against the file size."""
    path = Path(path)
    header, payload_offset, file_size = _read_header_bytes(path)
    attrs: dict[str, str] = {}
    line_offsets: dict[str, int] = {}
    objects: dict[str, tuple[int, int]] = {}
    position = 0
    for raw_line in header[: -len(END_LINE)].split(b"\n")[:-1]:
        line_start, position = position, position + len(raw_line) + 1
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError:
            raise _fail(path, "header line is not UTF-8 text", line_start) from None
        name, separator, value = line.partition("=")
        if not separator or not name:
            raise _fail(path, f"header line {line[:60]!r} is not 'name=value'", line_start)
        if name in attrs:
            raise _fail(path, f"header field {name!r} appears twice", line_start)
        attrs[name] = value
        line_offsets[name] = line_start
        if name.startswith("$Object.") and name not in ("$Object.Count", "$Object.Length"):
            parts = value.split(",")
            if len(parts) != 2:
                raise _fail(path, f"{name} must be 'offset,length', got {value!r}", line_start)
            offset, length = (_parse_int(path, name, part, line_start) for part in parts)
            if offset < 0 or length < 0:
                raise _fail(path, f"{name} has a negative offset or length: {value!r}", line_start)
            objects[name.removeprefix("$Object.")] = (offset, length)

    def field_offset(name: str) -> int:
        return line_offsets.get(name, 0)

    if "dtype" not in attrs:
        raise _fail(path, "header has no 'dtype=' line", 0)
    if "dims" not in attrs:
        raise _fail(path, "header has no 'dims=' line", 0)
    dtype_code = _parse_int(path, "dtype", attrs["dtype"], field_offset("dtype"))
    if dtype_for_code(dtype_code) is None:
        raise _fail(
            path,
            f"unknown aclDataType code {dtype_code}",
            field_offset("dtype"),
            hint="see the dtype table in docs/sources/atb.md",
        )
    format_code = (
        _parse_int(path, "format", attrs["format"], field_offset("format")) if "format" in attrs else FORMAT_ND
    )
    dims_text = attrs["dims"].strip()
    dims = (
        tuple(_parse_int(path, "dims", part, field_offset("dims")) for part in dims_text.split(","))
        if dims_text
        else ()
    )
    if any(size < 0 for size in dims):
        raise _fail(path, f"dims has a negative size: {attrs['dims']!r}", field_offset("dims"))

    available = file_size - payload_offset
    has_object_fields = "$Object.Count" in attrs or "$Object.Length" in attrs or bool(objects)
    if has_object_fields:
        object_count = _parse_int(
            path, "$Object.Count", attrs.get("$Object.Count", str(len(objects))), field_offset("$Object.Count")
        )
        payload_bytes = _parse_int(
            path, "$Object.Length", attrs.get("$Object.Length", str(available)), field_offset("$Object.Length")
        )
        if object_count != len(objects):
            raise _fail(
                path,
                f"$Object.Count={object_count} but the header lists {len(objects)} objects",
                field_offset("$Object.Count"),
            )
        if payload_bytes < 0:
            raise _fail(path, f"$Object.Length is negative: {payload_bytes}", field_offset("$Object.Length"))
        if payload_bytes > available:
            raise _fail(
                path,
                f"payload truncated: the header promises {payload_bytes} bytes, the file holds "
                f"{available} after the header",
                file_size,
            )
        for object_name, (offset, length) in objects.items():
            if offset + length > payload_bytes:
                raise _fail(
                    path,
                    f"$Object.{object_name}={offset},{length} runs past the {payload_bytes}-byte payload",
                    field_offset(f"$Object.{object_name}"),
                )
        if available > payload_bytes:
            _note_trailing_bytes(path, payload_offset + payload_bytes, available - payload_bytes)
    else:
        # The minimal header (tensor-view writer): the rest of the file is the tensor -- none at
        # all for an empty tensor (dims with a 0), which is not a description-only file.
        payload_bytes = available
        if available or (math.prod(dims) == 0 and "data" not in attrs):
            objects["data"] = (0, available)

    stats = None
    if any(name in attrs for name in STAT_NAMES):
        values = {
            name: _parse_stat(path, name, attrs[name], field_offset(name)) for name in STAT_NAMES if name in attrs
        }
        stats = TensorStats(
            min=values.get("min"), max=values.get("max"), mean=values.get("mean"), l2norm=values.get("l2norm")
        )
    data_reference = attrs.get("data")
    if data_reference is not None and not data_reference.strip():
        raise _fail(path, "header field 'data' names no file", field_offset("data"))
    parsed = BinHeader(
        path=path,
        attrs=attrs,
        payload_offset=payload_offset,
        payload_bytes=payload_bytes,
        file_size=file_size,
        dtype_code=dtype_code,
        format_code=format_code,
        dims=dims,
        objects=objects,
        stats=stats,
        data_reference=data_reference.strip() if data_reference else None,
    )
    data_range = parsed.data_range()
    if data_range is not None:
        expected = parsed.acl_dtype.payload_bytes(parsed.numel)
        if data_range[1] != expected and parsed.acl_dtype.torch_name is not None:  # others are never read
            raise _fail(
                path,
                f"{parsed.acl_dtype.atb_name} dims {list(dims)} need {expected} bytes but the "
                f"tensor holds {data_range[1]}",
                data_range[0],
            )
    elif data_reference is None and not has_object_fields and parsed.numel:
        raise _fail(
            path,
            f"no tensor bytes after the header, dims {list(dims)} need {parsed.acl_dtype.payload_bytes(parsed.numel)}",
            payload_offset,
        )
    return parsed


def _note_trailing_bytes(path: Path, offset: int, count: int) -> None:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            start = handle.read(len(b"$Version="))
    except OSError:
        start = b""
    if start == b"$Version=":
        log.warning(
            "%s: a second header is appended at byte %d (the probe appends when a tensor is saved twice "
            "to one path); reading the first tensor",
            path,
            offset,
        )
    else:
        log.warning(
            "%s: %d bytes after the payload at byte %d are not described by the header; ignored", path, count, offset
        )


# --- data handles -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NzLoader:
    """Loads an NZ-tiled payload and returns the ND matrix (picklable, for parallel compare)."""

    path: Path
    offset: int
    nbytes: int
    dtype: str
    storage_dims: tuple[int, ...]

    def __call__(self) -> torch.Tensor:
        from llmcheck.plugin_api import tensor_from_byte_range
        from llmcheck.plugins.atb.nz_format import nz_to_nd

        return nz_to_nd(tensor_from_byte_range(self.path, self.offset, self.nbytes, self.dtype, self.storage_dims))


@dataclass(frozen=True, slots=True)
class Int4Loader:
    """Loads a packed int4 payload (two per byte, low nibble first) as int8 values in -8..7."""

    path: Path
    offset: int
    nbytes: int
    dims: tuple[int, ...]

    def __call__(self) -> torch.Tensor:
        import torch

        from llmcheck.plugin_api import tensor_from_byte_range

        packed = tensor_from_byte_range(self.path, self.offset, self.nbytes, "uint8", (self.nbytes,)).to(torch.int16)
        nibbles = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)[: math.prod(self.dims)]
        signed = torch.where(nibbles >= 8, nibbles - 16, nibbles).to(torch.int8)
        return signed.reshape(self.dims)


def tensor_shape(header: BinHeader) -> tuple[int, ...]:
    """Return the shape a reader gives the tensor: the ND shape for NZ storage, else the dims."""
    if header.format_code in NZ_FORMATS:
        from llmcheck.plugins.atb.nz_format import nd_shape_of_nz

        try:
            return nd_shape_of_nz(header.dims)
        except ValueError as exc:
            raise _fail(header.path, str(exc), 0) from None
    return header.dims


def no_data_reason(header: BinHeader) -> str | None:
    """Return why the file gives no tensor data (``None`` when it does)."""
    if header.acl_dtype.torch_name is None:
        return f"dtype {header.acl_dtype.atb_name} has no torch equivalent; described, not loaded"
    if header.data_reference is None and not header.has_payload:
        return "statistics only" if header.stats is not None else "description only (dumped with -sd)"
    return None


def tensor_data(header: BinHeader, dump_root: Path | None = None) -> TensorData | None:
    """Return the lazy data handle of a parsed file, or ``None`` when it holds no data.

    ``data=<path>`` references are followed to the referenced ``.bin`` file, which must lie
    inside ``dump_root`` (the folder of the file itself when ``None``); anything else is a
    :class:`PathOutsideDumpError`.
    """
    if no_data_reason(header) is not None:
        return None
    dtype = header.acl_dtype
    assert dtype.torch_name is not None
    source = header
    hops = 0
    while source.data_reference is not None and not source.has_payload:
        hops += 1
        if hops > MAX_REFERENCE_HOPS:
            raise _fail(
                header.path, f"'data=' references form a chain longer than {MAX_REFERENCE_HOPS} files (a cycle?)", 0
            )
        target = resolve_reference(source, dump_root)
        source = read_bin_header(target)
    data_range = source.data_range()
    if data_range is None:
        raise _fail(source.path, "the file referenced by 'data=' holds no tensor bytes", source.payload_offset)
    offset, nbytes = data_range
    expected = dtype.payload_bytes(header.numel)
    if nbytes != expected:
        raise _fail(
            source.path,
            f"referenced tensor holds {nbytes} bytes, {header.path.name} needs {expected} "
            f"for {dtype.atb_name} dims {list(header.dims)}",
            offset,
        )
    shape = tensor_shape(header)
    if dtype.elements_per_byte > 1:
        return TensorData(
            dtype=dtype.torch_name,
            shape=shape,
            path=source.path,
            offset=offset,
            nbytes=nbytes,
            loader=Int4Loader(source.path, offset, nbytes, header.dims),
        )
    if header.format_code in NZ_FORMATS:
        return TensorData(
            dtype=dtype.torch_name,
            shape=shape,
            path=source.path,
            offset=offset,
            nbytes=nbytes,
            loader=NzLoader(source.path, offset, nbytes, dtype.torch_name, header.dims),
        )
    if header.format_code not in ROW_MAJOR_FORMATS:
        log.info("%s: format %s is kept in its storage layout %s", header.path, header.format, list(header.dims))
    return TensorData(dtype=dtype.torch_name, shape=shape, path=source.path, offset=offset, nbytes=nbytes)


def resolve_reference(header: BinHeader, dump_root: Path | None) -> Path:
    """Return the file a ``data=<path>`` reference names, refusing anything outside the dump."""
    assert header.data_reference is not None
    root = Path(dump_root if dump_root is not None else header.path.parent).resolve()
    reference = Path(header.data_reference)
    candidates = [reference] if reference.is_absolute() else [header.path.parent / reference, root / reference]
    for candidate in candidates:
        if not candidate.resolve().is_relative_to(root):
            raise PathOutsideDumpError(
                f"'data={header.data_reference}' points outside the dump ({root})",
                where=header.path,
                hint="references are followed only inside the dump folder",
            )
        if candidate.is_file():
            return inside_dump(candidate, root)
    raise _fail(header.path, f"'data={header.data_reference}' names a file that does not exist in the dump", 0)


def read_bin(path: Path, dump_root: Path | None = None) -> torch.Tensor:
    """Return the tensor of one ``.bin`` file (ND for NZ storage); error if it holds no data."""
    header = read_bin_header(path)
    reason = no_data_reason(header)
    if reason is not None:
        raise _fail(Path(path), f"holds no tensor data: {reason}", None)
    data = tensor_data(header, dump_root)
    assert data is not None
    return data.load()


# --- writer -------------------------------------------------------------------------------


def _stat_text(value: float | None) -> str:
    return NOT_AVAILABLE if value is None else repr(float(value))


def write_bin(
    path: Path,
    tensor: torch.Tensor | None = None,
    *,
    dtype: str | None = None,
    dims: tuple[int, ...] | None = None,
    format_code: int = FORMAT_ND,
    stats: TensorStats | None = None,
    data_reference: str | None = None,
) -> int:
    """Write one ATB ``.bin`` file in the probe's exact layout and return the bytes written.

    With ``tensor`` the file holds its bytes as they are (tile an NZ tensor with
    :func:`~llmcheck.plugins.atb.nz_format.nd_to_nz` first and pass ``format_code=29``).
    Without it the file is description-only (``dtype`` and ``dims`` required), carrying
    ``stats`` and/or a ``data_reference`` when given. An existing file is never touched.
    """
    path = Path(path)
    if tensor is not None:
        from llmcheck.plugin_api import dtype_name, tensor_bytes

        dtype = dtype_name(tensor.dtype)
        dims = tuple(tensor.shape)
        payload = tensor_bytes(tensor.detach().cpu())
    else:
        if dtype is None or dims is None:
            raise ValueError("write_bin without a tensor needs dtype and dims")
        payload = memoryview(b"")
    code = CODE_BY_TORCH_NAME.get(dtype)
    if code is None:
        raise LlmcheckError(f"dtype {dtype} has no aclDataType code", where=path)
    lines = [
        f"$Version={VERSION}",
        f"$Object.Count={1 if tensor is not None else 0}",
        f"$Object.Length={payload.nbytes}",
        f"format={format_code}",
        f"dtype={code}",
        "dims=" + ",".join(str(int(size)) for size in dims),
    ]
    if stats is not None:
        lines += [
            f"max={_stat_text(stats.max)}",
            f"min={_stat_text(stats.min)}",
            f"mean={_stat_text(stats.mean)}",
            f"l2norm={_stat_text(stats.l2norm)}",
        ]
    if data_reference is not None:
        if "\n" in data_reference or not data_reference.strip():
            raise ValueError("data_reference must be one non-empty line")
        lines.append(f"data={data_reference}")
    if tensor is not None:
        lines.append(f"$Object.data=0,{payload.nbytes}")
    header = ("\n".join(lines) + "\n").encode() + END_LINE
    try:
        with open(path, "xb") as handle:
            handle.write(header)
            handle.write(payload)
    except FileExistsError:
        raise LlmcheckError(
            "refusing to overwrite an existing tensor file", where=path, hint="write each tensor to a new path"
        ) from None
    return len(header) + payload.nbytes
