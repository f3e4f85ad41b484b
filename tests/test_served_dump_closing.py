"""A served model's dump whose engine worker was killed at shutdown: ``llmcheck dump`` closes it when its steps are whole.

vLLM force-kills its model worker as a stopped server shuts down; on a busy machine the
capture's writer may still be writing the last step then. The steps written before are whole
and the dump is closed with a note; a step cut part-way leaves the dump cut.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llmcheck.core.capture.dump_command import ProgramRun
from llmcheck.core.capture.statistics import tensor_stats
from llmcheck.core.dumps.store import DumpWriter, closing_state, read_dump
from llmcheck.core.records import BatchLayout, RecordKey, TensorRecord
from llmcheck.plugins.torch_hooks.backend import VllmCaptureBackend

LAYERS = 3


def _killed_engine_dump(folder: Path, records_per_step: list[int], layouts: int) -> Path:
    """Write a dump as an engine's writer leaves it when killed: no closing manifest, ``layouts`` steps laid out."""
    order = 0
    with DumpWriter(folder, "test") as writer:
        for step, count in enumerate(records_per_step):
            for layer in range(count):
                tensor = torch.full((2, 8), float(order))
                key = RecordKey(name=f"model.layers.{layer}", step=step)
                writer.add(TensorRecord(key, "float32", (2, 8), order, stats=tensor_stats(tensor)), tensor)
                order += 1
            writer.flush()
        for step in range(layouts):
            writer.add_batch_layout(BatchLayout(step, ("cmpl-1",), (0, 2), (step, step + 1)))
    manifest_path = writer.path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for closing_field in ("end_time", "records"):
        manifest.pop(closing_field, None)
    manifest_path.write_text(json.dumps(manifest))
    # the shard of the step the writer was writing when it was killed: never renamed, never indexed
    (writer.path / "shard_00099.safetensors.tmp").write_bytes(b"\0" * 64)
    return writer.path


def test_steps_written_whole_before_the_kill_are_closed_and_the_unfinished_shard_removed(tmp_path: Path) -> None:
    dump = _killed_engine_dump(tmp_path, [LAYERS, LAYERS, LAYERS], layouts=4)  # step 3's records never came
    assert closing_state(dump)[1] == "the capture did not close it (the program was killed or did not exit normally)"

    VllmCaptureBackend().close_whole_steps(dump, ProgramRun(0, "SIGINT"))

    assert closing_state(dump) == (3 * LAYERS, None)
    served = read_dump(dump)
    assert served.cut is None and len(served.records) == 3 * LAYERS
    assert sorted(served.batches) == [(0, 0), (0, 1), (0, 2)]
    assert not list(dump.glob("*.tmp"))
    assert served.manifest["closed_by"] == (
        "llmcheck dump: the program was stopped by SIGINT, and its capturing process ended without closing it; "
        "steps 0-2 are whole; step 3 was lost (its records were not written); "
        "the unfinished shard shard_00099.safetensors.tmp was removed"
    )


def test_a_step_cut_part_way_leaves_the_dump_cut_and_every_file_in_place(tmp_path: Path) -> None:
    dump = _killed_engine_dump(tmp_path, [LAYERS, LAYERS, LAYERS - 1], layouts=3)  # step 2 lost its last layer

    VllmCaptureBackend().close_whole_steps(dump, ProgramRun(0, "SIGTERM"))

    assert closing_state(dump)[1] == "the capture did not close it (the program was killed or did not exit normally)"
    assert (dump / "shard_00099.safetensors.tmp").is_file()
    assert "unfinished shard shard_00099.safetensors.tmp was discarded" in (read_dump(dump).cut or "")
