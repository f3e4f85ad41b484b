"""The ATB ``.bin`` tensor file: hand-written fixtures decode to the values the reference layout says,
every ACL dtype round-trips, NZ tiles become ND, headers without data become statistics,
and broken files fail with one error naming the file and the byte offset."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmcheck.core.errors import DumpFormatError, LlmcheckError, PathOutsideDumpError
from llmcheck.plugins.atb.acl_dtypes import ACL_DTYPES, CODE_BY_TORCH_NAME, dtype_from_csv_name
from llmcheck.plugins.atb.bin_format import (
    no_data_reason,
    read_bin,
    read_bin_header,
    tensor_data,
    write_bin,
)
from llmcheck.plugins.atb.nz_format import nd_shape_of_nz, nd_to_nz, nz_to_nd

FIXTURES = Path(__file__).parent / "data" / "atb" / "bin"


# --- hand-written fixtures ---------------------------------------------------------------


def test_reference_worked_example_fp16_2x3_decodes_with_its_98_byte_header():
    header = read_bin_header(FIXTURES / "fp16_nd_2x3.bin")
    assert header.payload_offset == 98
    assert (header.dtype_code, header.format, header.dims) == (1, "nd", (2, 3))
    assert header.data_range() == (98, 12)
    tensor = read_bin(FIXTURES / "fp16_nd_2x3.bin")
    assert tensor.dtype == torch.float16
    assert tensor.tolist() == [[0.5, -1.0, 2.0], [65504.0, -0.0, 1 / 1024]]


def test_object_data_offset_inside_the_payload_is_honoured():
    tensor = read_bin(FIXTURES / "bf16_offset4.bin")
    assert tensor.dtype == torch.bfloat16
    assert tensor.float().tolist() == pytest.approx([1.0, -2.5, 2.9914e38, 0.15625], rel=1e-3)
    assert tensor[0].item() == 1.0 and tensor[3].item() == 0.15625


def test_description_only_file_gives_a_record_without_data():
    header = read_bin_header(FIXTURES / "int8_desc_only.bin")
    assert header.dims == (16, 4) and header.acl_dtype.torch_name == "int8"
    assert tensor_data(header) is None
    assert "description only" in no_data_reason(header)
    with pytest.raises(DumpFormatError, match="holds no tensor data"):
        read_bin(FIXTURES / "int8_desc_only.bin")


def test_statistics_header_carries_max_min_mean_l2norm_and_no_data():
    header = read_bin_header(FIXTURES / "fp32_stats.bin")
    assert (header.stats.max, header.stats.min, header.stats.mean, header.stats.l2norm) == (2.5, -1.0, 0.25, 7.75)
    assert tensor_data(header) is None and no_data_reason(header) == "statistics only"


def test_not_available_statistics_read_as_unknown():
    stats = read_bin_header(FIXTURES / "bool_stats_na.bin").stats
    assert stats is not None and (stats.max, stats.min, stats.mean, stats.l2norm) == (None, None, None, None)


def test_fractal_nz_fixture_reads_as_its_nd_matrix():
    header = read_bin_header(FIXTURES / "fp16_nz_16x32.bin")
    assert header.format == "fractal_nz" and header.dims == (1, 2, 16, 16)
    data = tensor_data(header)
    assert data.shape == (1, 16, 32) and data.loader is not None
    matrix = data.load()
    expected = torch.arange(16 * 32, dtype=torch.float16).reshape(1, 16, 32)
    assert torch.equal(matrix, expected)


def test_packed_int4_unpacks_low_nibble_first_to_signed_values():
    assert read_bin(FIXTURES / "int4_5.bin").tolist() == [1, -2, 7, -8, 3]


def test_minimal_tensor_view_header_takes_the_rest_of_the_file():
    assert read_bin(FIXTURES / "minimal_fp32_2.bin").tolist() == [1.5, -4.0]


def test_truncated_payload_names_the_file_and_byte_offset():
    path = FIXTURES / "truncated_fp16.bin"
    with pytest.raises(DumpFormatError) as caught:
        read_bin_header(path)
    assert caught.value.offset == path.stat().st_size
    assert str(path) in caught.value.one_line() and "payload truncated" in caught.value.one_line()


def test_data_reference_reads_the_referenced_file_of_the_dump():
    header = read_bin_header(FIXTURES / "ref_to_fp16_nd_2x3.bin")
    assert header.data_reference == "fp16_nd_2x3.bin" and not header.has_payload
    data = tensor_data(header, FIXTURES)
    assert data.path.name == "fp16_nd_2x3.bin" and data.offset == 98
    assert data.load().tolist() == [[0.5, -1.0, 2.0], [65504.0, -0.0, 1 / 1024]]


# --- round trips -------------------------------------------------------------------------


def _sample(torch_name: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    values = torch.randn(3, 5, generator=generator, dtype=torch.float64) * 4
    if torch_name == "bool":
        return values > 0
    if torch_name.startswith("complex"):
        return torch.complex(values, -values).to(getattr(torch, torch_name))
    if torch_name.startswith(("int", "uint")):
        return (values.abs() * 10).to(getattr(torch, torch_name))
    return values.to(getattr(torch, torch_name))


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("torch_name", sorted(CODE_BY_TORCH_NAME))
def test_every_acl_dtype_round_trips_bit_exactly(tmp_path, torch_name):
    tensor = _sample(torch_name)
    path = tmp_path / "t.bin"
    written = write_bin(path, tensor)
    assert written == path.stat().st_size
    header = read_bin_header(path)
    assert header.dtype_code == CODE_BY_TORCH_NAME[torch_name]
    loaded = read_bin(path)
    assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape
    assert (
        torch.equal(loaded.view(torch.uint8), tensor.view(torch.uint8))
        if tensor.dtype != torch.bool
        else torch.equal(loaded, tensor)
    )


def test_every_acl_dtype_code_is_known_with_its_csv_name():
    assert {dtype.code for dtype in ACL_DTYPES} >= {0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 16, 17, 27, 35, 36, 37}
    assert dtype_from_csv_name("bf16").torch_name == "bfloat16"
    assert dtype_from_csv_name("float").torch_name == "float32"
    assert dtype_from_csv_name("ACL_FLOAT16").torch_name == "float16"


def test_dtype_without_torch_equivalent_is_described_not_loaded(tmp_path):
    path = tmp_path / "hif8.bin"
    path.write_bytes(
        b"$Version=1.0\n$Object.Count=1\n$Object.Length=4\nformat=2\ndtype=34\ndims=4\n"
        b"$Object.data=0,4\n$End=1\n\x01\x02\x03\x04"
    )
    header = read_bin_header(path)
    assert header.acl_dtype.atb_name == "hifloat8" and tensor_data(header) is None
    assert "no torch equivalent" in no_data_reason(header)


@pytest.mark.parametrize("shape,block_columns", [((16, 32), 16), ((5, 20), 16), ((3, 33, 40), 16), ((2, 7, 64), 32)])
def test_nd_to_nz_and_back_keeps_every_value_and_pads_to_tiles(shape, block_columns):
    matrix = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    tiles = nd_to_nz(matrix, block_columns)
    m, n = shape[-2], shape[-1]
    m_padded, n_padded = -(-m // 16) * 16, -(-n // block_columns) * block_columns
    assert tiles.shape[-3:] == (n_padded // block_columns, m_padded, block_columns)
    restored = nz_to_nd(tiles)
    assert restored.shape == nd_shape_of_nz(tiles.shape)
    assert torch.equal(restored[..., :m, :n].reshape(shape), matrix)
    assert restored[..., m:, :].abs().sum() == 0 and restored[..., :, n:].abs().sum() == 0


def test_nz_file_written_from_tiles_reads_back_as_nd(tmp_path):
    matrix = torch.randn(16, 48, dtype=torch.float16)
    write_bin(tmp_path / "w.bin", nd_to_nz(matrix), format_code=29)
    assert torch.equal(read_bin(tmp_path / "w.bin"), matrix.unsqueeze(0))


def test_statistics_and_description_files_written_read_back(tmp_path):
    from llmcheck.core.records import TensorStats

    write_bin(
        tmp_path / "s.bin", dtype="bfloat16", dims=(2, 8), stats=TensorStats(min=-3.0, max=4.5, mean=0.5, l2norm=None)
    )
    header = read_bin_header(tmp_path / "s.bin")
    assert header.attrs["$Object.Count"] == "0" and header.attrs["l2norm"] == "N/A"
    assert (header.stats.min, header.stats.max, header.stats.mean, header.stats.l2norm) == (-3.0, 4.5, 0.5, None)


def test_writer_never_overwrites_or_appends(tmp_path):
    path = tmp_path / "once.bin"
    write_bin(path, torch.ones(2))
    size = path.stat().st_size
    with pytest.raises(LlmcheckError, match="refusing to overwrite"):
        write_bin(path, torch.zeros(3))
    assert path.stat().st_size == size


def test_tensor_larger_than_2_gib_is_memory_mapped_not_read(tmp_path):
    numel = 2_200_000_000  # uint8: 2.2 GB, a sparse file
    header = (
        f"$Version=1.0\n$Object.Count=1\n$Object.Length={numel}\nformat=2\ndtype=4\ndims={numel}\n"
        f"$Object.data=0,{numel}\n$End=1\n"
    ).encode()
    path = tmp_path / "big.bin"
    with open(path, "wb") as handle:
        handle.write(header)
        handle.seek(len(header) + numel - 1)
        handle.write(b"\x2a")
    tensor = read_bin(path)
    assert tensor.shape == (numel,) and int(tensor[-1]) == 42 and int(tensor[0]) == 0


# --- malformed files ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "content,offset,message",
    [
        (b"", 0, "empty"),
        (b"$Version=1.0\ndtype=1\ndims=2\n", 28, "no '$End=1'"),
        (b"$Version=1.0\nnot a field\ndtype=1\ndims=1\n$End=1\n\x00\x00", 13, "not 'name=value'"),
        (b"dtype=1\ndtype=1\ndims=1\n$End=1\n\x00\x00", 8, "appears twice"),
        (b"dtype=x\ndims=1\n$End=1\n", 0, "not an integer"),
        (b"dtype=99\ndims=1\n$End=1\n\x00", 0, "unknown aclDataType"),
        (b"dtype=1\ndims=2,-1\n$End=1\n", 8, "negative"),
        (
            b"$Object.Count=2\n$Object.Length=2\ndtype=1\ndims=1\n$Object.data=0,2\n$End=1\n\x00\x00",
            0,
            "lists 1 objects",
        ),
        (b"$Object.Count=1\n$Object.Length=2\ndtype=1\ndims=1\n$Object.data=1,2\n$End=1\n\x00\x00", 48, "runs past"),
        (
            b"$Object.Count=1\n$Object.Length=4\ndtype=1\ndims=1\n$Object.data=0,4\n$End=1\n\x00\x00\x00\x00",
            72,
            "need 2 bytes",
        ),
        (b"dtype=0\ndims=4\n$End=1\n", 22, "no tensor bytes"),
    ],
)
def test_malformed_header_is_one_error_with_the_byte_offset(tmp_path, content, offset, message):
    path = tmp_path / "bad.bin"
    path.write_bytes(content)
    with pytest.raises(DumpFormatError, match=re.escape(message)) as caught:
        read_bin_header(path)
    assert caught.value.offset == offset and caught.value.where == str(path)


def test_reference_outside_the_dump_is_refused(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    write_bin(tmp_path / "secret.bin", torch.ones(2, 3, dtype=torch.float16))
    write_bin(dump / "ref.bin", dtype="float16", dims=(2, 3), data_reference="../secret.bin")
    with pytest.raises(PathOutsideDumpError, match="outside the dump"):
        tensor_data(read_bin_header(dump / "ref.bin"), dump)


def test_reference_cycle_is_an_error_not_a_hang(tmp_path):
    write_bin(tmp_path / "a.bin", dtype="float16", dims=(2,), data_reference="b.bin")
    write_bin(tmp_path / "b.bin", dtype="float16", dims=(2,), data_reference="a.bin")
    with pytest.raises(DumpFormatError, match="chain longer"):
        tensor_data(read_bin_header(tmp_path / "a.bin"), tmp_path)


_NAMES = st.sampled_from(
    [
        "$Version",
        "$Object.Count",
        "$Object.Length",
        "$Object.data",
        "format",
        "dtype",
        "dims",
        "max",
        "min",
        "mean",
        "l2norm",
        "$End",
        "x",
    ]
)
_VALUES = st.one_of(
    st.integers(-3, 300).map(str),
    st.sampled_from(["", "1.0", "N/A", "2,3", "0,4", "0,12", "1,1,16,16", "29", "27", "a=b", "99999999999999999999"]),
    st.text(max_size=8),
)
_LINES = st.lists(
    st.tuples(_NAMES, _VALUES).map(lambda item: f"{item[0]}={item[1]}".encode("utf-8", "replace")), max_size=12
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=_LINES, end=st.booleans(), payload=st.binary(max_size=64), noise=st.binary(max_size=8))
def test_fuzzed_headers_only_ever_raise_the_format_error(tmp_path, lines, end, payload, noise):
    path = tmp_path / "fuzz.bin"
    path.write_bytes(b"\n".join(lines) + b"\n" + noise + (b"$End=1\n" if end else b"") + payload)
    try:
        header = read_bin_header(path)
        data = tensor_data(header)
        if data is not None and data.numel < 10_000:
            assert tuple(data.load().shape) == data.shape  # what parses also loads, in its stated shape
    except DumpFormatError as error:
        assert error.where is not None  # the one-line error names the file it could not read


def test_fixture_headers_follow_the_reference_line_order():
    lines = (FIXTURES / "fp16_nd_2x3.bin").read_bytes()[:98].decode().splitlines()
    assert [line.split("=")[0] for line in lines] == [
        "$Version",
        "$Object.Count",
        "$Object.Length",
        "format",
        "dtype",
        "dims",
        "$Object.data",
        "$End",
    ]
    written = Path(FIXTURES / "fp16_nd_2x3.bin").read_bytes()
    assert struct.unpack("<6e", written[98:]) == (0.5, -1.0, 2.0, 65504.0, -0.0, 1 / 1024)


def test_an_empty_tensor_in_the_minimal_layout_is_an_empty_tensor_not_a_description(tmp_path):
    path = tmp_path / "outtensor0.bin"
    path.write_bytes(b"dtype=0\ndims=0\n$End=1\n")  # what the original tool's writer gives an empty float tensor
    header = read_bin_header(path)
    assert no_data_reason(header) is None
    tensor = read_bin(path)
    assert tensor.dtype == torch.float32 and tuple(tensor.shape) == (0,)
