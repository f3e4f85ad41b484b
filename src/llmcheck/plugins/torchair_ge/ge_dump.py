"""CANN data-dump files (what torchair's GE graph mode writes per op): reader and writer, no CANN needed.

A file is named ``{OpType}.{OpName}.{taskId}.{streamId}.{timestampUs}`` (the op name may
contain dots; ``/`` in it is written as ``_``) and comes in two forms:

* **framed** (current)::

      [uint64 little-endian header_len][header_len bytes: DumpData message, data fields empty]
      [input payloads][output payloads][buffer payloads][workspace payloads]

  with each payload's length in its ``size`` field; the file size must equal
  ``8 + header_len + sum(sizes)``.
* **bare** (old, v1): the whole file is one ``DumpData`` message with each tensor's bytes
  inline in its ``data`` field.

Message fields (``toolkit.dumpdata``, public in ``Ascend/msprobe: resource/dump_data.proto``)::

    DumpData { version=1 dump_time=2 output=3 input=4 buffer=5 op_name=6 attr=7 space=8 }
    OpInput  { data_type=1 format=2 shape=3 data=4 size=5 original_shape=6 sub_format=7 address=8 offset=9 }
    OpOutput { data_type=1 format=2 shape=3 original_op=4 data=5 size=6 original_shape=7 sub_format=8
               address=9 dim_range=10 offset=11 }
    Shape { repeated uint64 dim=1 }   OpBuffer/Workspace { type=1 data=2 size=3 }   OpAttr { name=1 value=2 }

Either way every tensor ends up as a byte range of the file, so nothing is read until a
pair is measured.
"""

from __future__ import annotations

import math
import mmap
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmcheck.plugin_api import (
    DTYPE_ITEMSIZE,
    DumpFormatError,
    TensorData,
    inside_dump,
    walk_files,
)
from llmcheck.plugins.torchair_ge.ge_dtypes import (
    FORMAT_FRACTAL_NZ,
    FORMAT_NC1HWC0,
    FORMAT_ND,
    GE_DTYPE_TO_TORCH,
    ge_dtype_name,
    ge_format_name,
)
from llmcheck.plugins.torchair_ge.ge_formats import StorageLayoutLoader
from llmcheck.plugins.torchair_ge.protobuf_wire import (
    WIRE_LENGTH_DELIMITED,
    WIRE_VARINT,
    WireField,
    WireReader,
    bytes_field,
    packed_varints_field,
    varint_field,
)

FRAME_HEADER_BYTES = 8
FRAMED_VERSION = "2.0"
BARE_VERSION = "1.0"

#: Files beside GE dumps that are not dumps (msit skips the same suffixes).
IGNORED_SUFFIXES = (".txt", ".npy", ".bin", ".json", ".csv", ".pb", ".log")
#: Other files torchair and CANN tools leave beside GE dumps (graph dumps, converted statistics).
COMPANION_SUFFIXES = (*IGNORED_SUFFIXES, ".pbtxt", ".py", ".npz")
NOT_A_DUMP_FILE_NAME = "not read: the name is not {OpType}.{OpName}.{taskId}.{streamId}.{timestampUs}"

# DumpData field numbers
_DUMP_VERSION, _DUMP_TIME, _DUMP_OUTPUT, _DUMP_INPUT, _DUMP_BUFFER, _DUMP_OP_NAME, _DUMP_ATTR, _DUMP_SPACE = range(1, 9)
# OpInput / OpOutput field numbers, by role
_INPUT_FIELDS = {"data_type": 1, "format": 2, "shape": 3, "data": 4, "size": 5, "original_shape": 6, "sub_format": 7}
_OUTPUT_FIELDS = {"data_type": 1, "format": 2, "shape": 3, "data": 5, "size": 6, "original_shape": 7, "sub_format": 8}
# OpBuffer / Workspace
_BLOB_DATA, _BLOB_SIZE = 2, 3

