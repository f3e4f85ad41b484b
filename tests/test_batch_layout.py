"""A serving engine's per-step batch bookkeeping survives the dump format, and broken bookkeeping is one error line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmcheck.plugin_api import (
    BATCHES_NAME,
    BatchLayout,
    DumpFormatError,
    DumpWriter,
    RecordKey,
    TensorRecord,
    read_dump,
)


def _dump_with_layouts(tmp_path: Path, layouts: list[BatchLayout]) -> Path:
    with DumpWriter(tmp_path, "vllm", rank=1, background=False) as writer:
        writer.add(TensorRecord(RecordKey("model.embed_tokens"), "float32", (3, 4), 0), torch.ones(3, 4))
        for layout in layouts:
            writer.add_batch_layout(layout)
    return writer.path


def test_layouts_written_per_step_read_back_by_rank_and_step(tmp_path: Path) -> None:
    prefill = BatchLayout(0, ("req-a", "req-b"), (0, 3, 5), (0, 1, 2, 0, 1))
    decode = BatchLayout(1, ("req-a", "req-b"), (0, 1, 2), (3, 2))
    dump = read_dump(_dump_with_layouts(tmp_path, [prefill, decode]))
    assert set(dump.batches) == {(1, 0), (1, 1)}
    assert dump.batches[(1, 0)].rows_of("req-b") == range(3, 5)
    assert dump.batches[(1, 1)].positions == (3, 2)
    assert dump.batches[(1, 1)].rows_of("req-c") is None


def test_a_dump_without_bookkeeping_has_no_batches(tmp_path: Path) -> None:
    assert read_dump(_dump_with_layouts(tmp_path, [])).batches == {}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"step": 0, "request_ids": ["a"], "query_start_loc": [0], "positions": []}', "1 requests need 2"),
        ('{"step": 0, "request_ids": ["a"], "query_start_loc": [0, 4], "positions": [0]}', "reach row 4 of 1"),
        ('{"step": 0, "request_ids": ["a"], "positions": [0]}', "missing field 'query_start_loc'"),
        ("[1, 2]", "not a batch layout"),
    ],
)
def test_broken_bookkeeping_is_one_error_naming_the_file_and_line(tmp_path: Path, line: str, problem: str) -> None:
    path = _dump_with_layouts(tmp_path, [])
    (path / BATCHES_NAME).write_text(line + "\n", encoding="utf-8")
    with pytest.raises(DumpFormatError) as raised:
        read_dump(path)
    message = raised.value.one_line()
    assert BATCHES_NAME in message and "line 1" in message and problem in message
