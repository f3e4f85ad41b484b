"""Pairing: merge every plugin's proposed pairs by priority, and read and write the user's mapping files.

Plugins propose pairs through the *map pairs* hook, each with a rule and a priority (user
mapping 100, source-specific rules 50, exact key 20, sequence alignment 0). A pair is kept
when it has the highest priority among the proposals of *both* its records; equal-priority
proposals are all kept (a rule may pair one golden tensor with several of mine). A
one-sided proposal (``Pair(None, record, note=...)``) claims its record at its priority:
lower-priority pairs of that record are dropped. Records left in no pair are reported
unmatched, with the note a plugin gave for them; a one-sided proposal with ``expected=True``
declares its record legitimately unmatched (counted apart: it does not fail a compare).

``pairs.json`` lists every kept pair with its rule and the unmatched records of each side.
A user may edit it and give it back with ``--mapping``: each pair in it becomes an exact
user pair (priority 100). A mapping file may instead hold name patterns, JSON or YAML::

    {"model.layers.*.mlp": "decoder.blocks.*.ffn"}          # golden pattern -> my pattern
    [{"golden": "lm_head", "my": "output_layer"}]            # the same as a list
    [{"golden": "*.down_proj", "rule": "tp_unshard(sum)"}]   # a rule for a pairing plugin

A rule entry states how records whose golden name matches are to be paired; the pairing
plugin whose rule it names reads it from :attr:`UserMapping.rules` (the tensor-parallel
rules, ``docs/commands/compare.md``).

``*`` matches any run of characters; records pair when the parts matched by the ``*`` agree
and their io, position, step and call index agree. The seed tool's ``-mf FOLDER`` (a folder
holding ``op_mapping_file.json``, ``{op type: [op types]}``) is read the same way, one entry
per listed value.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from llmcheck.core.dumps.atomic_files import atomic_output
from llmcheck.core.errors import PluginError, UsageError, closest_name
from llmcheck.core.pairing.pair_table import PairTable, pair_side
from llmcheck.core.records import Dump, Pair, RecordKey, TensorRecord, UserMapping

PAIRS_FORMAT = "llmcheck-pairs"
PAIRS_FORMAT_VERSION = 1
NO_COUNTERPART = "no pairing rule found a counterpart"
#: The file the seed tool's ``-mf`` folder holds.
SEED_MAPPING_NAME = "op_mapping_file.json"


@dataclass(frozen=True)
class Unmatched:
    """A record no kept pair holds, and why (a plugin's note, or that no rule found a counterpart)."""

    record: TensorRecord
    note: str = NO_COUNTERPART
    expected: bool = False  # a pairing rule declared it has no counterpart by nature


@dataclass
class Pairing:
    """The kept pairs in golden execution order, and the unmatched records of each side.

    ``pairs`` is a :class:`~llmcheck.core.pairing.pair_table.PairTable` as :func:`merge_pairs`
    returns it: 20 bytes a pair, where a list of pair objects is 88.
    """

    pairs: Sequence[Pair]
    unmatched_golden: list[Unmatched] = field(default_factory=list)
    unmatched_my: list[Unmatched] = field(default_factory=list)

    @property
    def unexpected_golden(self) -> list[Unmatched]:
        """Return the unmatched golden records no rule declared legitimate: data the compare could not check."""
        return [item for item in self.unmatched_golden if not item.expected]


def _refuse_copies(dump: Dump, side: str, proposals: Sequence[Pair]) -> None:
    """Raise when a proposal holds an equal copy of a loaded record instead of the record itself.

    Proposals are matched to records by identity, so a copy would leave its record both
    paired (under the copy) and unmatched. A record the dump does not hold and no loaded
    record equals (shards gathered into one tensor) is a derived record, which is allowed.
    """
    loaded = loaded_records(dump)
    side_of = _GOLDEN if side == "golden" else _MY
    by_key: dict[RecordKey, TensorRecord] | None = None
    for pair in proposals:
        record = side_of(pair)
        if record is None or loaded(record):
            continue
        by_key = dump.by_key() if by_key is None else by_key
        if by_key.get(record.key) == record:
            raise PluginError(
                f"the pairing rule {pair.rule!r} proposed a copy of the {side} record "
                f"{record.key.label()} instead of the loaded record",
                where=dump.root,
                hint="a llmcheck_map_pairs implementation must put the very record objects of "
                "the dumps it was given into its pairs, not copies",
            )


def loaded_records(dump: Dump) -> Callable[[TensorRecord], bool]:
    """Return a test of whether a record is one of ``dump``'s very record objects (not an equal copy).

    Why not a set of the records' ids: that is 100 bytes a record, held while pairs.json is
    written -- the compare's peak. A dump's records are in execution order, and ``order``
    counts them from the first one's in llmcheck's own dumps and most sources, so a record
    is found at its place by that count and checked by identity; a dump whose orders are not
    such a count (and a record not found so) falls back to the set, made the first time.
    """
    records = dump.records
    count = len(records)
    first = records[0].order if count and type(records[0].order) is int else 0
    ids: set[int] | None = None

    def loaded(record: TensorRecord) -> bool:
        nonlocal ids
        order = record.order
        if type(order) is int and 0 <= order - first < count and records[order - first] is record:
            return True
        if ids is None:
            ids = set(map(id, records))
        return id(record) in ids

    return loaded


_GOLDEN = attrgetter("golden")
_MY = attrgetter("my")
_NONE_ID = id(None)


def merge_pairs(golden: Dump, my: Dump, proposals: Sequence[Pair]) -> Pairing:
    """Return the pairs kept from every plugin's proposals, and what stayed unmatched.

    Raises :class:`~llmcheck.core.errors.PluginError` when a proposal holds a copy of a
    loaded record rather than the record itself (records are matched by identity).
    """
    if _whole_dumps_in_order(golden, my, proposals):
        return Pairing(pairs=cast(PairTable, proposals), unmatched_golden=[], unmatched_my=[])
    _refuse_copies(golden, "golden", proposals)
    _refuse_copies(my, "my", proposals)
    # the ids as C integers, 8 bytes each, where a set of them holds 60: pairing is a compare's peak
    golden_ids, my_ids = _ids(map(_GOLDEN, proposals)), _ids(map(_MY, proposals))
    if (
        len(np.unique(golden_ids)) == len(np.unique(my_ids)) == len(proposals)
        and not (golden_ids == _NONE_ID).any()
        and not (my_ids == _NONE_ID).any()
    ):
        # Every proposal pairs two records no other proposal names (two runs captured alike,
        # paired by exact key): each is its records' best, so all are kept, with no note.
        return _pairing(golden, my, list(proposals), golden_ids, my_ids, {}, set())
    del golden_ids, my_ids
    best_golden: dict[int, int] = {}
    best_my: dict[int, int] = {}
    notes: dict[int, str] = {}
    expected: set[int] = set()  # ids of records a rule declared legitimately unmatched
    for pair in proposals:
        # A one-sided proposal is a claim too: a rule that states "this record has no
        # counterpart" at priority 50 keeps a priority-0 sequence alignment from pairing it.
        if pair.golden is not None:
            best_golden[id(pair.golden)] = max(best_golden.get(id(pair.golden), pair.priority), pair.priority)
        if pair.my is not None:
            best_my[id(pair.my)] = max(best_my.get(id(pair.my), pair.priority), pair.priority)
        if pair.note and (pair.golden is None) != (pair.my is None):
            lone = pair.golden if pair.golden is not None else pair.my
            notes.setdefault(id(lone), pair.note)
        if pair.expected and (pair.golden is None) != (pair.my is None):
            expected.add(id(pair.golden if pair.golden is not None else pair.my))
    kept: list[Pair] = []
    seen: set[tuple[int, int]] = set()
    for pair in proposals:
        if pair.golden is None or pair.my is None:
            continue
        identity = (id(pair.golden), id(pair.my))
        if identity in seen:
            continue
        if pair.priority == best_golden[identity[0]] and pair.priority == best_my[identity[1]]:
            kept.append(pair)
            seen.add(identity)
    paired_golden = np.fromiter((golden_id for golden_id, _ in seen), dtype=np.uint64, count=len(seen))
    paired_my = np.fromiter((my_id for _, my_id in seen), dtype=np.uint64, count=len(seen))
    return _pairing(golden, my, kept, paired_golden, paired_my, notes, expected)


def _whole_dumps_in_order(golden: Dump, my: Dump, proposals: Sequence[Pair]) -> bool:
    """Return whether ``proposals`` are the only ones and pair both dumps' very record lists in golden execution order.

    Then every proposal pairs two records no other names, nothing is left unmatched, and
    the kept pairs' order (golden ``order``, then my ``order``) is theirs: they are kept as
    they are, with none of the merge's lookups (:func:`~llmcheck.core.pairing.pair_table.pairs_in_order`).
    """
    if not (
        isinstance(proposals, PairTable)
        and proposals.side("golden") is golden.records
        and proposals.side("my") is my.records
    ):
        return False
    previous = None
    for record in golden.records:  # read one at a time: a list of ten million orders is 400 MB
        order = record.order
        if type(order) is not int or (previous is not None and order <= previous):
            return False
        previous = order
    return True


def _ids(objects: Iterable[Any]) -> np.ndarray:
    """Return the ids of ``objects`` as an array of C integers."""
    return np.fromiter(map(id, objects), dtype=np.uint64)


def _unpaired(records: Sequence[TensorRecord], paired: np.ndarray) -> list[TensorRecord]:
    """Return the records whose ids ``paired`` lacks, in their order."""
    if not len(records):
        return []
    held = np.isin(_ids(records), paired)
    return [record for record, is_paired in zip(records, held.tolist()) if not is_paired]


def _pairing(
    golden: Dump,
    my: Dump,
    kept: list[Pair],
    paired_golden: np.ndarray,
    paired_my: np.ndarray,
    notes: dict[int, str],
    expected: set[int],
) -> Pairing:
    """Return the kept pairs in golden execution order and each side's records no kept pair holds (by ``id``)."""
    kept.sort(key=lambda pair: (pair.golden.order, pair.my.order))  # type: ignore[union-attr]
    return Pairing(
        pairs=PairTable(kept),
        unmatched_golden=[
            Unmatched(r, notes.get(id(r), NO_COUNTERPART), id(r) in expected)
            for r in _unpaired(golden.records, paired_golden)
        ],
        unmatched_my=[
            Unmatched(r, notes.get(id(r), NO_COUNTERPART), id(r) in expected) for r in _unpaired(my.records, paired_my)
        ],
    )


# --- record keys as JSON ------------------------------------------------------------------


def key_to_json(key: RecordKey) -> dict[str, Any]:
    """Return a record key as the JSON object pairs.json uses."""
    document = {
        "name": key.name,
        "io": key.io,
        "position": key.position,
        "step": key.step,
        "call_index": key.call_index,
        "moment": key.moment,
    }
    if key.rank:  # only multi-rank runs name a rank: single-process pairs.json files stay as they were
        document["rank"] = key.rank
    return document


def key_from_json(value: Any, where: Path, what: str) -> RecordKey:
    """Return the record key of a pairs.json object (``name`` required, the rest defaulted)."""
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        raise UsageError(f"{what} needs an object with a 'name'", where=where)
    try:
        return RecordKey(
            name=value["name"],
            io=str(value.get("io", "output")),
            position=str(value.get("position", "0")),
            step=int(value.get("step", 0)),
            call_index=int(value.get("call_index", 0)),
            moment=str(value.get("moment", "after")),
            rank=int(value.get("rank", 0)),
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what}: step, call_index and rank must be integers", where=where) from exc


#: What ``json.dumps`` writes for a text -- quoted, non-ASCII characters escaped -- by the C encoder it uses.
_json_text = json.encoder.encode_basestring_ascii
#: The field types of a :class:`RecordKey` written without ``json.dumps`` (any other goes through it).
_PLAIN_KEY_TYPES = (str, str, str, int, int, str, int)


def key_json_text(key: RecordKey) -> str:
    """Return ``json.dumps(key_to_json(key))``, written directly for a key of plain str and int fields.

    pairs.json holds two keys per pair and one per unmatched record, ~10**5 of them in a
    decode dump: a format string is several times cheaper than a ``json.dumps`` call each.
    """
    name, io, position, step, call_index, moment, rank = (
        key.name,
        key.io,
        key.position,
        key.step,
        key.call_index,
        key.moment,
        key.rank,
    )
    if (type(name), type(io), type(position), type(step), type(call_index), type(moment), type(rank)) != (
        _PLAIN_KEY_TYPES
    ):
        return json.dumps(key_to_json(key))
    text = (
        f'{{"name": {_json_text(name)}, "io": {_json_text(io)}, "position": {_json_text(position)}, '
        f'"step": {step}, "call_index": {call_index}, "moment": {_json_text(moment)}'
    )
    return f'{text}, "rank": {rank}}}' if rank else text + "}"


def _pair_json_text(pair: Pair, derived: int) -> str:
    """Return ``json.dumps`` of one pairs.json pair entry (``derived``: nonzero for a built side), written directly when its rule, note and priority are plain."""
    rule, note, priority = pair.rule, pair.note, pair.priority
    if type(rule) is not str or type(note) is not str or not isinstance(priority, int) or isinstance(priority, bool):
        entry = {
            "golden": key_to_json(pair.golden.key),  # type: ignore[union-attr]
            "my": key_to_json(pair.my.key),  # type: ignore[union-attr]
            "rule": rule,
            "priority": priority,
            **({"note": note} if note else {}),
            **({"derived": True} if derived else {}),
        }
        return json.dumps(entry)
    text = (
        f'{{"golden": {key_json_text(pair.golden.key)}, "my": {key_json_text(pair.my.key)}, '  # type: ignore[union-attr]
        f'"rule": {_json_text(rule)}, "priority": {int.__repr__(priority)}'  # an IntEnum prints as its number
    )
    if note:
        text += f', "note": {_json_text(note)}'
    return text + (', "derived": true}' if derived else "}")


def _unmatched_json_text(item: Unmatched) -> str:
    """Return ``json.dumps`` of one unmatched record's entry."""
    key_text = key_json_text(item.record.key)
    if type(item.note) is not str:
        return json.dumps(_unmatched_json(item))
    expected = ', "expected": true}' if item.expected else "}"
    return f'{key_text[:-1]}, "note": {_json_text(item.note)}{expected}'


def write_pairs_json(path: Path, pairing: Pairing, golden: Dump, my: Dump) -> None:
    """Write pairs.json: every kept pair with its rule, then the unmatched records of each side.

    A pair with a side a plugin built rather than read (shards gathered into one tensor, the
    part of a golden tensor one rank holds) is marked ``"derived": true``: fed back with
    ``--mapping`` it is left to the rule that built it, since its keys alone name another pair.
    """
    derived = bytearray(len(pairing.pairs))  # a byte a pair, not a list's 8
    for dump, side in ((golden, "golden"), (my, "my")):
        loaded = loaded_records(dump)
        for number, record in enumerate(pair_side(pairing.pairs, side)):
            if record is None or not loaded(record):
                derived[number] = True
    document = {
        "format": PAIRS_FORMAT,
        "format_version": PAIRS_FORMAT_VERSION,
        "golden_root": str(golden.root),
        "my_root": str(my.root),
        "how_to_edit": "fix or add pairs, then rerun: llmcheck compare ... --mapping pairs.json",
    }
    entries: dict[str, Iterator[str]] = {
        "pairs": map(_pair_json_text, pairing.pairs, derived),
        "unmatched_golden": map(_unmatched_json_text, pairing.unmatched_golden),
        "unmatched_my": map(_unmatched_json_text, pairing.unmatched_my),
    }
    with atomic_output(path, "w", encoding="utf-8", newline="") as handle:
        _write_one_entry_per_line(handle, document, entries)


def _unmatched_json(item: Unmatched) -> dict[str, Any]:
    return {**key_to_json(item.record.key), "note": item.note, **({"expected": True} if item.expected else {})}


#: Entries of pairs.json joined and written together: the text of 10**5 pairs is never held whole.
_ENTRIES_PER_WRITE = 2048


def _write_one_entry_per_line(handle: IO[str], document: Mapping[str, Any], lists: Mapping[str, Iterator[str]]) -> None:
    """Write a JSON object, ``document``'s fields and then ``lists`` of JSON texts, each list entry on a line of its own.

    One entry per line is easy to edit and to diff; ``indent`` would send 10**5 pairs through
    the pure-Python encoder. The entries are written a block at a time, so a decode dump's
    pairs (15 MB of text) are not held as one string -- nor as one list, one joined text and
    one whole document, 50 MB at once.
    """
    handle.write("{\n" + ",\n".join(f" {json.dumps(key)}: {json.dumps(value)}" for key, value in document.items()))
    for key, entries in lists.items():
        block = list(itertools.islice(entries, _ENTRIES_PER_WRITE))
        if not block:
            handle.write(f",\n {json.dumps(key)}: []")
            continue
        handle.write(f",\n {json.dumps(key)}: [\n  ")
        separator = ""
        while block:
            handle.write(separator + ",\n  ".join(block))
            separator = ",\n  "
            block = list(itertools.islice(entries, _ENTRIES_PER_WRITE))
        handle.write("\n ]")
    handle.write("\n}\n")


# --- the user's mapping file ----------------------------------------------------------------


def load_user_mapping(path: Path, known_rules: Collection[str]) -> UserMapping:
    """Return the ``--mapping`` file as name-pattern entries, or as exact key pairs for an edited pairs.json.

    ``known_rules`` are the rule names the loaded plugins read (``Plugins.mapping_rules()``): a
    rule entry naming another is refused, since a typo would pair nothing.
    """
    from llmcheck.core.dumps.structured_file import read_structured_file

    path = Path(path)
    if path.is_dir():  # the seed tool's -mf took a folder holding op_mapping_file.json
        path = path / SEED_MAPPING_NAME
    content = read_structured_file(path)
    rules: list[tuple[str, str]] = []
    rule_positions: list[int] = []
    if isinstance(content, Mapping) and content.get("format") == PAIRS_FORMAT:
        pairs = content.get("pairs")
        if not isinstance(pairs, list):
            raise UsageError("pairs.json has no 'pairs' list", where=path)
        key_pairs = []
        for position, pair in enumerate(pairs, start=1):
            if not isinstance(pair, Mapping):
                raise UsageError(f"pair {position} is not an object", where=path)
            if pair.get("derived"):  # built by a plugin's rule (gathered shards): that rule builds it again
                continue
            key_pairs.append(
                (
                    key_from_json(pair.get("golden"), path, f"pair {position} golden"),
                    key_from_json(pair.get("my"), path, f"pair {position} my"),
                )
            )
        return UserMapping(path=path, entries=(), key_pairs=tuple(key_pairs))
    if isinstance(content, Mapping):  # a list value (the seed's {op type: [op types]}) maps to each
        items = [
            (golden, my) for golden, value in content.items() for my in (value if isinstance(value, list) else [value])
        ]
    elif isinstance(content, list):
        items = []
        for position, entry in enumerate(content, start=1):
            if isinstance(entry, Mapping) and "rule" in entry and "my" not in entry:
                rules.append(_rule_entry(entry, position, path))
                rule_positions.append(position)
                continue
            if not isinstance(entry, Mapping) or "golden" not in entry or "my" not in entry:
                raise UsageError(
                    f"entry {position} needs 'golden' and 'my' name patterns (or 'golden' and a 'rule')", where=path
                )
            items.append((entry["golden"], entry["my"]))
    else:
        raise UsageError("a mapping file holds {golden pattern: my pattern} or a list of {golden, my}", where=path)
    for golden_pattern, my_pattern in items:
        if (
            not isinstance(golden_pattern, str)
            or not isinstance(my_pattern, str)
            or not golden_pattern
            or not my_pattern
        ):
            raise UsageError(
                f"mapping {golden_pattern!r} -> {my_pattern!r}: both sides must be non-empty names", where=path
            )
        if golden_pattern.count("*") != my_pattern.count("*"):
            raise UsageError(
                f"mapping {golden_pattern!r} -> {my_pattern!r}: both sides need the same number of '*'", where=path
            )
    _check_rules(list(zip(rule_positions, rules)), path, known_rules)
    return UserMapping(path=path, entries=tuple((str(g), str(m)) for g, m in items), rules=tuple(rules))


def _rule_entry(entry: Mapping[str, Any], position: int, path: Path) -> tuple[str, str]:
    """Return ``(golden name pattern, rule)`` of a ``{"golden": pattern, "rule": text}`` entry."""
    pattern, rule = entry.get("golden"), entry.get("rule")
    if not isinstance(pattern, str) or not pattern or not isinstance(rule, str) or not rule:
        raise UsageError(f"entry {position}: a rule entry needs a 'golden' name pattern and a 'rule' text", where=path)
    return pattern, rule


def rule_name(rule: str) -> str:
    """Return the name of a rule text: ``tp_unshard`` of ``tp_unshard(dim=-1, ranks=0..3)``."""
    return rule.split("(", 1)[0].strip()


def _check_rules(rules: Sequence[tuple[int, tuple[str, str]]], path: Path, known_rules: Collection[str]) -> None:
    """Raise a usage error naming the rule entries whose rule no plugin registers (a typo would pair nothing)."""
    if not rules:
        return
    known = list(known_rules)
    unknown = [(position, rule) for position, (_, rule) in rules if rule_name(rule) not in known]
    if not unknown:
        return
    problems = []
    for position, rule in unknown:
        close = closest_name(rule_name(rule), known)
        problems.append(f"entry {position}: unknown rule {rule!r}" + (f" (did you mean {close}?)" if close else ""))
    raise UsageError(
        "; ".join(problems),
        where=path,
        hint=f"known rules: {', '.join(known) or 'none, no loaded plugin reads rules'}; "
        'pair by name with {"golden": pattern, "my": pattern}',
    )