_FILE_NAME_PATTERN = re.compile(r"^(?P<type>[^.]+)\.(?P<name>.+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)$")


@dataclass(frozen=True, slots=True)
class GeDumpFileName:
    """What a GE dump file's name says: op type and name, task and stream ids, timestamp in µs."""

    op_type: str
    op_name: str
    task_id: int
    stream_id: int
    timestamp_us: int

    def file_name(self) -> str:
        """Return the file name CANN would give this op (``/`` in the op name written as ``_``)."""
        return f"{self.op_type}.{self.op_name.replace('/', '_')}.{self.task_id}.{self.stream_id}.{self.timestamp_us}"


def parse_dump_file_name(name: str) -> GeDumpFileName | None:
    """Return the parts of a GE dump file name, or ``None`` when the name is not one."""
    if name.endswith(IGNORED_SUFFIXES):
        return None
    match = _FILE_NAME_PATTERN.match(name)
    if match is None:
        return None
    return GeDumpFileName(match["type"], match["name"], int(match["task"]), int(match["stream"]), int(match["ts"]))


@dataclass(frozen=True, slots=True)
class GeDumpTensor:
    """One input or output of a dumped op: GE dtype and format numbers, shapes, where its bytes are."""

    dtype_code: int
    format_code: int
    shape: tuple[int, ...]
    original_shape: tuple[int, ...] | None
    data_offset: int  # absolute offset of the payload in the file
    nbytes: int
    sub_format: int = 0

    @property
    def dtype(self) -> str:
        """Return the torch dtype name, or the lower-cased GE name for types torch cannot hold."""
        return GE_DTYPE_TO_TORCH.get(self.dtype_code, ge_dtype_name(self.dtype_code).lower())

    @property
    def format_name(self) -> str:
        """Return the GE format name (``"ND"``, ``"FRACTAL_NZ"``, ...)."""
        return ge_format_name(self.format_code)

    @property
    def converts_layout(self) -> bool:
        """Return whether the payload is in a device layout llmcheck converts back to ``original_shape``."""
        return (
            self.format_code in (FORMAT_FRACTAL_NZ, FORMAT_NC1HWC0)
            and self.original_shape is not None
            and len(self.original_shape) > 0
            and tuple(self.original_shape) != self.shape
        )

    @property
    def logical_shape(self) -> tuple[int, ...]:
        """Return the shape the model sees: ``original_shape`` for converted layouts, else ``shape``."""
        return tuple(self.original_shape) if self.converts_layout and self.original_shape else self.shape

    def tensor_data(self, path: Path) -> TensorData | None:
        """Return the lazy data handle, or ``None`` for a dtype torch cannot hold."""
        if self.dtype_code not in GE_DTYPE_TO_TORCH:
            return None
        if self.converts_layout and self.original_shape:
            loader = StorageLayoutLoader(
                path,
                self.data_offset,
                self.nbytes,
                self.dtype,
                self.shape,
                tuple(self.original_shape),
                self.format_name,
            )
            return TensorData(dtype=self.dtype, shape=self.logical_shape, loader=loader)
        return TensorData(dtype=self.dtype, shape=self.shape, path=path, offset=self.data_offset, nbytes=self.nbytes)


@dataclass(frozen=True, slots=True)
class GeDumpFile:
    """A parsed GE dump file: its form, header fields and the byte ranges of its tensors."""

    path: Path
    framed: bool
    version: str
    dump_time: int
    op_name: str
    inputs: tuple[GeDumpTensor, ...]
    outputs: tuple[GeDumpTensor, ...]
    buffer_bytes: int = 0
    workspace_bytes: int = 0
    attrs: tuple[tuple[str, str], ...] = ()


# --- reading ---------------------------------------------------------------------------


@dataclass
class _TensorFields:
    dtype_code: int = 0
    format_code: int = FORMAT_ND
    shape: tuple[int, ...] = ()
    original_shape: tuple[int, ...] | None = None
    data: WireField | None = None
    size: int = 0
    sub_format: int = 0
    message_at: int = 0


