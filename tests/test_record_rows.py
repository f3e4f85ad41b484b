"""The records of a dump read from llmcheck's own index, and their statistics, held as rows of columns, read back exactly what the index holds.

Exactly: each value's type and bits (``-0.0``, NaN, infinities, a count among floats, a missing
value, a field every record of a block shares and one that one record sets), in a full block and
in the last one; equal to and pickled as the ``TensorRecord(...)`` / ``TensorStats(...)`` of the
same values; frozen; and in less than half the memory of objects of their own.
"""

from __future__ import annotations

import math
import pickle
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pytest

from llmcheck.core.dumps.record_rows import (
    ROWS_PER_BLOCK,
    RecordRow,
    RecordRows,
    StatsRow,
    is_stats_of,
    statistics_values,
)
from llmcheck.core.dumps.store import NO_ATTRS, DumpWriter, read_dump
from llmcheck.core.records import RECORD_FIELDS, STATS_FIELDS, HeldRecord, RecordKey, TensorRecord, TensorStats


def _bits(value: Any) -> Any:
    """Return what tells a value apart from every other: a float's bits, statistics' values' bits, and the type."""
    if isinstance(value, float):
        return float, struct.pack("<d", value)
    if isinstance(value, TensorStats):
        return TensorStats, tuple(map(_bits, value.values()))
    return type(value), value


