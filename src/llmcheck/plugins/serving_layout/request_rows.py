"""One request's rows in a serving engine's steps, and the rows a per-request run's step covers.

An engine step runs a flattened batch: prefill chunks and decode tokens of several requests.
A run of one request (transformers ``generate``) has a step per forward: the prompt, then one
token each. Both are indexed here by token position: the engine's :class:`BatchLayout` gives
each of its rows a request and a position, and the per-request run's positions are its
``position_ids`` input where it recorded one, else its sequence lengths laid end to end.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from llmcheck.plugin_api import IO_INPUT, ROOT_MODULE, Dump, TensorRecord


@dataclass(frozen=True, slots=True)
class RowSpan:
    """Consecutive rows ``start`` to ``stop`` (exclusive) of one engine step."""

    step: int
    start: int
    stop: int


def request_positions(engine: Dump, rank: int, request_id: str) -> dict[int, tuple[int, int]]:
    """Return where each token position of a request ran: ``{position: (engine step, row)}``.

    A position run twice (a request preempted and recomputed) keeps its last run: the one
    whose keys and values the request's later tokens read.
    """
    where: dict[int, tuple[int, int]] = {}
    for (layout_rank, step), layout in sorted(engine.batches.items()):
        if layout_rank != rank:
            continue
        rows = layout.rows_of(request_id)
        if rows is None:
            continue
        for row in rows:
            where[layout.positions[row]] = (step, row)
    return where


def spans_of(positions: Sequence[int], where: dict[int, tuple[int, int]]) -> list[RowSpan] | None:
    """Return the engine rows holding ``positions`` in order, merged into spans; ``None`` if one never ran."""
    spans: list[RowSpan] = []
    for position in positions:
        found = where.get(position)
        if found is None:
            return None
        step, row = found
        if spans and spans[-1].step == step and spans[-1].stop == row:
            spans[-1] = RowSpan(step, spans[-1].start, row + 1)
        else:
            spans.append(RowSpan(step, row, row + 1))
    return spans


def reference_positions(reference: Dump) -> dict[int, list[int]]:
    """Return each step's token positions in a per-request run (a batch of one).

    Read from the step's ``position_ids`` input when the run recorded one (the root's, or the
    decoder stack's), else counted: a step's sequence length, after the lengths of the steps before.
    """
    lengths: dict[int, int] = {}
    recorded: dict[int, TensorRecord] = {}
    for record in reference.records:
        key = record.key
        if (
            key.io == IO_INPUT
            and key.position == "position_ids"
            and key.step not in recorded
            and record.data is not None
        ):
            recorded[key.step] = record
        if key.name.endswith("embed_tokens") and key.io != IO_INPUT and key.step not in lengths and record.shape:
            lengths[key.step] = record.shape[-2] if len(record.shape) >= 2 else record.shape[0]
    positions: dict[int, list[int]] = {}
    start = 0
    for step in sorted(set(lengths) | set(recorded)):
        if step in recorded:
            values = recorded[step].data.load().reshape(-1).tolist()  # type: ignore[union-attr]
            positions[step] = [int(value) for value in values]
        else:
            positions[step] = list(range(start, start + lengths[step]))
        start = positions[step][-1] + 1 if positions[step] else start
    return positions


def prompt_tokens(dump: Dump) -> list[int] | None:
    """Return the first step's token ids as the run's root recorded them (``input_ids``), or ``None``."""
    for record in dump.records:
        key = record.key
        if key.name == ROOT_MODULE and key.io == IO_INPUT and key.position == "input_ids" and record.data is not None:
            return [int(value) for value in record.data.load().reshape(-1).tolist()]
    return None


def choose_request(reference: Dump, engine: Dump, rank: int) -> tuple[str | None, str]:
    """Return the engine request the per-request run ran, and how it was chosen (for the pairs' rule text).

    The request whose prompt tokens (the engine's ``input_ids`` rows at positions 0, 1, ...)
    equal the reference's first step's; without recorded tokens, the only request, or the
    first one that ran the reference's first positions.
    """
    layouts = sorted((step, layout) for (layout_rank, step), layout in engine.batches.items() if layout_rank == rank)
    if not layouts:
        return None, "the engine dump has no batch layout"
    order: list[str] = list(dict.fromkeys(request for _, layout in layouts for request in layout.request_ids))
    wanted = prompt_tokens(reference)
    if wanted is not None:
        ids_by_step = {
            record.key.step: record
            for record in engine.records
            if record.key.rank == rank
            and record.key.name == ROOT_MODULE
            and record.key.io == IO_INPUT
            and record.key.position == "input_ids"
            and record.data is not None
        }
        prompts: dict[str, dict[int, int]] = defaultdict(dict)
        for step, layout in layouts:
            record = ids_by_step.get(step)
            if record is None:
                continue
            ids = record.data.load().reshape(-1).tolist()  # type: ignore[union-attr]
            for index, request in enumerate(layout.request_ids):
                for row in range(layout.query_start_loc[index], layout.query_start_loc[index + 1]):
                    if layout.positions[row] < len(wanted) and row < len(ids):
                        prompts[request].setdefault(layout.positions[row], int(ids[row]))
        for request in order:
            seen = prompts.get(request, {})
            if len(seen) == len(wanted) and all(seen[position] == token for position, token in enumerate(wanted)):
                return request, "the request whose prompt tokens are the golden's"
    if len(order) == 1:
        return order[0], "the only request"
    reference_steps = reference_positions(reference)
    first = reference_steps[min(reference_steps)] if reference_steps else []
    for request in order:
        where = request_positions(engine, rank, request)
        if first and spans_of(first, where) is not None:
            return request, "the first request that ran the golden's first positions"
    return None, f"none of the {len(order)} requests has the golden's prompt"
