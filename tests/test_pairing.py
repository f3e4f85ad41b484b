"""Merging pairing proposals: priorities, one-sided claims, and which rules apply to which sources."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from llmcheck.core.dumps.store import DumpWriter, read_dump
from llmcheck.core.errors import PluginError
from llmcheck.core.pairing.merge import Pairing, merge_pairs, write_pairs_json
from llmcheck.core.pairing.pair_table import PairTable, pair_side, pairs_in_order
from llmcheck.core.plugins import get_plugins
from llmcheck.core.records import Dump, Pair, PairPriority, RecordKey, TensorRecord, TensorStats
from llmcheck.plugins.native.pairing import exact_key_pairs, map_pairs


def _records(*names: str) -> list[TensorRecord]:
    return [
        TensorRecord(key=RecordKey(name=name), dtype="float32", shape=(4,), order=order)
        for order, name in enumerate(names)
    ]


def test_a_higher_priority_pair_wins_over_a_lower_one_for_the_same_record(tmp_path: Path) -> None:
    golden, my = Dump("a", tmp_path, _records("x")), Dump("a", tmp_path, _records("p", "q"))
    merged = merge_pairs(
        golden,
        my,
        [Pair(golden.records[0], my.records[0], "sequence", 0), Pair(golden.records[0], my.records[1], "rule", 50)],
    )
    assert [(p.my.key.name, p.rule) for p in merged.pairs] == [("q", "rule")]
    assert [u.record.key.name for u in merged.unmatched_my] == ["p"]


def test_a_one_sided_claim_keeps_a_lower_priority_rule_from_pairing_that_record(tmp_path: Path) -> None:
    golden, my = Dump("a", tmp_path, _records("x")), Dump("a", tmp_path, _records("Cast_3"))
    note = "Cast op inserted by the graph compiler, no FX counterpart"
    merged = merge_pairs(
        golden,
        my,
        [Pair(None, my.records[0], "ge_fx", 50, note=note), Pair(golden.records[0], my.records[0], "sequence", 0)],
    )
    assert merged.pairs == []
    assert [(u.record.key.name, u.note) for u in merged.unmatched_my] == [("Cast_3", note)]


def test_sequence_alignment_pairs_differently_named_runs_of_one_source_only(tmp_path: Path) -> None:
    same_golden, same_my = Dump("fx", tmp_path, _records("add_1")), Dump("fx", tmp_path, _records("add_7"))
    assert [p.rule for p in map_pairs(same_golden, same_my, None)] == ["sequence"]
    other_my = Dump("ge", tmp_path, _records("Add_7"))
    assert map_pairs(same_golden, other_my, None) == []


def test_a_pair_holding_a_copy_of_a_loaded_record_is_an_error_naming_the_rule(tmp_path: Path) -> None:
    golden, my = Dump("test", tmp_path, _records("a", "b")), Dump("test", tmp_path, _records("a", "b"))
    copy = golden.records[0].with_changes()  # equal to the loaded record, but another object
    assert copy == golden.records[0] and copy is not golden.records[0]
    with pytest.raises(PluginError) as caught:
        merge_pairs(golden, my, [Pair(copy, my.records[0], "copying-rule", 50)])
    assert "copying-rule" in caught.value.what and "a step 0 output.0" in caught.value.what
    assert caught.value.where == str(tmp_path)


def test_a_record_a_rule_derived_itself_may_be_paired(tmp_path: Path) -> None:
    golden, my = Dump("test", tmp_path, _records("a")), Dump("test", tmp_path, _records("a"))
    gathered = golden.records[0].with_changes(key=RecordKey(name="a", rank=-1))  # built from shards, not loaded
    pairing = merge_pairs(golden, my, [Pair(gathered, my.records[0], "gather", 50)])
    assert [(pair.golden, pair.my) for pair in pairing.pairs] == [(gathered, my.records[0])]


def test_a_list_pairing_each_record_once_is_kept_as_the_general_merge_keeps_it(tmp_path: Path) -> None:
    """merge_pairs keeps a one-to-one proposal list whole without its priority book-keeping: the same as with it.

    A repeated proposal sends the list through the general path (which drops the repeat); both
    must give the same pairs in the same order, and the same unmatched records.
    """
    golden = Dump("a", tmp_path, _records("a", "b", "c", "d"))
    my = Dump("a", tmp_path, _records("c", "a", "b", "e"))
    one_to_one = [
        Pair(golden.records[2], my.records[0], "exact_key", 50),
        Pair(golden.records[0], my.records[1], "exact_key", 50),
        Pair(golden.records[1], my.records[2], "sequence", 0),
    ]
    fast = merge_pairs(golden, my, one_to_one)
    general = merge_pairs(golden, my, [*one_to_one, one_to_one[0]])
    assert [(p.golden.key.name, p.my.key.name, p.rule) for p in fast.pairs] == [
        ("a", "a", "exact_key"),
        ("b", "b", "sequence"),
        ("c", "c", "exact_key"),
    ]
    assert [(p.golden, p.my, p.rule) for p in fast.pairs] == [(p.golden, p.my, p.rule) for p in general.pairs]
    assert fast.unmatched_golden == general.unmatched_golden and [u.record.key.name for u in fast.unmatched_golden] == [
        "d"
    ]
    assert fast.unmatched_my == general.unmatched_my and [u.record.key.name for u in fast.unmatched_my] == ["e"]


@pytest.mark.parametrize("first_order", [0, 7, None], ids=["orders-from-0", "orders-from-7", "orders-not-a-count"])
def test_a_copy_of_a_loaded_record_is_refused_and_a_derived_record_marked_whatever_the_orders(
    tmp_path: Path, first_order: int | None
) -> None:
    """Records are told apart from copies by identity: at their place by order, else by a set of ids."""
    records = _records("a", "b", "c")
    if first_order is not None:
        records = [record.with_changes(order=first_order + record.order) for record in records]
    else:  # orders that count nothing: a record is not found at its place, and the set decides
        records = [record.with_changes(order=10 * (3 - record.order)) for record in records]
    golden, my = Dump("a", tmp_path, records), Dump("a", tmp_path, _records("a", "b", "c"))
    copy = records[1].with_changes()
    assert copy == records[1] and copy is not records[1]
    with pytest.raises(PluginError, match="proposed a copy of the golden record b"):
        merge_pairs(golden, my, [Pair(copy, my.records[1], "rule", 50)])
    derived = records[2].with_changes(shape=(8,))  # equal to no loaded record: built by a rule, allowed
    merged = merge_pairs(
        golden, my, [Pair(records[0], my.records[0], "rule", 50), Pair(derived, my.records[2], "rule", 50)]
    )
    written = tmp_path / "pairs.json"
    write_pairs_json(written, merged, golden, my)
    entries = json.loads(written.read_text())["pairs"]
    assert sorted((entry["golden"]["name"], entry.get("derived", False)) for entry in entries) == [
        ("a", False),
        ("c", True),
    ]


def _statistics_dump(folder: Path, keys: list[RecordKey], scale: float) -> Path:
    """Write a statistics-only dump (llmcheck's own index) of one record a key, in the order given."""
    with DumpWriter(folder, "test") as writer:
        for order, key in enumerate(keys):
            stats = TensorStats(min=-scale, max=scale, mean=0.0, l2norm=2.0 * scale, nan_count=0, inf_count=0)
            writer.add(TensorRecord(key=key, dtype="float32", shape=(4,), order=order, stats=stats))
    return writer.path


def _decode_keys(steps: int) -> list[RecordKey]:
    names = ["model.embed_tokens", "model.layers.0.mlp", "model.layers.1.mlp", "lm_head"]
    return [RecordKey(name, io, step=step) for step in range(steps) for name in names for io in ("input", "output")]


def _fields_of(pairs: Sequence[Pair]) -> list[tuple[int, int, str, int, str, bool]]:
    return [(id(p.golden), id(p.my), p.rule, p.priority, p.note, p.expected) for p in pairs]


def _by_key_lookup(golden: Dump, my: Dump) -> Pairing:
    """Pair as the exact-key rule's lookup does, through the merge's general path (a repeated proposal forces it)."""
    lookup = exact_key_pairs(golden, my, [None] * len(golden.records), [None] * len(my.records))
    return merge_pairs(golden, my, [*lookup, *lookup[:1]])


def test_two_runs_captured_alike_are_paired_where_they_stand_as_the_key_lookup_pairs_them(tmp_path: Path) -> None:
    """The common compare -- one model, captured the same way twice -- pairs record i with record i.

    The pairs are the two loaded record lists themselves (no ``Pair`` object and no lookup a
    record: ten million pairs cost 1 byte each), equal, pair for pair and field for field, to
    what the key lookup and the general merge make.
    """
    keys = _decode_keys(steps=3)
    golden_path = _statistics_dump(tmp_path / "golden", keys, 1.0)
    my_path = _statistics_dump(tmp_path / "my", keys, 1.5)
    golden, my = get_plugins().load_runs(golden_path, None, my_path, None)
    proposals = map_pairs(golden, my, None)
    assert pair_side(proposals, "golden") is golden.records and pair_side(proposals, "my") is my.records
    pairing = merge_pairs(golden, my, proposals)
    assert pairing.pairs is proposals and not pairing.unmatched_golden and not pairing.unmatched_my
    assert len(pairing.pairs) == len(keys) == 24
    assert _fields_of(pairing.pairs) == _fields_of(_by_key_lookup(golden, my).pairs)
    assert {(p.rule, p.priority, type(p.priority)) for p in pairing.pairs} == {
        ("exact_key", PairPriority.EXACT_KEY, PairPriority)
    }


@pytest.mark.parametrize("difference", ["a record missing", "a key named twice", "keys read apart", "another order"])
def test_runs_not_captured_alike_are_paired_by_key_lookup_as_before(tmp_path: Path, difference: str) -> None:
    keys = _decode_keys(steps=2)
    my_keys = list(keys)
    if difference == "a record missing":
        del my_keys[5]
    elif difference == "another order":
        my_keys[2], my_keys[3] = my_keys[3], my_keys[2]
    golden_path = _statistics_dump(tmp_path / "golden", keys, 1.0)
    my_path = _statistics_dump(tmp_path / "my", my_keys, 1.5)
    golden: Dump
    my: Dump
    if difference == "keys read apart":  # equal keys, but each dump's own objects: paired by equality
        golden, my = read_dump(golden_path), read_dump(my_path)
        assert golden.records[0].key == my.records[0].key and golden.records[0].key is not my.records[0].key
    elif difference == "a key named twice":  # a source other than llmcheck's index (which refuses it) may
        keys[3] = keys[2]
        golden, my = (
            Dump("test", tmp_path, [TensorRecord(key, "float32", (4,), order) for order, key in enumerate(keys)])
            for _ in range(2)
        )
    else:
        golden, my = get_plugins().load_runs(golden_path, None, my_path, None)
    proposals = map_pairs(golden, my, None)
    assert not isinstance(proposals, PairTable)
    pairing, expected = merge_pairs(golden, my, proposals), _by_key_lookup(golden, my)
    assert _fields_of(pairing.pairs) == _fields_of(expected.pairs)
    assert pairing.unmatched_golden == expected.unmatched_golden and pairing.unmatched_my == expected.unmatched_my
    if difference == "a record missing":
        assert [u.record.key for u in pairing.unmatched_golden] == [keys[5]]
    if difference == "a key named twice":  # both golden records find the my record the lookup holds last
        assert [(p.golden.order, p.my.order) for p in pairing.pairs[2:4]] == [(2, 3), (3, 3)]


def test_pairs_in_order_of_whole_dumps_are_kept_in_golden_execution_order(tmp_path: Path) -> None:
    """A table of both record lists side by side is kept as it is only where the golden orders rise; else it is sorted."""
    golden = Dump("a", tmp_path, _records("a", "b", "c"))
    my = Dump("a", tmp_path, _records("a", "b", "c"))
    table = pairs_in_order(golden.records, my.records, "exact_key", PairPriority.EXACT_KEY)
    assert merge_pairs(golden, my, table).pairs is table
    shuffled = Dump("a", tmp_path, [golden.records[2], golden.records[0], golden.records[1]])
    table = pairs_in_order(shuffled.records, my.records, "exact_key", PairPriority.EXACT_KEY)
    pairing = merge_pairs(shuffled, my, table)
    assert pairing.pairs is not table
    assert [(p.golden.key.name, p.my.key.name) for p in pairing.pairs] == [("a", "b"), ("b", "c"), ("c", "a")]
    with pytest.raises(ValueError, match="one length"):
        pairs_in_order(golden.records, my.records[:2], "exact_key", PairPriority.EXACT_KEY)
