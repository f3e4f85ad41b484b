"""Judging a step again after its first introduced row judges that step alone: the other steps' rows are what judging them all again gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmcheck.core.capture.statistics import tensor_stats
from llmcheck.core.compare import compare_dumps
from llmcheck.core.dumps.store import DumpWriter
from llmcheck.core.dumps.tensor_io import dtype_name
from llmcheck.core.judging import divergence
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import RecordKey, TensorRecord

LAYERS, STEPS = 8, 4
#: (step, layer) -> the factor the my-run's output is off by there: a defect in two of the four steps
DEFECTS = {(1, 5): 1.02, (3, 2): 1.05}


def _write_decode(folder: Path, defective: bool) -> Path:
    """Write a decode-like dump: each step runs the layers in turn; the my-run adds rounding-sized noise, and the defects."""
    generator, noise = torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)
    order = 0
    with DumpWriter(folder, "test") as writer:
        for step in range(STEPS):
            hidden, carried = torch.randn(64, generator=generator), 1.0
            for layer in range(LAYERS):
                hidden = hidden * 1.1 + 0.01 * torch.randn(64, generator=generator)
                tensor = hidden.clone()
                if defective:
                    tensor = tensor * (1 + 1e-7 * torch.randn(64, generator=noise))
                    carried *= DEFECTS.get((step, layer), 1.0)  # the layers after a defect carry it on
                    tensor = tensor * carried
                key = RecordKey(name=f"model.layers.{layer}", step=step)
                record = TensorRecord(
                    key=key,
                    dtype=dtype_name(tensor.dtype),
                    shape=tuple(tensor.shape),
                    order=order,
                    stats=tensor_stats(tensor),
                )
                writer.add(record, tensor)
                order += 1
    return writer.path


def test_rejudging_the_steps_whose_cutoff_moved_equals_rejudging_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins = get_plugins()
    golden = plugins.load_tensors(_write_decode(tmp_path / "golden", defective=False))
    my = plugins.load_tensors(_write_decode(tmp_path / "my", defective=True))
    by_step = compare_dumps(golden, my, workers=1).rows
    assert {row.golden.key.step for row in by_step if row.attribution == divergence.INTRODUCED} == {1, 3}

    rejudge = divergence._Judge.rejudge

    def every_step(judge: divergence._Judge, cutoff: dict[int, int], steps: set[int]) -> None:
        rejudge(judge, cutoff, set(judge.steps))

    monkeypatch.setattr(divergence._Judge, "rejudge", every_step)
    all_steps = compare_dumps(golden, my, workers=1).rows
    assert [repr(row) for row in by_step] == [repr(row) for row in all_steps]
