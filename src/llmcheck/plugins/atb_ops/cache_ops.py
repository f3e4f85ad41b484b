"""ATB's in-place cache writers, KvCacheOperation and ReshapeAndCacheOperation.

Both write new keys/values into a cache tensor that is one of their inputs, so the
reference recomputes the cache as it must be after the call, from the cache *before* the
call (dump with ``-time 2`` or the default ``-time 3`` so inputs are saved before the
call). Values are copied, so the references keep the dtype: a cache must match exactly.

* KvCache: ``newKv [tokens, hidden], layerId, cache [layers, batch, maxSeq, hidden],
  tokenOffset, seqLen`` -- sequence ``i``'s tokens land at ``tokenOffset[i] - seqLen[i]``.
* ReshapeAndCache: ``key, value [tokens, kvHeads, headSize], keyCache, valueCache
  [blocks, blockSize, kvHeads, headSize], slotMapping`` -- token ``t`` lands in slot
  ``slotMapping[t]`` (negative: skipped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llmcheck.plugins.atb_ops.op_inputs import param, positional, require


def kv_cache(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return the cache after a KvCacheOperation wrote the new tokens into it."""
    new_kv, layer_id, cache, token_offsets, lengths = positional(inputs, at_least=5)[:5]
    result = cache.clone()
    layer = int(layer_id.reshape(-1)[0])
    start = 0
    for sequence, (offset, length) in enumerate(zip(token_offsets.reshape(-1).tolist(), lengths.reshape(-1).tolist())):
        first = int(offset) - int(length)
        result[layer, sequence, first : first + int(length)] = new_kv[start : start + int(length)].to(cache.dtype)
        start += int(length)
    return [result]


def reshape_and_cache(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return ``[keyCache, valueCache]`` after a ReshapeAndCacheOperation wrote each token to its slot."""
    require(int(param(params, "compressType", 0)) == 0, f"compressType {params.get('compressType')} is not supported")
    require(int(param(params, "kvCacheCfg", 0)) != 1, "kvCacheCfg K_CACHE_V_BYPASS is not supported")
    key, value, key_cache, value_cache, slots = positional(inputs, at_least=5)[:5]
    results = []
    for new, cache in ((key, key_cache), (value, value_cache)):
        blocks, block_size = cache.shape[0], cache.shape[1]
        flat = cache.clone().reshape(blocks * block_size, -1)
        rows = new.reshape(new.shape[0], -1).to(cache.dtype)
        require(
            rows.shape[1] == flat.shape[1], f"a token of {rows.shape[1]} values does not fit a slot of {flat.shape[1]}"
        )
        for token, slot in enumerate(slots.reshape(-1).tolist()):
            if slot >= 0:
                flat[int(slot)] = rows[token]
        results.append(flat.reshape(cache.shape))
    return results
