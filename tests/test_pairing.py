"""Merging pairing proposals: priorities, one-sided claims, and which rules apply to which sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmcheck.core.errors import PluginError
from llmcheck.core.pairing.merge import merge_pairs, write_pairs_json
from llmcheck.core.records import Dump, Pair, RecordKey, TensorRecord
from llmcheck.plugins.native.pairing import map_pairs


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
