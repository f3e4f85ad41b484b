"""Judging measured pairs a column at a time gives exactly the verdicts, results and rows of judging each pair alone."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmcheck.core import compare
from llmcheck.core.compare import compare_dumps
from llmcheck.core.dumps.store import DumpWriter, read_dump
from llmcheck.core.dumps.tensor_io import dtype_name
from llmcheck.core.judging.verdicts import (
    VERDICT_OF_CODE,
    TableJudge,
    ThresholdOverride,
    _metric_verdict,
    verdict_codes,
)
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import Dump, RecordKey, TensorData, TensorRecord, TensorStats

#: Limits a table or an override may hold, and values on and beside them.
LIMITS = (0.0, 1e-6, 1e-3, 0.5, 0.99, 1.0, 3.0)
_EDGES = [
    value
    for limit in LIMITS
    for value in (limit, -limit, math.nextafter(limit, -math.inf), math.nextafter(limit, math.inf))
]
_VALUES = st.one_of(
    st.sampled_from([*_EDGES, math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-2.0, max_value=4.0),
)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(_VALUES, min_size=1, max_size=40),
    higher_is_better=st.booleans(),
    limits=st.tuples(st.sampled_from(LIMITS), st.sampled_from(LIMITS)),
)
def test_a_columns_verdict_codes_are_the_verdicts_each_value_gets_alone(
    values: list[float], higher_is_better: bool, limits: tuple[float, float]
) -> None:
    warn, fail = sorted(limits, reverse=higher_is_better)  # warn comes before fail in the metric's direction
    codes = verdict_codes(np.array(values, dtype=np.float64), higher_is_better, warn, fail).tolist()
    assert [VERDICT_OF_CODE[code] for code in codes] == [
        _metric_verdict(value, higher_is_better, warn, fail) for value in values
    ]


_SPECS = list(get_plugins().metrics().values())
_NAMES = ("model.layers.0.mlp", "model.layers.1.self_attn", "lm_head", "model.norm")
_CLASSES = ("fp32", "bf16", "fp16", "fp64", "int", "bool")


@st.composite
def _overrides(draw: st.DrawFn) -> list[ThresholdOverride]:
    entries = []
    for _ in range(draw(st.integers(0, 4))):
        spec = draw(st.sampled_from(_SPECS))
        warn, fail = sorted(
            draw(st.tuples(st.sampled_from(LIMITS), st.sampled_from(LIMITS))), reverse=spec.higher_is_better
        )
        pattern = draw(st.sampled_from(("*", "lm_head*", "model.layers.*", "model.norm")))
        dtype_class = draw(st.sampled_from((None, "fp32", "bf16")))
        entries.append(ThresholdOverride(pattern, spec.name, warn, fail, dtype_class))
    return entries


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.lists(_VALUES, min_size=len(_SPECS), max_size=len(_SPECS)),
            st.sampled_from(_NAMES),
            st.sampled_from(_CLASSES),
        ),
        min_size=1,
        max_size=30,
    ),
    overrides=_overrides(),
    chosen=st.sets(st.sampled_from([spec.name for spec in _SPECS])),
)
def test_rows_judged_a_column_at_a_time_are_judged_as_each_alone(
    rows: list[tuple[list[float], str, str]], overrides: list[ThresholdOverride], chosen: set[str]
) -> None:
    from llmcheck.core.judging.rows import judging_specs

    specs = judging_specs(_SPECS, sorted(chosen))  # metrics not chosen have no thresholds
    metrics = [spec.name for spec in specs]
    values = np.array([row_values for row_values, _, _ in rows], dtype=np.float64)
    names = [name for _, name, _ in rows]
    classes = [judged_class for _, _, judged_class in rows]
    judged, verdicts, deciding = TableJudge(specs, overrides).judge_columns(metrics, values, names, classes)
    alone = TableJudge(specs, overrides)
    for row, (row_values, name, judged_class) in enumerate(rows):
        results, verdict, decided = alone.judge(dict(zip(metrics, row_values)), name, judged_class)
        assert (verdicts[row], deciding[row]) == (verdict, decided)
        assert repr(dict(judged[row])) == repr(dict(results))  # repr: NaN equals NaN, -0.0 stays -0.0
        assert type(judged[row]) is type(results)


def _write(folder: Path, tensors: list[tuple[str, torch.Tensor]]) -> Path:
    with DumpWriter(folder, "test") as writer:
        for order, (name, tensor) in enumerate(tensors):
            record = TensorRecord(
                key=RecordKey(name=name), dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape), order=order
            )
            writer.add(record, tensor)
    return writer.path


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    """Small pairs passing, warning and failing; mixed precisions and shapes; tensors seen by several records."""
    generator = torch.Generator().manual_seed(0)
    golden: list[tuple[str, torch.Tensor]] = []
    my: list[tuple[str, torch.Tensor]] = []
    for layer in range(6):
        for noise in (0.0, 1e-7, 1e-5, 1e-3, 0.3):
            g = torch.randn(512, generator=generator)
            m = g + noise * torch.randn(512, generator=generator)
            golden.append((f"model.layers.{layer}.mlp.{noise}", g))
            my.append((f"model.layers.{layer}.mlp.{noise}", m))
            # the next module sees the same tensors: their bytes are stored once, measured once
            golden.append((f"model.layers.{layer}.post.{noise}", g))
            my.append((f"model.layers.{layer}.post.{noise}", m))
    g = torch.randn(1, 256, generator=generator)
    golden += [("lm_head", g), ("lm_head.bf16", g.clone()), ("ids", torch.arange(64))]
    my += [
        ("lm_head", (g * 1.001).reshape(256)),
        ("lm_head.bf16", (g * 1.01).to(torch.bfloat16)),
        ("ids", torch.arange(64)),
    ]
    nan = torch.randn(256, generator=generator)
    nan[3] = math.nan
    golden.append(("nan_one", nan.clone()))
    my.append(("nan_one", torch.where(torch.arange(256) == 7, math.nan, nan)))  # measured alone: the per-pair way
    return _write(tmp_path / "golden", golden), _write(tmp_path / "my", my)


def _row_fields(result: compare.CompareResult) -> list[str]:
    return [repr(row) for row in result.rows]


@pytest.mark.parametrize("with_overrides", [False, True])
def test_rows_made_a_block_at_a_time_are_the_rows_made_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_overrides: bool
) -> None:
    golden, my = (read_dump(path) for path in _runs(tmp_path))
    overrides = (
        [
            ThresholdOverride("lm_head*", "relative_euclidean_distance", 1e-4, 1e-3),
            ThresholdOverride("model.layers.3.*", "cosine_similarity", 0.9999, 0.99, "fp32"),
        ]
        if with_overrides
        else []
    )
    in_blocks = compare_dumps(golden, my, workers=1, threshold_overrides=overrides)
    measure_pairing = compare.measure_pairing
    monkeypatch.setattr(compare, "measure_pairing", lambda *args: measure_pairing(*args[:-1]))  # no columns
    one_by_one = compare_dumps(golden, my, workers=1, threshold_overrides=overrides)
    assert _row_fields(in_blocks) == _row_fields(one_by_one)
    verdicts = {row.golden.key.name: row.verdict for row in in_blocks.rows}
    assert {"pass", "warn", "fail"} <= set(verdicts.values())
    assert verdicts["model.layers.2.post.0.3"] == verdicts["model.layers.2.mlp.0.3"] == "fail"
    reasons = {row.golden.key.name: row.reason for row in in_blocks.rows}
    assert "size-1 dims" in reasons["lm_head"] and "NaN/Inf on one side only" in reasons["nan_one"]


@pytest.mark.slow
def test_rows_made_from_worker_processes_columns_are_those_of_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmcheck.core.measuring import metric_engine

    golden, my = (read_dump(path) for path in _runs(tmp_path))
    in_process = compare_dumps(golden, my, workers=1)
    monkeypatch.setattr(metric_engine, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(metric_engine, "BATCH_TARGET_BYTES", 4096)  # several batches: some measured by workers
    assert _row_fields(compare_dumps(golden, my, workers=2)) == _row_fields(in_process)


_STAT_VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 1.0001, 2.0, -3.0, 65504.0, -65504.0, 3.4e38, math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.integers(-3, 3),  # a source that wrote an integer statistic
    st.none(),
)


@st.composite
def _statistics(draw: st.DrawFn, base: TensorStats | None = None) -> TensorStats | None:
    """Return statistics as sources record them: mostly plain finite floats near ``base``, now and then anything."""
    if base is not None and draw(st.integers(0, 3)) > 0:  # my-run near the golden: pass, warn or fail
        scale = draw(st.sampled_from([1.0, 1.0 + 1e-7, 1.001, 1.1, 3.0]))
        return TensorStats(
            *(None if value is None else value * scale for value in (base.min, base.max, base.mean, base.l2norm)), 0, 0
        )  # type: ignore[operator]
    if draw(st.integers(0, 4)) > 0:
        low, high = sorted(draw(st.tuples(st.floats(-10.0, 10.0), st.floats(-10.0, 10.0))))
        return TensorStats(
            low, high, (low + high) / 2, draw(st.floats(0.0, 100.0)), 0, draw(st.sampled_from([0, None]))
        )
    if draw(st.booleans()):
        return None
    return TensorStats(
        *(draw(_STAT_VALUES) for _ in range(4)),
        draw(st.sampled_from([0, 1, None])),
        draw(st.sampled_from([0, 2, None])),
    )


@st.composite
def _statistics_pairs(draw: st.DrawFn) -> tuple[list[TensorRecord], list[TensorRecord]]:
    golden: list[TensorRecord] = []
    my: list[TensorRecord] = []
    data = TensorData("float32", (2, 4), Path("/nonexistent"), 0, 32)
    for order in range(draw(st.integers(1, 25))):
        name = draw(st.sampled_from(_NAMES))
        dtypes = draw(
            st.sampled_from(
                [("float32", "float32"), ("float32", "bfloat16"), ("float16", "float16"), ("int64", "int64")]
            )
        )
        shapes = draw(st.sampled_from([((2, 4), (2, 4)), ((2, 4), (1, 2, 4)), ((2, 4), (4, 2))]))
        golden_stats = draw(_statistics())
        my_stats = draw(_statistics(golden_stats))
        digests = draw(st.sampled_from([(None, None), ("ab", "ab"), ("ab", "cd"), ("ab", None)]))
        kept = draw(st.sampled_from(["neither", "golden", "my"]))  # which side kept its data
        key = RecordKey(name=name, step=order)
        golden.append(
            TensorRecord(
                key,
                dtypes[0],
                shapes[0],
                order,
                stats=golden_stats,
                digest=digests[0],
                data=data if kept == "golden" else None,
            )
        )
        my.append(
            TensorRecord(
                key, dtypes[1], shapes[1], order, stats=my_stats, digest=digests[1], data=data if kept == "my" else None
            )
        )
    return golden, my


@settings(max_examples=80, deadline=None)
@given(records=_statistics_pairs(), overrides=_overrides(), same_dump=st.booleans())
def test_statistics_only_rows_made_a_block_at_a_time_are_the_rows_made_one_by_one(
    records: tuple[list[TensorRecord], list[TensorRecord]], overrides: list[ThresholdOverride], same_dump: bool
) -> None:
    from llmcheck.core.judging.rows import PairJudge
    from llmcheck.core.pairing.merge import merge_pairs

    golden = Dump("llmcheck", Path("/golden"), records[0])
    my = Dump("llmcheck", Path("/golden" if same_dump else "/my"), records[1])
    specs = compare.select_metrics(None)
    judge = PairJudge.of(golden, my, specs, None, overrides)
    pairs = merge_pairs(golden, my, get_plugins().map_pairs(golden, my, None)).pairs
    problems = {index: "golden has no tensor data (a statistics-only dump)" for index in range(len(pairs))}
    indices = list(range(len(pairs)))
    in_blocks = list(judge.unmeasured_rows(indices, pairs, problems))
    one_by_one = [judge.row(index, pairs[index], problems[index], None) for index in indices]
    assert [repr(row) for row in in_blocks] == [repr(row) for row in one_by_one]  # repr: NaN equals NaN
    assert [type(row.metrics) for row in in_blocks] == [type(row.metrics) for row in one_by_one]


def test_a_statistics_only_compare_judges_its_plain_pairs_a_block_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmcheck.core.judging.rows import PairJudge

    records: tuple[list[TensorRecord], list[TensorRecord]] = ([], [])
    for order in range(40):
        base = TensorStats(-1.0 - order, 2.0 + order, 0.25, 10.0 + order, 0, 0)
        scale = (1.0, 1.0 + 1e-3, 1.05, 1.5)[order % 4]  # bf16 limits: warn 0.016, fail 0.1
        my_stats = TensorStats(base.min * scale, base.max * scale, base.mean * scale, base.l2norm * scale, 0, 0)  # type: ignore[operator]
        key = RecordKey(name=f"model.layers.{order % 5}.mlp", step=order // 5)
        records[0].append(TensorRecord(key, "float32", (4, 8), order, stats=base))
        records[1].append(TensorRecord(key, "bfloat16", (4, 8), order, stats=my_stats))
    golden, my = Dump("llmcheck", Path("/golden"), records[0]), Dump("llmcheck", Path("/my"), records[1])
    made_alone: list[int] = []
    row = PairJudge.row
    monkeypatch.setattr(
        PairJudge, "row", lambda self, index, *args: made_alone.append(index) or row(self, index, *args)
    )
    result = compare_dumps(golden, my, workers=1)
    assert {row.verdict for row in result.rows} == {"pass", "warn", "fail"}
    assert len(made_alone) < 10  # the first row of each class of rows alike, not each row
