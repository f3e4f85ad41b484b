"""opcheck on a format-exact ATB dump: every reference recomputes its op, defects are caught, nothing crashes.

The dump is a two-step (prefill + decode) tensor tree of a small fp16 decoder layer,
written file by file in ATB's ``.bin`` format with ``op_param.json`` beside each op, the
way ATB's probe writes it. Each "device" output is computed in float32 from the fp16
inputs and rounded to fp16, as an NPU kernel does; two outputs are then spoiled.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.plugins.atb.bin_format import write_bin

HIDDEN, HEADS, HEAD_SIZE, FFN, VOCAB, TOKENS = 64, 4, 16, 96, 50, 6
BLOCK_SIZE, BLOCKS = 4, 4
LINEAR_OFF_BY = 2.0**-6  # relative error planted in 3 % of the o_proj output (fp16 allows 2^-10)
FP16 = torch.float16


class AtbDumpWriter:
    """Writes one run of an ATB tensor tree: ``msit_dump_TS/tensors/0_4321/{step}/{id}_{Type}/...``."""

    def __init__(self, root: Path) -> None:
        self.root = root / "msit_dump_20240601_120000"
        self.run = self.root / "tensors" / "0_4321"

    def op(
        self, step: int, path: str, op_param: dict | None, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
    ) -> None:
        folder = self.run / str(step) / path
        (folder / "before").mkdir(parents=True)
        (folder / "after").mkdir(parents=True)
        if op_param is not None:
            (folder / "op_param.json").write_text(json.dumps(op_param))
        for index, tensor in enumerate(inputs):
            write_bin(folder / "before" / f"intensor{index}.bin", tensor.contiguous())
        for index, tensor in enumerate(outputs):
            write_bin(folder / "after" / f"outtensor{index}.bin", tensor.contiguous())


def _device(value: torch.Tensor) -> torch.Tensor:
    """Round a float32 result to fp16, as the kernel's output store does."""
    return value.to(FP16)


