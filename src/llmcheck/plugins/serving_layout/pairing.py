"""Pairing a serving engine's flattened, fused dump with a per-request transformers dump.

For each record of the per-request run (the reference), :func:`~.engine_names.engine_source`
names the engine record that holds the same values; :mod:`.request_rows` finds the rows of
the chosen request that hold the reference step's token positions. The pair's engine side is
a record built here: those rows (from one engine step, or several when the prompt was
prefilled in chunks), the fused projection's columns of the part, reshaped to the
reference's shape -- read lazily, like any record. Logits are one row per request.

Every engine record read this way, and every record either side holds that the other
cannot (rotary tables, the engine's residual halves), is stated in ``pairs.json`` with why,
as expected; what is left unmatched is unexplained. Which side is the engine does not
matter: a vLLM golden pairs with a transformers run the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from llmcheck.plugin_api import (
    IO_OUTPUT,
    MOMENT_AFTER,
    MOMENT_BEFORE,
    PARAMETER_DIGESTS_ATTR,
    Dump,
    Pair,
    PairPriority,
    RecordKey,
    TensorData,
    TensorRecord,
    is_float_dtype,
)
from llmcheck.plugins.serving_layout.engine_names import (
    GATE_UP_PARTS,
    EngineSource,
    engine_only_reason,
    engine_source,
    reference_only_reason,
)
from llmcheck.plugins.serving_layout.request_rows import (
    RowSpan,
    choose_request,
    reference_positions,
    request_positions,
    spans_of,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

RULE = "serving_layout"
NO_ENGINE_COUNTERPART = "no engine record holds these values"
NO_REFERENCE_COUNTERPART = "no record of the per-request run holds these values"
_LAYER_INDEX = re.compile(r"(?:.*\.)?layers\.(\d+)(?:\.|$)")
_Slot = tuple[str, str, str, int, int, str]


def engine_rows(
    sources: Sequence[TensorData],
    spans: Sequence[tuple[int, int]],
    columns: tuple[int, int] | None,
    shape: tuple[int, ...],
    dtype: str | None,
) -> torch.Tensor:
    """Return rows of engine tensors (one per span), joined, a column range of them, in the reference's shape."""
    import torch

    parts = []
    for data, (start, stop) in zip(sources, spans):
        tensor = data.load()
        if tensor.dim() >= 3 and tensor.shape[0] == 1:  # a dumper that kept a batch dimension of one
            tensor = tensor[0]
        tensor = tensor[start:stop]
        if columns is not None:
            tensor = tensor[..., columns[0] : columns[1]]
        parts.append(tensor)
    joined = torch.cat(parts) if len(parts) > 1 else parts[0]
    joined = joined.reshape(shape)
    if dtype is not None:
        joined = joined.to(getattr(torch, dtype))
    return joined.contiguous()


