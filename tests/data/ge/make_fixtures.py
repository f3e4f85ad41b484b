"""Writes the hand-built GE dump fixtures of this folder, byte by byte from the public proto field numbers.

Independent of llmcheck's writer on purpose: every tag below is spelled out from
``toolkit.dumpdata`` (``Ascend/msprobe: resource/dump_data.proto``), so the reader is tested
against the format, not against itself. Run ``python tests/data/ge/make_fixtures.py`` to
regenerate; the files are committed.

Tag byte = field_number << 3 | wire_type (0 varint, 2 length-delimited).
"""

import struct
from pathlib import Path

HERE = Path(__file__).parent


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def ld(tag: int, payload: bytes) -> bytes:  # length-delimited field with a one-byte tag
    return bytes([tag]) + varint(len(payload)) + payload


# --- framed: Add.Add_2.44.6.1706596912161941 -------------------------------------------
# Shape{dim=1 packed}: 0x0A len 02 02 -> dims [2, 2]
shape_2x2 = ld(0x0A, b"\x02\x02")
# OpInput{data_type=1 (0x08) FLOAT=1, format=2 (0x10) ND=2, shape=3 (0x1A), size=5 (0x28) 16}
op_input = b"\x08\x01" + b"\x10\x02" + ld(0x1A, shape_2x2) + b"\x28\x10"
# OpOutput{data_type=1, format=2, shape=3, size=6 (0x30) 16}
op_output = b"\x08\x01" + b"\x10\x02" + ld(0x1A, shape_2x2) + b"\x30\x10"
header = (
    ld(0x0A, b"2.0")  # version = 1
    + b"\x10"
    + varint(1706596912161941)  # dump_time = 2
    + ld(0x1A, op_output)  # output = 3
    + ld(0x22, op_input)  # input = 4 (first input)
    + ld(0x22, op_input)  # input = 4 (second input)
    + ld(0x32, b"Add_2")
)  # op_name = 6
payloads = (
    struct.pack("<4f", 1, 2, 3, 4)  # input 0
    + struct.pack("<4f", 10, 20, 30, 40)  # input 1
    + struct.pack("<4f", 11, 22, 33, 44)
)  # output 0
framed = struct.pack("<Q", len(header)) + header + payloads
(HERE / "Add.Add_2.44.6.1706596912161941").write_bytes(framed)

# --- bare (old v1): MatMul.layer.0.mm.12.3.1706596912170000 ------------------------------
# The op name "layer.0.mm" contains dots. Input: BF16 (27) [2] = [1.0, -2.0];
# output: FLOAT16 (2) [2] = [0.5, 4.0]; data inline (OpInput.data=4 tag 0x22, OpOutput.data=5 tag 0x2A).
bf16_data = struct.pack("<2H", 0x3F80, 0xC000)
fp16_data = struct.pack("<2e", 0.5, 4.0)
shape_2 = ld(0x0A, b"\x02")
bare_input = b"\x08\x1b" + b"\x10\x02" + ld(0x1A, shape_2) + ld(0x22, bf16_data)
bare_output = b"\x08\x02" + b"\x10\x02" + ld(0x1A, shape_2) + ld(0x2A, fp16_data)
bare = ld(0x0A, b"1.0") + ld(0x1A, bare_output) + ld(0x22, bare_input) + ld(0x32, b"layer.0.mm")
(HERE / "MatMul.layer.0.mm.12.3.1706596912170000").write_bytes(bare)

# --- framed FRACTAL_NZ: TransData.trans_nz.3.1.1706596912180000 --------------------------
# A float16 2x3 matrix [[1,2,3],[4,5,6]] stored FRACTAL_NZ: storage shape (N1, M1, M0, N0) =
# (1, 1, 16, 16), element (m, n) at tile row m, column n, zero padding elsewhere.
tile = [[0.0] * 16 for _ in range(16)]
for m, row in enumerate([[1, 2, 3], [4, 5, 6]]):
    for n, value in enumerate(row):
        tile[m][n] = float(value)
nz_data = b"".join(struct.pack("<16e", *row) for row in tile)
storage_shape = ld(0x0A, b"\x01\x01\x10\x10")
original_shape = ld(0x0A, b"\x02\x03")
# OpOutput{FLOAT16, format FRACTAL_NZ=29 (0x1d), shape, size=512 (0x80 0x04), original_shape=7 (0x3A)}
nz_output = b"\x08\x02" + b"\x10\x1d" + ld(0x1A, storage_shape) + b"\x30\x80\x04" + ld(0x3A, original_shape)
nz_header = ld(0x0A, b"2.0") + ld(0x1A, nz_output) + ld(0x32, b"trans_nz")
(HERE / "TransData.trans_nz.3.1.1706596912180000").write_bytes(struct.pack("<Q", len(nz_header)) + nz_header + nz_data)
