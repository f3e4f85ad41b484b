"""In-process torch capture (``register_hook``): what lands in the dump, filters, steps, moments, ranks."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
import torch

from llmcheck import DumpConfig, read_dump, register_hook, remove_hook
from llmcheck.bundled_model import random_llama
from llmcheck.core.capture.statistics import tensor_stats
from llmcheck.core.errors import UsageError


def _prompt(length: int = 6, vocab: int = 256) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(1))


def _capture(model: torch.nn.Module, tmp_path: Path, run, **config):
    with torch.no_grad(), register_hook(model, DumpConfig(dump_path=tmp_path, **config)) as session:
        run(model)
    return session, read_dump(session.path)


def _names(dump) -> set[str]:
    return {record.key.name for record in dump.records}


def assert_same_stats(measured, expected) -> None:
    """Extremes and counts exactly; mean and norm to float64 rounding (sums may run in another order)."""
    assert (measured.min, measured.max, measured.nan_count, measured.inf_count) == (
        expected.min,
        expected.max,
        expected.nan_count,
        expected.inf_count,
    )
    for value, reference in ((measured.mean, expected.mean), (measured.l2norm, expected.l2norm)):
        assert value == reference or value == pytest.approx(reference, rel=1e-12, abs=1e-15)


def test_generate_dumps_every_decoder_layer_output_for_the_steps_asked(tmp_path: Path, tiny_llama) -> None:
    prompt = _prompt()
    session, dump = _capture(
        tiny_llama, tmp_path, lambda m: m.generate(prompt, max_new_tokens=4, do_sample=False), token_range=[0, 2]
    )
    assert dump.cut is None
    assert session.step == 3 and session.steps_dumped == [0, 2]  # 4 new tokens = prefill + 3 decode forwards
    by_key = {(r.key.name, r.key.io, r.key.position, r.key.step): r for r in dump.records}
    for layer in range(2):
        prefill = by_key[(f"model.layers.{layer}", "output", "0", 0)]
        decode = by_key[(f"model.layers.{layer}", "output", "0", 2)]
        assert prefill.shape == (1, 6, 64) and decode.shape == (1, 1, 64)  # step 2 sees one new token
        assert prefill.op_type == "LlamaDecoderLayer" and prefill.parent == "model.layers"
        assert prefill.data.load().shape == (1, 6, 64)
    assert {r.key.step for r in dump.records} == {0, 2}
    root_inputs = {r.key.position for r in dump.records if r.key.name == "root" and r.key.io == "input"}
    assert "input_ids" in root_inputs  # generate passes the inputs by keyword; they are captured too
    assert by_key[("root", "output", "logits", 0)].shape == (1, 1, 256)  # generate asks for the last position only


def test_dumped_tensors_equal_what_the_model_computed(tmp_path: Path, tiny_llama) -> None:
    seen: dict[str, torch.Tensor] = {}
    handles = [
        module.register_forward_hook(
            lambda mod, args, out, name=name: seen.__setitem__(name, out[0] if isinstance(out, tuple) else out)
        )
        for name, module in tiny_llama.named_modules()
        if name in ("model.layers.1", "model.layers.0.mlp.down_proj")
    ]
    try:
        _, dump = _capture(tiny_llama, tmp_path, lambda m: m(_prompt()))
    finally:
        for handle in handles:
            handle.remove()
    for name, expected in seen.items():
        record = next(r for r in dump.records if r.key.name == name and r.key.io == "output" and r.key.position == "0")
        assert torch.equal(record.data.load(), expected)
        assert_same_stats(record.stats, tensor_stats(expected))


class AddOneInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1)


class InPlaceOuter(torch.nn.Module):
    """``(x * 1 + 1) * 2`` where the ``+ 1`` is an in-place op in the child module ``inner``."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = AddOneInPlace()
        self.register_buffer("anchor", torch.zeros(1))  # gives the model a device for .to()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x * 1) * 2


