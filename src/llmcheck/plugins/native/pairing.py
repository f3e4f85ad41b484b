"""Built-in pairing rules: user mapping, exact key, and sequence alignment in execution order.

* ``user_mapping`` (``PairPriority.USER_MAPPING``): the ``--mapping`` file's name patterns, or the exact key
  pairs of an edited ``pairs.json``.
* ``exact_key`` (``PairPriority.EXACT_KEY``): the same key on both sides -- same name, io, position, step,
  call index and moment. Two runs of one model captured the same way pair completely.
* ``op_sequence`` (``EXACT_KEY``): inside a module whose op-level records differ between the
  runs (a kernel swapped), the ops are aligned in execution order on op name, io and shape.
* ``sequence`` (``PairPriority.SEQUENCE``): for two runs of differently-named graphs of the same kind of
  dump (two torch dumps, two FX dumps), the records no exact key matched are aligned in
  execution order (longest common subsequence, per step and module scope) on what does not
  depend on naming: io, shape and whether the dtype is a float.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from operator import attrgetter, is_

import numpy as np

from llmcheck.plugin_api import (
    Dump,
    OpCall,
    Pair,
    PairPriority,
    RecordKey,
    TensorRecord,
    UserMapping,
    group_op_calls,
    is_float_dtype,
    op_record_module,
    pairs_in_order,
)

log = logging.getLogger("llmcheck.pairing")

RULE_USER = "user_mapping"
#: How many of the mapping entries that pair nothing the warning names (the count says the rest).
ENTRIES_NAMED = 5
RULE_EXACT = "exact_key"
RULE_SEQUENCE = "sequence"
RULE_OP_SEQUENCE = "op_sequence"


def map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> Sequence[Pair]:
    """Return the user-mapping, exact-key and sequence proposals for two dumps."""
    if user_mapping is None and _same_keys_in_order(golden.records, my.records):
        # Two runs captured alike: every exact key pairs its records where they stand, and
        # nothing is left for the other rules.
        return pairs_in_order(golden.records, my.records, RULE_EXACT, PairPriority.EXACT_KEY)
    proposals = user_mapping_pairs(golden, my, user_mapping) if user_mapping is not None else []
    golden_scopes, my_scopes = _op_scopes_of(golden.records), _op_scopes_of(my.records)
    exact = exact_key_pairs(golden, my, golden_scopes, my_scopes)
    proposals.extend(exact)
    if golden.source != my.source:
        # Two kinds of dump (ATB against torch, GE against FX) are paired by their source
        # plugins' rules, which know both namings; aligning leftovers by shape alone would
        # invent pairs between unrelated tensors.
        return proposals
    paired_golden = {id(pair.golden) for pair in exact}
    paired_my = {id(pair.my) for pair in exact}
    # Ops of a module both runs have were aligned by name already: a leftover there is an op
    # one run executes and the other does not, never a counterpart to guess by shape.
    shared_scopes = set(golden_scopes) & set(my_scopes) - {None}
    proposals.extend(
        sequence_pairs(
            _leftovers(golden.records, golden_scopes, paired_golden, shared_scopes),
            _leftovers(my.records, my_scopes, paired_my, shared_scopes),
        )
    )
    return proposals


_KEY = attrgetter("key")
#: A record key's fields as one tuple, in the key's field order.
_KEY_FIELDS = attrgetter(*(field.name for field in dataclasses.fields(RecordKey)))

#: A record's op scope: the step and the module an op record's name places it in (None: a module's record).
_OpScope = tuple[int, str] | None


def _same_keys_in_order(golden: Sequence[TensorRecord], my: Sequence[TensorRecord]) -> bool:
    """Return whether both runs hold one key object per record, the same ones in the same order, each once.

    Dumps a compare loads share their equal keys (one object for equal keys), so this is a
    test of identity a record, and of the keys' distinctness on one side: an index that names a
    key twice is paired by the exact-key rule's lookup, as it always was.
    """
    if len(golden) != len(my) or not all(map(is_, map(_KEY, golden), map(_KEY, my))):
        return False
    key_ids = np.fromiter(map(id, map(_KEY, golden)), dtype=np.uint64, count=len(golden))
    key_ids.sort()
    return not (key_ids[1:] == key_ids[:-1]).any()


def _op_scopes_of(records: Sequence[TensorRecord]) -> list[_OpScope]:
    """Return each record's op scope, in order.

    A decode dump repeats every name at every step: each distinct name's module is parsed
    once, not once a record (four times a record, as the pairing looks at scopes, was a
    third of pairing 200 000 statistics-only pairs); a dump of module records only has no
    scope to build.
    """
    names = [record.key.name for record in records]
    modules = {name: op_record_module(name) for name in set(names)}
    if not any(modules.values()):
        return [None] * len(records)
    return [
        None if (module := modules[name]) is None else (record.key.step, module) for name, record in zip(names, records)
    ]


def _leftovers(
    records: Sequence[TensorRecord], scopes: Sequence[_OpScope], paired: set[int], shared_scopes: set[_OpScope]
) -> list[TensorRecord]:
    """Return the records no exact key paired, outside the op scopes both runs have (``scopes`` are the records')."""
    if len(paired) == len(records):  # every record is paired: none is left (the common case)
        return []
    return [record for record, scope in zip(records, scopes) if id(record) not in paired and scope not in shared_scopes]


def exact_key_pairs(
    golden: Dump, my: Dump, golden_scopes: Sequence[_OpScope], my_scopes: Sequence[_OpScope]
) -> list[Pair]:
    """Return a pair for every key present on both sides, op scopes whose op sequences differ aside.

    Op-level records are named ``{module}/{op}`` with a call index counted inside the module:
    when the two runs execute different ops in one module (an attention kernel swapped for
    its eager ops), ``aten.view.default[3]`` names different tensors on the two sides. The ops
    of such a scope are aligned in execution order on their op name, io, slot and shape
    instead (rule ``op_sequence``), and what has no counterpart stays unmatched. ``golden_scopes``
    and ``my_scopes`` are each record's op scope (:func:`_op_scopes_of`).
    """
    golden_ops, my_ops = _op_scopes(golden.records, golden_scopes), _op_scopes(my.records, my_scopes)
    diverged = {
        group
        for group in golden_ops.keys() & my_ops.keys()
        if [record.key for record in golden_ops[group]] != [record.key for record in my_ops[group]]
    }
    # Keys looked up as tuples of their fields (made and hashed in C), not as RecordKey
    # objects whose __hash__ and __eq__ run in Python: equal keys have equal tuples.
    mine = {key: record for key, record in zip(map(_KEY_FIELDS, map(_KEY, my.records)), my.records)}
    golden_keys = map(_KEY_FIELDS, map(_KEY, golden.records))
    pairs = [
        Pair(record, counterpart, RULE_EXACT, PairPriority.EXACT_KEY)
        for record, key, scope in zip(golden.records, golden_keys, golden_scopes)
        if (counterpart := mine.get(key)) is not None and scope not in diverged
    ]
    for group in sorted(diverged, key=str):
        golden_calls, my_calls = group_op_calls(golden_ops[group]), group_op_calls(my_ops[group])
        matcher = difflib.SequenceMatcher(
            None,
            [_call_signature(call) for call in golden_calls],
            [_call_signature(call) for call in my_calls],
            autojunk=False,
        )
        for block in matcher.get_matching_blocks():
            for offset in range(block.size):
                golden_call, my_call = golden_calls[block.a + offset], my_calls[block.b + offset]
                pairs.extend(
                    Pair(golden_record, my_record, RULE_OP_SEQUENCE, PairPriority.EXACT_KEY)
                    for golden_record, my_record in zip(golden_call.records(), my_call.records())
                )
    return pairs


def _call_signature(call: OpCall) -> tuple[object, ...]:
    """Return what must agree for two op calls to be the same op: its name and each tensor's slot and shape."""
    return (call.name, *(_op_signature(record)[1:] for record in call.records()))


def _op_scopes(
    records: Iterable[TensorRecord], scopes: Iterable[_OpScope]
) -> dict[tuple[int, str], list[TensorRecord]]:
    """Return the op records of each op scope, in order (``scopes`` are the records' own)."""
    by_scope: dict[tuple[int, str], list[TensorRecord]] = defaultdict(list)
    for record, scope in zip(records, scopes):
        if scope is not None:
            by_scope[scope].append(record)
    return by_scope


def _op_signature(record: TensorRecord) -> tuple[object, ...]:
    key = record.key
    return key.name, key.io, key.position, key.moment, tuple(record.shape), is_float_dtype(record.dtype)


def _signature(record: TensorRecord) -> tuple[str, tuple[int, ...], bool]:
    return record.key.io, tuple(record.shape), is_float_dtype(record.dtype)


def _scope(record: TensorRecord) -> str:
    """Return the module scope a record belongs to: its parent, else the part of its name before ``/``."""
    if record.parent:
        return record.parent
    return op_record_module(record.key.name) or ""


def sequence_pairs(golden_records: list[TensorRecord], my_records: list[TensorRecord]) -> list[Pair]:
    """Return pairs aligning two record lists in execution order, per step and module scope, on io, shape and float-ness.

    Alignment stays inside one module scope (``model.layers.0.self_attn``) where both runs have
    that scope: an attention kernel swapped for its eager ops inside layer 0 must not pair
    layer 0's leftovers with layer 1's. Records of scopes only one run has (a renamed module
    tree) are then aligned per step, as one sequence.
    """
    pairs: list[Pair] = []
    golden_groups = _by_step_and_scope(golden_records)
    my_groups = _by_step_and_scope(my_records)
    shared = golden_groups.keys() & my_groups.keys()
    for group in sorted(shared, key=str):
        pairs.extend(_aligned(golden_groups[group], my_groups[group]))
    golden_rest = _by_step(r for group, records in golden_groups.items() if group not in shared for r in records)
    my_rest = _by_step(r for group, records in my_groups.items() if group not in shared for r in records)
    for step in sorted(golden_rest.keys() & my_rest.keys()):
        pairs.extend(_aligned(golden_rest[step], my_rest[step]))
    return pairs


def _aligned(golden_side: list[TensorRecord], my_side: list[TensorRecord]) -> list[Pair]:
    """Return the pairs of the longest common subsequence of two record lists (by signature)."""
    matcher = difflib.SequenceMatcher(
        None, [_signature(r) for r in golden_side], [_signature(r) for r in my_side], autojunk=False
    )
    return [
        Pair(golden_side[block.a + offset], my_side[block.b + offset], RULE_SEQUENCE, PairPriority.SEQUENCE)
        for block in matcher.get_matching_blocks()
        for offset in range(block.size)
    ]


def _by_step(records: Iterable[TensorRecord]) -> dict[int, list[TensorRecord]]:
    steps: dict[int, list[TensorRecord]] = defaultdict(list)
    for record in sorted(records, key=lambda record: record.order):
        steps[record.key.step].append(record)
    return steps


def _by_step_and_scope(records: Iterable[TensorRecord]) -> dict[tuple[int, str], list[TensorRecord]]:
    groups: dict[tuple[int, str], list[TensorRecord]] = defaultdict(list)
    for record in records:
        groups[(record.key.step, _scope(record))].append(record)
    return groups


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
                pairs.append(Pair(golden_by_key[golden_key], my_by_key[my_key], RULE_USER, PairPriority.USER_MAPPING))
    idle: list[str] = []  # the entries that pair nothing, each with why
    for golden_text, my_text in mapping.entries:
        golden_pattern, my_pattern = _pattern(golden_text), _pattern(my_text)
        candidates: dict[tuple[object, ...], list[TensorRecord]] = defaultdict(list)
        for record in my.records:
            match = my_pattern.match(record.key.name)
            if match:
                candidates[(match.groups(), *_slot(record.key))].append(record)
        taken: dict[tuple[object, ...], int] = defaultdict(int)
        golden_named = 0
        for record in golden.records:
            match = golden_pattern.match(record.key.name)
            if not match:
                continue
            golden_named += 1
            slot = (match.groups(), *_slot(record.key))
            options = candidates.get(slot)
            if options and taken[slot] < len(options):
                pairs.append(Pair(record, options[taken[slot]], RULE_USER, PairPriority.USER_MAPPING))
                taken[slot] += 1
        if not taken:
            idle.append(f"{golden_text!r} -> {my_text!r} ({_why_idle(golden_named, bool(candidates))})")
    if idle:
        log.warning(
            "%s: %d of the %d name-pattern entries pair nothing: %s%s",
            mapping.path,
            len(idle),
            len(mapping.entries),
            "; ".join(idle[:ENTRIES_NAMED]),
            f"; and {len(idle) - ENTRIES_NAMED} more" if len(idle) > ENTRIES_NAMED else "",
        )
    return pairs


def _why_idle(golden_named: int, my_named: bool) -> str:
    """Return why a mapping entry paired nothing, from what its two patterns matched."""
    if not golden_named:
        return "no golden record has a name like it" if my_named else "no record of either run has a name like it"
    if not my_named:
        return "no my record has a name like it"
    return "the records it names differ in what '*' matched, or in io, position, step or call"
