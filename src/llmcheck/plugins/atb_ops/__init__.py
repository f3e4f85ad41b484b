"""Built-in plugin: reference implementations of ATB operators for ``llmcheck opcheck``.

Each reference recomputes one ATB op type on the CPU in float64 from the op's dumped
input tensors, driven by its ``op_param.json`` (the parameter structs of
``atb/infer_op_params.h``). It is an ordinary plugin on the reference hook: a package can
register more ATB ops the same way, or override none of these (a clash is an error).
"""

from __future__ import annotations

from collections.abc import Callable

from llmcheck.plugin_api import OpReference, hookimpl
from llmcheck.plugins.atb_ops.lazy_compute import LazyCompute

_PACKAGE = "llmcheck.plugins.atb_ops"

#: op type, module, function, what it computes, in-place inputs
_TABLE: tuple[tuple[str, str, str, str, tuple[int, ...]], ...] = (
    ("LinearOperation", "matmul_ops", "linear", "x @ weight (+bias, *deqScale, +accum): transposes, NZ, int8", ()),
    ("MatmulOperation", "matmul_ops", "matmul", "a @ b with transposeA/transposeB", ()),
    ("RmsNormOperation", "norm_ops", "rms_norm", "RMS norm: NORM/PRENORM/POSTNORM, Gemma, rstd, int8", ()),
    ("LayerNormOperation", "norm_ops", "layer_norm", "layer norm: NORM/PRENORM/POSTNORM, dynamic int8", ()),
    ("ElewiseOperation", "elementwise_ops", "elewise", "every elewiseType: cast, muls, arithmetic, cos/sin, quant", ()),
    ("ActivationOperation", "elementwise_ops", "activation", "ReLU, GELU, fast GELU, SiLU/Swish, SwiGLU, sigmoid", ()),
    ("RopeOperation", "rope_ops", "rope", "rotary embedding of q and k, rotaryCoeff 2 / 4 / headSize", ()),
    ("SelfAttentionOperation", "attention_ops", "self_attention", "prefill attention, own or PA cache, masks, GQA", ()),
    ("PagedAttentionOperation", "attention_ops", "paged_attention", "decode attention over a paged KV cache", ()),
    ("KvCacheOperation", "cache_ops", "kv_cache", "writes new tokens into the KV cache (in place)", (2,)),
    ("ReshapeAndCacheOperation", "cache_ops", "reshape_and_cache", "writes tokens into paged cache slots", (2, 3)),
    ("SoftmaxOperation", "tensor_ops", "softmax", "softmax over consecutive axes", ()),
    ("GatherOperation", "tensor_ops", "gather", "gather along an axis", ()),
    ("ConcatOperation", "tensor_ops", "concat", "concatenation along concatDim", ()),
    ("SplitOperation", "tensor_ops", "split", "split into splitNum parts or splitSizes", ()),
    ("SliceOperation", "tensor_ops", "slice_op", "slice at offsets of size", ()),
    ("TransposeOperation", "tensor_ops", "transpose", "permutation of dims", ()),
    ("ReduceOperation", "tensor_ops", "reduce", "max, min or sum over axes", ()),
    ("WhereOperation", "tensor_ops", "where", "cond ? x : y", ()),
)

REFERENCES: tuple[OpReference, ...] = tuple(
    OpReference(op_type, LazyCompute(f"{_PACKAGE}.{module}", function), description, inplace_inputs=inplace)
    for op_type, module, function, description, inplace in _TABLE
)


@hookimpl
def llmcheck_register_op_references(register: Callable[[OpReference], None]) -> None:
    for reference in REFERENCES:
        register(reference)
