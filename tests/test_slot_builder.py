"""Records built through their slots (the loader's and the judge's 10**6 objects) equal those the classes build."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmcheck.core.records import (
    RECORD_FIELDS,
    ComparisonRow,
    MetricResult,
    RecordKey,
    TensorData,
    TensorRecord,
    TensorStats,
    build_metric_result,
    build_record,
    build_row,
    build_stats,
    slot_builder,
)


def _same(built: object, constructed: object, hashable: bool = True) -> None:
    assert type(built) is type(constructed)
    assert built == constructed and repr(built) == repr(constructed)
    assert not hashable or hash(built) == hash(constructed)


def test_built_objects_equal_constructed_ones_defaults_included() -> None:
    key = slot_builder(RecordKey)("layer", "output", "0", 3, 1, "after")
    _same(key, RecordKey("layer", "output", "0", 3, 1, "after"))
    assert key.rank == 0  # a default
    record = build_record(key=key, dtype="float32", shape=(2,), order=4)
    constructed = TensorRecord(key=key, dtype="float32", shape=(2,), order=4)
    assert [getattr(record, name) for name in RECORD_FIELDS] == [getattr(constructed, name) for name in RECORD_FIELDS]
    _same(
        build_metric_result("cosine_similarity", 0.5, higher_is_better=True),
        MetricResult("cosine_similarity", 0.5, higher_is_better=True),
    )
    _same(build_stats(-1.0, 2.0, 0.5, 3.0, 0, 0), TensorStats(-1.0, 2.0, 0.5, 3.0, nan_count=0, inf_count=0))
    _same(build_stats(nan_count=1), TensorStats(nan_count=1))
    row = build_row(0, record, record, "exact_key", {}, "pass", reason="a note")
    _same(row, ComparisonRow(0, record, record, "exact_key", {}, "pass", reason="a note"), hashable=False)
    _same(row.with_changes(verdict="fail"), dataclasses.replace(row, verdict="fail"), hashable=False)


def test_a_default_factory_gives_each_built_object_its_own_value() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Holder:
        name: str
        items: list[int] = dataclasses.field(default_factory=list)

    build = slot_builder(Holder)
    first, second = build("a"), build("b")
    assert first.items == [] and first.items is not second.items
    assert build("c", [1]).items == [1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.name = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'name'"):
        build()


def test_a_class_checking_its_fields_is_built_only_when_the_caller_says_its_values_pass() -> None:
    with pytest.raises(TypeError, match="TensorData checks its fields in __post_init__"):
        slot_builder(TensorData)
    data = slot_builder(TensorData, skip_post_init=True)(
        dtype="float32", shape=(2,), path=Path("s"), offset=8, nbytes=8
    )
    _same(data, TensorData(dtype="float32", shape=(2,), path=Path("s"), offset=8, nbytes=8))

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        name: str

    with pytest.raises(TypeError, match="NoSlots is not a slots dataclass"):
        slot_builder(NoSlots)