def test_inputs_are_saved_before_an_in_place_op_and_outputs_after(tmp_path: Path) -> None:
    _, dump = _capture(InPlaceOuter(), tmp_path, lambda m: m(torch.zeros(3)), save_time="both")
    values = {(r.key.name, r.key.io, r.key.moment): r.data.load().tolist() for r in dump.records}
    assert values[("inner", "input", "before")] == [0.0, 0.0, 0.0]  # as the in-place op found it
    assert values[("inner", "input", "after")] == [1.0, 1.0, 1.0]
    assert values[("inner", "output", "after")] == [1.0, 1.0, 1.0]
    assert values[("root", "output", "after")] == [2.0, 2.0, 2.0]


def test_a_module_called_twice_in_a_step_gets_two_call_indexes(tmp_path: Path) -> None:
    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Linear(2, 2, bias=False)
            torch.nn.init.eye_(self.scale.weight)
            self.scale.weight.data *= 3

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.scale(self.scale(x))

    _, dump = _capture(Twice(), tmp_path, lambda m: m(torch.ones(1, 2)), tensor_part=1)
    outputs = {r.key.call_index: r.data.load().tolist() for r in dump.records if r.key.name == "scale"}
    assert outputs == {0: [[3.0, 3.0]], 1: [[9.0, 9.0]]}  # never overwritten


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (dict(module_list=["LlamaMLP"]), {"model.layers.0.mlp", "model.layers.1.mlp"}),
        (dict(module_list=[torch.nn.Embedding]), {"model.embed_tokens"}),
        (
            dict(include=["model.layers.1.self_attn"]),
            {"model.layers.1.self_attn", *(f"model.layers.1.self_attn.{p}_proj" for p in "qkvo")},
        ),
        (
            dict(include=["model.layers.1.mlp*"], exclude=["*.up_proj"]),
            {
                "model.layers.1.mlp",
                "model.layers.1.mlp.gate_proj",
                "model.layers.1.mlp.down_proj",
                "model.layers.1.mlp.act_fn",
            },
        ),
        (dict(module_ids=["0_1_1"], include_children=False), {"model.layers.1"}),
        (
            dict(module_ids=["0_1_1_1"]),
            {
                "model.layers.1.mlp",
                "model.layers.1.mlp.gate_proj",
                "model.layers.1.mlp.up_proj",
                "model.layers.1.mlp.down_proj",
                "model.layers.1.mlp.act_fn",
            },
        ),
        (
            dict(type_prefixes=["llamarms"]),
            {"model.norm", *(f"model.layers.{i}.{n}_layernorm" for i in range(2) for n in ("input", "post_attention"))},
        ),
    ],
)
def test_filters_select_exactly_the_modules_asked(tmp_path: Path, tiny_llama, config, expected) -> None:
    _, dump = _capture(tiny_llama, tmp_path, lambda m: m(_prompt()), **config)
    assert _names(dump) == expected


@pytest.mark.parametrize(("tensor_part", "ios"), [(0, {"input"}), (1, {"output"}), (2, {"input", "output"})])
def test_tensor_part_picks_inputs_outputs_or_both(tmp_path: Path, tiny_llama, tensor_part, ios) -> None:
    _, dump = _capture(tiny_llama, tmp_path, lambda m: m(_prompt()), tensor_part=tensor_part, include=["model.norm"])
    assert {r.key.io for r in dump.records} == ios


def test_statistics_only_writes_no_tensor_data_and_the_same_statistics(tmp_path: Path, tiny_llama) -> None:
    _, full = _capture(tiny_llama, tmp_path / "full", lambda m: m(_prompt()))
    _, stats_only = _capture(tiny_llama, tmp_path / "stats", lambda m: m(_prompt()), statistics_only=True)
    assert not list((stats_only.root).glob("shard_*"))
    assert all(r.data is None for r in stats_only.records)
    assert [(r.key, r.stats) for r in stats_only.records] == [(r.key, r.stats) for r in full.records]
    sample = next(r for r in full.records if r.key.name == "model.layers.0.mlp")
    assert_same_stats(sample.stats, tensor_stats(sample.data.load()))


