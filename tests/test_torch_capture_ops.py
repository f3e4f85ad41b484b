"""Op-level torch capture: every ATen operator with its exact arguments, replayable from the dump alone."""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import pytest
import torch

from llmcheck import DumpConfig, read_dump, register_hook
from llmcheck.core.capture.call_arguments import decode_call, encode_call, replay_call
from llmcheck.core.errors import DumpFormatError
from llmcheck.core.records import RecordKey

ATTENTION = "model.layers.0.self_attn"


@pytest.fixture
def op_dump(tmp_path: Path, tiny_llama):
    """An op-level dump of two generate steps of the tiny Llama, with the step-0 ONNX graph."""
    prompt = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(2))
    with (
        torch.no_grad(),
        register_hook(
            tiny_llama, DumpConfig(dump_path=tmp_path, mode="op", token_range=[0, 1], export_onnx=True)
        ) as session,
    ):
        tiny_llama.generate(prompt, max_new_tokens=2, do_sample=False)
    return read_dump(session.path)


def test_op_level_records_the_aten_ops_of_an_attention_block_with_their_arguments(op_dump) -> None:
    ops = {r.op_type for r in op_dump.records if r.parent == f"{ATTENTION}.q_proj" and r.key.step == 0}
    assert {"aten.t.default", "aten.mm.default"} <= ops
    attention_ops = {r.op_type for r in op_dump.records if r.parent == ATTENTION}
    assert {
        "aten.transpose.int",
        "aten.mul.Tensor",
        "aten.cat.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
    } <= attention_ops
    sdpa = next(
        r
        for r in op_dump.records
        if r.key.name == f"{ATTENTION}/aten._scaled_dot_product_flash_attention_for_cpu.default"
        and r.key.io == "output"
        and r.key.step == 0
    )
    assert [arg["tensor"] for arg in sdpa.attrs["args"][:3]] == ["0", "1", "2"]
    assert sdpa.attrs["args"][0]["stride"] == [320, 16, 64, 1]  # q is a transposed view: its layout is kept
    assert sdpa.attrs["args"][3:] == [0.0, True]  # dropout_p, is_causal
    assert sdpa.attrs["kwargs"] == {"scale": 0.25}  # 1 / sqrt(head_dim 16)
    transpose = next(r for r in op_dump.records if r.op_type == "aten.transpose.int" and r.parent == ATTENTION)
    assert transpose.attrs["args"][1:] == [1, 2]
    cat = next(r for r in op_dump.records if r.op_type == "aten.cat.default" and r.parent == ATTENTION)
    assert [arg["tensor"] for arg in cat.attrs["args"][0]] == ["0.0", "0.1"]  # a list of tensors keeps its structure
    q_mm = next(
        r
        for r in op_dump.records
        if r.key.name == f"{ATTENTION}.q_proj/aten.mm.default" and r.key.step == 0 and r.key.io == "output"
    )
    assert q_mm.op_type == "aten.mm.default" and q_mm.parent == f"{ATTENTION}.q_proj"


def test_every_op_of_an_attention_block_replays_bitwise_from_the_dump_alone(op_dump) -> None:
    by_key = op_dump.by_key()
    replayed = 0
    for record in op_dump.records:
        if record.key.io != "output" or not record.parent.startswith(ATTENTION):
            continue
        key = record.key

        def tensor_at(position: str, key: RecordKey = key) -> torch.Tensor:
            return by_key[RecordKey(key.name, "input", position, key.step, key.call_index, "before")].data.load()

        result = replay_call(record.op_type, record.attrs, tensor_at)
        if isinstance(result, (tuple, list)):
            result = result[int(key.position)]
        assert torch.equal(result, record.data.load()), record.key.label()
        replayed += 1
    assert replayed > 60  # both steps, the projections and the attention proper


def test_op_calls_of_one_step_count_their_repeats(op_dump) -> None:
    repeats = sorted(
        {r.key.call_index for r in op_dump.records if r.key.name == f"{ATTENTION}/aten.mul.Tensor" and r.key.step == 0}
    )
    assert repeats[0] == 0 and len(repeats) >= 4  # rotary embedding multiplies q and k by cos and sin


