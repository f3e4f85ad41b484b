"""Protobuf wire format, read and written by hand: the GE dump header needs nothing more.

CANN writes its data-dump files with the ``toolkit.dumpdata.DumpData`` message. Decoding it
takes varints and length-delimited fields only, so llmcheck reads it here without protoc,
generated code or a CANN install. Every read is bounds-checked: a truncated or corrupt
buffer raises :class:`~llmcheck.core.errors.DumpFormatError` naming the file and the byte
offset, never an ``IndexError``.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from llmcheck.plugin_api import DumpFormatError

WIRE_VARINT = 0
WIRE_FIXED64 = 1
WIRE_LENGTH_DELIMITED = 2
WIRE_START_GROUP = 3
WIRE_END_GROUP = 4
WIRE_FIXED32 = 5

_MAX_VARINT_BYTES = 10
_MAX_FIELD_NUMBER = (1 << 29) - 1


class WireField(NamedTuple):
    """One field of a message: its number, wire type, and value (an int) or payload span.

    ``start``/``end`` are absolute offsets of the payload of a length-delimited field (or of
    the field's bytes for fixed-width ones) in the buffer the field was read from.
    """

    number: int
    wire_type: int
    value: int
    start: int
    end: int


class WireReader:
    """Walks the fields of protobuf messages inside one buffer, reporting errors against a file.

    ``buffer`` is ``bytes`` or a read-only ``mmap`` (indexing gives ints, slicing copies only
    the slice), so a large file is walked without being read whole.
    """

    def __init__(self, buffer: bytes | mmap.mmap, where: Path | str, base_offset: int = 0) -> None:
        self.buffer = buffer
        self.where = where
        self.base_offset = base_offset  # where ``buffer[0]`` sits in the file, for error offsets

    def error(self, what: str, offset: int) -> DumpFormatError:
        """Return the error for a problem at buffer offset ``offset``."""
        return DumpFormatError(
            what,
            where=self.where,
            offset=self.base_offset + offset,
            hint="the file is truncated or is not a GE dump file",
        )

    def read_varint(self, position: int, end: int) -> tuple[int, int]:
        """Return ``(value, next_position)`` of the varint at ``position``."""
        if position < end:
            first = self.buffer[position]
            if first < 0x80:  # most tags, enums and small sizes: one byte
                return first, position + 1
        value = 0
        for index in range(_MAX_VARINT_BYTES):
            if position + index >= end:
                raise self.error("varint runs past the end of its message", position)
            byte = self.buffer[position + index]
            value |= (byte & 0x7F) << (7 * index)
            if not byte & 0x80:
                return value, position + index + 1
        raise self.error("varint longer than 10 bytes", position)

    def fields(self, start: int, end: int) -> Iterator[WireField]:
        """Yield every field of the message occupying ``buffer[start:end]``, in file order."""
        if end > len(self.buffer):
            raise self.error("message runs past the end of the data", len(self.buffer))
        position = start
        while position < end:
            tag_at = position
            tag, position = self.read_varint(position, end)
            number, wire_type = tag >> 3, tag & 7
            if number == 0 or number > _MAX_FIELD_NUMBER:
                raise self.error(f"invalid field number {number}", tag_at)
            if wire_type == WIRE_VARINT:
                value, next_position = self.read_varint(position, end)
                yield WireField(number, wire_type, value, position, next_position)
            elif wire_type == WIRE_LENGTH_DELIMITED:
                length, payload_at = self.read_varint(position, end)
                next_position = payload_at + length
                if next_position > end:
                    raise self.error(
                        f"field {number} declares {length} bytes but its message ends {end - payload_at} bytes later",
                        position,
                    )
                yield WireField(number, wire_type, length, payload_at, next_position)
            elif wire_type in (WIRE_FIXED64, WIRE_FIXED32):
                width = 8 if wire_type == WIRE_FIXED64 else 4
                next_position = position + width
                if next_position > end:
                    raise self.error(f"fixed-width field {number} runs past the end of its message", position)
                value = int.from_bytes(self.buffer[position:next_position], "little")
                yield WireField(number, wire_type, value, position, next_position)
            else:  # groups are not used by any message llmcheck reads
                raise self.error(f"unsupported wire type {wire_type} for field {number}", tag_at)
            position = next_position

    def text(self, field: WireField) -> str:
        """Return a length-delimited field as UTF-8 text."""
        try:
            return self.buffer[field.start : field.end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(f"field {field.number} is not UTF-8 text", field.start + exc.start) from None

    def packed_varints(self, field: WireField) -> list[int]:
        """Return the integers of a packed repeated varint field."""
        values = []
        position = field.start
        while position < field.end:
            value, position = self.read_varint(position, field.end)
            values.append(value)
        return values


# --- writing ---------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Return ``value`` (a non-negative int below 2**64) as a protobuf varint."""
    if value < 0:
        value += 1 << 64  # negative int32/int64 are written as 10-byte two's complement
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def varint_field(number: int, value: int) -> bytes:
    """Return a varint field (tag and value); proto3 writers omit zeros, callers decide."""
    return encode_varint(number << 3 | WIRE_VARINT) + encode_varint(value)


def bytes_field(number: int, payload: bytes) -> bytes:
    """Return a length-delimited field: a string, bytes, a sub-message or a packed list."""
    return encode_varint(number << 3 | WIRE_LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


def packed_varints_field(number: int, values: list[int] | tuple[int, ...]) -> bytes:
    """Return a packed repeated varint field (proto3's encoding of ``repeated uint64``)."""
    return bytes_field(number, b"".join(encode_varint(v) for v in values))
