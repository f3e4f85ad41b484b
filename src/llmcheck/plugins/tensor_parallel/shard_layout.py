"""How a tensor of a tensor-parallel run is spread over its ranks, inferred or stated, and written as a rule.

Three layouts cover Megatron-style tensor parallelism:

* ``concat`` -- each rank holds a slice along one dimension (column-parallel outputs split
  along the last dimension, attention heads split across ranks): ``tp_unshard(dim=-1)``;
* ``sum`` -- each rank holds a partial sum (a row-parallel output before its all-reduce):
  ``tp_unshard(sum)``;
* ``replicated`` -- each rank holds the whole tensor (inputs, norms, all-reduced outputs):
  ``tp_replicated``.

A rule may name the ranks it gathers (``ranks=0..3``, or ``ranks=0,2``); without them, every
rank holding the record takes part.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from llmcheck.plugin_api import TensorRecord

CONCAT = "concat"
SUM = "sum"
REPLICATED = "replicated"
RULE_PREFIX = "tp_"
#: Two copies of a replicated tensor hold L2 norms this close (relative); partial sums do not.
REPLICA_NORM_TOLERANCE = 0.05
_RULE = re.compile(r"\s*(tp_unshard|tp_replicated)\s*(?:\((.*)\))?\s*\Z")


class RuleError(ValueError):
    """A ``tp_*`` rule text that cannot be read."""


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """How one record is spread over ranks: ``kind``, the split ``dim`` (negative, from the end) for concat, and the ranks."""

    kind: str
    dim: int | None = None
    ranks: tuple[int, ...] | None = None

    def rule(self) -> str:
        """Return the rule text pairs.json shows for the gathered pair (``tp_unshard(dim=-1, ranks=0..3)``)."""
        ranks = [f"ranks={ranks_text(self.ranks)}"] if self.ranks else []
        if self.kind == REPLICATED:
            return f"tp_replicated({', '.join(ranks)})"
        what = f"dim={self.dim}" if self.kind == CONCAT else "sum"
        return f"tp_unshard({', '.join([what, *ranks])})"

    def shard_rule(self, rank: int) -> str:
        """Return the rule text of one rank's row (its shard against the golden's part, or its replica)."""
        ranks = ranks_text(self.ranks or ())
        if self.kind == REPLICATED:
            return f"tp_replicated(rank={rank}, ranks={ranks})"
        return f"tp_shard(dim={self.dim}, rank={rank}, ranks={ranks})"


def ranks_text(ranks: Sequence[int]) -> str:
    """Return ranks as a rule writes them: ``0..3`` for a run of consecutive ranks, else ``0,2``."""
    ranks = list(ranks)
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return ",".join(str(rank) for rank in ranks)


def _parse_ranks(text: str) -> tuple[int, ...]:
    try:
        if ".." in text:
            first, last = text.split("..", 1)
            ranks = tuple(range(int(first), int(last) + 1))
        else:
            ranks = tuple(int(part) for part in text.split(","))
    except ValueError as exc:
        raise RuleError(f"ranks={text!r}: write ranks=0..3 or ranks=0,2") from exc
    if not ranks:
        raise RuleError(f"ranks={text!r} names no rank")
    return ranks


def parse_rule(text: str) -> ShardLayout:
    """Return the layout a user's ``tp_unshard(...)`` / ``tp_replicated(...)`` rule states."""
    match = _RULE.match(text)
    if not match:
        raise RuleError(f"{text!r} is not tp_unshard(dim=D|sum[, ranks=A..B]) or tp_replicated([ranks=A..B])")
    name, arguments = match.group(1), match.group(2) or ""
    kind, dim, ranks = (REPLICATED if name == "tp_replicated" else None), None, None
    for argument in _arguments(arguments):
        if argument == SUM and name == "tp_unshard":
            kind = SUM
        elif argument.startswith("dim=") and name == "tp_unshard":
            try:
                dim = int(argument[4:])
            except ValueError as exc:
                raise RuleError(f"{text!r}: dim must be an integer") from exc
            kind = CONCAT
        elif argument.startswith("ranks="):
            ranks = _parse_ranks(argument[6:].strip())
        else:
            raise RuleError(f"{text!r}: unknown argument {argument!r}")
    if kind is None:
        raise RuleError(f"{text!r}: say dim=D (concatenate) or sum (partial sums)")
    return ShardLayout(kind, dim, ranks)


def _arguments(text: str) -> list[str]:
    """Split ``dim=-1, ranks=0,2`` into arguments, keeping a comma list of ranks (always last) whole."""
    head, found, ranks = text.partition("ranks=")
    parts = [part.strip() for part in head.split(",") if part.strip()]
    return [*parts, "ranks=" + ranks.strip()] if found else parts


def infer_layout(golden: TensorRecord, shards: Sequence[TensorRecord]) -> ShardLayout | None:
    """Return how ``shards`` (one record per rank, rank order) spread ``golden``'s tensor, or None when no layout fits."""
    golden_shape = tuple(golden.shape)
    shapes = [tuple(shard.shape) for shard in shards]
    ranks = tuple(shard.key.rank for shard in shards)
    if all(shape == golden_shape for shape in shapes):
        return ShardLayout(REPLICATED if _norms_agree(golden, shards) else SUM, None, ranks)
    if any(len(shape) != len(golden_shape) for shape in shapes):
        return None
    differing = {axis for shape in shapes for axis, size in enumerate(shape) if size != golden_shape[axis]}
    if len(differing) != 1:
        return None
    (axis,) = differing
    if sum(shape[axis] for shape in shapes) != golden_shape[axis]:
        return None
    return ShardLayout(CONCAT, axis - len(golden_shape), ranks)


def fits(layout: ShardLayout, golden: TensorRecord, shards: Sequence[TensorRecord]) -> bool:
    """Return whether a stated layout can rebuild ``golden``'s shape from ``shards``' shapes."""
    golden_shape = tuple(golden.shape)
    shapes = [tuple(shard.shape) for shard in shards]
    if layout.kind != CONCAT:
        return all(shape == golden_shape for shape in shapes)
    assert layout.dim is not None
    if not -len(golden_shape) <= layout.dim < len(golden_shape):
        return False
    axis = layout.dim % len(golden_shape)
    others_agree = all(
        len(shape) == len(golden_shape) and all(size == golden_shape[i] for i, size in enumerate(shape) if i != axis)
        for shape in shapes
    )
    return others_agree and sum(shape[axis] for shape in shapes) == golden_shape[axis]


def _norms_agree(golden: TensorRecord, shards: Sequence[TensorRecord]) -> bool:
    """Return whether at least half the ranks hold the golden's L2 norm (copies), rather than partial sums.

    A defect on one rank changes that rank's copy only, so a majority decides; without
    statistics the tensor is taken as replicated (state ``tp_unshard(sum)`` to say otherwise).
    """
    golden_norm = golden.stats.l2norm if golden.stats is not None else None
    norms = [shard.stats.l2norm if shard.stats is not None else None for shard in shards]
    known_norms = [norm for norm in norms if norm is not None]
    if golden_norm is None or len(known_norms) < len(norms):
        return True
    agreeing = sum(
        1 for norm in known_norms if abs(norm - golden_norm) <= REPLICA_NORM_TOLERANCE * abs(golden_norm) + 1e-12
    )
    return 2 * agreeing >= len(norms)
