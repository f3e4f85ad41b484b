"""ATB's SelfAttentionOperation (prefill, with or without its own KV cache) and PagedAttentionOperation (decode).

Every sequence of the batch is attended separately in float64: ``softmax(clamp(q k^T *
qkScale) + mask) v``, with ``q`` scaled by ``qScale`` first and grouped-query heads
(``kvHeadNum``) shared by ``headNum / kvHeadNum`` query heads. A mask holding only 0 and
1 marks masked positions with 1 (ATB's bf16 masks); any other mask is added as it is.
Variants the parameters name but these references do not compute (quantised attention,
compressed ALiBi and sliding-window masks, BNSD layout, MLA, speculative decoding, ...)
are reported unsupported rather than guessed.

Input layouts, in ATB's order:

* SelfAttention ``calcType`` PA_ENCODER (3): ``q, k, v, [mask], seqLen``.
* SelfAttention with its cache (``calcType`` 0-2, ``kvcacheCfg`` 0): ``q, k, v, cacheK,
  cacheV, [mask], tokenOffset, seqLen, layerId``; with ``kvcacheCfg`` 1 (bypass):
  ``q, cacheK, cacheV, [mask], tokenOffset, seqLen, layerId``.
* PagedAttention: ``query, keyCache, valueCache, blockTables, contextLens, [mask]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llmcheck.plugins.atb_ops.op_inputs import param, positional, require, wide

#: Added to a score a binary mask marks (large and finite, so a fully masked row stays defined).
MASKED_SCORE = -3e38
PA_ENCODER = 3
KV_BYPASS = 1
MASK_NONE, MASK_NORM, MASK_ALIBI, MASK_NORM_COMPRESS, MASK_CAUSAL = 0, 1, 2, 3, 9


def _heads(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Return a ``[tokens, hidden]`` or ``[tokens, heads, size]`` tensor as ``[tokens, heads, size]``."""
    if tensor.dim() >= 3 and tensor.shape[-2] == heads:
        return tensor.reshape(-1, heads, tensor.shape[-1])
    require(tensor.shape[-1] % heads == 0, f"hidden size {tensor.shape[-1]} does not split into {heads} heads")
    return tensor.reshape(-1, heads, tensor.shape[-1] // heads)


def _as_mask(mask: torch.Tensor) -> torch.Tensor:
    binary = bool(((mask == 0) | (mask == 1)).all())
    return mask * MASKED_SCORE if binary else mask


def _causal(queries: int, keys: int) -> torch.Tensor:
    offset = keys - queries
    rows = torch.arange(queries).unsqueeze(1)
    cols = torch.arange(keys).unsqueeze(0)
    return torch.where(cols > rows + offset, MASKED_SCORE, 0.0).to(torch.float64)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: Mapping[str, Any], mask: torch.Tensor | None
) -> torch.Tensor:
    """Return the attention of ``q [s_q, H, d]`` over ``k, v [s_kv, KH, d]`` as ``[s_q, H, d_v]``."""
    heads, kv_heads = q.shape[1], k.shape[1]
    require(heads % kv_heads == 0, f"{heads} query heads do not share {kv_heads} kv heads evenly")
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    q = q * float(param(params, "qScale", 1.0) or 1.0)
    scores = torch.einsum("qhd,khd->hqk", q, k) * float(param(params, "qkScale", 1.0))
    if int(param(params, "clampType", 0)) == 1:
        scores = scores.clamp(float(param(params, "clampMin", 0.0)), float(param(params, "clampMax", 0.0)))
    if mask is not None:
        scores = scores + mask
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def _check_variant(params: Mapping[str, Any]) -> int:
    for name, default in (
        ("quantType", 0),
        ("mlaVHeadSize", 0),
        ("inputLayout", 0),
        ("scaleType", 0),
        ("windowSize", 0),
        ("compressType", 0),
    ):
        require(int(param(params, name, default)) == default, f"{name}={params.get(name)} is not supported")
    require(not bool(param(params, "batchRunStatusEnable", False)), "batchRunStatusEnable is not supported")
    mask_type = int(param(params, "maskType", MASK_NONE))
    require(
        mask_type in (MASK_NONE, MASK_NORM, MASK_ALIBI, MASK_NORM_COMPRESS, MASK_CAUSAL),
        f"maskType {mask_type} is not supported",
    )
    return mask_type


def _mask_for(mask: torch.Tensor | None, mask_type: int, sequence: int, queries: int, keys: int) -> torch.Tensor | None:
    """Return the additive mask block of one sequence, ``[H or 1, queries, keys]``."""
    if mask_type == MASK_NONE:
        return None
    if mask_type in (MASK_NORM_COMPRESS, MASK_CAUSAL) or mask is None:
        return _causal(queries, keys).unsqueeze(0)
    mask = _as_mask(wide(mask))
    if mask.dim() == 4:  # [batch, heads, s, s]
        mask = mask[sequence if mask.shape[0] > 1 else 0]
    elif mask.dim() == 3 and mask_type != MASK_ALIBI:  # [batch, s, s]
        mask = mask[sequence if mask.shape[0] > 1 else 0].unsqueeze(0)
    elif mask.dim() == 2:
        mask = mask.unsqueeze(0)
    require(
        mask.shape[-2] >= queries and mask.shape[-1] >= keys,
        f"mask {list(mask.shape)} is smaller than {queries} queries x {keys} keys",
    )
    return mask[..., :queries, :keys]


