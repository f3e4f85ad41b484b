"""Small pairs measured in groups give exactly the metric values of streaming each pair alone."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from llmcheck.core.compare import compare_dumps
from llmcheck.core.dumps.store import DumpWriter, read_dump
from llmcheck.core.dumps.tensor_io import dtype_name
from llmcheck.core.measuring import pair_chunk, small_pairs
from llmcheck.core.measuring.pair_block import row_dots
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import RecordKey, TensorRecord
from llmcheck.core.reporting.reporters import write_reports
from llmcheck.plugins.metrics import builtin_metric_specs

METRIC_COLUMNS = [spec.name for spec in builtin_metric_specs()]
STATISTICS_COLUMNS = [
    f"{side}_{column}"
    for side in ("golden", "my")
    for column in ("max_value", "min_value", "mean_value", "nan_count", "inf_count")
]


def _write(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Write a dump without recorded statistics, so the compare measures both sides' statistics too."""
    with DumpWriter(folder, "test") as writer:
        for order, (name, tensor) in enumerate(tensors.items()):
            record = TensorRecord(
                key=RecordKey(name=name), dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape), order=order
            )
            writer.add(record, tensor.contiguous().clone())
    return writer.path


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    """Golden and my tensors covering what a metric or the NaN/sentinel handling treats specially."""
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    golden: dict[str, torch.Tensor] = {}
    my: dict[str, torch.Tensor] = {}

    def pair(name: str, g: torch.Tensor, m: torch.Tensor) -> None:
        golden[name], my[name] = g, m

    for i, size in enumerate([1, 7, 1024, 3000, 4096, 8192, 16384, 20000, 65536]):  # several blocks of one size
        for copy in range(3):
            g = randn(size)
            pair(f"fp32_{i}_{copy}", g, g * (1 + 1e-6 * randn(size)))
    for noise in (1e-7, 3e-5, 3e-3, 0.5):  # KL: quadratic series, cubic series, direct sum
        g = randn(4096)
        pair(f"kl_{noise}", g, g + noise * randn(4096))
    g = randn(2048)
    pair("bf16", g.to(torch.bfloat16), (g * 1.01).to(torch.bfloat16))
    pair("fp16", g.half(), (g * 1.001).half())
    pair("fp64", g.double(), g.double() + 1e-9)
    pair("fp8", g.to(torch.float8_e4m3fn), (g * 1.1).to(torch.float8_e4m3fn))
    pair("int32", torch.arange(500, dtype=torch.int32), torch.arange(500, dtype=torch.int32) + 1)
    pair("complex", torch.complex(g[:1024], g[1024:]), torch.complex(g[:1024], g[1024:] * 1.01))
    pair("identical", g, g.clone())
    pair("zeros", torch.zeros(300), torch.zeros(300))
    pair("zeros_golden", torch.zeros(300), randn(300))
    with_zeros = randn(1000)
    with_zeros[::3] = 0.0  # relative error undefined there
    pair("some_zeros", with_zeros, with_zeros + 1e-4)
    nan_both = randn(1000)
    nan_both[5] = float("nan")
    pair("nan_both", nan_both, nan_both.clone())
    nan_one = randn(1000)
    pair("nan_one", nan_one, torch.where(torch.arange(1000) == 9, float("nan"), nan_one))
    inf_one = randn(1000)
    pair("inf_one", inf_one, torch.where(torch.arange(1000) == 9, float("inf"), inf_one))  # a block row's SQNR is 0/inf
    mask = torch.where(torch.arange(1024) % 4 == 0, torch.finfo(torch.float16).min, 0.0)
    pair("fp16_mask", (mask + randn(1024) * (mask == 0)).half(), (mask + randn(1024) * (mask == 0)).half())
    pair("inf_both", torch.full((64,), float("inf")), torch.full((64,), float("inf")))
    pair("large", randn(200_000), randn(200_000))  # over one chunk: streamed in either mode
    return _write(tmp_path / "golden", golden), _write(tmp_path / "my", my)