@dataclass
class _HeaderFields:
    version: str = ""
    dump_time: int = 0
    op_name: str = ""
    inputs: list[_TensorFields] = field(default_factory=list)
    outputs: list[_TensorFields] = field(default_factory=list)
    blobs: list[tuple[int, WireField | None, int]] = field(default_factory=list)  # (kind, data, size); kind 5 or 8
    attrs: list[tuple[str, str]] = field(default_factory=list)


def _expect(reader: WireReader, item: WireField, wire_type: int, what: str) -> None:
    if item.wire_type != wire_type:
        raise reader.error(f"{what} has wire type {item.wire_type}, expected {wire_type}", item.start)


def _read_shape(reader: WireReader, message: WireField) -> tuple[int, ...]:
    dims: list[int] = []
    for item in reader.fields(message.start, message.end):
        if item.number != 1:
            continue
        if item.wire_type == WIRE_LENGTH_DELIMITED:
            dims.extend(reader.packed_varints(item))
        else:
            _expect(reader, item, WIRE_VARINT, "Shape.dim")
            dims.append(item.value)
    return tuple(dims)


def _read_tensor(reader: WireReader, message: WireField, numbers: dict[str, int]) -> _TensorFields:
    tensor = _TensorFields(message_at=message.start)
    for item in reader.fields(message.start, message.end):
        if item.number == numbers["data_type"]:
            _expect(reader, item, WIRE_VARINT, "data_type")
            tensor.dtype_code = item.value
        elif item.number == numbers["format"]:
            _expect(reader, item, WIRE_VARINT, "format")
            tensor.format_code = item.value
        elif item.number == numbers["shape"]:
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "shape")
            tensor.shape = _read_shape(reader, item)
        elif item.number == numbers["original_shape"]:
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "original_shape")
            tensor.original_shape = _read_shape(reader, item)
        elif item.number == numbers["data"]:
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "data")
            tensor.data = item
        elif item.number == numbers["size"]:
            _expect(reader, item, WIRE_VARINT, "size")
            tensor.size = item.value
        elif item.number == numbers["sub_format"]:
            _expect(reader, item, WIRE_VARINT, "sub_format")
            tensor.sub_format = item.value
    return tensor


def _read_blob(reader: WireReader, message: WireField) -> tuple[WireField | None, int]:
    data, size = None, 0
    for item in reader.fields(message.start, message.end):
        if item.number == _BLOB_DATA:
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "data")
            data = item
        elif item.number == _BLOB_SIZE:
            _expect(reader, item, WIRE_VARINT, "size")
            size = item.value
    return data, size


def _read_attr(reader: WireReader, message: WireField) -> tuple[str, str]:
    name = value = ""
    for item in reader.fields(message.start, message.end):
        if item.number in (1, 2):
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "OpAttr field")
            if item.number == 1:
                name = reader.text(item)
            else:
                value = reader.text(item)
    return name, value


def _read_header(reader: WireReader, start: int, end: int) -> _HeaderFields:
    header = _HeaderFields()
    for item in reader.fields(start, end):
        number = item.number
        if number == _DUMP_VERSION:
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "DumpData.version")
            header.version = reader.text(item)
        elif number == _DUMP_TIME:
            _expect(reader, item, WIRE_VARINT, "DumpData.dump_time")
            header.dump_time = item.value
        elif number == _DUMP_OUTPUT:
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "DumpData.output")
            header.outputs.append(_read_tensor(reader, item, _OUTPUT_FIELDS))
        elif number == _DUMP_INPUT:
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "DumpData.input")
            header.inputs.append(_read_tensor(reader, item, _INPUT_FIELDS))
        elif number in (_DUMP_BUFFER, _DUMP_SPACE):
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "DumpData.buffer/space")
            data, size = _read_blob(reader, item)
            header.blobs.append((number, data, size))
        elif number == _DUMP_OP_NAME:
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "DumpData.op_name")
            header.op_name = reader.text(item)
        elif number == _DUMP_ATTR:
            _expect(reader, item, WIRE_LENGTH_DELIMITED, "DumpData.attr")
            header.attrs.append(_read_attr(reader, item))
    return header


