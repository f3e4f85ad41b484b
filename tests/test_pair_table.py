"""The kept pairs of a compare, held as columns, read back as the very pairs the pairing kept.

Field for field: the records themselves (not copies), the rule, the priority with its type (a
:class:`PairPriority` stays one), the note and ``expected``; in order, by index, by slice and
by side; and in a fraction of what a list of pair objects holds.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from llmcheck.core.pairing.merge import merge_pairs
from llmcheck.core.pairing.pair_table import PairTable, pair_side
from llmcheck.core.records import Dump, Pair, PairPriority, RecordKey, TensorRecord


def _records(count: int, prefix: str) -> list[TensorRecord]:
    return [TensorRecord(key=RecordKey(f"{prefix}{n}"), dtype="float32", shape=(2,), order=n) for n in range(count)]


def _pairs(golden: list[TensorRecord], my: list[TensorRecord]) -> list[Pair]:
    rules = [
        ("exact_key", PairPriority.EXACT_KEY, "", False),
        ("tp_unshard(sum)", 50, "gathered from 2 shards", False),
        ("sequence", PairPriority.SEQUENCE, "", True),
    ]
    return [Pair(g, m, *rules[n % len(rules)]) for n, (g, m) in enumerate(zip(golden, my))]


def _fields(pair: Pair) -> tuple[object, ...]:
    return (id(pair.golden), id(pair.my), pair.rule, pair.priority, type(pair.priority), pair.note, pair.expected)


def test_a_table_reads_back_every_pair_field_for_field() -> None:
    golden, my = _records(10, "g"), _records(10, "m")
    pairs = _pairs(golden, my)
    table = PairTable(pairs)
    assert len(table) == 10
    assert [_fields(pair) for pair in table] == [_fields(pair) for pair in pairs]
    assert [_fields(table[n]) for n in range(-10, 10)] == [_fields(pair) for pair in pairs + pairs]
    assert [_fields(pair) for pair in table[2:7:2]] == [_fields(pair) for pair in pairs[2:7:2]]
    assert table == pairs and table != pairs[:-1] and PairTable([]) == []
    assert list(pair_side(table, "golden")) == golden and list(pair_side(table, "my")) == my
    assert pair_side(pairs, "my") == my
    with pytest.raises(IndexError):
        table[10]
    with pytest.raises(ValueError, match="sides"):
        table.side("left")


def test_merge_pairs_keeps_its_pairs_in_a_table_of_20_bytes_a_pair() -> None:
    count = 20_000
    golden = Dump(source="test", root=Path("g"), records=_records(count, "layer"))
    my = Dump(source="test", root=Path("m"), records=_records(count, "layer"))
    proposals = [Pair(g, m, "exact_key", PairPriority.EXACT_KEY) for g, m in zip(golden.records, my.records)]
    merge_pairs(golden, my, proposals[:2])  # once before: numpy's set routines load their modules on first use
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = merge_pairs(golden, my, proposals)
        del proposals  # the proposals go (88 bytes a pair): the table is what stays
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert isinstance(kept.pairs, PairTable)
    assert [(pair.golden, pair.my) for pair in kept.pairs] == list(zip(golden.records, my.records))
    assert held / count <= 24, held / count
