"""Which record of a serving engine's Llama-family model holds what a transformers record holds.

vLLM and SGLang run the same decoder as transformers with other modules:

* ``self_attn.qkv_proj`` computes ``q_proj``, ``k_proj`` and ``v_proj`` in one matmul (its
  output's columns: q, then k, then v) and ``mlp.gate_up_proj`` computes ``gate_proj`` and
  ``up_proj`` (gate, then up);
* ``mlp.act_fn`` (``SiluAndMul``) takes both halves and gives ``silu(gate) * up``: the input
  of ``down_proj``, which transformers never records as a module output;
* the norms add the residual themselves: ``input_layernorm(x, residual)`` returns the normed
  tensor and the residual sum, so the sum transformers computes inside the decoder layer (its
  output, the next norm's input) is the engine norm's second output;
* ``self_attn.attn`` is the attention core whose output ``o_proj`` reads;
* the decoder layer returns ``(hidden, residual)``: neither is transformers' layer output.

:func:`engine_source` says, for one transformers record, which engine record (name, io,
position, column part) holds the same values; :func:`reference_only_reason` says why a
transformers record has no counterpart, and :func:`engine_only_reason` why an engine record
has none, so a clean compare leaves nothing unexplained.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmcheck.plugin_api import IO_INPUT, IO_OUTPUT, ROOT_MODULE

#: The column parts of a fused projection, in the order its output holds them.
QKV_PARTS = ("q", "k", "v")
GATE_UP_PARTS = ("gate", "up")

#: Engine inputs that are another engine module's output, which is paired: input of -> output of.
_READ_AS_OUTPUT = {
    "self_attn.o_proj": "self_attn.attn",
    "mlp.act_fn": "mlp.gate_up_proj",
    "mlp.down_proj": "mlp.act_fn",
}

_LAYER = re.compile(r"(?P<prefix>(?:.*\.)?layers)\.(?P<index>\d+)(?:\.(?P<rest>.+))?")


@dataclass(frozen=True, slots=True)
class EngineSource:
    """Where an engine holds a transformers record's values: a record, and the part of its columns.

    ``part`` names a slice of a fused projection's output (``"q"``, ``"gate"``, ...), ``None``
    for the whole tensor; ``logits`` marks the engine's logits, one row per request.
    """

    name: str
    io: str
    position: str
    part: str | None = None
    logits: bool = False


def _split(name: str) -> tuple[str, int, str] | None:
    match = _LAYER.fullmatch(name)
    if match is None:
        return None
    return match["prefix"], int(match["index"]), match["rest"] or ""


def engine_source(name: str, io: str, position: str, layer_count: int, final_norm: str) -> EngineSource | None:
    """Return the engine record holding transformers record ``name io.position``, or ``None`` for the same key.

    ``layer_count`` is the number of decoder layers and ``final_norm`` the name of the
    engine's final norm (``model.norm``): the last layer's output is that norm's residual.
    """
    if name == "lm_head" and io == IO_OUTPUT and position == "0":
        return EngineSource("logits_processor", IO_OUTPUT, "0", logits=True)
    if name == "lm_head" and io == IO_INPUT and position == "0":
        return EngineSource("logits_processor", IO_INPUT, "1", logits=True)
    if name == final_norm and io == IO_INPUT and position == "0":
        return EngineSource(final_norm, IO_OUTPUT, "1")
    if name.rsplit(".", 1)[-1] == "model" and io == IO_OUTPUT and position in ("0", "last_hidden_state"):
        return EngineSource(ROOT_MODULE, IO_OUTPUT, "0")
    layer = _split(name)
    if layer is None:
        return None
    prefix, index, rest = layer
    base = f"{prefix}.{index}"
    residual_in = (
        EngineSource(f"{base}.input_layernorm", IO_INPUT, "0")
        if index == 0
        else EngineSource(f"{base}.input_layernorm", IO_OUTPUT, "1")
    )
    if rest == "" and io == IO_INPUT and position in ("0", "hidden_states"):
        return residual_in
    if rest == "" and io == IO_OUTPUT and position == "0":
        if index + 1 < layer_count:
            return EngineSource(f"{prefix}.{index + 1}.input_layernorm", IO_OUTPUT, "1")
        return EngineSource(final_norm, IO_OUTPUT, "1")
    if rest == "input_layernorm" and io == IO_INPUT and position == "0":
        return residual_in
    if rest == "post_attention_layernorm" and io == IO_INPUT and position == "0":
        return EngineSource(f"{base}.post_attention_layernorm", IO_OUTPUT, "1")
    projection = rest.rsplit(".", 1)
    if len(projection) == 2 and projection[0] == "self_attn" and projection[1] in ("q_proj", "k_proj", "v_proj"):
        part = projection[1][0]
        if io == IO_OUTPUT and position == "0":
            return EngineSource(f"{base}.self_attn.qkv_proj", IO_OUTPUT, "0", part)
        if io == IO_INPUT and position == "0":
            return EngineSource(f"{base}.self_attn.qkv_proj", IO_INPUT, "0")
    if len(projection) == 2 and projection[0] == "mlp" and projection[1] in ("gate_proj", "up_proj"):
        part = projection[1].removesuffix("_proj")
        if io == IO_OUTPUT and position == "0":
            return EngineSource(f"{base}.mlp.gate_up_proj", IO_OUTPUT, "0", part)
        if io == IO_INPUT and position == "0":
            return EngineSource(f"{base}.mlp.gate_up_proj", IO_INPUT, "0")
    if rest == "mlp.act_fn" and io == IO_INPUT and position == "0":
        return EngineSource(f"{base}.mlp.gate_up_proj", IO_OUTPUT, "0", "gate")
    if rest == "mlp.down_proj" and io == IO_INPUT and position == "0":
        return EngineSource(f"{base}.mlp.act_fn", IO_OUTPUT, "0")
    if rest == "self_attn.o_proj" and io == IO_INPUT and position == "0":
        return EngineSource(f"{base}.self_attn.attn", IO_OUTPUT, "0")
    return None


def reference_only_reason(name: str, io: str, position: str) -> str | None:
    """Return why a transformers record has no engine counterpart, or ``None`` when it should have one."""
    if name.endswith("rotary_emb") or position.startswith("position_embeddings"):
        return "transformers computes rotary cos/sin once per forward; the engine applies them inside attention"
    if position in ("position_ids", "cache_position", "attention_mask") or position.startswith("past_key_values"):
        return "bookkeeping input: the engine's positions are in the dump's batch layout"
    if name.endswith("mlp.act_fn") and io == IO_OUTPUT:
        return "silu(gate) alone: the engine's SiluAndMul multiplies by up in the same op (paired at down_proj's input)"
    if name == ROOT_MODULE and io == IO_OUTPUT:
        return "the model's logits, the same tensor as lm_head's output (paired there)"
    if (name == "model" or name.endswith(".model")) and io == IO_INPUT:
        return "the engine's decoder stack is called outside module hooks: its inputs are the root's"
    return None


def engine_only_reason(name: str, io: str, position: str) -> str | None:
    """Return why an engine record has no transformers counterpart, or ``None`` when it should have one."""
    layer = _split(name)
    rest = layer[2] if layer is not None else ""
    if layer is not None and rest == "":
        return "the engine's decoder layer passes (hidden, residual); transformers' layer output is their sum"
    if rest.endswith("rotary_emb") or (rest == "self_attn.attn" and io == IO_INPUT):
        return "rotated q and k (and v) inside attention: transformers applies the rotation as a function"
    if (rest.endswith("layernorm") or name.endswith("norm")) and io == IO_INPUT and position == "0":
        return "the previous block's output before the fused norm adds the residual: paired at that block's output"
    if (rest.endswith("layernorm") or name.endswith("norm")) and io == IO_INPUT and position == "1":
        return "the residual the fused norm adds: transformers' residual sum is paired at the norm's second output"
    if io == IO_INPUT and position == "0" and rest in _READ_AS_OUTPUT:
        return f"the output of {_READ_AS_OUTPUT[rest]}, paired there"
    if position == "positions" or (name == ROOT_MODULE and io == IO_INPUT):
        return "bookkeeping input: the engine's rows are in the dump's batch layout"
    if position.startswith("1") and io == IO_OUTPUT and rest.endswith("proj"):
        return "the projection's bias output (None when it has none)"
    return None