def _csv_columns(result, folder: Path) -> dict[str, dict[str, str]]:
    write_reports(result, folder, get_plugins().reporters())
    with open(folder / "cmp_report.csv", newline="") as handle:
        return {
            row["name"]: {column: row[column] for column in METRIC_COLUMNS + STATISTICS_COLUMNS}
            for row in csv.DictReader(handle)
        }


def test_grouped_small_pairs_give_the_csv_metric_columns_of_streaming_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden, my = (read_dump(path) for path in _runs(tmp_path))
    grouped = _csv_columns(compare_dumps(golden, my, workers=1), tmp_path / "grouped")
    monkeypatch.setattr(small_pairs, "SMALL_PAIR_VALUES", 0)
    streamed = _csv_columns(compare_dumps(golden, my, workers=1), tmp_path / "streamed")
    assert len(grouped) == 47
    assert grouped == streamed
    assert float(grouped["kl_0.5"]["kl_divergence"]) > 0.01  # the direct sum was taken, not the series
    assert grouped["nan_one"]["my_nan_count"] == "1" and grouped["fp16_mask"]["cosine_similarity"] != ""


def test_a_cut_shard_is_reported_by_name_when_its_pairs_are_grouped(tmp_path: Path) -> None:
    from llmcheck.core.errors import DumpFormatError

    golden_path, my_path = _runs(tmp_path)
    golden, my = read_dump(golden_path), read_dump(my_path)
    shard = next(my_path.glob("shard_*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(DumpFormatError, match="run past the end of the file") as caught:
        compare_dumps(golden, my, workers=1)
    assert shard.name in str(caught.value)


def test_row_dots_give_each_rows_dot_bit_for_bit() -> None:
    generator = np.random.default_rng(0)
    with pair_chunk.single_threaded_blas():
        for size in (1, 7, 1000, np.getbufsize() + 3, 20000):  # BLAS would split a dot over 10 000 among threads
            golden = generator.standard_normal((4, size))
            my = golden * (1 + 1e-3 * generator.standard_normal((4, size)))
            assert row_dots(golden, my) == [float(pair_chunk.dot(g, m)) for g, m in zip(golden, my)]


def test_stacked_blocks_give_each_rows_dot_and_sum_bit_for_bit() -> None:
    """A group's planes are reduced all at once, (planes, rows, size): each row as alone."""
    from llmcheck.core.measuring.pair_block import stacked_row_dots

    generator = np.random.default_rng(1)
    with pair_chunk.single_threaded_blas():
        for size in (1, 7, 129, np.getbufsize() + 3, 20000):
            buffer = generator.standard_normal((3, 5 * size + 11))  # planes of a group, a block in the middle
            planes = buffer[:, 11:].reshape(3, 5, size)
            squares = stacked_row_dots(planes[:2], planes[:2]).tolist()
            weighted = stacked_row_dots(planes[1:3], planes[2:3]).tolist()  # broadcast: (1, 2) . 2
            sums = planes.sum(axis=2).tolist()
            for row in range(5):
                golden, my, third = (np.array(plane[row]) for plane in planes)  # each row alone, elsewhere
                assert [squares[0][row], squares[1][row]] == [pair_chunk.dot(golden, golden), pair_chunk.dot(my, my)]
                assert [weighted[0][row], weighted[1][row]] == [pair_chunk.dot(my, third), pair_chunk.dot(third, third)]
                assert [sums[plane][row] for plane in range(3)] == [float(v.sum()) for v in (golden, my, third)]


@pytest.mark.slow
def test_one_process_and_worker_processes_give_the_same_csv_metric_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmcheck.core.measuring import metric_engine

    golden, my = (read_dump(path) for path in _runs(tmp_path))
    in_process = _csv_columns(compare_dumps(golden, my, workers=1), tmp_path / "j1")
    monkeypatch.setattr(metric_engine, "PARALLEL_MIN_BYTES", 0)
    in_workers = _csv_columns(compare_dumps(golden, my, workers=2), tmp_path / "j2")
    assert in_process == in_workers  # -j 1 and -j 2 agree to the last digit, streamed pairs and grouped ones
    assert in_process["large"]["cosine_similarity"] != in_process["fp32_7_0"]["cosine_similarity"]


def test_pairs_and_measurements_cross_to_worker_processes_unchanged(tmp_path: Path) -> None:
    import dataclasses
    import pickle

    from llmcheck.core.measuring.pair_chunk import Workspace
    from llmcheck.core.measuring.pair_measure import PairJob, measure_pair
    from llmcheck.core.measuring.pair_transfer import pack_jobs, pack_measurements, unpack_jobs, unpack_measurements

    golden, my = (read_dump(path) for path in _runs(tmp_path))
    jobs = [
        PairJob(index, g.data, m.data, golden_needs_stats=index % 2 == 0, my_run_dtype="float16")  # type: ignore[arg-type]
        for index, (g, m) in enumerate(zip(golden.records, my.records))
    ]
    assert unpack_jobs(pickle.loads(pickle.dumps(pack_jobs(jobs)))) == jobs
    specs = builtin_metric_specs()
    names = [spec.name for spec in specs]
    workspace = Workspace(1 << 16)
    folded, rows = small_pairs.measure_small_pairs(jobs[:-1], specs, workspace, 1 << 16)
    assert len(rows) == 41 and len(folded) == 5  # most pairs from their blocks, NaN/Inf/sentinel ones folded
    folded.append(measure_pair(jobs[-1], specs, workspace))  # "large": streamed
    folded[0] = dataclasses.replace(folded[0], values={"rmse": -0.0}, notes=["a note"])  # not every metric
    crossed = unpack_measurements(pickle.loads(pickle.dumps(pack_measurements(folded, names, rows.columns(names)))))
    expected = folded + rows.columns(names).measurements()
    assert repr(crossed) == repr(expected)  # repr: NaN equals NaN, -0.0 stays -0.0
    by_index = {m.index: m for m in crossed}
    by_name = {record.key.name: by_index[index] for index, record in enumerate(golden.records)}
    assert by_name["nan_one"].my_stats.nan_count == 1 and by_name["fp16_mask"].masked > 0
    assert by_index[1].golden_stats.min is None and by_index[2].golden_stats.min is not None
    assert by_index[1].my_stats.min is not None


def test_softmax_weights_from_the_stored_float32_values_are_those_from_float64_bit_for_bit() -> None:
    from llmcheck.core.measuring.pair_chunk import PairChunk, Workspace

    generator = np.random.default_rng(0)
    magnitudes = 10.0 ** generator.integers(-45, 39, 20000)  # float32 subnormals to near its largest value
    stored = (generator.standard_normal(20000) * magnitudes).astype(np.float32)
    stored = stored[np.isfinite(stored)]
    golden = stored.astype(np.float64)
    for shift in (float(golden.max()), float(golden[7]), 0.1):  # 0.1 is no float32: the float64 way is taken
        plain = PairChunk(golden, golden, Workspace(golden.size))
        from_stored = PairChunk(golden, golden, Workspace(golden.size), golden_float32=stored)
        with np.errstate(all="ignore"):
            weights, total = plain.softmax_weights(shift)
            weights_stored, total_stored = from_stored.softmax_weights(shift)
        assert weights.tobytes() == weights_stored.tobytes() and total == total_stored


def _block_runs(tmp_path: Path) -> tuple[Path, Path]:
    """Pairs of one size that share blocks but each take their own way through them.

    KL's series (quadratic and cubic) and direct rows alternate and come in runs, float32 and
    bfloat16 rows share blocks, float16/float64/complex64 rows and a float64 golden against a
    float32 my are blocks of their own kind, zeros of both signs make minima and maxima whose
    sign only the float64 reduction decides, and NaN/Inf rows sit among ordinary ones.
    """
    generator = torch.Generator().manual_seed(1)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    golden: dict[str, torch.Tensor] = {}
    my: dict[str, torch.Tensor] = {}
    size = 2048
    noises = [1e-7, 3e-3, 3e-5, 3e-3, 1e-7, 1e-7, 3e-3, 3e-3, 3e-3, 3e-5, 3e-5, 0.5]
    for row, noise in enumerate(noises):  # alternating, then in runs
        g = randn(size)
        golden[f"kl_{row}"], my[f"kl_{row}"] = g, g + noise * randn(size)
        golden[f"kl_bf16_{row}"], my[f"kl_bf16_{row}"] = g.bfloat16(), (g + noise * randn(size)).bfloat16()
    signed_zeros = _signed_zeros_the_float32_minimum_decides_otherwise(size)
    golden["zeros_signed_min"], my["zeros_signed_min"] = signed_zeros, signed_zeros * (1 + 1e-6 * randn(size))
    golden["zeros_signed_max"], my["zeros_signed_max"] = -signed_zeros, -signed_zeros.bfloat16().float()
    golden["zeros_only"], my["zeros_only"] = torch.zeros(size), torch.where(torch.arange(size) % 2 == 0, -0.0, 0.0)
    nan_row = randn(size)
    nan_row[3] = float("nan")
    golden["nan_row"], my["nan_row"] = nan_row, nan_row.clone()
    golden["inf_row"], my["inf_row"] = randn(size), torch.full((size,), float("inf"))
    g = randn(size)
    golden["fp16"], my["fp16"] = g.half(), (g * 1.001).half()
    golden["fp64"], my["fp64"] = g.double(), g.double() * (1 + 1e-12)
    golden["fp64_fp32"], my["fp64_fp32"] = g.double(), g * (1 + 1e-6)
    golden["complex64"], my["complex64"] = torch.complex(g[:1024], g[1024:]), torch.complex(g[1024:], g[:1024])
    return _write(tmp_path / "golden", golden), _write(tmp_path / "my", my)


def _signed_zeros_the_float32_minimum_decides_otherwise(size: int) -> torch.Tensor:
    """Return non-negative values with zeros of both signs whose float32 minimum is a zero of the other sign than float64's.

    Which zero a reduction returns depends on how it visits the values (float32 and float64
    are reduced in lanes of different widths), so the block takes such rows' minima again in float64.
    """
    generator = np.random.default_rng(0)
    for _ in range(100):
        values = np.abs(generator.standard_normal(size)).astype(np.float32)
        zeros = generator.choice(size, 40, replace=False)
        values[zeros] = np.where(generator.random(40) < 0.5, -0.0, 0.0)
        single, double = float(values.min()), float(values.astype(np.float64).min())
        if math.copysign(1.0, single) != math.copysign(1.0, double):
            return torch.from_numpy(values)
    raise AssertionError("no row found whose float32 and float64 minima are zeros of different signs")


def test_pairs_measured_in_blocks_are_measured_as_streaming_each_alone_bit_for_bit(tmp_path: Path) -> None:
    from llmcheck.core.measuring.metric_engine import measure_jobs
    from llmcheck.core.measuring.pair_chunk import Workspace
    from llmcheck.core.measuring.pair_measure import PairJob, measure_pair

    golden, my = (read_dump(path) for path in _block_runs(tmp_path))
    jobs = [
        PairJob(index, g.data, m.data, golden_needs_stats=not g.key.name.startswith("kl_bf16"))  # type: ignore[arg-type]
        for index, (g, m) in enumerate(zip(golden.records, my.records))
    ]
    specs = builtin_metric_specs()
    workspace = Workspace(1 << 16)
    measured = {m.index: m for m in measure_jobs(jobs, specs, workspace)}
    streamed = {job.index: measure_pair(job, specs, workspace) for job in jobs}
    assert len(measured) == len(jobs)
    names = [record.key.name for record in golden.records]
    for index, name in enumerate(names):  # repr: NaN equals NaN, -0.0 stays -0.0
        assert repr(measured[index]) == repr(streamed[index]), name
    by_name = dict(zip(names, (measured[index] for index in range(len(names)))))
    assert by_name["kl_11"].values["kl_divergence"] > 0.01  # a direct row
    assert by_name["zeros_signed_min"].golden_stats.min == 0.0 and by_name["zeros_signed_max"].golden_stats.max == 0.0
    assert by_name["nan_row"].golden_stats.nan_count == 1 and by_name["inf_row"].my_stats.inf_count == 2048
