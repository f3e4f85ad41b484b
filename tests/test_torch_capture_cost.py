"""What torch capture may cost the captured run: nothing in its values, no host read per tensor.

The forward keeps copies of what it records and hands each step to the dump writer's
thread, which measures the statistics (batched, float64) and writes the shards; the
statistics equal a per-tensor float64 reference bit for bit, whatever the batching.
CUDA variants are in ``test_torch_capture_cuda.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from llmcheck import DumpConfig, read_dump, register_hook
from llmcheck.bundled_model import random_llama
from llmcheck.core.capture.statistics import tensor_stats

#: Tensor methods that bring a value to the host: on an accelerator each one waits for the device.
HOST_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
}

CAPTURE_MODES = {
    "statistics only": dict(statistics_only=True),
    "full module tensors": dict(),
    "op level": dict(mode="op"),
}


class HostReadCounter(TorchFunctionMode):
    """Counts the calls that read a tensor's value to the host, made by the thread that runs the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func in HOST_READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


class Block(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, hidden)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


def stack_of_blocks(blocks: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(Block(16) for _ in range(blocks)))


@pytest.mark.parametrize("blocks", [2, 12])
@pytest.mark.parametrize("options", CAPTURE_MODES.values(), ids=CAPTURE_MODES.keys())
def test_the_forward_reads_no_recorded_value_to_the_host(tmp_path: Path, blocks: int, options: dict) -> None:
    model = stack_of_blocks(blocks)
    # weight digests read each parameter once per dump, by design; the recorded tensors are what is checked here
    config = DumpConfig(dump_path=tmp_path, weight_digests=False, **options)
    with torch.no_grad(), register_hook(model, config) as session:
        with HostReadCounter() as counter:
            model(torch.randn(2, 3, 16))
    assert counter.reads == []  # not per tensor, not per step: the writer thread does the reading
    assert session.records_written >= 10 * blocks


def test_weight_digests_read_each_parameter_at_the_first_dumped_step_only(tmp_path: Path) -> None:
    model = stack_of_blocks(2)
    config = DumpConfig(dump_path=tmp_path, token_range=None, statistics_only=True)
    with torch.no_grad(), register_hook(model, config):
        with HostReadCounter() as first:
            model(torch.randn(2, 3, 16))
        with HostReadCounter() as second:
            model(torch.randn(2, 3, 16))
    assert first.reads.count("cpu") >= len(list(model.parameters()))
    assert second.reads == []


def test_a_large_tensor_is_measured_off_the_forward_too(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 1 << 17), torch.nn.ReLU())  # outputs of 256K elements
    config = DumpConfig(dump_path=tmp_path, statistics_only=True, weight_digests=False)
    with torch.no_grad(), register_hook(model, config) as session:
        with HostReadCounter() as counter:
            output = model(torch.randn(2, 4))
    assert counter.reads == []
    record = next(r for r in read_dump(session.path).records if r.key.name == "root" and r.key.io == "output")
    assert record.stats == tensor_stats(output)  # measured alone, in cache-sized chunks, like every large tensor


@pytest.mark.parametrize("options", CAPTURE_MODES.values(), ids=CAPTURE_MODES.keys())
def test_outputs_and_generated_tokens_are_bitwise_identical_with_capture_on(tmp_path: Path, options: dict) -> None:
    torch.set_num_threads(1)
    model = random_llama(seed=3, hidden_size=32, num_layers=2, vocab_size=64)
    prompt = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain_logits = model(prompt).logits
        plain_tokens = model.generate(prompt, max_new_tokens=3, do_sample=False)
        with register_hook(model, DumpConfig(dump_path=tmp_path, token_range=None, **options)) as session:
            captured_logits = model(prompt).logits
            captured_tokens = model.generate(prompt, max_new_tokens=3, do_sample=False)
    assert torch.equal(captured_logits, plain_logits)
    assert torch.equal(captured_tokens, plain_tokens)
    assert session.failure is None and session.records_written > 0


def reference_stats(tensor: torch.Tensor) -> dict[str, Any]:
    """Return the statistics of one tensor computed alone, over its finite elements, accumulated in float64."""
    values = tensor.reshape(1, -1).to(torch.float64)
    finite = torch.isfinite(values)
    count = finite.sum(dim=1, dtype=torch.float64)
    cleaned = torch.where(finite, values, 0.0)
    some = bool(count[0] > 0)
    return {
        "min": torch.where(finite, values, torch.inf).amin(dim=1).item() if some else None,
        "max": torch.where(finite, values, -torch.inf).amax(dim=1).item() if some else None,
        "mean": (cleaned.sum(dim=1) / count.clamp(min=1)).item() if some else None,
        "l2norm": (cleaned * cleaned).sum(dim=1).sqrt().item() if some else None,
        "nan_count": int(torch.isnan(values).sum()),
        "inf_count": int(torch.isinf(values).sum()),
    }


