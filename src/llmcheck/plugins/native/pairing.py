"""Built-in pairing rules: user mapping, exact key, and sequence alignment in execution order.

* ``user_mapping`` (priority 100): the ``--mapping`` file's name patterns, or the exact key
  pairs of an edited ``pairs.json``.
* ``exact_key`` (priority 20): the same key on both sides -- same name, io, position, step,
  call index and moment. Two runs of one model captured the same way pair completely.
* ``sequence`` (priority 0): for two runs of differently-named graphs of the same kind of
  dump (two torch dumps, two FX dumps), the records no exact key matched are aligned in execution order (longest common subsequence, per step) on
  what does not depend on naming: io, shape and whether the dtype is a float.
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from typing import Iterable

from llmcheck.core.records import Dump, Pair, RecordKey, TensorRecord, UserMapping

RULE_USER = "user_mapping"
RULE_EXACT = "exact_key"
RULE_SEQUENCE = "sequence"
PRIORITY_USER = 100
PRIORITY_EXACT = 20
PRIORITY_SEQUENCE = 0


def map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair]:
    """Return the user-mapping, exact-key and sequence proposals for two dumps."""
    proposals = user_mapping_pairs(golden, my, user_mapping) if user_mapping is not None else []
    exact = exact_key_pairs(golden, my)
    proposals.extend(exact)
    if golden.source != my.source:
        # Two kinds of dump (ATB against torch, GE against FX) are paired by their source
        # plugins' rules, which know both namings; aligning leftovers by shape alone would
        # invent pairs between unrelated tensors.
        return proposals
    paired_golden = {id(pair.golden) for pair in exact}
    paired_my = {id(pair.my) for pair in exact}
    proposals.extend(sequence_pairs([r for r in golden.records if id(r) not in paired_golden],
                                    [r for r in my.records if id(r) not in paired_my]))
    return proposals


def exact_key_pairs(golden: Dump, my: Dump) -> list[Pair]:
    """Return a pair for every key present on both sides."""
    mine = my.by_key()
    return [Pair(record, mine[record.key], RULE_EXACT, PRIORITY_EXACT)
            for record in golden.records if record.key in mine]


def _signature(record: TensorRecord) -> tuple[str, tuple[int, ...], bool]:
    return record.key.io, tuple(record.shape), record.dtype.startswith(("float", "bfloat", "complex"))


def sequence_pairs(golden_records: list[TensorRecord], my_records: list[TensorRecord]) -> list[Pair]:
    """Return pairs aligning two record lists in execution order, step by step, on io, shape and float-ness."""
    pairs: list[Pair] = []
    golden_steps = _by_step(golden_records)
    my_steps = _by_step(my_records)
    for step in sorted(golden_steps.keys() & my_steps.keys()):
        golden_side, my_side = golden_steps[step], my_steps[step]
        matcher = difflib.SequenceMatcher(None, [_signature(r) for r in golden_side],
                                          [_signature(r) for r in my_side], autojunk=False)
        for block in matcher.get_matching_blocks():
            for offset in range(block.size):
                pairs.append(Pair(golden_side[block.a + offset], my_side[block.b + offset], RULE_SEQUENCE,
                                  PRIORITY_SEQUENCE))
    return pairs


def _by_step(records: Iterable[TensorRecord]) -> dict[int, list[TensorRecord]]:
    steps: dict[int, list[TensorRecord]] = defaultdict(list)
    for record in records:
        steps[record.key.step].append(record)
    return steps


def _pattern(text: str) -> re.Pattern[str]:
    """Return a regex for a name pattern whose ``*`` each capture any run of characters."""
    return re.compile("(.*?)".join(re.escape(part) for part in text.split("*")) + r"\Z")


def _slot(key: RecordKey) -> tuple[str, str, int, int, str]:
    return key.io, key.position, key.step, key.call_index, key.moment


def user_mapping_pairs(golden: Dump, my: Dump, mapping: UserMapping) -> list[Pair]:
    """Return the pairs the user's mapping file asks for."""
    pairs: list[Pair] = []
    if mapping.key_pairs:
        golden_by_key, my_by_key = golden.by_key(), my.by_key()
        for golden_key, my_key in mapping.key_pairs:
            if golden_key in golden_by_key and my_key in my_by_key:
                pairs.append(Pair(golden_by_key[golden_key], my_by_key[my_key], RULE_USER, PRIORITY_USER))
    for golden_text, my_text in mapping.entries:
        golden_pattern, my_pattern = _pattern(golden_text), _pattern(my_text)
        candidates: dict[tuple[object, ...], list[TensorRecord]] = defaultdict(list)
        for record in my.records:
            match = my_pattern.match(record.key.name)
            if match:
                candidates[(match.groups(), *_slot(record.key))].append(record)
        taken: dict[tuple[object, ...], int] = defaultdict(int)
        for record in golden.records:
            match = golden_pattern.match(record.key.name)
            if not match:
                continue
            slot = (match.groups(), *_slot(record.key))
            options = candidates.get(slot)
            if options and taken[slot] < len(options):
                pairs.append(Pair(record, options[taken[slot]], RULE_USER, PRIORITY_USER))
                taken[slot] += 1
    return pairs
