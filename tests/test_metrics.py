"""The built-in metrics: exact against textbook formulas, the seed's defects fixed, streaming-invariant."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from llmcheck.core.dumps.tensor_chunks import fp8_table
from llmcheck.core.dumps.tensor_io import tensor_bytes
from llmcheck.core.measuring.pair_chunk import PairChunk, Workspace
from llmcheck.core.measuring.pair_measure import PairJob, measure_pair
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import TensorData
from llmcheck.plugins.metrics import builtin_metric_specs

SEED_SEVEN = [
    "cosine_similarity",
    "max_relative_error",
    "mean_relative_error",
    "max_absolute_error",
    "mean_absolute_error",
    "kl_divergence",
    "relative_euclidean_distance",
]


def _file_data(tmp_path: Path, name: str, tensor: torch.Tensor) -> TensorData:
    path = tmp_path / f"{name}.bin"
    path.write_bytes(bytes(tensor_bytes(tensor.contiguous())))
    dtype = str(tensor.dtype).removeprefix("torch.")
    return TensorData(dtype=dtype, shape=tuple(tensor.shape), path=path, offset=0, nbytes=path.stat().st_size)


def _measure(tmp_path: Path, golden: torch.Tensor, my: torch.Tensor, chunk_values: int = 1 << 15):
    job = PairJob(0, _file_data(tmp_path, "golden", golden), _file_data(tmp_path, "my", my))
    return measure_pair(job, builtin_metric_specs(), Workspace(chunk_values), chunk_values)


def _reference(golden: np.ndarray, my: np.ndarray) -> dict[str, float]:
    """Textbook float64 formulas over whole arrays, the defects of the seed tool fixed."""
    g, m = golden.astype(np.float64).ravel(), my.astype(np.float64).ravel()
    d = m - g
    defined = np.abs(g) > np.finfo(np.float32).eps
    rel = np.abs(d[defined]) / np.abs(g[defined])
    # KL of near-equal runs is a tiny difference: the reference takes it in 80-bit long double.
    gl, ml = g.astype(np.longdouble), m.astype(np.longdouble)
    log_p = gl - (gl.max() + np.log(np.exp(gl - gl.max()).sum()))
    log_q = ml - (ml.max() + np.log(np.exp(ml - ml.max()).sum()))
    return {
        "cosine_similarity": float(g @ m / (np.linalg.norm(g) * np.linalg.norm(m))),
        "max_relative_error": float(rel.max()),
        "mean_relative_error": float(rel.mean()),
        "max_absolute_error": float(np.abs(d).max()),
        "mean_absolute_error": float(np.abs(d).mean()),
        "kl_divergence": float(np.sum(np.exp(log_p) * (log_p - log_q))),
        "relative_euclidean_distance": float(np.linalg.norm(d) / np.linalg.norm(g)),
        "rmse": float(np.sqrt(np.mean(d * d))),
        "sqnr": float(10 * np.log10((g @ g) / (d @ d))),
    }


def test_builtin_metrics_are_registered_in_the_seed_order_then_rmse_and_sqnr() -> None:
    assert list(get_plugins().metrics())[:9] == [*SEED_SEVEN, "rmse", "sqnr"]


@pytest.mark.parametrize("noise", [1e-7, 3e-3, 0.5])
def test_every_metric_matches_its_float64_formula_whatever_the_chunk_size(tmp_path: Path, noise: float) -> None:
    generator = torch.Generator().manual_seed(0)
    golden = torch.randn(3000, generator=generator) * 3
    my = golden * (1 + noise * torch.randn(3000, generator=generator))
    expected = _reference(golden.numpy(), my.numpy())
    for chunk_values in (3000, 256, 7):  # one chunk, several, and many odd-sized ones
        measured = _measure(tmp_path, golden, my, chunk_values).values
        for name, value in expected.items():
            # KL weights are float32 exponentials (1e-6 relative), and where the sides differ by
            # more than 1e-3 its log-sum-exp of my is float32 too.
            tolerance = {True: 1e-4, False: 1e-5}[noise > 1e-3] if name == "kl_divergence" else 1e-9
            assert measured[name] == pytest.approx(value, rel=tolerance, abs=1e-300), (name, chunk_values)


def test_kl_of_fp32_close_runs_is_accurate_far_below_float32_resolution(tmp_path: Path) -> None:
    golden = torch.linspace(-4, 4, 5000, dtype=torch.float64)
    my = golden + 1e-9 * torch.sin(torch.arange(5000, dtype=torch.float64))
    expected = _reference(golden.numpy(), my.numpy())["kl_divergence"]
    assert expected < 1e-17
    # A two-log-sum-exp implementation gives ~1e-16 noise here; the series path gives the value.
    assert _measure(tmp_path, golden, my).values["kl_divergence"] == pytest.approx(expected, rel=1e-4)


def test_absolute_errors_count_positions_where_golden_is_zero(tmp_path: Path) -> None:
    golden = torch.tensor([0.0, 0.0, 1.0, 2.0])
    my = torch.tensor([5.0, 0.0, 1.0, 2.0])  # the seed masked position 0 and reported 0 for both
    values = _measure(tmp_path, golden, my).values
    assert values["max_absolute_error"] == 5.0
    assert values["mean_absolute_error"] == 1.25


def test_relative_error_mean_is_over_the_positions_where_it_is_defined(tmp_path: Path) -> None:
    golden = torch.tensor([0.0, 0.0, 2.0, 4.0])
    my = torch.tensor([1.0, 1.0, 3.0, 4.0])  # relative errors defined at 2.0 (0.5) and 4.0 (0.0)
    values = _measure(tmp_path, golden, my).values
    assert values["mean_relative_error"] == 0.25  # the seed divided by all four: 0.125
    assert values["max_relative_error"] == 0.5


@pytest.mark.parametrize(
    ("golden", "my", "cosine", "distance"),
    [
        ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], 1.0, 0.0),
        ([0.0, 0.0, 0.0], [1.0, 0.0, 0.0], 0.0, math.inf),
        ([1.0, 2.0, 0.0], [0.0, 0.0, 0.0], 0.0, 1.0),
    ],
)
def test_all_zero_sides_get_defined_values(tmp_path: Path, golden, my, cosine: float, distance: float) -> None:
    values = _measure(tmp_path, torch.tensor(golden), torch.tensor(my)).values
    assert values["cosine_similarity"] == cosine
    assert values["relative_euclidean_distance"] == distance
    assert all(not math.isnan(value) for value in values.values())


def test_nan_and_inf_are_counted_and_metrics_use_the_positions_finite_on_both_sides(tmp_path: Path) -> None:
    golden = torch.tensor([1.0, 2.0, float("-inf"), 4.0, 5.0, float("nan")])
    my = torch.tensor([1.0, float("nan"), float("-inf"), float("inf"), 5.5, float("nan")])
    measured = _measure(tmp_path, golden, my, chunk_values=4)
    assert measured.nonfinite_mismatch == 2  # positions 1 and 3: non-finite on my side only
    assert measured.matching_nonfinite == 2  # -inf/-inf and nan/nan agree
    assert (measured.golden_stats.nan_count, measured.golden_stats.inf_count) == (1, 1)
    assert (measured.my_stats.nan_count, measured.my_stats.inf_count) == (2, 2)
    assert measured.values["max_absolute_error"] == 0.5  # over positions 0 and 4
    assert (measured.golden_stats.min, measured.golden_stats.max) == (1.0, 5.0)


def test_bf16_fp16_and_int_data_stream_exactly(tmp_path: Path) -> None:
    values = torch.tensor([0.0, -1.5, 3.140625, 65504.0, -(2.0**-14), 1e-3])
    for dtype in (torch.bfloat16, torch.float16, torch.int32, torch.bool, torch.complex64):
        golden = values.to(dtype)
        measured = _measure(tmp_path, golden, golden.clone())
        assert measured.values["max_absolute_error"] == 0.0
        flat = torch.view_as_real(golden).reshape(-1) if dtype.is_complex else golden
        assert measured.golden_stats.max == float(flat.to(torch.float64).max())


@pytest.mark.parametrize(
    "dtype_name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]
)
def test_fp8_decoding_tables_equal_torch_for_all_256_codes(dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    expected = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float64).numpy()
    np.testing.assert_array_equal(fp8_table(dtype_name), expected)


def test_update_and_update_chunk_give_the_same_value_for_plain_array_callers() -> None:
    rng = np.random.default_rng(1)
    golden, my = rng.standard_normal(500), rng.standard_normal(500)
    for spec in builtin_metric_specs():
        plain, chunked = spec.make_accumulator(), spec.make_accumulator()
        plain.update(golden, my)
        chunked.update_chunk(PairChunk(golden, my, Workspace(500)))
        assert plain.result() == chunked.result(), spec.name
