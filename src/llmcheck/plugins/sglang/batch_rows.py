"""Which request each row of an engine step holds, from the bookkeeping SGLang and Megatron dump beside the tensors.

SGLang runs a step as one flattened ``[tokens, hidden]`` batch and dumps its
``ForwardBatch`` fields: ``positions`` (each row's position in its request) and ``seq_lens``
(each request's length once this step's tokens are in), and ``rids`` (request ids) when it
has them. Request ``i`` starts at the row after request ``i - 1`` ends, at the position its
cached prefix ends, so it holds ``seq_lens[i] - positions[first row]`` rows: a prefill chunk
or one decode token alike. Rows past the last request (padding) belong to none.

Megatron (packed ``thd`` sequences) dumps ``cu_seqlens_q``, the query start offsets
themselves, and ``position_ids``; a row's position defaults to its place in its sequence.

Requests without ids are called ``"0"``, ``"1"``, ... in batch order.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

from llmcheck.plugin_api import BatchLayout, DumpFormatError

#: SGLang's ForwardBatch fields as the dumper names them.
SGLANG_POSITIONS = "positions"
SGLANG_SEQ_LENS = "seq_lens"
SGLANG_REQUEST_IDS = "rids"
#: Megatron's packed-sequence fields as the dumper names them.
MEGATRON_POSITIONS = "position_ids"
MEGATRON_QUERY_STARTS = "cu_seqlens_q"
#: The engines' batch bookkeeping the dumper writes under bare names: read into ``Dump.batches``
#: where it says which rows a request holds, never compared (each engine keeps its own).
BOOKKEEPING_FIELDS = frozenset(
    {SGLANG_POSITIONS, SGLANG_SEQ_LENS, SGLANG_REQUEST_IDS, "req_pool_indices"}
    | {MEGATRON_POSITIONS, MEGATRON_QUERY_STARTS, "cu_seqlens_kv", "qkv_format"}
)


def batch_layout(
    step: int, rank: int, fields: Mapping[str, Sequence[int] | Sequence[str]], where: Path
) -> BatchLayout | None:
    """Return a step's rows from its batch fields, or None when the step dumped none; ``where`` is named on error."""
    if MEGATRON_QUERY_STARTS in fields:
        return _packed_layout(step, rank, fields, where)
    if SGLANG_POSITIONS in fields and SGLANG_SEQ_LENS in fields:
        return _sglang_layout(step, rank, fields, where)
    return None


def _request_ids(fields: Mapping[str, Sequence[int] | Sequence[str]], count: int, where: Path) -> tuple[str, ...]:
    ids = fields.get(SGLANG_REQUEST_IDS)
    if ids is None:
        return tuple(str(index) for index in range(count))
    if len(ids) != count:
        raise DumpFormatError(f"{len(ids)} request ids for {count} requests", where=where, hint=_HINT)
    return tuple(str(request_id) for request_id in ids)


_HINT = "the batch fields of one step disagree: the dump was edited or mixes runs; dump the step again"


def _sglang_layout(
    step: int, rank: int, fields: Mapping[str, Sequence[int] | Sequence[str]], where: Path
) -> BatchLayout:
    positions = tuple(int(position) for position in fields[SGLANG_POSITIONS])
    seq_lens = [int(length) for length in fields[SGLANG_SEQ_LENS]]
    starts = [0]
    for index, seq_len in enumerate(seq_lens):
        first = starts[-1]
        rows = seq_len - positions[first] if first < len(positions) else 0
        if rows <= 0 or first + rows > len(positions):
            raise DumpFormatError(
                f"step {step}: request {index} (seq_len {seq_len}) does not fit the {len(positions)} positions "
                f"from row {first}",
                where=where,
                hint=_HINT,
            )
        starts.append(first + rows)
    return BatchLayout(step, _request_ids(fields, len(seq_lens), where), tuple(starts), positions, rank)


def _packed_layout(
    step: int, rank: int, fields: Mapping[str, Sequence[int] | Sequence[str]], where: Path
) -> BatchLayout:
    starts = tuple(int(offset) for offset in fields[MEGATRON_QUERY_STARTS])
    if not starts or starts[0] != 0 or list(starts) != sorted(starts):
        raise DumpFormatError(f"step {step}: cu_seqlens_q {list(starts)} do not rise from 0", where=where, hint=_HINT)
    if MEGATRON_POSITIONS in fields:
        positions = tuple(int(position) for position in fields[MEGATRON_POSITIONS])
    else:
        positions = tuple(row - start for start, end in itertools.pairwise(starts) for row in range(start, end))
    if starts[-1] > len(positions):
        raise DumpFormatError(
            f"step {step}: cu_seqlens_q reach row {starts[-1]} of {len(positions)} positions", where=where, hint=_HINT
        )
    return BatchLayout(step, _request_ids(fields, len(starts) - 1, where), starts, positions, rank)