def _lengths(tensor: torch.Tensor) -> list[int]:
    return [int(value) for value in tensor.reshape(-1).tolist()]


def self_attention(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the output of a SelfAttentionOperation, ``[tokens, headNum, headSize]``."""
    tensors = positional(inputs, at_least=4)
    mask_type = _check_variant(params)
    calc_type = int(param(params, "calcType", 0))
    require(calc_type in (0, 1, 2, PA_ENCODER), f"calcType {calc_type} is not supported")
    heads = int(param(params, "headNum", 0))
    require(heads > 0, "headNum is not set")
    kv_heads = int(param(params, "kvHeadNum", 0)) or heads
    has_mask = mask_type != MASK_NONE
    q = _heads(wide(tensors[0]), heads)
    outputs = []
    if calc_type == PA_ENCODER:
        k, v = _heads(wide(tensors[1]), kv_heads), _heads(wide(tensors[2]), kv_heads)
        mask = tensors[3] if has_mask else None
        lengths = _lengths(tensors[4 if has_mask else 3])
        start = 0
        for sequence, length in enumerate(lengths):
            block = slice(start, start + length)
            outputs.append(
                _attend(q[block], k[block], v[block], params, _mask_for(mask, mask_type, sequence, length, length))
            )
            start += length
        return [torch.cat(outputs)]
    bypass = int(param(params, "kvcacheCfg", 0)) == KV_BYPASS
    cache_at = 1 if bypass else 3
    cache_k, cache_v = wide(tensors[cache_at]), wide(tensors[cache_at + 1])
    rest = cache_at + 2 + (1 if has_mask else 0)
    require(len(tensors) >= rest + 3, f"expected {rest + 3} inputs for this calcType/kvcacheCfg, got {len(tensors)}")
    mask = tensors[cache_at + 2] if has_mask else None
    token_offsets, lengths = _lengths(tensors[rest]), _lengths(tensors[rest + 1])
    layer = int(tensors[rest + 2].reshape(-1)[0])
    require(cache_k.dim() == 4, f"cache {list(cache_k.shape)} is not [layers, batch, maxSeq, hidden]")
    new_k = None if bypass else _heads(wide(tensors[1]), kv_heads)
    new_v = None if bypass else _heads(wide(tensors[2]), kv_heads)
    start = 0
    for sequence, (length, total) in enumerate(zip(lengths, token_offsets)):
        past = total if bypass else total - length
        keys = _heads(cache_k[layer, sequence, :past], kv_heads)
        values = _heads(cache_v[layer, sequence, :past], kv_heads)
        if new_k is not None and new_v is not None:
            keys = torch.cat([keys, new_k[start : start + length]])
            values = torch.cat([values, new_v[start : start + length]])
        outputs.append(
            _attend(
                q[start : start + length],
                keys,
                values,
                params,
                _mask_for(mask, mask_type, sequence, length, keys.shape[0]),
            )
        )
        start += length
    return [torch.cat(outputs)]


def paged_attention(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return a PagedAttentionOperation's output ``[tokens, headNum, headSize]`` (one query token per sequence)."""
    tensors = positional(inputs, at_least=5)
    mask_type = _check_variant(params)
    require(int(param(params, "calcType", 0)) == 0, "calcType SPEC (speculative decoding) is not supported")
    heads = int(param(params, "headNum", 0))
    require(heads > 0, "headNum is not set")
    kv_heads = int(param(params, "kvHeadNum", 0)) or heads
    q = _heads(wide(tensors[0]), heads)
    key_cache, value_cache = wide(tensors[1]), wide(tensors[2])
    blocks, block_size = key_cache.shape[0], key_cache.shape[1]
    key_cache = key_cache.reshape(blocks, block_size, kv_heads, -1)
    value_cache = value_cache.reshape(blocks, block_size, kv_heads, -1)
    block_tables, context_lengths = tensors[3].to(torch.int64), _lengths(tensors[4])
    mask = tensors[5] if mask_type != MASK_NONE and len(tensors) > 5 else None
    require(len(context_lengths) == q.shape[0], f"{q.shape[0]} query tokens for {len(context_lengths)} sequences")
    outputs = []
    for sequence, length in enumerate(context_lengths):
        slots = [
            int(block_tables[sequence, position // block_size]) * block_size + position % block_size
            for position in range(length)
        ]
        slot_index = torch.tensor(slots, dtype=torch.int64)
        keys = key_cache.reshape(-1, kv_heads, key_cache.shape[-1])[slot_index]
        values = value_cache.reshape(-1, kv_heads, value_cache.shape[-1])[slot_index]
        sequence_mask = None
        if mask is not None:
            block = _as_mask(wide(mask))
            block = block[sequence] if block.dim() >= 3 and block.shape[0] == len(context_lengths) else block
            sequence_mask = block[..., :1, :length] if block.dim() >= 2 else block[:length]
        outputs.append(_attend(q[sequence : sequence + 1], keys, values, params, sequence_mask))
    return [torch.cat(outputs)]
