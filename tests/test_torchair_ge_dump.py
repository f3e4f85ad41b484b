"""GE dump files (CANN data dump): the framed and bare forms, dtypes, layouts, names, and broken files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmcheck.core.errors import DumpFormatError
from llmcheck.plugins.torchair_ge.ge_dtypes import GE_DTYPE_TO_TORCH
from llmcheck.plugins.torchair_ge.ge_dump import (
    GeDumpFileName,
    GeTensorPayload,
    encode_ge_dump,
    parse_dump_file_name,
    payload_from_tensor,
    read_ge_dump,
    write_ge_dump,
)
from llmcheck.plugins.torchair_ge.ge_formats import nd_to_nz, nz_to_nd

FIXTURES = Path(__file__).parent / "data" / "ge"


def test_hand_built_framed_fixture_reads_header_and_payloads():
    dump = read_ge_dump(FIXTURES / "Add.Add_2.44.6.1706596912161941")

    assert dump.framed and dump.version == "2.0" and dump.op_name == "Add_2"
    assert dump.dump_time == 1706596912161941
    assert [t.dtype for t in (*dump.inputs, *dump.outputs)] == ["float32"] * 3
    loaded = [t.tensor_data(dump.path).load() for t in (*dump.inputs, *dump.outputs)]
    assert loaded[0].tolist() == [[1, 2], [3, 4]]
    assert loaded[1].tolist() == [[10, 20], [30, 40]]
    assert loaded[2].tolist() == [[11, 22], [33, 44]]


def test_hand_built_bare_fixture_reads_inline_data_with_ge_dtype_numbers():
    dump = read_ge_dump(FIXTURES / "MatMul.layer.0.mm.12.3.1706596912170000")

    assert not dump.framed and dump.op_name == "layer.0.mm"
    (bf16_input,), (fp16_output,) = dump.inputs, dump.outputs
    assert (bf16_input.dtype_code, bf16_input.dtype) == (
        27,
        "bfloat16",
    )  # GE's BF16 is 27 (ACL says 27 too, but FLOAT16 differs)
    assert (fp16_output.dtype_code, fp16_output.dtype) == (2, "float16")  # GE FLOAT16 = 2, ACL's is 1
    assert bf16_input.tensor_data(dump.path).load().tolist() == [1.0, -2.0]
    assert fp16_output.tensor_data(dump.path).load().tolist() == [0.5, 4.0]


def test_hand_built_fractal_nz_fixture_loads_in_its_original_shape():
    dump = read_ge_dump(FIXTURES / "TransData.trans_nz.3.1.1706596912180000")

    (output,) = dump.outputs
    assert output.format_name == "FRACTAL_NZ" and output.shape == (1, 1, 16, 16)
    assert output.logical_shape == (2, 3)
    assert output.tensor_data(dump.path).load().tolist() == [[1, 2, 3], [4, 5, 6]]


def test_ge_dtype_table_is_not_acls():
    assert GE_DTYPE_TO_TORCH[1] == "float32" and GE_DTYPE_TO_TORCH[2] == "float16"
    assert GE_DTYPE_TO_TORCH[12] == "float64" and GE_DTYPE_TO_TORCH[27] == "bfloat16"
    assert GE_DTYPE_TO_TORCH[35] == "float8_e4m3fn" and GE_DTYPE_TO_TORCH[34] == "float8_e5m2"


def test_file_name_keeps_dots_inside_the_op_name():
    parsed = parse_dump_file_name("MatMulV2.model.layers.0.self_attn.q_proj.MatMul.7.2.1706596912161941")

    assert parsed == GeDumpFileName("MatMulV2", "model.layers.0.self_attn.q_proj.MatMul", 7, 2, 1706596912161941)
    assert parse_dump_file_name("Add.Add_2.44.6.1706596912161941.npy") is None
    assert parse_dump_file_name("dynamo_original_graph_1_rank_0_pid_1_ts_2.txt") is None
    assert parse_dump_file_name("manifest.json") is None


@pytest.mark.parametrize("framed", [True, False])
def test_writer_round_trips_every_torch_dtype_both_forms(tmp_path, framed):
    generator = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(3, 5, generator=generator).to(dtype)
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn)
    ]
    tensors += [torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.tensor([True, False]), torch.tensor(3.5)]
    name = GeDumpFileName("Custom", "block.0/custom", 1, 0, 123)
    path = write_ge_dump(
        tmp_path,
        name,
        [payload_from_tensor(t) for t in tensors[:4]],
        [payload_from_tensor(t) for t in tensors[4:]],
        framed=framed,
    )

    assert path.name == "Custom.block.0_custom.1.0.123"
    dump = read_ge_dump(path)
    assert dump.framed is framed
    for tensor, described in zip(tensors, (*dump.inputs, *dump.outputs)):
        loaded = described.tensor_data(path).load()
        assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape
        assert torch.equal(loaded.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def test_framed_size_counts_buffer_and_workspace_payloads(tmp_path):
    payload = payload_from_tensor(torch.ones(4))
    path = tmp_path / "Op.op.1.1.1"
    path.write_bytes(encode_ge_dump([payload], [payload], buffer_sizes=[32], workspace_sizes=[16]))

    dump = read_ge_dump(path)
    assert (dump.buffer_bytes, dump.workspace_bytes) == (32, 16)
    assert dump.outputs[0].tensor_data(path).load().tolist() == [1, 1, 1, 1]


def test_nz_layout_round_trips_batched_and_padded_matrices():
    generator = torch.Generator().manual_seed(1)
    for shape, column_tile in (((2, 3, 37, 20), 16), ((5,), 8), ((17, 33), 32)):
        matrix = torch.randn(shape, generator=generator)
        assert torch.equal(nz_to_nd(nd_to_nz(matrix, column_tile), shape), matrix)


def test_truncated_framed_file_names_the_file_and_where_the_payload_stops(tmp_path):
    whole = (FIXTURES / "Add.Add_2.44.6.1706596912161941").read_bytes()
    path = tmp_path / "Add.Add_2.44.6.1706596912161941"
    path.write_bytes(whole[:-5])

    with pytest.raises(DumpFormatError) as caught:
        read_ge_dump(path)
    message = caught.value.one_line()
    assert str(path) in message and "truncated" in message and "48 payload bytes" in message
    assert caught.value.offset == len(whole) - 5


def test_header_that_disagrees_with_its_shape_is_refused(tmp_path):
    wrong = GeTensorPayload(data=bytes(12), dtype_code=1, shape=(2, 2))  # 2x2 float needs 16 bytes
    path = tmp_path / "Op.op.1.1.1"
    path.write_bytes(encode_ge_dump([], [wrong]))

    with pytest.raises(DumpFormatError, match=r"output 0: FLOAT shape \[2, 2\] needs 16 bytes but the file gives 12"):
        read_ge_dump(path)


def test_empty_and_garbage_files_are_format_errors(tmp_path):
    empty = tmp_path / "Op.op.1.1.1"
    empty.write_bytes(b"")
    garbage = tmp_path / "Op.op.1.1.2"
    garbage.write_bytes(struct.pack("<Q", 4) + b"\xff\xff\xff\xff")
    for path in (empty, garbage):
        with pytest.raises(DumpFormatError) as caught:
            read_ge_dump(path)
        assert str(path) in caught.value.one_line() and caught.value.offset is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=200))
def test_fuzzed_bytes_raise_only_the_format_error(tmp_path, content):
    path = tmp_path / "Fuzz.fuzz.1.1.1"
    path.write_bytes(content)
    try:
        dump = read_ge_dump(path)
    except DumpFormatError as error:
        assert error.where == str(path)  # the one-line error names the file
    else:  # what parses only points at bytes the file has
        assert all(t.data_offset + t.nbytes <= len(content) for t in (*dump.inputs, *dump.outputs))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    position=st.integers(min_value=0, max_value=118),
    value=st.integers(min_value=0, max_value=255),
    cut=st.integers(min_value=1, max_value=119),
)
def test_mutated_and_cut_real_files_raise_only_the_format_error(tmp_path, position, value, cut):
    original = bytearray((FIXTURES / "Add.Add_2.44.6.1706596912161941").read_bytes())
    original[position % len(original)] = value
    path = tmp_path / "Add.Add_2.44.6.1"
    for content in (bytes(original), bytes(original[:cut])):
        path.write_bytes(content)
        try:
            dump = read_ge_dump(path)
        except DumpFormatError as error:
            assert error.where == str(path)  # the one-line error names the file
            continue
        for tensor in (*dump.inputs, *dump.outputs):  # what parses must also load or fail cleanly
            data = tensor.tensor_data(path)
            if data is not None:
                try:
                    assert tuple(data.load().shape) == data.shape
                except DumpFormatError as error:
                    assert error.where is not None