def _checked_tensor(
    reader: WireReader, fields: _TensorFields, role: str, index: int, data_offset: int, nbytes: int
) -> GeDumpTensor:
    """Return the tensor after checking that its dtype and shape need exactly ``nbytes`` bytes."""
    tensor = GeDumpTensor(
        fields.dtype_code,
        fields.format_code,
        fields.shape,
        fields.original_shape,
        data_offset,
        nbytes,
        fields.sub_format,
    )
    itemsize = DTYPE_ITEMSIZE.get(tensor.dtype)
    if fields.dtype_code in GE_DTYPE_TO_TORCH and itemsize is not None:
        needed = math.prod(fields.shape) * itemsize
        if needed != nbytes:
            raise reader.error(
                f"{role} {index}: {ge_dtype_name(fields.dtype_code)} shape {list(fields.shape)} "
                f"needs {needed} bytes but the file gives {nbytes}",
                fields.message_at,
            )
    return tensor


def _framed(reader: WireReader, file_size: int, header_len: int) -> GeDumpFile:
    header = _read_header(reader, 0, header_len)
    offset = FRAME_HEADER_BYTES + header_len
    declared = (
        sum(t.size for t in header.inputs)
        + sum(t.size for t in header.outputs)
        + sum(size for _, _, size in header.blobs)
    )
    if offset + declared != file_size:
        what = "truncated" if offset + declared > file_size else "has extra bytes"
        raise DumpFormatError(
            f"{what}: the header declares {declared} payload bytes after byte {offset} "
            f"but the file holds {file_size - offset}",
            where=reader.where,
            offset=min(file_size, offset + declared),
            hint="the dump was cut short or the file is not a GE dump",
        )
    tensors: dict[str, list[GeDumpTensor]] = {"input": [], "output": []}
    for role, items in (("input", header.inputs), ("output", header.outputs)):
        for index, fields in enumerate(items):
            tensors[role].append(_checked_tensor(reader, fields, role, index, offset, fields.size))
            offset += fields.size
    buffer_bytes = sum(size for kind, _, size in header.blobs if kind == _DUMP_BUFFER)
    workspace_bytes = sum(size for kind, _, size in header.blobs if kind == _DUMP_SPACE)
    return GeDumpFile(
        Path(reader.where),
        True,
        header.version,
        header.dump_time,
        header.op_name,
        tuple(tensors["input"]),
        tuple(tensors["output"]),
        buffer_bytes,
        workspace_bytes,
        tuple(header.attrs),
    )


def _bare(reader: WireReader, file_size: int) -> GeDumpFile:
    header = _read_header(reader, 0, file_size)
    tensors: dict[str, list[GeDumpTensor]] = {"input": [], "output": []}
    for role, items in (("input", header.inputs), ("output", header.outputs)):
        for index, fields in enumerate(items):
            data_offset, nbytes = (fields.data.start, fields.data.end - fields.data.start) if fields.data else (0, 0)
            if fields.size and fields.data is not None and fields.size != nbytes:
                raise reader.error(
                    f"{role} {index}: size field says {fields.size} bytes but its data holds {nbytes}",
                    fields.message_at,
                )
            tensors[role].append(_checked_tensor(reader, fields, role, index, data_offset, nbytes))
    blob_bytes = {
        kind: sum((d.end - d.start) if d else s for k, d, s in header.blobs if k == kind)
        for kind in (_DUMP_BUFFER, _DUMP_SPACE)
    }
    return GeDumpFile(
        Path(reader.where),
        False,
        header.version,
        header.dump_time,
        header.op_name,
        tuple(tensors["input"]),
        tuple(tensors["output"]),
        blob_bytes[_DUMP_BUFFER],
        blob_bytes[_DUMP_SPACE],
        tuple(header.attrs),
    )