def _values(count: int) -> list[tuple[Any, ...]]:
    """Return ``count`` rows' six values: mostly plain floats and zero counts, with every odd value somewhere."""
    odd = [
        (-0.0, math.inf, math.nan, 0.0, 3, 2),
        (None, None, None, None, None, None),
        (1, 2.5, None, 7.0, 0, None),  # an int where floats are
        (-math.inf, 1e308, 5e-324, 2.0**60, 2**62, 0),
    ]
    return [
        odd[number // 97 % len(odd)] if number % 97 == 5 else (-1.0 * number, number + 0.5, 0.25, 3.0, 0, 0)
        for number in range(count)
    ]


_KEY = RecordKey("model.layers.0.mlp")


def _record_with(make: RecordRows, order: int, stats: Any) -> TensorRecord:
    """Return a record made by ``make`` as a dump's reader makes one, holding ``stats`` (``make.stats(...)``, or None)."""
    return make(_KEY, "bfloat16", (1, 1, 64), order, "cpu", 0, None, None, stats, None, "x", NO_ATTRS, None)


def _statistics(make: RecordRows, given: list[tuple[Any, ...]]) -> list[TensorStats]:
    """Return the statistics of records made by ``make`` from each of ``given``'s six values, as a reader asks for them."""
    return [_record_with(make, order, make.stats(*values)).stats for order, values in enumerate(given)]


@pytest.mark.parametrize("count", [1, ROWS_PER_BLOCK, 3 * ROWS_PER_BLOCK + 17])
def test_rows_read_back_every_value_bit_for_bit(count: int) -> None:
    make = RecordRows()
    given = _values(count)
    made = _statistics(make, given)
    before_close = [tuple(map(_bits, row.values())) for row in made]  # the block still filling reads alike
    make.close()
    for row, values, early in zip(made, given, before_close):
        assert isinstance(row, StatsRow) and isinstance(row, TensorStats)
        expected = tuple(map(_bits, values))
        assert tuple(map(_bits, row.values())) == expected == early
        assert tuple(_bits(getattr(row, name)) for name in STATS_FIELDS) == expected


def test_a_row_equals_hashes_and_pickles_as_the_statistics_of_its_values() -> None:
    make = RecordRows()
    row, nan_row = _statistics(make, [(-1.5, 2.0, 0.25, 3.0, 0, 1), (math.nan, None, None, None, 1, 0)])
    make.close()
    held = TensorStats(min=-1.5, max=2.0, mean=0.25, l2norm=3.0, nan_count=0, inf_count=1)
    assert row == held and held == row and hash(row) == hash(held)
    assert row != TensorStats(min=-1.5, max=2.0, mean=0.25, l2norm=3.0, nan_count=0, inf_count=0)
    assert (
        repr(row) == repr(held) == ("TensorStats(min=-1.5, max=2.0, mean=0.25, l2norm=3.0, nan_count=0, inf_count=1)")
    )
    assert pickle.loads(pickle.dumps(row)) == held  # sent to a worker, it leaves its columns behind
    assert row.as_json() == held.as_json()
    with pytest.raises(FrozenInstanceError):
        row.min = 0.0  # type: ignore[misc]
    assert nan_row == nan_row  # the same statistics, though NaN is unequal to itself


def test_statistics_in_record_rows_cost_less_than_half_of_statistics_objects() -> None:
    """As a dump is read: each record's values are decoded afresh, and only what holds them stays."""
    count = 20 * ROWS_PER_BLOCK

    def decoded() -> Iterator[tuple[Any, ...]]:
        for number in range(count):
            yield -1.0 - number, 1.0 + number, 0.5 / (number + 1), 3.0 + number, 0, 0

    def record_bytes(with_stats: bool) -> float:
        tracemalloc.clear_traces()
        make = RecordRows()
        records = [
            _record_with(make, 10**6 + order, make.stats(*values) if with_stats else None)
            for order, values in enumerate(decoded())
        ]
        make.close()
        assert len(records) == count
        return tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        held = [TensorStats(*values) for values in decoded()]
        held_bytes = tracemalloc.get_traced_memory()[0]
        del held
        stats_bytes = record_bytes(with_stats=True) - record_bytes(with_stats=False)
    finally:
        tracemalloc.stop()
    # 32 bytes a record: its four doubles (its counts fill shared columns); 80 + 96 + 8 as objects
    assert stats_bytes / count <= 40 and held_bytes / count >= 2 * 88, (stats_bytes / count, held_bytes / count)


def test_statistics_that_are_float32_values_are_held_in_4_bytes_and_read_back_bit_for_bit() -> None:
    """A bfloat16 tensor's min and max are float32 values: a block holds such a column as C floats, 16 bytes a record less.

    A column with one value that is not a float32's (a float64 mean, a double beyond
    float32's range, a NaN's payload float32 drops) is held as doubles; each reads back as given.
    """
    payload_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    smallest, largest = 2.0**-149, float.fromhex("0x1.fffffep+127")  # float32's least subnormal and its largest
    count = 2 * ROWS_PER_BLOCK
    given = []
    for number in range(count):
        low = [-0.0, -math.inf, math.nan, -smallest, -largest][number % 5] if number % 7 == 0 else -1.0 - number
        high = 2.0**-60 * (number + 1) if number != count - 1 else 0.1  # 0.1: no float32, in the second block
        mean = [payload_nan, 1e39, 0.5][number // ROWS_PER_BLOCK] if number % ROWS_PER_BLOCK == 3 else 0.25
        given.append((low, high, mean, 3.0 + number / 3, 0, 0))
    make = RecordRows()
    records = [_record_with(make, order, make.stats(*values)) for order, values in enumerate(given)]
    make.close()
    for record, values in zip(records, given):
        assert tuple(map(_bits, record.stats.values())) == tuple(map(_bits, values))  # type: ignore[union-attr]
    first, second = records[0]._block, records[-1]._block  # type: ignore[attr-defined]
    assert [column.typecode for column in first.columns[:4]] == ["f", "f", "d", "d"]  # a NaN's payload: a double
    assert [column.typecode for column in second.columns[:4]] == ["f", "d", "d", "d"]  # 0.1, 1e39: doubles
    values, floats = statistics_values(records)
    assert floats.all()
    assert [tuple(map(_bits, row)) for row in values.tolist()] == [tuple(map(_bits, row[:4])) for row in given]


def test_statistics_that_are_floats_but_for_an_empty_tensors_none_are_held_as_c_numbers() -> None:
    given = [
        (None, None, None, None, 0, 0) if number % 50 == 7 else (-0.5, 2.0**-140, 0.1, 3.0, 0, 0)
        for number in range(300)
    ]
    make = RecordRows()
    records = [_record_with(make, order, make.stats(*values)) for order, values in enumerate(given)]
    make.close()
    for record, values in zip(records, given):
        assert tuple(map(_bits, record.stats.values())) == tuple(map(_bits, values))  # type: ignore[union-attr]
    columns = records[0]._block.columns[:4]  # type: ignore[attr-defined]
    assert [type(column).__name__ for column in columns] == ["_FloatsOrNone"] * 4
    assert [column.floats.typecode for column in columns] == ["f", "f", "d", "f"]
    values, floats = statistics_values(records)
    assert floats.tolist() == [number % 50 != 7 for number in range(300)]  # a None is no float: read, not made


def test_a_statistics_only_dump_reads_its_statistics_as_rows(tmp_path: Path) -> None:
    written = [
        TensorStats(min=-0.0, max=math.inf, mean=math.nan, l2norm=2.5, nan_count=4, inf_count=1),
        TensorStats(min=1.0, max=2.0, mean=1.5, l2norm=None, nan_count=0, inf_count=0),
        None,
    ]
    with DumpWriter(tmp_path, "test") as writer:
        for order, stats in enumerate(written):
            writer.add(
                TensorRecord(key=RecordKey(f"layer{order}"), dtype="float32", shape=(4,), order=order, stats=stats)
            )
    read = [record.stats for record in read_dump(writer.path).records]
    assert [type(stats) for stats in read] == [StatsRow, StatsRow, type(None)]
    assert [None if stats is None else tuple(map(_bits, stats.values())) for stats in read] == [
        None if stats is None else tuple(map(_bits, stats.values())) for stats in written
    ]


def test_a_records_statistics_are_made_when_asked_and_equal_on_every_read(tmp_path: Path) -> None:
    with_nan = TensorStats(min=-1.0, max=2.0, mean=math.nan, l2norm=3.0, nan_count=1, inf_count=0)
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(TensorRecord(key=RecordKey("a"), dtype="float32", shape=(4,), order=0, stats=with_nan))
        writer.add(TensorRecord(key=RecordKey("b"), dtype="float32", shape=(4,), order=1))
    record, without = read_dump(writer.path).records
    first, second = record.stats, record.stats
    assert first is not second and first == second and hash(first) == hash(second)  # NaN: the same place
    assert first != with_nan  # a NaN read from another place is unequal to itself, as NaN is
    assert is_stats_of(first, record) and not is_stats_of(first, without) and not is_stats_of(with_nan, record)
    assert without.stats is None and record == record.with_changes() and record.stats.values()[:2] == (-1.0, 2.0)


def _written_records(count: int) -> list[TensorRecord]:
    """Return statistics-only records whose every field varies somewhere: most alike, every 97th odd."""
    records = []
    for order in range(count):
        odd = order % 97 == 5
        records.append(
            TensorRecord(
                key=RecordKey(
                    f"model.layers.{order // 20}.mlp", io="input" if order % 2 else "output", call_index=order % 20
                ),
                dtype="float16" if odd else "bfloat16",
                shape=(1, order % 3 + 1, 64),
                order=order,
                device="npu:1" if odd else "cpu",
                rank=3 if odd else 0,
                op_type=None if odd else "LlamaMLP",
                parent="model" if odd else f"model.layers.{order // 20}",
                stats=None
                if order % 50 == 7
                else TensorStats(-1.0 * order, order + 0.5, -0.0, math.inf, 0, 2 if odd else 0),
                attrs={"ids": [order]} if odd else {},
            )
        )
    return records


@pytest.mark.parametrize("count", [3, 2 * ROWS_PER_BLOCK + 9])
def test_a_dump_reads_its_records_as_rows_field_for_field(tmp_path: Path, count: int) -> None:
    written = _written_records(count)
    with DumpWriter(tmp_path, "test") as writer:
        for record in written:
            writer.add(record)
    read = read_dump(writer.path).records
    assert all(isinstance(record, RecordRow) for record in read) and len(read) == count
    for record, given in zip(read, written):
        for name in RECORD_FIELDS:
            if name != "source_path":  # where the reader found it
                assert _bits(getattr(record, name)) == _bits(getattr(given, name)), (record.order, name)
        assert record == given.with_changes(source_path=record.source_path)
    record = read[-1]
    moved = record.with_changes(order=10**6, parent="elsewhere")
    assert type(moved) is HeldRecord and (moved.order, moved.parent, moved.key) == (10**6, "elsewhere", record.key)
    assert pickle.loads(pickle.dumps(record)) == record  # sent to another process: a held record, equal
    assert repr(record) == repr(record.with_changes())
    with pytest.raises(FrozenInstanceError):
        record.order = 0  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field 'size'"):
        record.with_changes(size=3)


def test_record_rows_cost_less_than_half_of_record_objects() -> None:
    """As a dump is read: each line's values decoded afresh (the order, the statistics), the rest shared."""
    count = 20 * ROWS_PER_BLOCK
    key = RecordKey("model.layers.0.mlp")
    shape = (1, 1, 64)

    def records(make: Callable[..., TensorRecord], make_stats: Callable[..., TensorStats]) -> list[TensorRecord]:
        return [
            make(
                key,
                "bfloat16",
                shape,
                10**6 + order,
                "cpu",
                0,
                "LlamaMLP",
                "model.layers.0",
                make_stats(-1.0 - order, 1.0 + order, 0.5 / (order + 1), 3.0 + order, 0, 0),
                None,
                "dump/index.jsonl:model.layers.0.mlp",
                NO_ATTRS,
                None,
            )
            for order in range(count)
        ]

    tracemalloc.start()
    try:
        held = records(TensorRecord, TensorStats)
        held_bytes = tracemalloc.get_traced_memory()[0]
        del held
        tracemalloc.clear_traces()
        rows = RecordRows()
        made = records(rows, rows.stats)
        rows.close()
        row_bytes = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert all(isinstance(record, RecordRow) for record in made)
    # a row: 64 (its key and shape slots; its dtype is its class's, one class a dtype) + 8 (its
    # place in the list) + 8 (order) + 32 (its statistics' doubles), the columns of values its block's
    # records share costing nothing; its statistics are made when asked; as objects: 136 + 8 + 28
    # (order) + 80 + 96
    assert row_bytes / count <= 112 and held_bytes / count >= 340, (row_bytes / count, held_bytes / count)


def test_orders_counted_one_a_row_are_held_as_a_range_and_any_others_read_back_as_given() -> None:
    """A dump's records count their order one a row: a block holds that as one ``range``, not 8 bytes a record."""
    make = RecordRows()
    counted = [_record_with(make, 7 + number, None) for number in range(ROWS_PER_BLOCK)]
    jumbled_orders = [3, 2**62, -5, 4] * (ROWS_PER_BLOCK // 4)
    jumbled = [_record_with(make, order, None) for order in jumbled_orders]
    last = [_record_with(make, 10**6 + number, None) for number in range(3)]  # the last block, sealed by close
    make.close()
    for records, orders in (
        (counted, range(7, 7 + ROWS_PER_BLOCK)),
        (jumbled, jumbled_orders),
        (last, range(10**6, 10**6 + 3)),
    ):
        assert [(type(record.order), record.order) for record in records] == [(int, order) for order in orders]
        assert [record.values()[3] for record in records] == list(orders)
    order_column = RECORD_FIELDS.index("order") - 3 + len(STATS_FIELDS)  # after the statistics, less the slots
    assert type(counted[0]._block.columns[order_column]) is range
    assert type(jumbled[0]._block.columns[order_column]) is not range
    assert pickle.loads(pickle.dumps(counted[5])) == counted[5] and counted[5].order == 12


def test_a_blocks_few_op_types_and_parents_cost_a_byte_a_row_and_read_back_the_very_objects() -> None:
    """A block's op types and parent modules repeat a few texts: held as a byte a row naming each, read back as given."""
    make = RecordRows()
    parents = [f"model.layers.{number % 40}" for number in range(ROWS_PER_BLOCK)]  # 40 texts, each its own object
    op_types = [None, "LlamaMLP", 0, 0.0, False] * (ROWS_PER_BLOCK // 5) + [None] * (ROWS_PER_BLOCK % 5)
    distinct_paths = [
        f"dump/index.jsonl:{number}" for number in range(ROWS_PER_BLOCK)
    ]  # all distinct: kept as they are

    def made(op_type: Any, parent: Any, source_path: str, order: int) -> TensorRecord:
        return make(
            _KEY, "bfloat16", (1, 1, 64), order, "cpu", 0, op_type, parent, None, None, source_path, NO_ATTRS, None
        )

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        records = [made(*given, order) for order, given in enumerate(zip(op_types, parents, distinct_paths))]
        make.close()
        row_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    for record, op_type, parent, path in zip(records, op_types, parents, distinct_paths):
        assert (
            record.op_type is op_type and record.parent is parent and record.source_path is path
        )  # 0, 0.0, False apart
        assert record.values()[6:8] == (op_type, parent)
    # a row: 64 (the row) + 8 (its place in the list) + 8 (its source path) + a byte each for its op type and
    # parent, the parent texts themselves (about 70 bytes each, over the block) counted; as tuples, 16 more
    assert row_bytes / ROWS_PER_BLOCK <= 100, row_bytes / ROWS_PER_BLOCK


def test_a_statistics_only_record_reads_its_path_in_the_index_and_a_tensors_its_shard(tmp_path: Path) -> None:
    """What a report shows as a record's data path: ``<dump>/index.jsonl:<name>`` without tensor data, made from its key."""
    with DumpWriter(tmp_path, "test") as writer:
        writer.add(
            TensorRecord(key=RecordKey("model.norm"), dtype="float32", shape=(2,), order=0, stats=TensorStats(0.0, 1.0))
        )
        writer.add(TensorRecord(key=RecordKey("lm_head", step=3), dtype="float32", shape=(2,), order=1))
    dump = writer.path.name
    first, second = read_dump(writer.path).records
    assert first.source_path == f"{dump}/index.jsonl:model.norm" and type(first.source_path) is str
    assert second.source_path == f"{dump}/index.jsonl:lm_head"
    assert first.values()[RECORD_FIELDS.index("source_path")] == first.source_path
    assert pickle.loads(pickle.dumps(first)).source_path == first.source_path
    assert first == first.with_changes() and first.with_changes().source_path == first.source_path