def test_a_tensor_shared_by_several_calls_is_stored_once(tmp_path: Path, tiny_llama) -> None:
    session, dump = _capture(tiny_llama, tmp_path, lambda m: m(_prompt()))
    index = [json.loads(line) for line in (dump.root / "index.jsonl").read_text().splitlines()]
    qkv_inputs = {
        line["tensor"]
        for line in index
        if line["io"] == "input" and line["name"] in {f"model.layers.0.self_attn.{p}_proj" for p in "qkv"}
    }
    assert len(qkv_inputs) == 1  # q, k and v read the same normalised hidden state
    assert session.writer.bytes_written < sum(r.nbytes for r in dump.records)


def test_memory_cap_hands_records_over_within_a_step(tmp_path: Path, tiny_llama) -> None:
    _, capped = _capture(tiny_llama, tmp_path / "capped", lambda m: m(_prompt()), max_pending_bytes=4096)
    _, uncapped = _capture(tiny_llama, tmp_path / "uncapped", lambda m: m(_prompt()))
    assert len(list(capped.root.glob("shard_*.safetensors"))) > 5
    assert len(list(uncapped.root.glob("shard_*.safetensors"))) == 1
    assert [r.key for r in capped.records] == [r.key for r in uncapped.records]
    for a, b in zip(capped.records, uncapped.records):
        assert torch.equal(a.data.load(), b.data.load())


def test_topology_lists_every_module_in_first_execution_order_with_its_id(tmp_path: Path, tiny_llama) -> None:
    _, dump = _capture(tiny_llama, tmp_path, lambda m: m(_prompt()), mode=[])
    assert dump.records == []  # mode=[]: the module tree only
    model = dump.topology.children[0]
    assert (dump.topology.name, dump.topology.op_type) == ("root", "LlamaForCausalLM")
    # rotary_emb is defined last but runs before the layers; the ModuleList takes its first layer's place
    assert [child.name for child in model.children] == [
        "model.embed_tokens",
        "model.rotary_emb",
        "model.layers",
        "model.norm",
    ]
    assert model.children[2].attrs["id"] == "0_1"
    assert {node.name for node in dump.topology.walk()} == {name or "root" for name, _ in tiny_llama.named_modules()}


def test_two_sessions_in_one_process_are_independent(tmp_path: Path) -> None:
    first, second = random_llama(seed=1), random_llama(seed=2, num_layers=1)
    with torch.no_grad():
        with (
            register_hook(first, DumpConfig(dump_path=tmp_path, include=["model.norm"])) as a,
            register_hook(second, DumpConfig(dump_path=tmp_path, token_range=[1], include=["lm_head"])) as b,
        ):
            for _ in range(2):
                first(_prompt())
                second(_prompt())
    assert a.path != b.path
    assert {(r.key.name, r.key.step) for r in read_dump(a.path).records} == {("model.norm", 0)}
    assert {(r.key.name, r.key.step) for r in read_dump(b.path).records} == {("lm_head", 1)}


def _generate_two_steps(model: torch.nn.Module) -> None:
    model.generate(_prompt(), max_new_tokens=2, do_sample=False)  # the prefill and one decode: steps 0 and 1


def test_a_token_range_the_program_never_reaches_warns_with_the_steps_that_ran(
    tmp_path: Path, tiny_llama, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="llmcheck"):
        session, dump = _capture(tiny_llama, tmp_path, _generate_two_steps, token_range=[7, 99])
    assert dump.records == [] and dump.cut is None
    assert [record.getMessage() for record in caplog.records] == [
        f"token_range [7, 99]: the program ran steps 0-1 only; nothing was dumped into {session.path}"
    ]