def serving_pairs(golden: Dump, my: Dump) -> list[Pair] | None:
    """Return the pairs of an engine dump (with batch layouts) and a per-request dump, or ``None`` for other dumps."""
    if bool(golden.batches) == bool(my.batches):
        return None
    engine, reference = (my, golden) if my.batches else (golden, my)
    engine_is_my = engine is my
    ranks = sorted({rank for rank, _ in engine.batches})
    rank = ranks[0]
    request, how = choose_request(reference, engine, rank)
    if request is None:
        note = f"no engine request pairs with this run: {how}"
        return [_one_sided(record, not engine_is_my, note, expected=False) for record in reference.records[:1]]
    where = request_positions(engine, rank, request)
    by_slot: dict[_Slot, TensorRecord] = {_slot(record): record for record in engine.records if record.key.rank == rank}
    layer_count = 1 + max(
        (int(match.group(1)) for record in engine.records if (match := _LAYER_INDEX.match(record.key.name))),
        default=-1,
    )
    final_norm = next(
        (name for name in ("model.norm", "model.final_layernorm", "norm") if (name, "output", "1") in _names(by_slot)),
        "model.norm",
    )
    # SiluAndMul (act_fn gives down_proj's input) goes with the fused gate_up_proj; an engine running
    # transformers' modules (SGLang's hooks on an HF model) has act_fn = silu(gate)
    fused_mlp = any(name.endswith("mlp.gate_up_proj") for name, *_ in by_slot)
    positions = reference_positions(reference)
    rule = f"{RULE}(request {request}: {how})"
    pairs: list[Pair] = []
    read: dict[int, str] = {}
    for record in reference.records:
        key = record.key
        reason = reference_only_reason(key.name, key.io, key.position)
        if reason is not None and (fused_mlp or not key.name.endswith("mlp.act_fn")):
            pairs.append(_one_sided(record, not engine_is_my, reason, expected=True))
            continue
        source = engine_source(key.name, key.io, key.position, layer_count, final_norm) or EngineSource(
            key.name, key.io, key.position
        )
        if not fused_mlp and source.name.endswith("mlp.act_fn"):  # transformers' own MLP: act_fn is silu(gate)
            source = EngineSource(key.name, key.io, key.position)
        step_positions = positions.get(key.step)
        spans = spans_of(step_positions, where) if step_positions else None
        built = None
        if spans is not None:
            built = _engine_record(record, source, spans, by_slot, engine, rank, request)
            if built is None and source != EngineSource(key.name, key.io, key.position):
                # an engine that runs transformers' own modules (SGLang's hooks on an HF model) keeps their names
                built = _engine_record(
                    record, EngineSource(key.name, key.io, key.position), spans, by_slot, engine, rank, request
                )
        if built is None:  # claimed, so that no same-name rule pairs it with a batch of other rows
            why = "its positions never ran in the request" if spans is None else f"none at {source.name}"
            pairs.append(_one_sided(record, not engine_is_my, f"{NO_ENGINE_COUNTERPART}: {why}", expected=False))
            continue
        counterpart, used = built
        for part in used:
            read.setdefault(id(part), f"read as {request}'s rows for {key.label()}")
        pairs.append(
            Pair(counterpart, record, rule, PairPriority.SOURCE_RULE)
            if not engine_is_my
            else Pair(record, counterpart, rule, PairPriority.SOURCE_RULE)
        )
    read_bytes = {
        record.data.identity(): text
        for record in engine.records
        if record.data is not None and (text := read.get(id(record))) is not None
    }
    for record in engine.records:
        same_bytes = read_bytes.get(record.data.identity()) if record.data is not None else None
        because: str | None = (
            read.get(id(record))
            or (same_bytes and f"the same tensor as one {same_bytes.removeprefix('read as ')}")
            or engine_only_reason(record.key.name, record.key.io, record.key.position)
        )
        if because is not None:
            pairs.append(_one_sided(record, engine_is_my, because, expected=True))
        else:  # claimed, so that no same-name rule pairs a batch of rows with one request's
            pairs.append(_one_sided(record, engine_is_my, NO_REFERENCE_COUNTERPART, expected=False))
    return pairs


def _names(by_slot: dict[_Slot, TensorRecord]) -> set[tuple[str, str, str]]:
    return {(name, io, position) for name, io, position, *_ in by_slot}


def _slot(record: TensorRecord) -> _Slot:
    key = record.key
    return key.name, key.io, key.position, key.step, key.call_index, key.moment


def _one_sided(record: TensorRecord, is_my: bool, note: str, *, expected: bool) -> Pair:
    if is_my:
        return Pair(None, record, RULE, PairPriority.SOURCE_RULE, note=note, expected=expected)
    return Pair(record, None, RULE, PairPriority.SOURCE_RULE, note=note, expected=expected)


