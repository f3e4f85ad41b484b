"""ATB's RopeOperation: rotary position embedding of q and k, in float64.

Inputs ``q, k, cos, sin, seqLen``; ``q``/``k`` are ``[tokens, heads * headSize]`` (or
``[batch, seq, heads, headSize]``), ``cos``/``sin`` one row of ``headSize`` per token.
``rotaryCoeff`` says how the head is rotated: the head is cut into ``rotaryCoeff / 2``
equal chunks and each chunk is rotated by halves -- 2 is the NeoX rotation of the whole
head, 4 rotates each half of the head (GLM), ``headSize`` rotates adjacent pairs (GPT-J).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llmcheck.plugins.atb_ops.op_inputs import param, positional, require, wide


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, chunks: int) -> torch.Tensor:
    """Return ``x [tokens, heads, d]`` rotated chunk by chunk with ``cos, sin [tokens, 1, d]``."""
    rotated = []
    for x_part, cos_part, sin_part in zip(x.chunk(chunks, -1), cos.chunk(chunks, -1), sin.chunk(chunks, -1)):
        first, second = x_part.chunk(2, -1)
        rotated.append(x_part * cos_part + torch.cat([-second, first], dim=-1) * sin_part)
    return torch.cat(rotated, dim=-1)


def rope(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> list[torch.Tensor]:
    """Return ``[q_embedded, k_embedded]`` of a RopeOperation, in the shapes of ``q`` and ``k``."""
    q, k, cos, sin = (wide(tensor) for tensor in positional(inputs, at_least=4)[:4])
    require(int(param(params, "cosFormat", 0)) == 0, "cosFormat 1 is not supported")
    head_size = cos.shape[-1]
    coefficient = int(param(params, "rotaryCoeff", 4))
    require(
        coefficient >= 2 and coefficient % 2 == 0 and head_size % coefficient == 0,
        f"rotaryCoeff {coefficient} does not divide head size {head_size}",
    )
    tokens = q.numel() // q.shape[-1] if q.dim() <= 2 else q.shape[0] * q.shape[1]
    cos_rows = cos.reshape(-1, head_size)
    sin_rows = sin.reshape(-1, head_size)
    if cos_rows.shape[0] != tokens:
        require(
            q.dim() == 4 and cos_rows.shape[0] == q.shape[1], f"cos has {cos_rows.shape[0]} rows for {tokens} tokens"
        )
        cos_rows = cos_rows.repeat(q.shape[0], 1)
        sin_rows = sin_rows.repeat(q.shape[0], 1)
    cos_rows, sin_rows = cos_rows.unsqueeze(1), sin_rows.unsqueeze(1)
    results = []
    for x in (q, k):
        require(x.numel() % (tokens * head_size) == 0, f"{list(x.shape)} does not hold heads of size {head_size}")
        per_head = x.reshape(tokens, -1, head_size)
        results.append(_rotate(per_head, cos_rows, sin_rows, coefficient // 2).reshape(x.shape))
    return results
