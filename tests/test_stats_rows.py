"""A statistics-only dump's statistics, held as rows of columns, read back exactly what the index holds.

Exactly: each value's type and bits (``-0.0``, NaN, infinities, a count among floats, a missing
value), in a full block and in the last one; equal to, hashed and pickled as the
``TensorStats(...)`` of the same values; frozen; and smaller than statistics objects of their own.
"""

from __future__ import annotations

import math
import pickle
import struct
import tracemalloc
from collections.abc import Iterator
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pytest

from llmcheck.core.dumps.stats_rows import ROWS_PER_BLOCK, StatsRow, StatsRows
from llmcheck.core.dumps.store import DumpWriter, read_dump
from llmcheck.core.records import STATS_FIELDS, RecordKey, TensorRecord, TensorStats


def _bits(value: Any) -> Any:
    if isinstance(value, float):
        return float, struct.pack("<d", value)
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


@pytest.mark.parametrize("count", [1, ROWS_PER_BLOCK, 3 * ROWS_PER_BLOCK + 17])
def test_rows_read_back_every_value_bit_for_bit(count: int) -> None:
    make = StatsRows()
    given = _values(count)
    made = [make(*values) for values in given]
    before_close = [tuple(map(_bits, row.values())) for row in made]  # the block still filling reads alike
    make.close()
    for row, values, early in zip(made, given, before_close):
        assert isinstance(row, StatsRow) and isinstance(row, TensorStats)
        expected = tuple(map(_bits, values))
        assert tuple(map(_bits, row.values())) == expected == early
        assert tuple(_bits(getattr(row, name)) for name in STATS_FIELDS) == expected


def test_a_row_equals_hashes_and_pickles_as_the_statistics_of_its_values() -> None:
    make = StatsRows()
    row = make(-1.5, 2.0, 0.25, 3.0, 0, 1)
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
    nan_row = make(math.nan, None, None, None, 1, 0)
    assert nan_row == nan_row  # the same statistics, though NaN is unequal to itself


def test_rows_cost_less_than_half_of_statistics_objects() -> None:
    """As a dump is read: each record's values are decoded afresh, and only what holds them stays."""
    count = 20 * ROWS_PER_BLOCK

    def decoded() -> Iterator[tuple[Any, ...]]:
        for number in range(count):
            yield -1.0 - number, 1.0 + number, 0.5 / (number + 1), 3.0 + number, 0, 0

    tracemalloc.start()
    try:
        held = [TensorStats(*values) for values in decoded()]
        held_bytes = tracemalloc.get_traced_memory()[0]
        del held
        tracemalloc.clear_traces()
        make = StatsRows()
        rows = [make(*values) for values in decoded()]
        make.close()
        row_bytes = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(rows) == count
    # 48 bytes the row, 32 its four doubles, 8 its place in the list; 80 + 96 + 8 as objects
    assert row_bytes / count <= 92 and held_bytes / count >= 2 * 88, (row_bytes / count, held_bytes / count)


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
