"""Pairing a multi-rank tensor-parallel run against a single-process golden run.

The run under suspicion holds one record per rank for each tensor (the ranks' dumps read
as one run, each record keyed by its rank); the golden holds the whole tensor once. For
each golden record whose key several ranks hold, the ranks' records are gathered by their
layout (:mod:`.shard_layout`), inferred from shapes and statistics or stated by the user:

* ``concat`` -- the golden whole pairs with the shards joined along the split dimension
  (rule ``tp_unshard(dim=-1, ranks=0..3)``), and each rank's shard pairs with its part of
  the golden (rule ``tp_shard(dim=-1, rank=1, ranks=0..3)``), so a defect in one rank's
  shard is named with its rank;
* ``sum`` -- the golden whole pairs with the sum of the ranks' partial sums
  (``tp_unshard(sum, ranks=0..3)``); a partial sum alone has no golden counterpart;
* ``replicated`` -- the golden pairs with every rank's copy (``tp_replicated(rank=R, ...)``).

All at priority 50, above the exact-key rule, which would pair the golden with rank 0's
shard alone. The user's ``--mapping`` file states a layout per golden name pattern::

    [{"golden": "*.mlp.down_proj.local:output.*", "rule": "tp_unshard(sum)"},
     {"golden": "*.attn.core", "rule": "tp_unshard(dim=-1, ranks=0..1)"}]

A pattern is matched against the golden record's name, or, when it holds a colon, against
``name:io.position`` (a module's input and output are often laid out differently). The
first matching pattern wins; a stated layout that cannot rebuild the golden shape is a
usage error naming the mapping file.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from fnmatch import fnmatchcase

from llmcheck.plugin_api import (
    ALL_RANKS,
    Dump,
    Pair,
    PairPriority,
    TensorRecord,
    TensorStats,
    UsageError,
    UserMapping,
)
from llmcheck.plugins.tensor_parallel.shard_gather import gathered_data, part_data
from llmcheck.plugins.tensor_parallel.shard_layout import (
    CONCAT,
    REPLICATED,
    RULE_PREFIX,
    SUM,
    RuleError,
    ShardLayout,
    fits,
    infer_layout,
    parse_rule,
)

_Slot = tuple[str, str, str, int, int, str]


def _slot(record: TensorRecord) -> _Slot:
    key = record.key
    return key.name, key.io, key.position, key.step, key.call_index, key.moment


def tensor_parallel_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair] | None:
    """Return the gathered and per-rank pairs of a multi-rank run against a single-process golden, or None."""
    if len(golden.ranks) != 1 or len(my.ranks) < 2:
        return None
    stated = _stated_layouts(user_mapping)
    by_slot: dict[_Slot, list[TensorRecord]] = defaultdict(list)
    for record in my.records:
        by_slot[_slot(record)].append(record)
    pairs: list[Pair] = []
    for record in golden.records:
        holders = sorted(by_slot.get(_slot(record), []), key=lambda shard: shard.key.rank)
        layout = _layout(record, holders, stated, user_mapping)
        if layout is None:
            continue
        shards = [shard for shard in holders if layout.ranks is None or shard.key.rank in layout.ranks]
        if len(shards) < 2:
            continue
        layout = replace(layout, ranks=tuple(shard.key.rank for shard in shards))
        pairs.extend(_pairs(record, shards, layout))
    return pairs


def _stated_layouts(user_mapping: UserMapping | None) -> list[tuple[str, str]]:
    if user_mapping is None:
        return []
    return [(pattern, rule) for pattern, rule in user_mapping.rules if rule.strip().startswith(RULE_PREFIX)]


def _layout(
    record: TensorRecord,
    holders: Sequence[TensorRecord],
    stated: list[tuple[str, str]],
    user_mapping: UserMapping | None,
) -> ShardLayout | None:
    if len(holders) < 2:
        return None
    for pattern, rule in stated:
        if not fnmatchcase(_matched_text(record, pattern), pattern):
            continue
        where = user_mapping.path if user_mapping is not None else None
        try:
            layout = parse_rule(rule)
        except RuleError as exc:
            raise UsageError(str(exc), where=where) from exc
        chosen = [shard for shard in holders if layout.ranks is None or shard.key.rank in layout.ranks]
        if not fits(layout, record, chosen):
            raise UsageError(
                f"rule {rule!r} for {pattern!r} cannot rebuild {record.key.label()} "
                f"{list(record.shape)} from shards {[list(shard.shape) for shard in chosen]}",
                where=where,
                hint="fix the rule's dim, or its ranks",
            )
        return layout
    return infer_layout(record, holders)


def _pairs(golden: TensorRecord, shards: list[TensorRecord], layout: ShardLayout) -> list[Pair]:
    if layout.kind == REPLICATED:
        return [
            Pair(
                golden if shard.key.rank == shards[0].key.rank else _for_rank(golden, shard.key.rank),
                shard,
                layout.shard_rule(shard.key.rank),
                PairPriority.SOURCE_RULE,
            )
            for shard in shards
        ]
    pairs = []
    if layout.kind == CONCAT:
        pairs.extend(_shard_pairs(golden, shards, layout))
    gathered = _gathered(golden, shards, layout)
    pairs.append(Pair(golden, gathered, layout.rule(), PairPriority.SOURCE_RULE))
    if layout.kind == SUM:  # a partial sum has no golden counterpart of its own: say where it went
        pairs.extend(
            Pair(
                None,
                shard,
                layout.rule(),
                PairPriority.SOURCE_RULE,
                note=f"a partial sum, compared summed as {gathered.key.label()}",
            )
            for shard in shards
        )
    return pairs


def _matched_text(record: TensorRecord, pattern: str) -> str:
    """Return what a rule's pattern is matched against: the name, or ``name:io.position`` for a pattern with a colon."""
    key = record.key
    return f"{key.name}:{key.io}.{key.position}" if ":" in pattern else key.name


