"""``llmcheck compare --executor ray``: the same report as the local executor, on a real local Ray cluster.

The cluster is ``ray.init(num_cpus=2)`` in this process; the tests skip with the reason
where Ray is not installed (``pip install 'llmcheck[ray]'``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import torch

from compare_runs import capture_run, scaled_weight
from llmcheck.core.cli import main
from llmcheck.core.compare import compare_dumps
from llmcheck.core.measuring.pair_measure import PairJob
from llmcheck.core.measuring.ray_executor import SINGLE_THREADED_BLAS, RayExecutor, chunks_by_location
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import Dump, TensorData

HERE = Path(__file__).resolve().parent
INPUT_IDS = torch.tensor([[1, 7, 42, 9, 100, 3, 250, 18]])


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[object]:
    """Start a local two-CPU Ray cluster whose workers import this folder's helpers, and stop it afterwards."""
    try:
        import ray
    except ImportError as exc:
        pytest.skip(f"ray is not installed (pip install 'llmcheck[ray]'): {exc}")
    python_path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": python_path, "OMP_NUM_THREADS": "1"}},
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Return dumps of a seeded Llama and of the same model with one weight 5 % off."""
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0)
    root = tmp_path_factory.mktemp("ray_runs")
    golden = capture_run(model, INPUT_IDS, root / "golden")
    with scaled_weight(model, "model.layers.1.mlp.up_proj", 1.05):
        my = capture_run(model, INPUT_IDS, root / "my")
    return golden, my


@pytest.mark.slow
def test_the_ray_executor_writes_the_same_report_as_the_local_one_bit_for_bit(
    ray_cluster: object, two_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    golden, my = two_runs
    # The local executor as a large compare runs it: BLAS on one thread, as in its worker processes.
    local = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmcheck.core.cli",
            "compare",
            "-gp",
            str(golden),
            "-mp",
            str(my),
            "-o",
            str(tmp_path / "local"),
            "-j",
            "1",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **SINGLE_THREADED_BLAS},
    )
    assert local.returncode == 3, local.stderr
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "ray"), "--executor", "ray"]) == 3
    local_csv = (tmp_path / "local" / "cmp_report.csv").read_text()
    assert (tmp_path / "ray" / "cmp_report.csv").read_text() == local_csv  # every metric column, bit for bit
    local, remote = (json.loads((tmp_path / side / "summary.json").read_text()) for side in ("local", "ray"))
    assert remote["counts"] == local["counts"] and remote["first_introduced"] == local["first_introduced"]
    assert local["first_introduced"]["name"] == "model.layers.1.mlp.up_proj"
    assert remote["tensor_bytes_read"] == local["tensor_bytes_read"] > 0


def _with_loader(dump: Dump, loader_for) -> Dump:
    """Return the dump with each record's data reached through ``loader_for(record, data)`` (None: unchanged)."""
    records = []
    for record in dump.records:
        loader = loader_for(record, record.data) if record.data is not None else None
        data = TensorData(dtype=record.data.dtype, shape=record.data.shape, loader=loader) if loader else record.data
        records.append(record.with_changes(data=data))
    return dataclasses.replace(dump, records=records)


@pytest.mark.slow
def test_a_dead_worker_is_retried_and_a_pair_that_still_fails_is_an_error_row(
    ray_cluster: object, two_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    from ray_faults import always_dies, dies_once

    golden, my = (get_plugins().load_tensors(path) for path in two_runs)
    dying_once = "model.layers.0.mlp.down_proj"
    dying_always = "model.layers.1.mlp.gate_proj"

    def loader_for(record, data):
        if record.key.name == dying_once and record.key.io == "output":
            return partial(dies_once, tmp_path / "died_once", data)
        if record.key.name == dying_always and record.key.io == "output":
            return partial(always_dies, data)
        return None

    faulty = _with_loader(my, loader_for)
    undisturbed = compare_dumps(golden, my, executor=RayExecutor())
    remote = compare_dumps(golden, faulty, executor=RayExecutor())
    assert (tmp_path / "died_once").exists()  # the worker did die once, and the pair was measured on the retry
    assert len(remote.rows) == len(undisturbed.rows)  # no row lost
    by_label = {row.golden.key.label(): row for row in remote.rows}
    for row in undisturbed.rows:
        label = row.golden.key.label()
        if label.startswith(dying_always) and row.golden.key.io == "output":
            assert by_label[label].verdict == "error"
            assert by_label[label].reason.startswith("measuring failed on the Ray cluster:")
        else:
            assert {name: result.value for name, result in by_label[label].metrics.items()} == {
                name: result.value for name, result in row.metrics.items()
            }, label


def test_pairs_are_chunked_by_the_files_they_read(tmp_path: Path) -> None:
    def job(index: int, golden_file: str, my_file: str, nbytes: int) -> PairJob:
        return PairJob(
            index=index,
            golden=TensorData("float32", (nbytes // 4,), tmp_path / golden_file, 0, nbytes),
            my=TensorData("float32", (nbytes // 4,), tmp_path / my_file, 0, nbytes),
        )

    jobs = [job(0, "g0", "m0", 100), job(1, "g1", "m1", 100), job(2, "g0", "m0", 100), job(3, "g0", "m0", 100)]
    chunks = chunks_by_location(jobs, target_bytes=400)
    assert [[j.index for j in chunk] for chunk in chunks] == [[0, 2], [3], [1]]


def test_a_ray_address_without_the_ray_executor_is_one_line_saying_so(
    two_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, my = two_runs
    code = main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out"), "--ray-address", "auto"])
    err = capsys.readouterr().err
    assert code == 2 and err == "llmcheck: error: --ray-address: is only used by --executor ray\n"
