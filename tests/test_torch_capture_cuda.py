"""Torch capture on CUDA: asynchronous pinned copies, statistics fetched once per step, the run unchanged.

Skipped where no CUDA device exists (CI); run on a GPU machine with
``PYTHONPATH=src python -m pytest tests/test_torch_capture_cuda.py``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from llmcheck import DumpConfig, read_dump, register_hook
from llmcheck.bundled_model import random_llama
from llmcheck.core.capture.statistics import tensor_stats

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def cuda_llama():
    return random_llama(seed=0, hidden_size=256, num_layers=4, vocab_size=1024, num_heads=8).to("cuda")


def _prompt() -> torch.Tensor:
    return torch.randint(0, 1024, (2, 48), generator=torch.Generator().manual_seed(3)).to("cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_capture_leaves_outputs_bitwise_identical_and_saves_the_device_values(
    tmp_path: Path, cuda_llama, dtype
) -> None:
    model = cuda_llama if dtype == torch.float32 else copy.deepcopy(cuda_llama).to(dtype)
    layer_outputs: list[torch.Tensor] = []
    with torch.no_grad():
        plain = model(_prompt()).logits
        with register_hook(model, DumpConfig(dump_path=tmp_path, token_range=None)) as session:
            hook = model.model.layers[2].register_forward_hook(lambda m, a, out: layer_outputs.append(out.clone()))
            captured = model(_prompt()).logits
            hook.remove()
            tokens_captured = model.generate(_prompt(), max_new_tokens=3, do_sample=False)
        tokens_plain = model.generate(_prompt(), max_new_tokens=3, do_sample=False)
    assert torch.equal(captured, plain)
    assert torch.equal(tokens_captured, tokens_plain)
    assert session.path.name.endswith("_rank0_cuda0")
    dump = read_dump(session.path)
    record = next(
        r for r in dump.records if r.key.name == "model.layers.2" and r.key.io == "output" and r.key.step == 0
    )
    assert record.device == "cuda:0" and record.dtype == str(dtype).removeprefix("torch.")
    assert torch.equal(record.data.load(), layer_outputs[0].cpu())
    expected = tensor_stats(layer_outputs[0].cpu())
    assert record.stats.min == expected.min and record.stats.max == expected.max
    assert record.stats.mean == pytest.approx(expected.mean, rel=1e-9, abs=1e-12)
    assert record.stats.l2norm == pytest.approx(expected.l2norm, rel=1e-9)
    assert {r.key.step for r in dump.records} == {0, 1, 2, 3}


def test_cuda_inputs_are_copied_before_an_in_place_op(tmp_path: Path) -> None:
    from test_torch_capture import InPlaceOuter

    model = InPlaceOuter().to("cuda")
    with torch.no_grad(), register_hook(model, DumpConfig(dump_path=tmp_path, save_time="both")) as session:
        model(torch.zeros(1 << 20, device="cuda"))  # large enough that a late copy would see the change
    values = {(r.key.name, r.key.io, r.key.moment): r.data.load() for r in read_dump(session.path).records}
    assert torch.all(values[("inner", "input", "before")] == 0)
    assert torch.all(values[("inner", "input", "after")] == 1)
    assert torch.all(values[("root", "output", "after")] == 2)


def test_cuda_op_level_capture_replays_on_the_cpu(tmp_path: Path, cuda_llama) -> None:
    from llmcheck.core.capture.call_arguments import replay_call
    from llmcheck.core.records import RecordKey

    with (
        torch.no_grad(),
        register_hook(cuda_llama, DumpConfig(dump_path=tmp_path, mode="op", include=["model.layers.0.mlp"])) as session,
    ):
        cuda_llama(_prompt())
    dump = read_dump(session.path)
    by_key = dump.by_key()
    mm = next(
        r for r in dump.records if r.key.name == "model.layers.0.mlp.up_proj/aten.mm.default" and r.key.io == "output"
    )
    assert mm.device == "cuda:0"
    replayed = replay_call(
        mm.op_type,
        mm.attrs,
        lambda position: (
            by_key[RecordKey(mm.key.name, "input", position, mm.key.step, mm.key.call_index, "before")]
            .data.load()
            .double()
        ),
    )
    torch.testing.assert_close(replayed.float(), mm.data.load(), rtol=1e-4, atol=1e-5)


def test_cuda_statistics_only_capture_fetches_statistics_without_data(tmp_path: Path, cuda_llama) -> None:
    with (
        torch.no_grad(),
        register_hook(
            cuda_llama, DumpConfig(dump_path=tmp_path, statistics_only=True, mode=["module", "op"])
        ) as session,
    ):
        cuda_llama(_prompt())
    dump = read_dump(session.path)
    assert dump.records and all(r.data is None and r.stats.nan_count == 0 for r in dump.records)
    assert not list(session.path.glob("shard_*"))


@pytest.mark.parametrize(
    "options",
    [dict(statistics_only=True), dict(), dict(mode=["module", "op"])],
    ids=["statistics only", "full module tensors", "op level"],
)
def test_cuda_forward_makes_no_synchronising_call_and_leaves_outputs_bitwise_identical(
    tmp_path: Path, cuda_llama, options: dict
) -> None:
    with torch.no_grad():
        plain = cuda_llama(_prompt()).logits
        # weight digests copy each parameter to the host once per dump, by design: not part of this check
        session = register_hook(cuda_llama, DumpConfig(dump_path=tmp_path, weight_digests=False, **options))
        prompt = _prompt()
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call in any thread raises
        try:
            captured = cuda_llama(prompt).logits
        finally:
            torch.cuda.set_sync_debug_mode(0)
        session.close()
    assert session.failure is None  # the writer thread waited on events, not by synchronising
    assert torch.equal(captured, plain)
    dump = read_dump(session.path)
    assert dump.cut is None and dump.records and all(r.stats is not None for r in dump.records)
