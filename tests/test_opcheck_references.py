"""The opcheck hooks, the criteria table, and ATB reference variants checked against independent formulas."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from llmcheck import OpReference, UnsupportedOpError, hookimpl
from llmcheck.core.cli import main
from llmcheck.core.dumps.store import DumpWriter
from llmcheck.core.errors import PluginError
from llmcheck.core.opcheck.criteria import CRITERIA, criterion_for
from llmcheck.core.opcheck.measures import measure_output
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import RecordKey, TensorRecord
from llmcheck.plugins.atb.bin_format import write_bin
from llmcheck.plugins.atb.nz_format import nd_to_nz, nz_to_nd
from llmcheck.plugins.atb_ops import attention_ops, matmul_ops, norm_ops, rope_ops


def _positions(*tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    return {str(index): tensor for index, tensor in enumerate(tensors)}


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _write_op_dump(folder: Path, op_type: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> Path:
    """Write an llmcheck dump holding one op call of ``op_type``."""
    with DumpWriter(folder, "test") as writer:
        for io, tensors in (("input", inputs), ("output", outputs)):
            for position, tensor in enumerate(tensors):
                key = RecordKey(
                    name="block/op", io=io, position=str(position), moment="before" if io == "input" else "after"
                )
                writer.add(
                    TensorRecord(
                        key=key,
                        dtype=str(tensor.dtype).removeprefix("torch."),
                        shape=tuple(tensor.shape),
                        order=writer.records_written,
                        op_type=op_type,
                    ),
                    tensor.clone(),
                )
    return writer.path


class _GeluPlugin:
    """A third-party plugin adding one reference (the erf GELU, in float64)."""

    @staticmethod
    def gelu(inputs, params):
        return [torch.nn.functional.gelu(inputs["0"].double())]

    @hookimpl
    def llmcheck_register_op_references(self, register):
        register(OpReference("MyGeluOperation", _GeluPlugin.gelu, "GELU, erf form"))


def test_hook_llmcheck_register_op_references(llmcheck_plugins, tmp_path: Path) -> None:
    plugins = llmcheck_plugins(_GeluPlugin())
    assert plugins.op_references()["MyGeluOperation"].description == "GELU, erf form"
    assert "LinearOperation" in plugins.op_references()  # the built-in ATB references are there too
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    dump = _write_op_dump(tmp_path, "MyGeluOperation", [x], [torch.nn.functional.gelu(x.float()).to(torch.bfloat16)])
    assert main(["opcheck", "-i", str(dump), "-o", str(tmp_path / "out")]) == 0
    [row] = _rows(tmp_path / "out" / "opcheck_result.csv")
    assert (row["op_name"], row["precision_result"], row["dtype"]) == ("MyGeluOperation", "PASS", "bfloat16")


class _ClashingPlugin:
    @hookimpl
    def llmcheck_register_op_references(self, register):
        register(OpReference("LinearOperation", _GeluPlugin.gelu, "a second Linear"))


def test_two_plugins_registering_one_op_type_is_an_error_naming_both(llmcheck_plugins) -> None:
    with pytest.raises(PluginError, match=r"operator reference 'LinearOperation' is registered by both .*'atb_ops'"):
        llmcheck_plugins(_ClashingPlugin()).op_references()


class _CustomFamily:
    @hookimpl
    def llmcheck_resolve_op_reference(self, op_type):
        if op_type.startswith("custom."):
            return OpReference(op_type, _GeluPlugin.gelu, "the custom family")
        return None


def test_hook_llmcheck_resolve_op_reference(llmcheck_plugins) -> None:
    plugins = llmcheck_plugins(_CustomFamily())
    assert plugins.op_reference("custom.gelu").description == "the custom family"
    assert plugins.op_reference("aten.mm.default").description.startswith("replay of aten.mm.default")
    assert plugins.op_reference("aten.no_such_op.default") is None
    assert plugins.op_reference("SomeGraphOperation") is None
    assert plugins.op_reference("RmsNormOperation") is plugins.op_references()["RmsNormOperation"]


def test_aten_replay_refuses_random_and_uninitialised_ops_but_replays_dropout_off() -> None:
    reference = get_plugins().op_reference
    with pytest.raises(UnsupportedOpError, match="draws random numbers"):
        reference("aten.rand_like.default").compute({"0": torch.ones(3)}, {"args": [{"tensor": "0"}], "kwargs": {}})
    with pytest.raises(UnsupportedOpError, match="uninitialised memory"):
        reference("aten.empty_like.default").compute({"0": torch.ones(3)}, {"args": [{"tensor": "0"}], "kwargs": {}})
    replayed = reference("aten.native_dropout.default").compute(
        {"0": torch.ones(3, dtype=torch.bfloat16)}, {"args": [{"tensor": "0"}, 0.1, False], "kwargs": {}}
    )
    assert replayed["0"].dtype == torch.float64 and torch.equal(replayed["0"], torch.ones(3, dtype=torch.float64))


def test_aten_references_say_which_ops_are_pointwise_as_torch_tags_them() -> None:
    # a compare replays a statistics-only call on its recorded min and max only where the op
    # maps each element on its own: a softmax or a mean of those two elements is no element of theirs
    reference = get_plugins().op_reference
    pointwise = {
        op_type: reference(op_type).pointwise
        for op_type in (
            "aten.pow.Tensor_Scalar",
            "aten.rsqrt.default",
            "aten.silu.default",
            "aten._softmax.default",
            "aten.mean.dim",
            "aten.mm.default",
        )
    }
    assert pointwise == {
        "aten.pow.Tensor_Scalar": True,
        "aten.rsqrt.default": True,
        "aten.silu.default": True,
        "aten._softmax.default": False,
        "aten.mean.dim": False,
        "aten.mm.default": False,
    }
    assert reference("RmsNormOperation").pointwise is False  # a reference says so itself; ATB's norm does not


# --- the criteria table ----------------------------------------------------------------------


def test_a_full_pass_meets_a_full_requirement_so_bool_outputs_can_pass() -> None:
    flags = torch.tensor([True, False, True])
    assert criterion_for("bool").required_pass_percent == 100.0
    assert measure_output(flags, flags.clone(), CRITERIA["bool"]).passed
    assert not measure_output(flags, torch.tensor([True, True, True]), CRITERIA["bool"]).passed


def test_relative_error_near_zero_is_measured_against_the_dtype_resolution_not_ignored() -> None:
    reference = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    measured = measure_output(reference, torch.tensor([1e-3, 1.0, -2.0], dtype=torch.float16), CRITERIA["float16"])
    assert measured.max_rel_error > 1.0 and not measured.passed  # the original counted this as no error at all
    assert measured.max_abs_error == pytest.approx(1e-3, rel=1e-3)


def test_nan_where_the_reference_is_finite_fails_and_matching_nan_agrees() -> None:
    reference = torch.tensor([math.nan, 1.0, 2.0] * 400, dtype=torch.float64)
    same = measure_output(reference, reference.to(torch.float32), CRITERIA["float32"])
    assert same.passed and same.nonfinite_mismatch == 0
    broken = reference.to(torch.float32)
    broken[1] = math.nan
    measured = measure_output(reference, broken, CRITERIA["float32"])
    assert measured.nonfinite_mismatch == 1 and measured.max_rel_error == math.inf and not measured.passed


def test_integer_outputs_allow_off_by_one_only_where_the_table_says() -> None:
    reference = torch.arange(-64, 64, dtype=torch.float64)
    off_by_one = reference.to(torch.int8) + torch.tensor([1] + [0] * 127, dtype=torch.int8)
    assert measure_output(reference, off_by_one, CRITERIA["int8"]).passed
    assert not measure_output(reference, off_by_one.to(torch.int32), CRITERIA["int32"]).passed


# --- ATB references, variant by variant ------------------------------------------------------


def test_linear_reads_transposes_nz_weights_bias_and_int8_dequantisation() -> None:
    generator = torch.Generator().manual_seed(3)
    x, weight, bias = torch.randn(5, 24, generator=generator), torch.randn(32, 24, generator=generator), torch.randn(32)
    expected = x.double() @ weight.double().T + bias.double()
    nz_weight = nz_to_nd(nd_to_nz(weight))  # what the ATB loader gives: [1, 32, 32], k padded 24 -> 32
    [result] = matmul_ops.linear(_positions(x, nz_weight, bias), {"transposeB": True, "hasBias": True})
    assert torch.allclose(result, expected)
    [result] = matmul_ops.linear(
        _positions(x.T.contiguous(), weight.T.contiguous()), {"transposeA": True, "transposeB": False, "hasBias": False}
    )
    assert torch.allclose(result, x.double() @ weight.double().T)
    q_x = torch.randint(-128, 127, (4, 24), dtype=torch.int8, generator=generator)
    q_w = torch.randint(-128, 127, (8, 24), dtype=torch.int8, generator=generator)
    q_bias = torch.randint(-1000, 1000, (8,), dtype=torch.int32, generator=generator)
    scale = torch.full((8,), 0.015625, dtype=torch.float32)
    packed_scale = scale.view(torch.int32).to(torch.int64)  # ATB passes the float bits in an int64
    [result] = matmul_ops.linear(
        _positions(q_x, q_w, q_bias, packed_scale), {"transposeB": True, "hasBias": True, "outDataType": 1}
    )
    exact = (q_x.long() @ q_w.long().T + q_bias.long()).double() * 0.015625
    assert torch.equal(result, exact)


def test_rms_norm_prenorm_returns_the_norm_of_the_sum_and_the_sum() -> None:
    x, residual, gamma = torch.randn(3, 16), torch.randn(3, 16), torch.rand(16)
    normed, summed = norm_ops.rms_norm(
        _positions(x, residual, gamma), {"layerType": 2, "preNormParam": {"epsilon": 1e-6}}
    )
    total = x.double() + residual.double()
    assert torch.allclose(summed, total)
    assert torch.allclose(normed, total / torch.sqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.double())


def test_rope_coefficients_rotate_whole_heads_half_heads_or_pairs() -> None:
    q = torch.randn(2, 8)  # two tokens, one head of 8
    angles = torch.rand(2, 4) * 3
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    [rotated, _] = rope_ops.rope(_positions(q, q, cos, sin, torch.tensor([2])), {"rotaryCoeff": 2})
    first, second = q.double().chunk(2, -1)
    expected = torch.cat(
        [first * angles.cos() - second * angles.sin(), second * angles.cos() + first * angles.sin()], -1
    )
    assert torch.allclose(rotated, expected)
    pair_cos, pair_sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    [rotated, _] = rope_ops.rope(_positions(q, q, pair_cos, pair_sin, torch.tensor([2])), {"rotaryCoeff": 8})
    even, odd = q.double()[:, 0::2], q.double()[:, 1::2]
    assert torch.allclose(rotated[:, 0::2], even * angles.cos() - odd * angles.sin())
    assert torch.allclose(rotated[:, 1::2], odd * angles.cos() + even * angles.sin())


def test_self_attention_with_its_own_cache_matches_sdpa_with_grouped_kv_heads() -> None:
    heads, kv_heads, size, past, new = 4, 2, 8, 3, 2
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(new, heads * size, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(new, kv_heads * size, generator=generator, dtype=torch.float64) for _ in range(2))
    cache_k, cache_v = (
        torch.randn(1, 1, 8, kv_heads * size, generator=generator, dtype=torch.float64) for _ in range(2)
    )
    params = {"headNum": heads, "kvHeadNum": kv_heads, "qkScale": size**-0.5, "calcType": 1, "maskType": 0}
    [out] = attention_ops.self_attention(
        _positions(q, k, v, cache_k, cache_v, torch.tensor([past + new]), torch.tensor([new]), torch.tensor([0])),
        params,
    )
    keys = torch.cat([cache_k[0, 0, :past], k]).view(-1, kv_heads, size).repeat_interleave(2, 1).transpose(0, 1)
    values = torch.cat([cache_v[0, 0, :past], v]).view(-1, kv_heads, size).repeat_interleave(2, 1).transpose(0, 1)
    expected = torch.nn.functional.scaled_dot_product_attention(q.view(new, heads, size).transpose(0, 1), keys, values)
    assert torch.allclose(out, expected.transpose(0, 1))
    with pytest.raises(UnsupportedOpError, match="inputLayout"):
        attention_ops.self_attention(_positions(q, k, v, q), {**params, "inputLayout": 1})


def test_in_place_kv_cache_is_judged_on_the_cache_after_the_call(tmp_path: Path) -> None:
    """KvCache has no output tensors: opcheck compares the cache's after-state (dumped with -time 2)."""
    new_kv = torch.randn(3, 8).to(torch.float16)
    cache = torch.zeros(1, 1, 6, 8, dtype=torch.float16)
    expected = cache.clone()
    expected[0, 0, 1:4] = new_kv
    folder = tmp_path / "msit_dump_20240101_000000" / "tensors" / "0_99" / "0" / "0_KvCacheOperation"
    for moment in ("before", "after"):
        (folder / moment).mkdir(parents=True)
        tensors = [
            new_kv,
            torch.tensor([0], dtype=torch.int32),
            cache if moment == "before" else expected,
            torch.tensor([4], dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32),
        ]
        for index, tensor in enumerate(tensors):
            write_bin(folder / moment / f"intensor{index}.bin", tensor)
    (folder / "op_param.json").write_text(json.dumps({}))
    assert main(["opcheck", "-i", str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    [row] = _rows(tmp_path / "out" / "opcheck_result.csv")
    assert (row["op_name"], row["precision_result"]) == ("KvCacheOperation", "PASS")
    assert row["tensor_path"].endswith("after/intensor2.bin")