def _engine_record(
    reference: TensorRecord,
    source: EngineSource,
    spans: list[RowSpan],
    by_slot: dict[_Slot, TensorRecord],
    engine: Dump,
    rank: int,
    request: str,
) -> tuple[TensorRecord, list[TensorRecord]] | None:
    """Return the engine record holding ``reference``'s values, built from rows, and the engine records it reads."""
    key = reference.key
    if source.logits:
        last = spans[-1]
        layout = engine.batches[(rank, last.step)]
        index = layout.request_ids.index(request)
        if layout.query_start_loc[index + 1] != last.stop:
            return None  # the step did not sample this request's token at the reference's last position
        spans = [RowSpan(last.step, index, index + 1)]
        if reference.shape and len(reference.shape) >= 2 and reference.shape[-2] != 1:
            return None  # full-sequence logits: the engine computes only the sampled rows
    moment = key.moment if source.io == key.io else MOMENT_AFTER if source.io == IO_OUTPUT else MOMENT_BEFORE
    parts = [
        by_slot.get((source.name, source.io, source.position, span.step, key.call_index, moment)) for span in spans
    ]
    if any(part is None for part in parts):
        return None
    found: list[TensorRecord] = parts  # type: ignore[assignment]  # no None, checked above
    first = found[0]
    if not first.shape:
        return None
    columns = _columns(source.part, first.shape[-1], reference.shape[-1] if reference.shape else 0)
    if source.part is not None and columns is None:
        return None
    rows = sum(span.stop - span.start for span in spans)
    width = (columns[1] - columns[0]) if columns is not None else _row_width(first.shape)
    if rows * width != _numel(reference.shape):
        return None
    whole = len(found) == 1 and spans[0].start == 0 and spans[0].stop == _rows(first.shape) and columns is None
    dtype = first.dtype
    cast = None
    if not is_float_dtype(dtype) and not is_float_dtype(reference.dtype) and dtype != reference.dtype:
        cast, dtype = reference.dtype, reference.dtype
    if any(part.data is None for part in found):
        if not whole:
            return None  # statistics only: rows of one request cannot be cut out of a batch's statistics
        return first.with_changes(shape=tuple(reference.shape)), found
    data = TensorData(
        dtype=dtype,
        shape=tuple(reference.shape),
        loader=partial(
            engine_rows,
            tuple(part.data for part in found),  # type: ignore[misc]  # all hold data, checked above
            tuple((span.start, span.stop) for span in spans),
            columns,
            tuple(reference.shape),
            cast,
        ),
    )
    attrs = dict(first.attrs)
    digests = attrs.get(PARAMETER_DIGESTS_ATTR)
    if source.part is not None and isinstance(digests, dict):
        parts_digests = _part_digests(digests, source.part)
        if parts_digests:
            attrs[PARAMETER_DIGESTS_ATTR] = parts_digests
        else:  # the whole fused weight's digest says nothing of one part's
            del attrs[PARAMETER_DIGESTS_ATTR]
    rows_text = ", ".join(f"step {span.step} rows {span.start}-{span.stop - 1}" for span in spans)
    cut = f"{rows_text}" + (f", columns {columns[0]}-{columns[1] - 1} ({source.part})" if columns else "")
    built = first.with_changes(
        key=RecordKey(source.name, source.io, source.position, spans[0].step, key.call_index, moment, rank),
        dtype=dtype,
        shape=tuple(reference.shape),
        stats=None,
        data=data,
        digest=None,
        attrs={**attrs, "engine_rows": cut},
        source_path=f"{first.source_path} ({cut})",
    )
    return built, found


def _columns(part: str | None, total: int, width: int) -> tuple[int, int] | None:
    """Return the columns of a fused projection's output that hold ``part`` (``width`` of them), or ``None``."""
    if part is None:
        return None
    if part == "q":
        return (0, width) if total > width else None
    if part in ("k", "v"):  # q first, then k and v of equal width
        start = total - 2 * width if part == "k" else total - width
        return (start, start + width) if start > 0 else None
    if part in GATE_UP_PARTS:
        if total != 2 * width:
            return None
        return (0, width) if part == "gate" else (width, total)
    return None


def _part_digests(digests: dict[str, object], part: str) -> dict[str, object]:
    """Return the digests a fused module's capture recorded for one part of its weight, under the plain names.

    The vLLM capture digests each part of a fused projection's weight (``weight[q]``) beside the
    whole, so an honest ``qkv_proj`` matches transformers' ``q_proj`` digest for digest.
    """
    suffix = f"[{part}]"
    return {name.removesuffix(suffix): value for name, value in digests.items() if name.endswith(suffix)}


def _rows(shape: tuple[int, ...]) -> int:
    """Return the rows of an engine tensor: its first dimension, the second behind a batch dimension of one."""
    return shape[1] if len(shape) >= 3 and shape[0] == 1 else shape[0]


def _row_width(shape: tuple[int, ...]) -> int:
    width = 1
    for size in shape[2 if len(shape) >= 3 and shape[0] == 1 else 1 :]:
        width *= size
    return width


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