def _for_rank(golden: TensorRecord, rank: int) -> TensorRecord:
    """Return the golden record as the counterpart of one rank (its own key, so pairs.json and labels say which)."""
    return golden.with_changes(key=replace(golden.key, rank=rank))


def _shard_pairs(golden: TensorRecord, shards: list[TensorRecord], layout: ShardLayout) -> list[Pair]:
    """Return each rank's shard paired with its part of the golden tensor (when the golden kept its data)."""
    if golden.data is None:
        return []
    assert layout.dim is not None
    axis = layout.dim % len(golden.shape)
    pairs, start = [], 0
    for shard in shards:
        length = shard.shape[axis]
        part = _for_rank(golden, shard.key.rank).with_changes(
            shape=tuple(shard.shape), stats=None, data=part_data(golden.data, axis, start, length, tuple(shard.shape))
        )
        pairs.append(Pair(part, shard, layout.shard_rule(shard.key.rank), PairPriority.SOURCE_RULE))
        start += length
    return pairs


def _gathered(golden: TensorRecord, shards: list[TensorRecord], layout: ShardLayout) -> TensorRecord:
    """Return the record the shards make together: data joined or summed lazily, statistics combined."""
    first = shards[0]
    data = None
    if all(shard.data is not None for shard in shards):
        data = gathered_data(
            [shard.data for shard in shards],  # type: ignore[misc]  # all not None, checked above
            first.dtype,
            tuple(golden.shape),
            layout.dim if layout.kind == CONCAT else None,
        )
    return first.with_changes(
        key=replace(first.key, rank=ALL_RANKS),
        rank=ALL_RANKS,
        shape=tuple(golden.shape),
        data=data,
        order=max(shard.order for shard in shards),
        stats=_combined_stats(shards, layout.kind),
        digest=None,
        source_path=f"{first.source_path} (+{len(shards) - 1} ranks)",
        attrs={**first.attrs, "gathered_from": [shard.key.label() for shard in shards]},
    )


def _combined_stats(shards: list[TensorRecord], kind: str) -> TensorStats | None:
    """Return the statistics of the gathered tensor that follow from the shards' own (a sum keeps only its mean)."""
    stats = [shard.stats for shard in shards]
    if any(part is None for part in stats):
        return None
    if kind == SUM:
        means = [part.mean for part in stats]  # type: ignore[union-attr]
        return TensorStats(mean=sum(means)) if None not in means else None
    counts = [shard.numel for shard in shards]
    fields = {name: [getattr(part, name) for part in stats] for name in ("min", "max", "mean", "l2norm")}
    if any(None in values for values in fields.values()):
        return None
    return TensorStats(
        min=min(fields["min"]),
        max=max(fields["max"]),
        mean=sum(m * n for m, n in zip(fields["mean"], counts)) / max(sum(counts), 1),
        l2norm=sum(norm * norm for norm in fields["l2norm"]) ** 0.5,
    )
