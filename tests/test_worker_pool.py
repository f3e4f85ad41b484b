"""Worker processes for a large compare start before the dumps load, and measure exactly as workers started later."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.compare import select_metrics
from llmcheck.core.measuring import metric_engine, worker_pool
from llmcheck.core.measuring.worker_pool import WorkerPool, early_pool, files_reach


def test_files_reach_counts_nested_folders_and_stops_at_the_limit(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "one.bin").write_bytes(b"x" * 100)
    (tmp_path / "a" / "b" / "two.bin").write_bytes(b"x" * 50)
    (tmp_path / "loose.bin").write_bytes(b"x" * 10)
    folder, loose, missing = tmp_path / "a", tmp_path / "loose.bin", tmp_path / "missing"
    assert files_reach([folder], 150) and not files_reach([folder], 151)
    assert files_reach([folder, loose, missing], 160) and not files_reach([folder, loose, missing], 161)
    assert not files_reach([missing], 1) and files_reach([], 0)


def test_a_pool_is_started_only_for_a_compare_that_will_measure_in_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "shard.bin").write_bytes(b"x" * 1000)
    specs = select_metrics(None)
    inputs = (tmp_path / "dump", tmp_path / "dump")
    assert early_pool(4, specs, inputs) is None  # 2 KB is measured in this process
    monkeypatch.setattr(metric_engine, "PARALLEL_MIN_BYTES", 2000)
    assert early_pool(1, specs, inputs) is None  # -j 1
    with early_pool(2, specs, inputs) as pool:
        assert isinstance(pool, WorkerPool) and pool.workers == 2
        assert pool.take(select_metrics(["cosine_similarity"]), pool.chunk_values) is None  # other metrics
        executor, workers = pool.take(specs, pool.chunk_values)
        assert workers == 2 and pool.take(specs, pool.chunk_values) is None  # handed over once
        executor.shutdown()


def test_a_pool_nobody_takes_is_shut_down() -> None:
    pool = WorkerPool(2, select_metrics(None), metric_engine.DEFAULT_CHUNK_VALUES)
    processes = pool._executor._processes  # the started processes, by pid
    pool.close()
    assert pool.take(select_metrics(None), metric_engine.DEFAULT_CHUNK_VALUES) is None
    assert all(not process.is_alive() for process in processes.values())


def _dumps_a_thousandth_apart(
    make_llmcheck_dump, tmp_path: Path, tensors: int, shape: tuple[int, ...]
) -> tuple[Path, Path]:
    """Return a golden dump of random tensors and a my-dump 1e-3 off everywhere (every pair fails)."""
    torch.manual_seed(tensors)
    golden = {f"layer{i}": torch.randn(*shape) for i in range(tensors)}
    my = {name: value * (1 + 1e-3 * torch.randn(value.shape)) for name, value in golden.items()}
    return make_llmcheck_dump(tmp_path / "g", golden), make_llmcheck_dump(tmp_path / "m", my)


def test_a_compare_measures_in_the_workers_started_before_loading_with_the_same_digits(
    make_llmcheck_dump, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden_dump, my_dump = _dumps_a_thousandth_apart(make_llmcheck_dump, tmp_path, 6, (256, 64))
    monkeypatch.setattr(metric_engine, "PARALLEL_MIN_BYTES", 0)
    taken: list[bool] = []
    take = WorkerPool.take
    monkeypatch.setattr(WorkerPool, "take", lambda self, *args: taken.append(True) or take(self, *args))
    started: list[WorkerPool | None] = []
    monkeypatch.setattr(worker_pool, "WorkerPool", lambda *args: started.append(WorkerPool(*args)) or started[-1])
    arguments = ["compare", "-gp", str(golden_dump), "-mp", str(my_dump)]
    assert main([*arguments, "-o", str(tmp_path / "early"), "-j", "2"]) == 3  # 1e-3 off: every tensor fails
    assert len(started) == 1 and taken == [True] and started[0].take(select_metrics(None), 1 << 16) is None
    assert main([*arguments, "-o", str(tmp_path / "one"), "-j", "1"]) == 3
    assert len(started) == 1  # -j 1: no workers
    early, one = ((tmp_path / out / "cmp_report.csv").read_text() for out in ("early", "one"))
    assert early == one


def test_this_process_measures_beside_the_workers_with_the_same_digits(
    make_llmcheck_dump, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-j 3`` is three measuring processes: two spawned, taking batches from the front, and this one from the back."""
    golden_dump, my_dump = _dumps_a_thousandth_apart(make_llmcheck_dump, tmp_path, 12, (64, 64))
    from llmcheck.core.compare import compare_dumps
    from llmcheck.core.plugins import get_plugins

    runs = [get_plugins().load_tensors(path) for path in (golden_dump, my_dump)]
    in_process = compare_dumps(*runs, workers=1)
    monkeypatch.setattr(metric_engine, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(metric_engine, "BATCH_TARGET_BYTES", 1)  # a batch per pair: 12 batches
    spawned: list[int] = []
    start_executor = metric_engine.start_executor
    monkeypatch.setattr(
        metric_engine,
        "start_executor",
        lambda workers, *args: spawned.append(workers) or start_executor(workers, *args),
    )
    here: list[int] = []
    measure_jobs = metric_engine.measure_jobs_as_columns
    monkeypatch.setattr(
        metric_engine,
        "measure_jobs_as_columns",
        lambda jobs, *args: here.extend(job.index for job in jobs) or measure_jobs(jobs, *args),
    )
    beside = compare_dumps(*runs, workers=3)
    assert spawned == [2]
    # the first four batches went to the two workers before this process took any: both measured
    assert here and len(here) <= len(in_process.rows) - 4 and here[0] == len(in_process.rows) - 1
    for one, three in zip(in_process.rows, beside.rows, strict=True):
        assert one.verdict == three.verdict
        assert {k: v.value for k, v in one.metrics.items()} == {k: v.value for k, v in three.metrics.items()}


def test_measurements_handed_on_as_they_arrive_are_not_kept(
    make_llmcheck_dump, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compare makes each row as its measurement arrives: the 10^5 measurements are never all held."""
    from llmcheck.core.compare import compare_dumps
    from llmcheck.core.plugins import get_plugins

    golden_dump, my_dump = _dumps_a_thousandth_apart(make_llmcheck_dump, tmp_path, 8, (32, 32))
    runs = [get_plugins().load_tensors(path) for path in (golden_dump, my_dump)]
    monkeypatch.setattr(metric_engine, "PARALLEL_MIN_BYTES", 0)
    kept: list[bool] = []
    measure_pairs = metric_engine.measure_pairs

    def measure(*args, keep=True, **options):
        kept.append(keep)
        handed: list[int] = []
        on_measured, on_columns = options.pop("on_measured"), options.pop("on_columns")
        found = measure_pairs(
            *args,
            keep=keep,
            on_measured=lambda m: handed.append(m.index) or on_measured(m),
            on_columns=lambda columns: handed.extend(columns.index) or on_columns(columns),
            **options,
        )
        assert found == {} and sorted(handed) == list(range(len(runs[0].records)))
        return found

    monkeypatch.setattr(metric_engine, "measure_pairs", measure)
    for workers in (1, 2):
        result = compare_dumps(*runs, workers=workers)
        assert [row.verdict for row in result.rows] == ["fail"] * len(runs[0].records)
    assert kept == [False, False]
