"""A step is judged by its own rows alone: judging the steps one at a time, and judging a step again after its first
introduced row, give what judging every row together gives."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from compare_runs import capture_generate
from llmcheck.core.capture.statistics import tensor_stats
from llmcheck.core.compare import compare_dumps
from llmcheck.core.dumps.store import DumpWriter
from llmcheck.core.dumps.tensor_io import dtype_name
from llmcheck.core.judging import divergence
from llmcheck.core.judging import rows as rows_module
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import ComparisonRow, Dump, RecordKey, TensorRecord

LAYERS, STEPS = 8, 4
#: (step, layer) -> the factor the my-run's output is off by there: a defect in two of the four steps
DEFECTS = {(1, 5): 1.02, (3, 2): 1.05}


def _write_decode(folder: Path, defective: bool, *, with_data: bool = True, interleaved: bool = False) -> Path:
    """Write a decode-like dump: each step runs the layers in turn; the my-run adds rounding-sized noise, and the defects.

    ``with_data=False`` keeps statistics alone (``dump -sd``); ``interleaved`` orders the records
    of two steps turn about (step 0's first layer, step 1's, step 0's second, ...), as two
    requests a server runs side by side.
    """
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
                    order=(step // 2 * 2 * LAYERS + 2 * layer + step % 2) if interleaved else order,
                    stats=tensor_stats(tensor),
                )
                writer.add(record, tensor if with_data else None)
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


def _dumps(tmp_path: Path, **dump_options: bool) -> tuple[Dump, Dump]:
    plugins = get_plugins()
    golden = plugins.load_tensors(_write_decode(tmp_path / "golden", defective=False, **dump_options))
    return golden, plugins.load_tensors(_write_decode(tmp_path / "my", defective=True, **dump_options))


def _one_window(rows: Sequence[ComparisonRow]) -> list[list[int]]:
    return [sorted(range(len(rows)), key=lambda index: rows[index].golden.order)]


@pytest.mark.parametrize("with_data", [True, False], ids=["tensors", "statistics-only"])
def test_judging_a_step_at_a_time_equals_judging_every_row_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_data: bool
) -> None:
    golden, my = _dumps(tmp_path, with_data=with_data)
    steps_together = compare_dumps(golden, my, workers=1).rows  # small steps share a window
    assert len(divergence.step_windows(steps_together)) == 1
    assert {row.golden.key.step for row in steps_together if row.attribution == divergence.INTRODUCED} == {1, 3}

    monkeypatch.setattr(divergence, "WINDOW_ROWS", 1)  # every step a window of its own
    by_step = compare_dumps(golden, my, workers=1).rows
    assert len(divergence.step_windows(by_step)) == STEPS
    monkeypatch.setattr(divergence, "step_windows", _one_window)
    together = compare_dumps(golden, my, workers=1).rows
    assert [repr(row) for row in by_step] == [repr(row) for row in together] == [repr(row) for row in steps_together]


def test_small_steps_share_a_window_up_to_its_rows_and_a_large_step_is_one_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(divergence, "WINDOW_ROWS", 6)
    # steps of 3, 3, 3, 10 and 3 rows: the first two together, then each alone (any two are past 6)
    assert divergence._window_starts([3, 6, 9, 19], 22) == [6, 9, 19]
    assert divergence._window_starts([2, 4, 6], 8) == [6]  # three steps of two fill a window, the fourth starts one
    assert divergence._window_starts([10], 12) == [10]  # a large first step, then a small one
    assert divergence._window_starts([], 50) == []  # one step


def test_a_generate_dump_judged_a_step_at_a_time_equals_it_judged_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a real decode: every module's inputs and outputs, so feeders, parts, parents and siblings all count
    from llmcheck.bundled_model import random_llama

    def generate(model: torch.nn.Module, folder: Path) -> Dump:
        return get_plugins().load_tensors(capture_generate(model, folder, new_tokens=3))

    defective = random_llama(seed=0, num_layers=4)
    with torch.no_grad():
        defective.model.layers[2].mlp.down_proj.weight.mul_(1.05)
    golden, my = generate(random_llama(seed=0, num_layers=4), tmp_path / "g"), generate(defective, tmp_path / "m")
    monkeypatch.setattr(divergence, "WINDOW_ROWS", 1)  # every step a window of its own
    by_step = compare_dumps(golden, my, workers=1).rows
    assert len(divergence.step_windows(by_step)) == 3
    introduced = {(row.golden.key.name, row.golden.key.step) for row in by_step if row.attribution == "introduced"}
    assert introduced == {("model.layers.2.mlp.down_proj", step) for step in range(3)}

    monkeypatch.setattr(divergence, "WINDOW_ROWS", 4096)
    steps_together = compare_dumps(golden, my, workers=1).rows
    assert len(divergence.step_windows(steps_together)) == 1
    monkeypatch.setattr(divergence, "step_windows", _one_window)
    together = compare_dumps(golden, my, workers=1).rows
    assert [repr(row) for row in by_step] == [repr(row) for row in together] == [repr(row) for row in steps_together]


def test_steps_whose_records_interleave_are_judged_together(tmp_path: Path) -> None:
    rows = compare_dumps(*_dumps(tmp_path, interleaved=True), workers=1).rows
    (window,) = divergence.step_windows(rows)
    assert [rows[index].golden.order for index in window] == list(range(STEPS * LAYERS))
    # a record's nearest earlier one is another step's: nothing names its feeders, and it is judged on its own
    assert {row.golden.key.step for row in rows if row.verdict == "fail"} == {1, 3}
    assert {row.attribution for row in rows if row.verdict == "fail"} == {divergence.UNKNOWN}


def test_statistics_rows_made_a_block_at_a_time_equal_those_made_in_one_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden, my = _dumps(tmp_path, with_data=False)
    whole = compare_dumps(golden, my, workers=1).rows
    monkeypatch.setattr(rows_module, "PLAIN_BLOCK", 3)  # blocks of 3 of the 32 pairs: the last one short
    in_blocks = compare_dumps(golden, my, workers=1).rows
    assert [repr(row) for row in whole] == [repr(row) for row in in_blocks]
    assert {row.golden.key.step for row in whole if row.attribution == divergence.INTRODUCED} == {1, 3}