class Overflowing(torch.nn.Module):
    """Scales its input so far that some float16 values become Inf, and takes their difference (NaN)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = (x * 30000).half() * 4
        return torch.cat([scaled, scaled - scaled]).float()


@pytest.mark.parametrize("statistics_only", [True, False], ids=["statistics only", "full tensors"])
def test_batched_statistics_equal_each_tensor_measured_alone_bit_for_bit(tmp_path: Path, statistics_only: bool) -> None:
    model = torch.nn.Sequential(stack_of_blocks(3), Overflowing(), torch.nn.Flatten(0))
    seen: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        module.register_forward_hook(lambda m, args, out, name=name or "root": seen.setdefault(name, out.clone()))
    with (
        torch.no_grad(),
        register_hook(model, DumpConfig(dump_path=tmp_path, statistics_only=statistics_only, tensor_part=1)) as session,
    ):
        model(torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1)))
    records = {record.key.name: record for record in read_dump(session.path).records}
    assert set(records) == set(seen)
    for name, tensor in seen.items():
        assert records[name].stats.as_json() == reference_stats(tensor), name
    assert records["1"].stats.nan_count > 0 and records["1"].stats.inf_count > 0
    assert records["0.0.up"].stats.nan_count == 0


class ReusesItsChildsOutput(torch.nn.Module):
    """Zeroes the output of its child in place after the child returned it (the capture already holds it)."""

    def __init__(self) -> None:
        super().__init__()
        self.child = torch.nn.Linear(4, 4)
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.child(x)
        activated = self.relu(out)  # overwrites out: its negative values become 0
        return activated.mul_(0).add_(1)


@pytest.mark.parametrize("statistics_only", [True, False], ids=["statistics only", "full tensors"])
def test_a_tensor_changed_in_place_after_it_was_recorded_keeps_its_recorded_value(
    tmp_path: Path, statistics_only: bool
) -> None:
    torch.manual_seed(0)
    model = ReusesItsChildsOutput()
    inputs = torch.randn(3, 4)
    with torch.no_grad():
        child_output = model.child(inputs).clone()
        with register_hook(model, DumpConfig(dump_path=tmp_path, statistics_only=statistics_only)) as session:
            model(inputs)
    records = {(r.key.name, r.key.io): r for r in read_dump(session.path).records}
    assert child_output.min() < 0
    assert records[("child", "output")].stats.as_json() == reference_stats(child_output)
    assert records[("relu", "input")].stats.min == child_output.min().item()  # as ReLU found it
    assert records[("relu", "output")].stats.min == 0.0
    assert records[("root", "output")].stats.min == records[("root", "output")].stats.max == 1.0
    if not statistics_only:
        assert torch.equal(records[("child", "output")].data.load(), child_output)


class TiedProjection(torch.nn.Module):
    """One square Linear applied twice in a forward: its weight is read by four operators."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.proj(x)))


def test_op_level_stores_a_weight_once_per_step_and_names_only_the_weight_itself(tmp_path: Path) -> None:
    model = TiedProjection()
    with torch.no_grad(), register_hook(model, DumpConfig(dump_path=tmp_path, mode="op")) as session:
        model(torch.randn(2, 8))
    lines = [json.loads(line) for line in (session.path / "index.jsonl").read_text().splitlines()]
    weights = [line for line in lines if line.get("attrs", {}).get("parameter") == "proj.weight"]
    assert [line["name"] for line in weights] == ["proj/aten.t.default", "proj/aten.t.default"]
    assert len({(line["shard"], line["tensor"]) for line in weights}) == 1  # one copy of the bytes
    transposed = [line for line in lines if line["name"] == "proj/aten.addmm.default" and line["position"] == "2"]
    assert len(transposed) == 2 and all("parameter" not in line["attrs"] for line in transposed)
    dump = read_dump(session.path)
    assert torch.equal(
        next(r for r in dump.records if r.attrs.get("parameter") == "proj.weight").data.load(), model.proj.weight
    )


def test_the_host_read_counter_sees_every_kind_of_host_read() -> None:
    value = torch.tensor([1.5, 2.5])
    with HostReadCounter() as counter:
        value.sum().item(), value.tolist(), value.cpu(), bool(value[0] > 0), float(value[0]), int(value[1])
    assert sorted(counter.reads) == sorted(["item", "tolist", "cpu", "__bool__", "__float__", "__int__"])