def _rms(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> torch.Tensor:
    x = x.float()
    return _device(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon) * gamma.float())


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    heads = x.float().view(x.shape[0], -1, HEAD_SIZE)
    first, second = heads.chunk(2, -1)
    rotated = torch.cat([-second, first], -1)
    return _device((heads * cos.float()[:, None] + rotated * sin.float()[:, None]).reshape(x.shape))


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    q, k, v = (t.float().view(t.shape[0], HEADS, HEAD_SIZE).transpose(0, 1) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores + mask.float()
    return _device((torch.softmax(scores, -1) @ v).transpose(0, 1))


def write_decoder_dump(root: Path) -> Path:
    """Write the dump (spoiled: ``1_6`` o_proj slightly, ``1_8`` RmsNorm badly) and return its root."""
    generator = torch.Generator().manual_seed(7)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(FP16)

    dump = AtbDumpWriter(root)
    embedding = randn(VOCAB, HIDDEN)
    ids = torch.tensor([3, 17, 5, 42, 8, 11], dtype=torch.int64)
    hidden = embedding[ids]
    dump.op(0, "0_GatherOperation", {"axis": 0, "batchDims": 0}, [embedding, ids], [hidden])

    layer = "1_Decoder_layer"
    gamma = (1.0 + 0.1 * torch.randn(HIDDEN, generator=generator)).to(FP16)
    normed = _rms(hidden, gamma)
    norm_param = {
        "layerType": 1,
        "normParam": {
            "quantType": 0,
            "epsilon": 1e-6,
            "layerNormEps": 1e-5,
            "rstd": False,
            "precisionMode": 0,
            "modelType": 0,
        },
        "preNormParam": {"quantType": 0, "epsilon": 1e-5, "hasBias": False},
        "postNormParam": {"quantType": 0, "epsilon": 1e-5, "hasBias": False},
    }
    dump.op(0, f"{layer}/0_RmsNormOperation", norm_param, [hidden, gamma], [normed])

    linear_param = {"transposeA": False, "transposeB": True, "hasBias": False, "outDataType": -1, "enAccum": False}
    w_qkv = randn(3 * HIDDEN, HIDDEN, scale=HIDDEN**-0.5)
    qkv = _device(normed.float() @ w_qkv.float().T)
    dump.op(0, f"{layer}/1_LinearOperation", linear_param, [normed, w_qkv], [qkv])
    q, k, v = qkv.chunk(3, dim=-1)
    dump.op(
        0,
        f"{layer}/2_SplitOperation",
        {"splitDim": -1, "splitNum": 3, "splitSizes": []},
        [qkv],
        [q.contiguous(), k.contiguous(), v.contiguous()],
    )

    angles = torch.arange(TOKENS, dtype=torch.float32)[:, None] * (
        10000.0 ** (-torch.arange(0, HEAD_SIZE, 2) / HEAD_SIZE)
    )
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(FP16)
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(FP16)
    seq_len = torch.tensor([TOKENS], dtype=torch.int32)
    q_rot, k_rot = _rope(q, cos, sin), _rope(k, cos, sin)
    dump.op(
        0, f"{layer}/3_RopeOperation", {"rotaryCoeff": 2, "cosFormat": 0}, [q, k, cos, sin, seq_len], [q_rot, k_rot]
    )

    key_cache = torch.zeros(BLOCKS, BLOCK_SIZE, HEADS, HEAD_SIZE, dtype=FP16)
    value_cache = torch.zeros_like(key_cache)
    slots = torch.arange(TOKENS, dtype=torch.int32)
    new_key_cache, new_value_cache = key_cache.clone(), value_cache.clone()
    new_key_cache.view(-1, HEADS, HEAD_SIZE)[:TOKENS] = k_rot.view(TOKENS, HEADS, HEAD_SIZE)
    new_value_cache.view(-1, HEADS, HEAD_SIZE)[:TOKENS] = v.view(TOKENS, HEADS, HEAD_SIZE)
    dump.op(
        0,
        f"{layer}/4_ReshapeAndCacheOperation",
        {"compressType": 0, "kvCacheCfg": 0},
        [k_rot.view(TOKENS, HEADS, HEAD_SIZE), v.view(TOKENS, HEADS, HEAD_SIZE), key_cache, value_cache, slots],
        [new_key_cache, new_value_cache],
    )

    scale = HEAD_SIZE**-0.5
    mask = torch.triu(torch.full((TOKENS, TOKENS), -10000.0), diagonal=1).to(FP16)
    attention_param = {
        "headNum": HEADS,
        "kvHeadNum": HEADS,
        "qScale": 1.0,
        "qkScale": scale,
        "calcType": 3,
        "kernelType": 0,
        "clampType": 0,
        "maskType": 1,
        "isTriuMask": 1,
        "quantType": 0,
        "batchRunStatusEnable": False,
        "kvcacheCfg": 0,
        "inputLayout": 0,
        "mlaVHeadSize": 0,
    }
    attended = _attention(q_rot, k_rot, v, mask, scale)
    dump.op(
        0,
        f"{layer}/5_SelfAttentionOperation",
        attention_param,
        [
            q_rot.view(TOKENS, HEADS, HEAD_SIZE),
            k_rot.view(TOKENS, HEADS, HEAD_SIZE),
            v.view(TOKENS, HEADS, HEAD_SIZE),
            mask,
            seq_len,
        ],
        [attended],
    )

    w_o, b_o = randn(HIDDEN, HIDDEN, scale=HIDDEN**-0.5), randn(HIDDEN, scale=0.1)
    projected = _device(attended.float().reshape(TOKENS, HIDDEN) @ w_o.float().T + b_o.float())
    spoiled = projected.clone().view(-1)
    spoiled[::33] = (spoiled[::33].float() * (1.0 + LINEAR_OFF_BY)).to(FP16)  # every 33rd element: 3 %
    dump.op(
        0,
        f"{layer}/6_LinearOperation",
        {**linear_param, "hasBias": True},
        [attended.reshape(TOKENS, HIDDEN), w_o, b_o],
        [spoiled.view(TOKENS, HIDDEN)],
    )

    residual = _device(hidden.float() + projected.float())
    dump.op(
        0,
        f"{layer}/7_ElewiseOperation",
        {
            "elewiseType": 8,
            "outTensorType": -1,
            "quantParam": {"inputScale": 1.0, "inputOffset": 0, "asymmetric": False},
            "mulsParam": {"varAttr": 0.0},
        },
        [hidden, projected],
        [residual],
    )
    gamma2 = (1.0 + 0.1 * torch.randn(HIDDEN, generator=generator)).to(FP16)
    wrongly_normed = _rms(residual, gamma2, epsilon=1.0)  # the defect: epsilon 1.0 instead of 1e-6
    normed2 = _rms(residual, gamma2)
    dump.op(0, f"{layer}/8_RmsNormOperation", norm_param, [residual, gamma2], [wrongly_normed])

    w_gate_up = randn(2 * FFN, HIDDEN, scale=HIDDEN**-0.5)
    gate_up = _device(normed2.float() @ w_gate_up.float().T)
    dump.op(0, f"{layer}/9_LinearOperation", linear_param, [normed2, w_gate_up], [gate_up])
    gate, up = gate_up.float().chunk(2, -1)
    activated = _device(torch.nn.functional.silu(gate) * up)
    dump.op(
        0, f"{layer}/10_ActivationOperation", {"activationType": 6, "scale": 1.0, "dim": -1}, [gate_up], [activated]
    )
    w_down = randn(HIDDEN, FFN, scale=FFN**-0.5)
    down = _device(activated.float() @ w_down.float().T)
    dump.op(0, f"{layer}/11_LinearOperation", linear_param, [activated, w_down], [down])
    layer_out = _device(residual.float() + down.float())
    dump.op(0, f"{layer}/12_ElewiseOperation", {"elewiseType": 8}, [residual, down], [layer_out])
    dump.op(0, layer, None, [hidden], [layer_out])  # the graph op itself: no reference exists

    logits = _device(layer_out.float() @ embedding.float().T)
    dump.op(0, "2_LinearOperation", linear_param, [layer_out, embedding], [logits])
    dump.op(0, "3_SoftmaxOperation", {"axes": [-1]}, [logits], [_device(torch.softmax(logits.float(), -1))])

    # Decode step: one new token attends over the cache the prefill filled.
    query = randn(1, HEADS, HEAD_SIZE)
    block_tables = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
    context_lengths = torch.tensor([TOKENS], dtype=torch.int32)
    decoded = _attention(query.view(1, HIDDEN), k_rot, v, None, scale)
    dump.op(
        1,
        "0_PagedAttentionOperation",
        {
            "headNum": HEADS,
            "qkScale": scale,
            "kvHeadNum": HEADS,
            "maskType": 0,
            "batchRunStatusEnable": False,
            "quantType": 0,
            "hasQuantOffset": False,
            "compressType": 0,
            "calcType": 0,
            "mlaVHeadSize": 0,
        },
        [query, new_key_cache, new_value_cache, block_tables, context_lengths],
        [decoded],
    )
    return dump.root


def _rows(report: Path) -> list[dict[str, str]]:
    with open(report, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def decoder_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_decoder_dump(tmp_path_factory.mktemp("atb"))


@pytest.mark.slow  # two worker processes, each importing torch
def test_opcheck_fails_exactly_the_spoiled_linear_and_rmsnorm(decoder_dump: Path, tmp_path: Path) -> None:
    code = main(["opcheck", "-i", str(decoder_dump), "-o", str(tmp_path), "-metric", "abs", "cos_sim", "kl", "-j", "2"])
    rows = _rows(tmp_path / "opcheck_result.csv")
    failed = {(row["op_id"], row["out_tensor_id"]) for row in rows if row["precision_result"] == "FAILED"}
    assert code == 3  # done, and failing outputs were found
    assert failed == {("1_6", "0"), ("1_8", "0")}
    checked = [row for row in rows if row["precision_result"] in ("PASS", "FAILED")]
    checked_types = {row["op_name"] for row in checked}
    assert checked_types == {
        "GatherOperation",
        "RmsNormOperation",
        "LinearOperation",
        "SplitOperation",
        "RopeOperation",
        "ReshapeAndCacheOperation",
        "SelfAttentionOperation",
        "ElewiseOperation",
        "ActivationOperation",
        "SoftmaxOperation",
        "PagedAttentionOperation",
    }
    assert len(checked) == 21  # 17 ops; Split gives 3 outputs, Rope and ReshapeAndCache 2
    by_op = {(row["op_id"], row["step"]): row for row in rows if row["out_tensor_id"] in ("0", "")}
    assert by_op["1", "0"]["precision_result"] == "unsupported"
    assert "no reference implementation for op type Decoder_layer" in by_op["1", "0"]["fail_reason"]
    linear = by_op["1_6", "0"]
    assert 96.0 < float(linear["rel_precision_rate(%)"]) < 97.5  # 1 element in 33 spoiled
    assert math.isclose(float(linear["max_rel_error"]), LINEAR_OFF_BY, rel_tol=0.1)
    assert linear["precision_standard"] == "99.9%(rel_error<=0.0009765625)"
    assert "99.9% required" in linear["fail_reason"]
    assert float(by_op["1_8", "0"]["rel_precision_rate(%)"]) < 5.0
    assert float(by_op["1_6", "0"]["cosine_similarity"]) > 0.9999
    assert list(rows[0])[:9] == [
        "op_id",
        "op_name",
        "op_param",
        "tensor_path",
        "out_tensor_id",
        "precision_standard",
        "precision_result",
        "rel_precision_rate(%)",
        "max_rel_error",
    ]
    assert list(rows[0])[9:14] == [
        "abs_precision_rate(%)",
        "max_abs_error",
        "cosine_similarity",
        "kl_divergence",
        "fail_reason",
    ]
    assert json.loads(by_op["1_6", "0"]["op_param"])["hasBias"] is True
    assert by_op["0", "0"]["tensor_path"] == "tensors/0_4321/0/0_GatherOperation/after/outtensor0.bin"
    assert by_op["0", "1"]["op_name"] == "PagedAttentionOperation"


def test_opcheck_filters_by_id_and_op_name(
    decoder_dump: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert main(["opcheck", "-i", str(decoder_dump), "-o", str(tmp_path), "-ids", "1_6,2", "-opname", "linear"]) == 3
    rows = _rows(tmp_path / "opcheck_result.csv")
    assert [(row["op_id"], row["precision_result"]) for row in rows] == [("1_6", "FAILED"), ("2", "PASS")]
    assert "replacing the previous report" not in caplog.text
    assert main(["opcheck", "-i", str(decoder_dump), "-o", str(tmp_path), "-opname", "paged,rope"]) == 0
    assert f"{tmp_path}: replacing the previous report (opcheck_result.csv" in caplog.text
    assert {row["op_name"] for row in _rows(tmp_path / "opcheck_result.csv")} == {
        "RopeOperation",
        "PagedAttentionOperation",
    }


def test_opcheck_of_a_missing_dump_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["opcheck", "-i", str(tmp_path / "nowhere"), "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"llmcheck: error: {tmp_path / 'nowhere'}: no such file or directory (check the path"
    )


def test_opcheck_xlsx_puts_checked_outputs_and_unchecked_ops_on_their_own_sheets(
    decoder_dump: Path, tmp_path: Path
) -> None:
    openpyxl = pytest.importorskip("openpyxl")
    main(["opcheck", "-i", str(decoder_dump), "-o", str(tmp_path), "-ids", "1", "-metric", "kl"])
    book = openpyxl.load_workbook(tmp_path / "opcheck_result.xlsx")
    assert book.sheetnames == ["opcheck_result", "addition_failed_cases"]
    checked = list(book["opcheck_result"].values)
    assert checked[0][:7] == (
        "op_id",
        "op_name",
        "op_param",
        "tensor_path",
        "out_tensor_id",
        "precision_standard",
        "precision_result",
    )
    assert len(checked) == 1 + 17 and all(isinstance(row[7], (int, float)) for row in checked[1:])  # rates as numbers
    assert [row[:2] for row in list(book["addition_failed_cases"].values)[1:]] == [("1", "Decoder_layer")]


def test_opcheck_takes_op_params_from_the_op_csv_given_with_c(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(6, 64, generator=generator).to(FP16)
    weight = (torch.randn(32, 64, generator=generator) * 0.125).to(FP16)
    dump = AtbDumpWriter(tmp_path)
    dump.op(0, "0_LinearOperation", None, [x, weight], [_device(x.float() @ weight.float().T)])  # no op_param.json
    columns = (
        "CaseNum|CaseName|OpName|OpParam|InNum|InDType|InFormat|InShape|OutNum|OutDType|OutFormat|OutShape|"
        "DataGenType|DataGenRange|InTensorFile|OutTensorFile|TestType|TestLevel|FromModel|SocVersion|"
        "ExpectedError"
    )
    row = [
        "1",
        "LinearOperation_0",
        "LinearOperation_0",
        json.dumps({"transposeA": False, "transposeB": True, "hasBias": False}),
        "2",
        "float16;float16",
        "nd;nd",
        "6,64;32,64",
        "1",
        "float16",
        "nd",
        "6,32",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
    ]
    op_csv = tmp_path / "operation_tensors_0.csv"
    op_csv.write_text(columns + "\n" + "|".join(row) + "\n")

    assert main(["opcheck", "-i", str(dump.root), "-o", str(tmp_path / "with_csv"), "-c", str(op_csv)]) == 0
    (checked,) = _rows(tmp_path / "with_csv" / "opcheck_result.csv")
    assert checked["precision_result"] == "PASS" and json.loads(checked["op_param"])["transposeB"] is True
    main(["opcheck", "-i", str(dump.root), "-o", str(tmp_path / "without_csv")])
    (unchecked,) = _rows(tmp_path / "without_csv" / "opcheck_result.csv")
    assert unchecked["precision_result"] != "PASS"  # transposeB unknown: the shapes cannot multiply