def read_ge_dump(path: Path) -> GeDumpFile:
    """Return the parsed header of a GE dump file (framed or bare), tensors as byte ranges.

    Raises :class:`DumpFormatError` naming the file and byte offset when the file is
    truncated or follows neither form.
    """
    path = Path(path)
    try:
        file_size = path.stat().st_size
        if file_size == 0:
            raise DumpFormatError("empty file", where=path, offset=0, hint="not a GE dump file")
        with open(path, "rb") as stream:
            prefix = stream.read(FRAME_HEADER_BYTES)
            header_len = int.from_bytes(prefix, "little") if len(prefix) == FRAME_HEADER_BYTES else -1
            framed_error: DumpFormatError | None = None
            if header_len > 0 and FRAME_HEADER_BYTES + header_len <= file_size:
                header_bytes = stream.read(header_len)
                try:
                    return _framed(WireReader(header_bytes, path, FRAME_HEADER_BYTES), file_size, header_len)
                except DumpFormatError as exc:
                    framed_error = exc
            with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                try:
                    return _bare(WireReader(mapped, path), file_size)
                except DumpFormatError as bare_error:
                    raise (framed_error or bare_error) from None
    except OSError as exc:
        raise DumpFormatError(f"cannot read the file: {exc.strerror}", where=path) from exc


# --- writing ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GeTensorPayload:
    """A tensor to write into a GE dump: its raw bytes and how the header describes them."""

    data: bytes
    dtype_code: int
    shape: tuple[int, ...]
    format_code: int = FORMAT_ND
    original_shape: tuple[int, ...] | None = None


def _shape_message(dims: Sequence[int]) -> bytes:
    return packed_varints_field(1, list(dims)) if dims else b""


def _tensor_message(payload: GeTensorPayload, numbers: dict[str, int], inline: bool) -> bytes:
    parts = [
        varint_field(numbers["data_type"], payload.dtype_code) if payload.dtype_code else b"",
        varint_field(numbers["format"], payload.format_code) if payload.format_code else b"",
        bytes_field(numbers["shape"], _shape_message(payload.shape)),
    ]
    if inline:
        parts.append(bytes_field(numbers["data"], payload.data))
    parts.append(varint_field(numbers["size"], len(payload.data)) if payload.data else b"")
    if payload.original_shape is not None:
        parts.append(bytes_field(numbers["original_shape"], _shape_message(payload.original_shape)))
    return b"".join(parts)


def encode_ge_dump(
    inputs: Sequence[GeTensorPayload],
    outputs: Sequence[GeTensorPayload],
    *,
    op_name: str = "",
    dump_time_us: int = 0,
    framed: bool = True,
    buffer_sizes: Sequence[int] = (),
    workspace_sizes: Sequence[int] = (),
) -> bytes:
    """Return the bytes of a GE dump file holding these tensors, in the framed or the bare form."""
    version = FRAMED_VERSION if framed else BARE_VERSION
    header = [
        bytes_field(_DUMP_VERSION, version.encode()),
        varint_field(_DUMP_TIME, dump_time_us) if dump_time_us else b"",
    ]
    header += [bytes_field(_DUMP_OUTPUT, _tensor_message(p, _OUTPUT_FIELDS, not framed)) for p in outputs]
    header += [bytes_field(_DUMP_INPUT, _tensor_message(p, _INPUT_FIELDS, not framed)) for p in inputs]
    blobs = [(_DUMP_BUFFER, size) for size in buffer_sizes] + [(_DUMP_SPACE, size) for size in workspace_sizes]
    for kind, size in blobs:
        data = bytes(size)
        body = (bytes_field(_BLOB_DATA, data) if not framed else b"") + (
            varint_field(_BLOB_SIZE, size) if size else b""
        )
        header.append(bytes_field(kind, body))
    if op_name:
        header.append(bytes_field(_DUMP_OP_NAME, op_name.encode()))
    message = b"".join(header)
    if not framed:
        return message
    payloads = [p.data for p in inputs] + [p.data for p in outputs] + [bytes(size) for _, size in blobs]
    return len(message).to_bytes(FRAME_HEADER_BYTES, "little") + message + b"".join(payloads)