def test_onnx_graph_of_the_captured_ops_connects_producers_to_consumers(op_dump) -> None:
    model = onnx.load(str(op_dump.root / "model.onnx"))
    onnx.checker.check_model(model)
    nodes = {node.name: node for node in model.graph.node}
    q_mm = nodes[f"{ATTENTION}.q_proj/aten.mm.default"]
    q_t = nodes[f"{ATTENTION}.q_proj/aten.t.default"]
    assert q_t.output[0] in q_mm.input  # the transposed weight flows into the matmul
    assert q_mm.domain == "llmcheck.torch" and q_mm.op_type == "aten.mm.default"
    assert {o.name for o in model.graph.output} >= {"lm_head/aten._unsafe_view.default.output.0"}


def test_op_type_prefixes_and_module_filters_apply_to_ops(tmp_path: Path, tiny_llama) -> None:
    with (
        torch.no_grad(),
        register_hook(
            tiny_llama, DumpConfig(dump_path=tmp_path, mode="op", type_prefixes=["mm"], include=["model.layers.1.mlp"])
        ) as session,
    ):
        tiny_llama(torch.zeros(1, 3, dtype=torch.long))
    names = {r.key.name for r in read_dump(session.path).records}
    assert names == {f"model.layers.1.mlp.{p}_proj/aten.mm.default" for p in ("gate", "up", "down")}


def test_in_place_op_inputs_are_saved_as_they_were_before_it(tmp_path: Path) -> None:
    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2
            y.add_(1)
            return y.mul(3)

    with torch.no_grad(), register_hook(Scale(), DumpConfig(dump_path=tmp_path, mode="op")) as session:
        session.model(torch.ones(2))
    values = {(r.key.name, r.key.call_index, r.key.io): r.data.load().tolist() for r in read_dump(session.path).records}
    assert values[("root/aten.mul.Tensor", 0, "input")] == [1.0, 1.0]
    assert values[("root/aten.mul.Tensor", 0, "output")] == [2.0, 2.0]
    assert values[("root/aten.add_.Tensor", 0, "input")] == [2.0, 2.0]  # not the 3.0 it became
    assert values[("root/aten.add_.Tensor", 0, "output")] == [3.0, 3.0]
    assert values[("root/aten.mul.Tensor", 1, "input")] == [3.0, 3.0]
    assert values[("root/aten.mul.Tensor", 1, "output")] == [9.0, 9.0]


def test_non_tensor_arguments_round_trip_exactly() -> None:
    weight = torch.arange(6.0).reshape(2, 3)
    args = (
        weight,
        [weight, None],
        -math.inf,
        1e-6,
        3,
        True,
        "floor",
        torch.bfloat16,
        torch.device("cuda", 1),
        torch.strided,
        torch.channels_last,
        complex(1.5, -2.0),
        torch.Size([2, 3]),
    )
    encoded, tensors = encode_call(args, {"dim": (0, -1), "out_dtype": None})
    assert [position for position, _ in tensors] == ["0", "1.0"]
    assert encoded["args"][2] == {"float": "-inf"}
    assert encoded["args"][7:10] == [{"dtype": "bfloat16"}, {"device": "cuda:1"}, {"layout": "strided"}]
    decoded_args, decoded_kwargs = decode_call(encoded, {"0": weight, "1.0": weight}.__getitem__)
    assert torch.equal(decoded_args[0], weight) and decoded_args[1][1] is None
    assert decoded_args[2:] == [
        -math.inf,
        1e-6,
        3,
        True,
        "floor",
        torch.bfloat16,
        torch.device("cpu"),
        torch.strided,
        torch.channels_last,
        complex(1.5, -2.0),
        [2, 3],
    ]
    assert decoded_kwargs == {"dim": [0, -1], "out_dtype": None}


def test_an_argument_that_cannot_be_recorded_makes_the_call_unreplayable() -> None:
    encoded, _ = encode_call((torch.Generator(),), {})
    with pytest.raises(DumpFormatError, match="Generator"):
        decode_call(encoded, lambda position: torch.zeros(1))
