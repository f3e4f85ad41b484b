"""Writes the hand-made ATB fixtures in this folder, byte by byte, from the published layout.

Run once (``python tests/data/atb/make_fixtures.py``); the files are committed. Nothing here
uses llmcheck: headers are spelled out as the probe writes them (reference §2.1: the lines
``$Version``, ``$Object.Count``, ``$Object.Length``, ``format``, ``dtype``, ``dims``,
``$Object.data``, ``$End=1``) and payloads are packed with ``struct``, so the reader is
tested against the format, not against our own writer.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HERE = Path(__file__).parent


def half(value: float) -> bytes:
    return struct.pack("<e", value)


def halves(values: list[float]) -> bytes:
    return b"".join(half(v) for v in values)


def bf16(value: float) -> bytes:
    return struct.pack("<f", value)[2:]  # the high half of a float32 (values chosen exact in bf16)


def header(*lines: str) -> bytes:
    return "".join(line + "\n" for line in lines).encode("ascii") + b"$End=1\n"


def tensor_file(dtype: int, dims: str, payload: bytes, format_code: int = 2) -> bytes:
    return (
        header(
            "$Version=1.0",
            "$Object.Count=1",
            f"$Object.Length={len(payload)}",
            f"format={format_code}",
            f"dtype={dtype}",
            f"dims={dims}",
            f"$Object.data=0,{len(payload)}",
        )
        + payload
    )


def write(path: Path, content: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)


def bin_fixtures() -> None:
    folder = HERE / "bin"
    # The reference's worked example: fp16 ND [2,3], a 98-byte header then 12 bytes.
    write(folder / "fp16_nd_2x3.bin", tensor_file(1, "2,3", halves([0.5, -1.0, 2.0, 65504.0, -0.0, 1 / 1024])))
    # bf16 [4] at payload offset 4 (four padding bytes before the tensor).
    payload = b"\xde\xad\xbe\xef" + bf16(1.0) + bf16(-2.5) + bf16(3.0e38) + bf16(0.15625)
    write(
        folder / "bf16_offset4.bin",
        header(
            "$Version=1.0",
            "$Object.Count=1",
            f"$Object.Length={len(payload)}",
            "format=2",
            "dtype=27",
            "dims=4",
            "$Object.data=4,8",
        )
        + payload,
    )
    # -sd: description only.
    write(
        folder / "int8_desc_only.bin",
        header("$Version=1.0", "$Object.Count=0", "$Object.Length=0", "format=2", "dtype=2", "dims=16,4"),
    )
    # --type tensor stats: statistics, no payload.
    write(
        folder / "fp32_stats.bin",
        header(
            "$Version=1.0",
            "$Object.Count=0",
            "$Object.Length=0",
            "format=2",
            "dtype=0",
            "dims=3,5",
            "max=2.5",
            "min=-1",
            "mean=0.25",
            "l2norm=7.75",
        ),
    )
    write(
        folder / "bool_stats_na.bin",
        header(
            "$Version=1.0",
            "$Object.Count=0",
            "$Object.Length=0",
            "format=2",
            "dtype=12",
            "dims=8",
            "max=N/A",
            "min=N/A",
            "mean=N/A",
            "l2norm=N/A",
        ),
    )
    # FRACTAL_NZ: the ND fp16 matrix m[i][j] = i*32 + j, [16, 32], stored as [1, 2, 16, 16]:
    # column block 0 (j = 0..15) row by row, then column block 1 (j = 16..31).
    tiles = halves([float(i * 32 + block * 16 + c) for block in range(2) for i in range(16) for c in range(16)])
    write(folder / "fp16_nz_16x32.bin", tensor_file(1, "1,2,16,16", tiles, format_code=29))
    # int4: [1, -2, 7, -8, 3], two per byte, low nibble first.
    write(folder / "int4_5.bin", tensor_file(29, "5", bytes([0xE1, 0x87, 0x03])))
    # The tensor-view writer's minimal header: dtype, dims, $End, then the bytes.
    write(folder / "minimal_fp32_2.bin", b"dtype=0\ndims=2\n$End=1\n" + struct.pack("<2f", 1.5, -4.0))
    # Truncated: the header promises 12 bytes, 5 follow.
    write(folder / "truncated_fp16.bin", tensor_file(1, "2,3", halves([1, 2, 3, 4, 5, 6]))[:-7])
    # msprobe deduplication: the bytes are in another file of the dump.
    write(
        folder / "ref_to_fp16_nd_2x3.bin",
        header(
            "$Version=1.0",
            "$Object.Count=0",
            "$Object.Length=0",
            "format=2",
            "dtype=1",
            "dims=2,3",
            "data=fp16_nd_2x3.bin",
        ),
    )


def tree_fixture() -> None:
    root = HERE / "msit_dump_20240131_120000"
    run = root / "tensors" / "0_4242"
    layer_in = halves([0.5, 1.0, 1.5, 2.0, -0.5, -1.0, -1.5, -2.0])
    norm_weight = halves([1.0, 1.0, 1.0, 1.0])
    norm_out = halves([0.25, 0.5, 0.75, 1.0, -0.25, -0.5, -0.75, -1.0])
    linear_weight = halves([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    linear_out = halves([0.25, 0.5, 0.75, 1.0, -0.25, -0.5, -0.75, -1.0])
    layer = run / "0" / "0_Decoder_layer"
    write(layer / "op_param.json", '""')
    write(layer / "before" / "intensor0.bin", tensor_file(1, "2,4", layer_in))
    write(layer / "after" / "outtensor0.bin", tensor_file(1, "2,4", linear_out))
    norm = layer / "0_RmsNormOperation"
    write(norm / "op_param.json", json.dumps({"layerType": 1, "normParam": {"epsilon": 1e-06, "quantType": 0}}))
    write(norm / "before" / "intensor0.bin", tensor_file(1, "2,4", layer_in))
    write(norm / "before" / "intensor1.bin", tensor_file(1, "4", norm_weight))
    write(norm / "after" / "outtensor0.bin", tensor_file(1, "2,4", norm_out))
    linear = layer / "1_LinearOperation"
    write(
        linear / "op_param.json",
        json.dumps({"transposeA": False, "transposeB": True, "hasBias": False, "outDataType": -1}),
    )
    write(linear / "before" / "intensor0.bin", tensor_file(1, "2,4", norm_out))
    write(linear / "before" / "intensor1.bin", tensor_file(1, "4,4", linear_weight))
    write(linear / "after" / "outtensor0.bin", tensor_file(1, "2,4", linear_out))
    # Execute count 1: only outputs, the linear without op_param.json (its params are in the op CSV).
    write(run / "1" / "0_Decoder_layer" / "after" / "outtensor0.bin", tensor_file(1, "2,4", linear_out))
    write(
        run / "1" / "0_Decoder_layer" / "1_LinearOperation" / "after" / "outtensor0.bin",
        tensor_file(1, "2,4", linear_out),
    )
    write(
        root / "layer" / "4242" / "Decoder_layer_0.json",
        json.dumps(
            {
                "opName": "Decoder_layer_0",
                "opType": "Decoder_layer",
                "param": "",
                "inTensors": ["Decoder_layer_0_input_0", "Decoder_layer_0_input_1", "Decoder_layer_0_input_2"],
                "outTensors": ["Decoder_layer_0_output_0"],
                "internalTensors": ["Decoder_layer_0_internal_0"],
                "nodes": [
                    {
                        "opName": "RmsNormOperation_0_0",
                        "opType": "RmsNormOperation",
                        "param": {"layerType": 1, "normParam": {"epsilon": 1e-06, "quantType": 0}},
                        "inTensors": ["Decoder_layer_0_input_0", "Decoder_layer_0_input_1"],
                        "outTensors": ["Decoder_layer_0_internal_0"],
                    },
                    {
                        "opName": "LinearOperation_0_1",
                        "opType": "LinearOperation",
                        "param": {"transposeA": False, "transposeB": True, "hasBias": False, "outDataType": -1},
                        "inTensors": ["Decoder_layer_0_internal_0", "Decoder_layer_0_input_2"],
                        "outTensors": ["Decoder_layer_0_output_0"],
                    },
                ],
            },
            indent=4,
        ),
    )
    columns = (
        "CaseNum|CaseName|OpName|OpParam|InNum|InDType|InFormat|InShape|OutNum|OutDType|OutFormat|OutShape|"
        "DataGenType|DataGenRange|InTensorFile|OutTensorFile|TestType|TestLevel|FromModel|SocVersion|"
        "ExpectedError"
    )
    base = "/data/out/msit_dump_20240131_120000/tensors/0_4242"
    write(
        root / "operation_io_tensors" / "4242" / "operation_tensors_0.csv",
        "\n".join(
            [
                columns,
                f'1|RmsNormOperation_0_01|RmsNormOperation_0_0|{{"layerType":1,"normParam":{{"epsilon":1e-06,"quantType":0}}}}'
                f"|2|float16;float16|nd;nd|2,4;4|1|float16|nd|2,4|customize;customize| |{base}/0/0_Decoder_layer/"
                f"0_RmsNormOperation/before/intensor0.bin;{base}/0/0_Decoder_layer/0_RmsNormOperation/before/intensor1.bin|"
                f"{base}/0/0_Decoder_layer/0_RmsNormOperation/after/outtensor0.bin|||||NO_ERROR",
                f'2|LinearOperation_0_12|LinearOperation_0_1|{{"hasBias":false,"outDataType":-1,"transposeA":false,'
                f'"transposeB":true}}|2|float16;float16|nd;nd|2,4;4,4|1|float16|nd|2,4|customize;customize| |'
                f"{base}/0/0_Decoder_layer/1_LinearOperation/before/intensor0.bin;{base}/0/0_Decoder_layer/"
                f"1_LinearOperation/before/intensor1.bin|{base}/0/0_Decoder_layer/1_LinearOperation/after/outtensor0.bin"
                "|||||NO_ERROR",
            ]
        )
        + "\n",
    )
    write(
        root / "operation_io_tensors" / "4242" / "operation_tensors_1.csv",
        "\n".join(
            [
                columns,
                f'1|LinearOperation_0_11|LinearOperation_0_1|{{"hasBias":false,"outDataType":-1,"transposeA":false,'
                f'"transposeB":true}}|2|float16;float16|nd;nd|2,4;4,4|1|float16|nd|2,4|customize;customize| |'
                f"{base}/1/0_Decoder_layer/1_LinearOperation/before/intensor0.bin;{base}/1/0_Decoder_layer/"
                f"1_LinearOperation/before/intensor1.bin|{base}/1/0_Decoder_layer/1_LinearOperation/after/outtensor0.bin"
                "|||||NO_ERROR",
            ]
        )
        + "\n",
    )
    write(
        root / "cpu_profiling" / "4242" / "operation_statistic_0.txt",
        "\n".join(
            [
                "[RmsNormOperation_0_0]:totalTime:120, runnerCreateTime:3, runnerSetupTime:40, runnerFillHostTilingTime:5, "
                "setupTotalCount:1, setupCacheHitCount:0, setupCacheMissCount:1",
                "[RmsNormOperation_0_0]:totalTime:80, streamSyncTime:0, tillingCopyTime:2, kernelExecuteTime:60, "
                "launchTime:10, preLaunchTime:8",
                "[LinearOperation_0_1]:totalTime:200, runnerCreateTime:5, runnerSetupTime:90, runnerFillHostTilingTime:7, "
                "setupTotalCount:1, setupCacheHitCount:0, setupCacheMissCount:1",
                "[LinearOperation_0_1]:totalTime:150, streamSyncTime:0, tillingCopyTime:3, kernelExecuteTime:120, "
                "launchTime:20, preLaunchTime:7",
                "[LinearOperation_0_1]:totalTime:140, streamSyncTime:0, tillingCopyTime:3, kernelExecuteTime:110, "
                "launchTime:20, preLaunchTime:7",
            ]
        )
        + "\n",
    )


if __name__ == "__main__":
    bin_fixtures()
    tree_fixture()