def test_a_token_range_that_is_reached_in_part_dumps_without_a_warning(
    tmp_path: Path, tiny_llama, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="llmcheck"):
        _, dump = _capture(tiny_llama, tmp_path, _generate_two_steps, token_range=[1, 99], include=["lm_head"])
    assert {record.key.step for record in dump.records} == {1}
    assert caplog.records == []


def test_remove_hook_stops_capture_and_leaves_the_model_without_hooks(tmp_path: Path, tiny_llama) -> None:
    session = register_hook(tiny_llama, DumpConfig(dump_path=tmp_path, token_range=None))
    with torch.no_grad():
        tiny_llama(_prompt())
        remove_hook(session)
        tiny_llama(_prompt())
    assert session.step == 0
    assert {r.key.step for r in read_dump(session.path).records} == {0}
    assert read_dump(session.path).cut is None
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in tiny_llama.modules())


def test_rank_and_device_are_in_the_folder_name_and_every_record(tmp_path: Path, tiny_llama, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")
    session, dump = _capture(tiny_llama, tmp_path, lambda m: m(_prompt()), include=["lm_head"])
    assert session.path.name.endswith("_rank3_cpu")
    assert {(r.rank, r.device) for r in dump.records} == {(3, "cpu")}
    assert dump.manifest["rank"] == 3 and dump.manifest["backend"] == "torch"


def test_device_ids_leave_out_a_process_on_another_device(tmp_path: Path, tiny_llama) -> None:
    with torch.no_grad(), register_hook(tiny_llama, DumpConfig(dump_path=tmp_path, device_ids=["0"])) as session:
        tiny_llama(_prompt())
    assert session.path is None and list(tmp_path.iterdir()) == []


def test_cpu_profiling_writes_an_operator_table_per_step(tmp_path: Path, tiny_llama) -> None:
    session, _ = _capture(
        tiny_llama,
        tmp_path,
        lambda m: m.generate(_prompt(), max_new_tokens=2, do_sample=False),
        token_range=[0, 1],
        profile_cpu=True,
        statistics_only=True,
    )
    tables = sorted((session.path / "cpu_profiling").glob("*.csv"))
    assert [t.name for t in tables] == ["operation_statistic_0.csv", "operation_statistic_1.csv"]
    rows = list(csv.DictReader(tables[0].open()))
    by_op = {row["op_name"]: row for row in rows}
    assert int(by_op["aten::linear"]["calls"]) == 2 * 7 + 1  # 7 projections per layer and the lm_head
    assert float(by_op["aten::linear"]["cpu_time_total_us"]) > 0
    assert "aten::clone" not in by_op  # the capture's own copies are left out


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tensor_part", 5),
        ("mode", "api"),
        ("save_time", "later"),
        ("token_range", [-1]),
        ("max_pending_bytes", 0),
    ],
)
def test_bad_config_values_are_usage_errors_naming_the_field(field, value) -> None:
    with pytest.raises(UsageError, match=f"DumpConfig.{field}"):
        DumpConfig(**{field: value})


def test_register_hook_refuses_an_unknown_hook_type(tiny_llama) -> None:
    with pytest.raises(UsageError, match="hook_type"):
        register_hook(tiny_llama, DumpConfig(), hook_type="dump_api")


def test_statistics_measured_together_equal_statistics_measured_one_by_one() -> None:
    from llmcheck.core.capture.statistics import segmented_stats_vectors, stats_from_vectors

    generator = torch.Generator().manual_seed(4)
    tensors = [
        torch.randn(64, 48, generator=generator),
        torch.randn(48, 64, generator=generator).bfloat16(),
        torch.tensor([1.0, float("nan"), float("inf"), -2.0]),
        torch.empty(0, 3),
        torch.arange(10),
        torch.tensor([True, False, True]),
        torch.tensor([float("nan")]),
        torch.tensor(3.5),
        torch.randn(4, dtype=torch.complex64, generator=generator),
    ]
    together = stats_from_vectors(list(segmented_stats_vectors(tensors).unbind(0)))
    for measured, tensor in zip(together, tensors):
        assert_same_stats(measured, tensor_stats(tensor))