def write_ge_dump(
    folder: Path,
    name: GeDumpFileName,
    inputs: Sequence[GeTensorPayload],
    outputs: Sequence[GeTensorPayload],
    *,
    framed: bool = True,
) -> Path:
    """Write one op's GE dump file into ``folder`` (created if needed) and return its path.

    Refuses to replace an existing file: a dump is never overwritten.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name.file_name()
    content = encode_ge_dump(inputs, outputs, op_name=name.op_name, dump_time_us=name.timestamp_us, framed=framed)
    with open(path, "xb") as stream:
        stream.write(content)
    return path


def payload_from_tensor(tensor: object, *, layout: str = "ND") -> GeTensorPayload:
    """Return a tensor (torch or numpy) as a GE payload, in ``layout`` ``"ND"`` or ``"FRACTAL_NZ"``."""
    import torch

    from llmcheck.plugin_api import dtype_name, tensor_bytes
    from llmcheck.plugins.torchair_ge.ge_dtypes import TORCH_TO_GE_DTYPE
    from llmcheck.plugins.torchair_ge.ge_formats import nd_to_nz

    value = torch.as_tensor(tensor).detach().cpu().contiguous()
    code = TORCH_TO_GE_DTYPE.get(dtype_name(value.dtype))
    if code is None:
        raise ValueError(f"GE dumps have no dtype for {value.dtype}")
    if layout == "FRACTAL_NZ":
        column_tile = max(1, 32 // value.element_size())
        storage = nd_to_nz(value, column_tile)
        return GeTensorPayload(
            bytes(tensor_bytes(storage)), code, tuple(storage.shape), FORMAT_FRACTAL_NZ, tuple(value.shape)
        )
    if layout != "ND":
        raise ValueError(f"payload_from_tensor writes ND or FRACTAL_NZ, not {layout}")
    return GeTensorPayload(bytes(tensor_bytes(value)), code, tuple(value.shape), FORMAT_ND, tuple(value.shape))


def _is_step_folder(directory: Path) -> bool:
    """Return whether a folder sits where CANN puts one step's dump files (``.../{modelId}/{step}``)."""
    return directory.name.isdigit() and directory.parent.name.isdigit()


def dump_files_under(folder: Path, skipped: list[tuple[Path, str]] | None = None) -> list[tuple[Path, GeDumpFileName]]:
    """Return every GE dump file below ``folder`` with its parsed name, sorted by path.

    ``skipped``, when given, receives what is passed over among the dump files, with why:
    a file beside a dump file (or in a step folder of the CANN tree) whose name is not a
    dump file name -- hidden files and the companions torchair and CANN tools write
    (``COMPANION_SUFFIXES``) aside -- and a folder link, which is never entered.
    """
    found: list[tuple[Path, GeDumpFileName]] = []
    links: list[tuple[Path, str]] = []
    for directory, file_names in walk_files(folder, links):
        unparsed = []
        found_before = len(found)
        for file_name in file_names:
            parsed = parse_dump_file_name(file_name)
            if parsed is not None:
                found.append((inside_dump(directory / file_name, folder), parsed))
            elif not file_name.startswith(".") and not file_name.endswith(COMPANION_SUFFIXES):
                unparsed.append(directory / file_name)
        if skipped is None:
            continue
        if unparsed and (len(found) > found_before or _is_step_folder(directory)):
            skipped.extend((path, NOT_A_DUMP_FILE_NAME) for path in sorted(unparsed))
    if skipped is not None:
        skipped.extend(links)
    return sorted(found, key=lambda item: str(item[0]))
