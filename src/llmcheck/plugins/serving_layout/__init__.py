"""Built-in plugin ``serving_layout``: a serving engine's dump (vLLM, SGLang) paired with a per-request run.

Pairing only. An engine dump carries its batch layout (``Dump.batches``: each step's request
ids, query start offsets and row positions); the other run is one request in transformers'
layout. This plugin cuts the request's rows out of each engine step, splits the fused
projections (``qkv_proj``, ``gate_up_proj``) into transformers' separate ones, and pairs the
fused norms' residual outputs with transformers' residual sums (rule ``serving_layout(...)``,
stated in ``pairs.json``; see ``docs/sources/vllm.md``). It names no backend: any source that
fills ``Dump.batches`` with engine module names pairs the same way.
"""

from __future__ import annotations

from llmcheck.plugin_api import Dump, Pair, UserMapping, hookimpl


@hookimpl
def llmcheck_map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair] | None:
    """Return the engine-layout pairs when exactly one of the two dumps is a serving engine's."""
    from llmcheck.plugins.serving_layout.pairing import serving_pairs

    return serving_pairs(golden, my)
