"""The bug zoo: does llmcheck name the module a defect was injected into, across models, dtypes and captures?

A user judges llmcheck by one thing: after a golden run and a defective run, does
``first_introduced`` point at the module that is actually broken? This script measures that
on many small, plausible defects, each injected into exactly ONE decoder layer of a seeded
random model, for several architectures, precisions and capture modes -- plus clean
controls (no defect at all), where any failure or named culprit is a false culprit.

Models. transformers' own config classes, small enough for a 2-core CPU (``ARCHS``): a Llama
(SDPA attention), a Qwen2 with grouped-query attention and q/k/v biases loaded with
``attn_implementation="eager"`` (its decoder layers receive an additive float mask filled
with ``torch.finfo(dtype).min``, which differs between dtypes: a known false-culprit source),
and a Phi-3 (fused ``qkv_proj`` and ``gate_up_proj``). HF's default initialisation (normal,
std 0.02) makes every residual branch add about 2 % of the stream, so hidden states stay
tiny and nearly the embedding; a trained model's branches are O(1). So every linear weight
is redrawn with std ``1/sqrt(fan_in)`` (each output keeps its input's scale, as after
training), biases with std 0.1, embeddings with std 1 (an O(1) residual stream) and norm
gains as ``1 + 0.1 * N(0, 1)`` (trained gains are not all ones). The golden and the my model
are the same seeded fp32 model; only the defect and the dtype differ.

Defects (``DEFECTS``), each in one decoder layer (the layer varies with the case): weights
scaled, quantised, swapped or one column perturbed; a norm's epsilon or gain wrong; the
MLP activation swapped; and defects in the attention code itself (softmax scale, a head
zeroed, causal mask dropped, the rotary base of another model version, the attention
branch scaled). Weight defects edit the weights; the others patch the one module's attribute, its
own ``forward`` (an instance attribute, so hooks and module paths are unchanged) or its
attention function (the one attention module gets its own config whose
``_attn_implementation`` names a registered wrapper around the real SDPA or eager function).

Scoring. Each defect lists its ACCEPTED culprits: the defective module's output and, where
the defect lives in code inside a parent (the attention function inside ``self_attn``), the
enclosing module that runs that code, plus the input of the module that first receives its
result (``o_proj``'s input *is* the attention function's output -- nothing finer records
it). Naming the decoder layer for a defect inside its MLP is a miss: something finer could
see it. At op level a record ``{module}/{aten op}`` is a hit when its module is accepted
(any of its operators' inputs or outputs; an input-only acceptance needs an input row).
A case is a HIT when the culprit llmcheck names (``result.culprit``: the first introduced
row, else the first op only one run executes where the error starts) is accepted; a clean
control is a FALSE CULPRIT when it has any failing row or names a culprit.

Settings (``SETTINGS``): my-run dtype against golden dtype, each with full module-level
capture and statistics-only capture; op-level capture for fp32 and bf16; and, when the
engine takes ``compare_dumps(..., noise=...)``, bf16 against fp32 with a noise twin (the
golden program without the defect at the my-run's dtype).

    python benchmarks/bug_zoo.py                      # every setting, arch and defect
    python benchmarks/bug_zoo.py --quick              # the fast subset the slow test runs
    python benchmarks/bug_zoo.py --settings bf16/fp32,bf16/fp32-stats --archs llama --json zoo.json
    python benchmarks/bug_zoo.py --peer               # msprobe side by side (see --peer's help)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

SEED = 0
SEQUENCE_LENGTH = 32
INPUT_SEED = 1
RMS_EPSILON = 1e-6
WRONG_EPSILON = 1e-2
WRONG_ROPE_THETA = 500000.0
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# --------------------------------------------------------------------------- architectures


@dataclass(frozen=True)
class Arch:
    """One model family: how to build it and where its parts live inside a decoder layer."""

    name: str
    config_class: str
    num_layers: int
    config: dict[str, Any]
    attn_implementation: str
    #: True: one fused ``self_attn.qkv_proj``; False: separate ``q_proj``, ``k_proj``, ``v_proj``
    fused_qkv: bool
    #: True: one fused ``mlp.gate_up_proj``; False: separate ``gate_proj`` and ``up_proj``
    fused_gate_up: bool
    activation: str  # attribute of the MLP holding the activation module

    def layer(self, index: int) -> str:
        return f"model.layers.{index}"


ARCHS: dict[str, Arch] = {
    "llama": Arch(
        "llama",
        "LlamaConfig",
        5,
        dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4, vocab_size=384),
        "sdpa",
        fused_qkv=False,
        fused_gate_up=False,
        activation="act_fn",
    ),
    "qwen2": Arch(
        "qwen2",
        "Qwen2Config",
        4,
        dict(hidden_size=96, intermediate_size=256, num_attention_heads=6, num_key_value_heads=2, vocab_size=320),
        "eager",
        fused_qkv=False,
        fused_gate_up=False,
        activation="act_fn",
    ),
    "phi3": Arch(
        "phi3",
        "Phi3Config",
        6,
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=512,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "sdpa",
        fused_qkv=True,
        fused_gate_up=True,
        activation="activation_fn",
    ),
}


def _realistic_init(model: torch.nn.Module, seed: int) -> None:
    """Redraw the weights at trained-model scale (see the module docstring for why and how)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(
                    torch.randn(module.weight.shape, generator=generator) / math.sqrt(module.in_features)
                )
                if module.bias is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
            elif isinstance(module, torch.nn.Embedding):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator))
            elif (
                type(module).__name__.endswith(("RMSNorm", "LayerNorm")) and getattr(module, "weight", None) is not None
            ):
                module.weight.copy_(1 + 0.1 * torch.randn(module.weight.shape, generator=generator))


def build_model(arch: Arch, seed: int = SEED) -> torch.nn.Module:
    """Return the seeded fp32 model of ``arch`` in eval mode, with realistic-scale random weights."""
    import transformers

    config_class = getattr(transformers, arch.config_class)
    config = config_class(
        num_hidden_layers=arch.num_layers,
        rms_norm_eps=RMS_EPSILON,
        tie_word_embeddings=False,
        max_position_embeddings=256,
        **arch.config,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=arch.attn_implementation)
    _realistic_init(model, seed)
    model.eval()
    return model


def input_ids(arch: Arch) -> torch.Tensor:
    """Return the seeded prompt (one sequence of ``SEQUENCE_LENGTH`` token ids)."""
    vocab = arch.config["vocab_size"]
    return torch.randint(1, vocab, (1, SEQUENCE_LENGTH), generator=torch.Generator().manual_seed(INPUT_SEED))


# --------------------------------------------------------------------------- defects


@dataclass(frozen=True)
class Accepted:
    """A culprit that counts as a hit: a module path and which of its rows (``output``, ``input``)."""

    module: str
    ios: tuple[str, ...] = ("output",)

    def text(self) -> str:
        return self.module if self.ios == ("output",) else f"{self.module} ({'/'.join(self.ios)})"


def _module(model: torch.nn.Module, path: str) -> torch.nn.Module:
    return model.get_submodule(path)


def _scale_rows(weight: torch.Tensor, rows: slice, factor: float) -> None:
    with torch.no_grad():
        weight[rows] *= factor


def _attention_code(layer: str) -> list[Accepted]:
    """Accepted culprits of a defect in the attention function: ``self_attn``, and ``o_proj``'s input."""
    return [Accepted(f"{layer}.self_attn"), Accepted(f"{layer}.self_attn.o_proj", ("input",))]


def _q_rows(model: torch.nn.Module, arch: Arch, layer: str) -> tuple[str, slice]:
    """Return the module holding the query projection and the weight rows that are the query's."""
    attention = _module(model, f"{layer}.self_attn")
    if arch.fused_qkv:
        return f"{layer}.self_attn.qkv_proj", slice(0, attention.config.num_attention_heads * attention.head_dim)
    return f"{layer}.self_attn.q_proj", slice(None)


def _k_rows(model: torch.nn.Module, arch: Arch, layer: str) -> tuple[str, slice]:
    attention = _module(model, f"{layer}.self_attn")
    if arch.fused_qkv:
        start = attention.config.num_attention_heads * attention.head_dim
        return f"{layer}.self_attn.qkv_proj", slice(start, start + attention.num_key_value_heads * attention.head_dim)
    return f"{layer}.self_attn.k_proj", slice(None)


_ATTENTION_WRAPPERS = 0


def _wrap_attention_function(
    model: torch.nn.Module, layer: str, change: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
) -> None:
    """Make one attention module call ``change(real_function, args, kwargs)`` instead of its attention function.

    The module gets its own copy of the config whose ``_attn_implementation`` names a wrapper
    registered with transformers' ``AttentionInterface``; every other layer keeps the real one.
    """
    global _ATTENTION_WRAPPERS
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attention = _module(model, f"{layer}.self_attn")
    implementation = attention.config._attn_implementation
    if implementation == "eager":
        real = sys.modules[type(attention).__module__].eager_attention_forward
    else:
        real = ALL_ATTENTION_FUNCTIONS[implementation]
    _ATTENTION_WRAPPERS += 1
    name = f"bug_zoo_{_ATTENTION_WRAPPERS}"
    AttentionInterface.register(name, lambda *args, **kwargs: change(real, args, kwargs))
    attention.config = copy.copy(attention.config)
    attention.config._attn_implementation = name


def _wrap_forward(module: torch.nn.Module, change: Callable[..., Any]) -> None:
    """Replace one module's forward by ``change(original_forward, *args, **kwargs)`` (hooks and path unchanged)."""
    original = module.forward
    module.forward = lambda *args, **kwargs: change(original, *args, **kwargs)  # type: ignore[method-assign]


def inject_down_proj_scale(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    path = f"{layer}.mlp.down_proj"
    _scale_rows(_module(model, path).weight, slice(None), 1.05)
    return [Accepted(path)]


def inject_norm_epsilon(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    path = f"{layer}.post_attention_layernorm"
    _module(model, path).variance_epsilon = WRONG_EPSILON
    return [Accepted(path)]


def inject_norm_gain(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    path = f"{layer}.input_layernorm"
    with torch.no_grad():
        _module(model, path).weight += 0.05
    return [Accepted(path)]


def inject_activation_swap(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    setattr(_module(model, f"{layer}.mlp"), arch.activation, torch.nn.GELU())  # SiLU -> GELU, same path
    return [Accepted(f"{layer}.mlp.{arch.activation}")]


def inject_softmax_scale(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    _module(model, f"{layer}.self_attn").scaling *= 1.1  # the scale handed to the attention function
    return _attention_code(layer)


def inject_head_zeroed(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    def zero_last_head(real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        output, weights = real(*args, **kwargs)
        output = output.clone()
        output[:, :, -1, :] = 0  # (batch, sequence, head, head_dim): the last head writes nothing
        return output, weights

    _wrap_attention_function(model, layer, zero_last_head)
    return _attention_code(layer)


def inject_causal_mask_dropped(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    def attend_everywhere(real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        module, query, key, value, _mask = args[:5]
        return real(module, query, key, value, None, *args[5:], **{**kwargs, "is_causal": False})

    _wrap_attention_function(model, layer, attend_everywhere)
    return _attention_code(layer)


def inject_attention_branch_scale(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    def scaled(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        output, weights = original(*args, **kwargs)
        return output * 0.9, weights  # the branch added to the residual stream is 10 % short

    _wrap_forward(_module(model, f"{layer}.self_attn"), scaled)
    return [Accepted(f"{layer}.self_attn")]


def inject_rope_theta(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    rotary = copy.deepcopy(model.model.rotary_emb)
    theta = model.config.rope_parameters["rope_theta"]
    with torch.no_grad():  # inv_freq_i = theta ** (-2i/d): the same frequencies under another base
        rotary.inv_freq.copy_(rotary.inv_freq ** (math.log(WRONG_ROPE_THETA) / math.log(theta)))

    def other_theta(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hidden = kwargs["hidden_states"]
        kwargs["position_embeddings"] = rotary(hidden, torch.arange(hidden.shape[1]).unsqueeze(0))
        return original(*args, **kwargs)

    _wrap_forward(_module(model, f"{layer}.self_attn"), other_theta)
    return _attention_code(layer)


def inject_q_column(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    path, rows = _q_rows(model, arch, layer)
    with torch.no_grad():
        _module(model, path).weight[rows, 5] *= 1.5  # one input feature's query weights 50 % too large
    return [Accepted(path)]


def inject_k_proj_scale(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    path, rows = _k_rows(model, arch, layer)
    _scale_rows(_module(model, path).weight, rows, 0.95)
    return [Accepted(path)]


def inject_o_proj_int8(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    path = f"{layer}.self_attn.o_proj"
    weight = _module(model, path).weight
    with torch.no_grad():
        step = weight.abs().max() / 127  # per-tensor symmetric int8, dequantised: a calibration shortcut
        weight.copy_(torch.round(weight / step) * step)
    return [Accepted(path)]


def inject_gate_up_swapped(model: torch.nn.Module, arch: Arch, layer: str) -> list[Accepted]:
    mlp = _module(model, f"{layer}.mlp")
    with torch.no_grad():
        if arch.fused_gate_up:
            gate, up = mlp.gate_up_proj.weight.chunk(2, dim=0)
            mlp.gate_up_proj.weight.copy_(torch.cat([up, gate], dim=0))
            return [Accepted(f"{layer}.mlp.gate_up_proj")]
        gate_weight = mlp.gate_proj.weight.clone()
        mlp.gate_proj.weight.copy_(mlp.up_proj.weight)
        mlp.up_proj.weight.copy_(gate_weight)
    return [Accepted(f"{layer}.mlp.gate_proj"), Accepted(f"{layer}.mlp.up_proj")]


@dataclass(frozen=True)
class Defect:
    name: str
    what: str
    inject: Callable[[torch.nn.Module, Arch, str], list[Accepted]]


DEFECTS: dict[str, Defect] = {
    defect.name: defect
    for defect in [
        Defect("down_proj_x1.05", "mlp.down_proj weight x1.05 (a quantisation scale 5 % off)", inject_down_proj_scale),
        Defect(
            "norm_eps_1e-2",
            f"post_attention_layernorm epsilon {RMS_EPSILON:g} -> {WRONG_EPSILON:g} "
            "(a fused kernel's hard-coded value)",
            inject_norm_epsilon,
        ),
        Defect(
            "norm_gain_+0.05", "input_layernorm weight + 0.05 (an offset-gain convention mixed up)", inject_norm_gain
        ),
        Defect("act_silu_to_gelu", "MLP activation SiLU -> GELU", inject_activation_swap),
        Defect("softmax_scale_x1.1", "attention softmax scale x1.1 (head_dim miscounted)", inject_softmax_scale),
        Defect("head_zeroed", "attention function writes zeros for its last head", inject_head_zeroed),
        Defect("causal_mask_dropped", "attention function ignores the causal mask", inject_causal_mask_dropped),
        Defect("attn_branch_x0.9", "self_attn output x0.9 before the residual add", inject_attention_branch_scale),
        Defect(
            "rope_theta_5e5",
            f"rotary base 10000 -> {WRONG_ROPE_THETA:g} in one layer (another model version's config)",
            inject_rope_theta,
        ),
        Defect("q_column_x1.5", "one input column of the query weight x1.5", inject_q_column),
        Defect("k_proj_x0.95", "key projection weight x0.95", inject_k_proj_scale),
        Defect("o_proj_int8", "o_proj weight rounded to per-tensor int8", inject_o_proj_int8),
        Defect("gate_up_swapped", "MLP gate and up projection weights swapped", inject_gate_up_swapped),
    ]
}
CLEAN = "clean"


def defect_layer(arch: Arch, defect_name: str) -> int:
    """Return the decoder layer a defect goes into: it varies with the defect and the architecture."""
    defect_index = list(DEFECTS).index(defect_name)
    arch_index = list(ARCHS).index(arch.name)
    return (defect_index + arch_index + 1) % arch.num_layers


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setting:
    """One way of running the pair: the my-run's dtype, the golden's, the capture, and whether a noise twin is given."""

    name: str
    my_dtype: str
    golden_dtype: str
    capture: str  # "module", "stats" (module level, statistics only), "op" or "op-stats" (op level, statistics only)
    noise_twin: bool = False


SETTINGS: dict[str, Setting] = {
    setting.name: setting
    for setting in [
        Setting("fp32/fp32", "fp32", "fp32", "module"),
        Setting("bf16/fp32", "bf16", "fp32", "module"),
        Setting("fp16/fp32", "fp16", "fp32", "module"),
        Setting("bf16/bf16", "bf16", "bf16", "module"),
        Setting("fp32/fp32-stats", "fp32", "fp32", "stats"),
        Setting("bf16/fp32-stats", "bf16", "fp32", "stats"),
        Setting("fp16/fp32-stats", "fp16", "fp32", "stats"),
        Setting("bf16/bf16-stats", "bf16", "bf16", "stats"),
        Setting("fp32/fp32-op", "fp32", "fp32", "op"),
        Setting("bf16/fp32-op", "bf16", "fp32", "op"),
        Setting("bf16/fp32-op-stats", "bf16", "fp32", "op-stats"),
        Setting("fp16/fp32-op-stats", "fp16", "fp32", "op-stats"),
        Setting("bf16/fp32+noise", "bf16", "fp32", "module", noise_twin=True),
    ]
}

QUICK_SETTINGS = ["fp32/fp32", "bf16/fp32", "fp32/fp32-stats"]
QUICK_ARCHS = ["llama", "qwen2"]
QUICK_DEFECTS = ["down_proj_x1.05", "norm_eps_1e-2", "softmax_scale_x1.1", "rope_theta_5e5"]


#: Extra ``DumpConfig`` fields of every capture (``--no-weight-digests`` sets ``weight_digests=False``).
CAPTURE_OPTIONS: dict[str, Any] = {}


def capture_config(dump_path: Path, capture: str, **options: Any) -> Any:
    """Return the ``DumpConfig`` of one capture mode: every module's inputs and outputs, or every operator's.

    ``options`` are further ``DumpConfig`` fields (over :data:`CAPTURE_OPTIONS`).
    """
    from llmcheck import DumpConfig

    fields = {**CAPTURE_OPTIONS, **options}
    if capture in ("op", "op-stats"):
        return DumpConfig(
            dump_path=str(dump_path),
            token_range=[0],
            tensor_part=2,
            mode="op",
            statistics_only=capture == "op-stats",
            **fields,
        )
    return DumpConfig(
        dump_path=str(dump_path), token_range=[0], tensor_part=2, statistics_only=capture == "stats", **fields
    )


def capture_run(model: torch.nn.Module, ids: torch.Tensor, dump_path: Path, capture: str, **options: Any) -> Path:
    """Run one forward pass under llmcheck's torch capture and return the dump folder."""
    from llmcheck import register_hook

    with register_hook(model, capture_config(dump_path, capture, **options)) as handle, torch.no_grad():
        model(ids)
    assert handle.path is not None
    return Path(handle.path)


def noise_supported() -> bool:
    """Return whether this llmcheck's ``compare_dumps`` takes a ``noise`` keyword (the noise-twin run)."""
    from llmcheck.core.compare import compare_dumps

    return "noise" in inspect.signature(compare_dumps).parameters


# --------------------------------------------------------------------------- running cases


@dataclass
class CaseResult:
    """What one case found: the blamed row, whether it is accepted, and how noisy the compare was."""

    setting: str
    arch: str
    defect: str
    layer: int | None
    accepted: list[str]
    blamed: str  # "name (io)" of first_introduced, or "nothing"
    blamed_module: str | None
    hit: bool | None  # None for clean controls
    false_culprit: bool | None  # clean controls only
    introduced_rows: int
    failures: int
    warnings: int
    pairs: int
    elapsed_s: float
    peer: dict[str, Any] = field(default_factory=dict)
    #: a miss whose defective module llmcheck still names among its noise suspects (a warning, no failure)
    suspected: bool = False

    @property
    def is_clean(self) -> bool:
        return self.defect == CLEAN

    def line(self) -> str:
        """Return the case's one printed line."""
        if self.is_clean:
            mark = "FALSE-CULPRIT" if self.false_culprit else "clean-ok"
            where = "-"
        else:
            mark = "HIT" if self.hit else "miss (suspect)" if self.suspected else "miss"
            where = f"L{self.layer}"
        text = (
            f"{self.setting:<16} {self.arch:<6} {self.defect:<20} {where:<3} {mark:<13} "
            f"blamed {self.blamed}; introduced rows {self.introduced_rows}; failures {self.failures}"
        )
        if self.peer:
            text += (
                f" | msprobe -da {self.peer['da']} ({self.peer['da_blamed']}), "
                f"compare {self.peer['compare']} ({self.peer['compare_blamed']})"
            )
        return text


def _row_scope(name: str) -> str:
    """Return the module a record belongs to: its name, or the module part of an op-level ``module/aten.op``."""
    return name.split("/", 1)[0]


def is_accepted(name: str, io: str, accepted: Sequence[Accepted], capture: str) -> bool:
    """Return whether a blamed record (name, io) is one of the accepted culprits (see the module docstring)."""
    for culprit in accepted:
        if capture in ("op", "op-stats"):
            if _row_scope(name) == culprit.module and (io in culprit.ios or "output" in culprit.ios):
                return True
        elif name == culprit.module and io in culprit.ios:
            return True
    return False


def score(
    setting: Setting,
    arch: str,
    defect: str,
    layer: int | None,
    accepted: Sequence[Accepted],
    result: Any,
    elapsed_s: float,
) -> CaseResult:
    """Return the case's result read from a ``CompareResult``."""
    # The culprit llmcheck names: the first introduced row, else (where the error enters through
    # ops only one run executes) the first of those suspect ops; older versions name only the first.
    named = getattr(result, "culprit", None)
    if named is None and result.first_introduced is not None:
        named = result.first_introduced.golden
    counts = result.counts()
    introduced_rows = sum(1 for row in result.rows if row.attribution == "introduced")
    blamed, blamed_module, hit, false_culprit, suspected = "nothing", None, None, None, False
    if named is not None:
        key = named.key
        suspect = " [op one run only]" if result.first_introduced is None else ""
        blamed, blamed_module = f"{key.name} ({key.io} {key.position}){suspect}", key.name
        introduced = result.first_introduced
        if introduced is not None and introduced.deciding_metric in introduced.metrics:
            decided = introduced.metrics[introduced.deciding_metric]  # what decided it, and by how much
            blamed += f" [{decided.name} {decided.value:.3g}]"
    if defect == CLEAN:
        false_culprit = counts["failures"] > 0 or named is not None
    else:
        hit = named is not None and is_accepted(named.key.name, named.key.io, accepted, setting.capture)
        suspected = not hit and any(
            row.attribution == "suspect"
            and is_accepted(row.golden.key.name, row.golden.key.io, accepted, setting.capture)
            for row in result.rows
        )
    return CaseResult(
        setting=setting.name,
        arch=arch,
        defect=defect,
        layer=layer,
        accepted=[culprit.text() for culprit in accepted],
        blamed=blamed,
        blamed_module=blamed_module,
        hit=hit,
        false_culprit=false_culprit,
        introduced_rows=introduced_rows,
        failures=counts["failures"],
        warnings=counts["warnings"],
        pairs=counts["pairs"],
        elapsed_s=round(elapsed_s, 3),
        suspected=suspected,
    )


class Zoo:
    """Runs cases, keeping one fp32 model per architecture and one golden dump per (arch, dtype, capture)."""

    def __init__(self, workdir: Path, peer: Any = None) -> None:
        self.workdir = workdir
        self.peer = peer
        self._models: dict[str, torch.nn.Module] = {}
        self._goldens: dict[tuple[str, str, str], Path] = {}
        self._twins: dict[tuple[str, str, str], Path] = {}
        self._runs = 0

    def model(self, arch: Arch) -> torch.nn.Module:
        if arch.name not in self._models:
            self._models[arch.name] = build_model(arch)
        return self._models[arch.name]

    def _folder(self, label: str) -> Path:
        self._runs += 1
        return self.workdir / f"{self._runs:05d}_{label}"

    def _dump(
        self, arch: Arch, dtype: str, capture: str, defect: str | None, label: str
    ) -> tuple[Path, list[Accepted]]:
        """Capture the arch at ``dtype``, with ``defect`` injected into a fresh copy (None: the clean model)."""
        model = copy.deepcopy(self.model(arch))
        accepted: list[Accepted] = []
        if defect is not None:
            accepted = DEFECTS[defect].inject(model, arch, arch.layer(defect_layer(arch, defect)))
        model.to(DTYPES[dtype])
        return capture_run(model, input_ids(arch), self._folder(label), capture), accepted

    def golden(self, arch: Arch, setting: Setting) -> Path:
        key = (arch.name, setting.golden_dtype, setting.capture)
        if key not in self._goldens:
            self._goldens[key], _ = self._dump(arch, setting.golden_dtype, setting.capture, None, "golden")
        return self._goldens[key]

    def twin(self, arch: Arch, setting: Setting) -> Path:
        """Return the noise twin: the golden program, no defect, at the my-run's dtype."""
        key = (arch.name, setting.my_dtype, setting.capture)
        if key not in self._twins:
            self._twins[key], _ = self._dump(arch, setting.my_dtype, setting.capture, None, "twin")
        return self._twins[key]

    def run_case(self, setting: Setting, arch: Arch, defect: str) -> CaseResult:
        """Capture the my run of one case, compare it with the cached golden and score it."""
        from llmcheck.core.compare import compare_dumps
        from llmcheck.core.plugins import get_plugins

        started = time.perf_counter()
        golden_path = self.golden(arch, setting)
        injected = None if defect == CLEAN else defect
        my_path, accepted = self._dump(arch, setting.my_dtype, setting.capture, injected, f"my_{defect}")
        plugins = get_plugins()
        options: dict[str, Any] = {}
        if setting.noise_twin:
            options["noise"] = plugins.load_tensors(self.twin(arch, setting))
        result = compare_dumps(plugins.load_tensors(golden_path), plugins.load_tensors(my_path), workers=1, **options)
        layer = None if injected is None else defect_layer(arch, defect)
        case = score(setting, arch.name, defect, layer, accepted, result, time.perf_counter() - started)
        if self.peer is not None:
            case.peer = self.peer.judge(self, setting, arch, defect, accepted)
        shutil.rmtree(my_path.parent, ignore_errors=True)
        return case


# --------------------------------------------------------------------------- msprobe side by side

MSPROBE_SETUP = (
    "python3 -m venv /tmp/zoo-peer && echo $PWD/.venv/lib/python3.11/site-packages > "
    "/tmp/zoo-peer/lib/python3.11/site-packages/llmcheck_venv.pth && "
    "/tmp/zoo-peer/bin/pip install mindstudio-probe"
)


def msprobe_problem() -> str | None:
    """Return why msprobe cannot run in this interpreter (the exact error), or None when it can."""
    try:
        from msprobe.core.compare.find_first.analyzer import DiffAnalyzer  # noqa: F401
        from msprobe.pytorch import PrecisionDebugger  # noqa: F401
        from msprobe.pytorch.compare.pt_compare import pt_compare  # noqa: F401
    except Exception as exc:  # any import failure is the answer: msprobe cannot run here
        return f"{type(exc).__name__}: {exc} (set up a side environment: {MSPROBE_SETUP})"
    return None


@contextlib.contextmanager
def _quiet_fds() -> Iterator[None]:
    """Send file descriptors 1 and 2 to /dev/null (msprobe logs every step and draws progress bars)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for descriptor in saved:
                os.close(descriptor)


def msprobe_module(name: str) -> tuple[str, str]:
    """Return (module path, io) of an msprobe L0 name.

    ``Module.model.layers.1.mlp.down_proj.Linear.forward.0[.output.0]`` -> (``model.layers.1.mlp.down_proj``,
    ``output``); a ``parameters.weight`` row counts as the module's own (``output``), ``kwargs`` as ``input``.
    """
    body = name[len("Module.") :] if name.startswith("Module.") else name
    head, marker, tail = body.partition(".forward.")
    module = head.rsplit(".", 1)[0] if marker else body
    part = tail.split(".")[1] if marker and "." in tail else ""
    io = {"input": "input", "kwargs": "input", "output": "output", "parameters": "output"}.get(part, "")
    return module, io


#: msprobe's two answers per case, and how the table names them
PEER_READINGS = {"da": "-da", "compare": "compare"}


class MsprobePeer:
    """Runs msprobe on the same case: its L0 (module) tensor dump, ``compare`` and ``compare -da``.

    Two readings of msprobe's answer, both in execution order:

    * ``-da`` (diff analyse, "find the first diff node"): the module it names in
      ``diff_analyze_*.json``; a hit when that module is an accepted culprit (any io: -da
      names modules, not tensors); nothing named on a clean run is right, anything named is
      a false culprit.
    * ``compare``: the first row of ``compare_result_*.csv`` whose ``Result`` is not ``pass``,
      read as (module, io) like llmcheck's rows.

    msprobe's ``PrecisionDebugger`` is a process-wide singleton with one dump path, so every
    run is one ``step`` of it, moved afterwards into a folder of its own (``rank0``, the
    layout ``-da`` expects). Only the module-level settings are run: ``-da`` judges recorded
    statistics in any case, and msprobe's L1 API names carry no module path to score.
    """

    def __init__(self) -> None:
        self._goldens: dict[tuple[str, str], Path] = {}
        self._debugger: Any = None

    def _dump(self, workdir: Path, model: torch.nn.Module, ids: torch.Tensor, label: str) -> Path:
        from msprobe.pytorch import PrecisionDebugger

        root = workdir / "msprobe_steps"
        with _quiet_fds():
            if self._debugger is None:
                self._debugger = PrecisionDebugger(task="tensor", dump_path=str(root), level="L0")
            PrecisionDebugger.start(model=model)
            with torch.no_grad():
                model(ids)
            PrecisionDebugger.stop()
            PrecisionDebugger.step()
        newest = max(root.glob("step*/proc*"), key=lambda path: int(path.parent.name[len("step") :]))
        target = workdir / f"msprobe_{label}"
        target.mkdir(parents=True, exist_ok=True)
        shutil.move(str(newest), target / "rank0")
        shutil.rmtree(newest.parent, ignore_errors=True)
        return target

    def judge(
        self, zoo: Zoo, setting: Setting, arch: Arch, defect: str, accepted: Sequence[Accepted]
    ) -> dict[str, Any]:
        """Return msprobe's marks for one case (empty when the setting is not one msprobe is run on)."""
        from msprobe.core.compare.find_first.analyzer import DiffAnalyzer
        from msprobe.pytorch.compare.pt_compare import pt_compare

        if setting.capture != "module" or setting.noise_twin:
            return {}
        golden_key = (arch.name, setting.golden_dtype)
        if golden_key not in self._goldens:
            model = copy.deepcopy(zoo.model(arch)).to(DTYPES[setting.golden_dtype])
            self._goldens[golden_key] = self._dump(
                zoo.workdir, model, input_ids(arch), f"golden_{arch.name}_{setting.golden_dtype}"
            )
        model = copy.deepcopy(zoo.model(arch))
        if defect != CLEAN:
            DEFECTS[defect].inject(model, arch, arch.layer(defect_layer(arch, defect)))
        model.to(DTYPES[setting.my_dtype])
        my_root = self._dump(zoo.workdir, model, input_ids(arch), "my")
        golden_root = self._goldens[golden_key]
        compare_out, analyse_out = my_root / "compare", my_root / "diff_analyze"
        compare_out.mkdir()
        analyse_out.mkdir()
        with _quiet_fds():
            pt_compare(
                {
                    "npu_path": str(my_root / "rank0" / "dump.json"),
                    "bench_path": str(golden_root / "rank0" / "dump.json"),
                    "is_print_compare_log": False,
                },
                str(compare_out),
            )
            DiffAnalyzer(str(my_root), str(golden_root), str(analyse_out)).analyze()
        marks = {"da": self._read_diff_analyze(analyse_out), "compare": self._read_compare(compare_out)}
        shutil.rmtree(my_root, ignore_errors=True)
        return self._score(marks, defect, accepted)

    @staticmethod
    def _read_diff_analyze(folder: Path) -> tuple[str, str] | None:
        for path in sorted(folder.glob("diff_analyze_*.json")):
            nodes = json.loads(path.read_text()).get("rank_0") or []
            if nodes:
                return msprobe_module(nodes[0]["op_name"])[0], ""
        return None

    @staticmethod
    def _read_compare(folder: Path) -> tuple[str, str] | None:
        import csv

        for path in sorted(folder.glob("compare_result_*.csv")):
            with path.open(newline="") as handle:
                for row in csv.DictReader(handle):
                    if row.get("Result", "pass") != "pass":
                        return msprobe_module(row["NPU Name"])
        return None

    @staticmethod
    def _score(marks: dict[str, tuple[str, str] | None], defect: str, accepted: Sequence[Accepted]) -> dict[str, Any]:
        scored: dict[str, Any] = {}
        for reading, named in marks.items():
            scored[f"{reading}_blamed"] = "nothing" if named is None else " ".join(filter(None, named))
            if defect == CLEAN:
                scored[reading] = "FALSE-CULPRIT" if named is not None else "clean-ok"
            else:
                scored[reading] = (
                    "HIT"
                    if named is not None
                    and any(
                        named[0] == culprit.module and (not named[1] or named[1] in culprit.ios) for culprit in accepted
                    )
                    else "miss"
                )
        return scored


# --------------------------------------------------------------------------- tables


def setting_table(results: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Return one row per setting: hit rate, false culprits on clean runs, mean introduced rows per defect case."""
    table = []
    for name in dict.fromkeys(result.setting for result in results):
        cases = [r for r in results if r.setting == name and not r.is_clean]
        clean = [r for r in results if r.setting == name and r.is_clean]
        hits = sum(1 for r in cases if r.hit)
        row: dict[str, Any] = {
            "setting": name,
            "hits": hits,
            "cases": len(cases),
            "hit_rate": hits / len(cases) if cases else None,
            "clean_runs": len(clean),
            "false_culprits": sum(1 for r in clean if r.false_culprit),
            "mean_introduced_rows": (sum(r.introduced_rows for r in cases) / len(cases)) if cases else None,
        }
        for reading in PEER_READINGS:
            peer_cases = [r for r in cases if reading in r.peer]
            if peer_cases:
                row[f"msprobe_{reading}_hits"] = sum(1 for r in peer_cases if r.peer[reading] == "HIT")
                row[f"msprobe_{reading}_cases"] = len(peer_cases)
                row[f"msprobe_{reading}_false_culprits"] = sum(
                    1 for r in clean if r.peer.get(reading) == "FALSE-CULPRIT"
                )
        table.append(row)
    return table


def _rate(hits: int, cases: int) -> str:
    return f"{hits}/{cases} ({100 * hits / cases:.0f} %)" if cases else "-"


def format_table(table: Sequence[dict[str, Any]]) -> str:
    """Return the per-setting table as a markdown table (msprobe's columns when it was run)."""
    readings = [reading for reading in PEER_READINGS if any(f"msprobe_{reading}_cases" in row for row in table)]
    header = "| setting | hit rate | false culprits (clean runs) | mean introduced rows |"
    for reading in readings:
        header += f" msprobe {PEER_READINGS[reading]} hit rate | msprobe {PEER_READINGS[reading]} false culprits |"
    lines = [header, "|" + "---|" * header.count(" |")]
    for row in table:
        mean = f"{row['mean_introduced_rows']:.1f}" if row["mean_introduced_rows"] is not None else "-"
        line = (
            f"| {row['setting']} | {_rate(row['hits'], row['cases'])} | "
            f"{row['false_culprits']} of {row['clean_runs']} | {mean} |"
        )
        for reading in readings:
            if f"msprobe_{reading}_cases" in row:
                line += (
                    f" {_rate(row[f'msprobe_{reading}_hits'], row[f'msprobe_{reading}_cases'])} | "
                    f"{row[f'msprobe_{reading}_false_culprits']} of {row['clean_runs']} |"
                )
            else:
                line += " - | - |"
        lines.append(line)
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def _names(text: str | None, known: Sequence[str], flag: str, program: str = "bug_zoo") -> list[str]:
    if not text:
        return list(known)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"{program}: error: {flag}: unknown {unknown[0]!r} (known: {', '.join(known)})")
    return names


def plan(settings: Sequence[str], archs: Sequence[str], defects: Sequence[str]) -> list[tuple[Setting, Arch, str]]:
    """Return the cases to run: every setting x arch x (defects + a clean control)."""
    return [(SETTINGS[s], ARCHS[a], d) for s in settings for a in archs for d in [*defects, CLEAN]]


def run_zoo(
    settings: Sequence[str],
    archs: Sequence[str],
    defects: Sequence[str],
    *,
    peer: Any = None,
    workdir: Path | None = None,
    echo: Callable[[str], None] = print,
) -> list[CaseResult]:
    """Run the cases and return their results, echoing one line per case."""
    torch.set_num_threads(1)
    if any(SETTINGS[name].noise_twin for name in settings) and not noise_supported():
        echo("noise twin: not supported by this llmcheck (compare_dumps takes no 'noise'); its setting is skipped")
        settings = [name for name in settings if not SETTINGS[name].noise_twin]
    results = []
    with contextlib.ExitStack() as stack:
        root = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bug_zoo_")))
        zoo = Zoo(root, peer)
        for setting, arch, defect in plan(settings, archs, defects):
            result = zoo.run_case(setting, arch, defect)
            echo(result.line())
            results.append(result)
    return results


def defect_catalogue(archs: Sequence[str], defects: Sequence[str]) -> list[str]:
    """Return one line per defect and arch: where it is injected and the culprits that count as a hit."""
    lines = []
    for arch_name in archs:
        arch = ARCHS[arch_name]
        model = build_model(arch)
        for name in defects:
            layer = defect_layer(arch, name)
            accepted = DEFECTS[name].inject(copy.deepcopy(model), arch, arch.layer(layer))
            lines.append(f"{arch.name:<6} {name:<20} L{layer}  accepted: {', '.join(c.text() for c in accepted)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"fast subset: {', '.join(QUICK_ARCHS)} x {len(QUICK_DEFECTS)} defects x {', '.join(QUICK_SETTINGS)}",
    )
    parser.add_argument("--settings", help=f"comma-separated, of: {', '.join(SETTINGS)}")
    parser.add_argument("--archs", help=f"comma-separated, of: {', '.join(ARCHS)}")
    parser.add_argument("--defects", help=f"comma-separated, of: {', '.join(DEFECTS)}")
    parser.add_argument("--json", type=Path, help="write every case's result and the tables here")
    parser.add_argument(
        "--list", action="store_true", help="print each defect's layer and accepted culprits, run nothing"
    )
    parser.add_argument(
        "--peer",
        action="store_true",
        help="also run msprobe (mindstudio-probe) on the same cases and print its hit rate beside",
    )
    parser.add_argument(
        "--no-weight-digests",
        action="store_true",
        help="capture without the modules' parameter digests: only the activations decide (how the "
        "method fares on a defect in code, which no weight check can see)",
    )
    options = parser.parse_args(argv)
    if options.no_weight_digests:
        CAPTURE_OPTIONS["weight_digests"] = False
    settings = _names(
        options.settings or (",".join(QUICK_SETTINGS) if options.quick else None), list(SETTINGS), "--settings"
    )
    archs = _names(options.archs or (",".join(QUICK_ARCHS) if options.quick else None), list(ARCHS), "--archs")
    defects = _names(
        options.defects or (",".join(QUICK_DEFECTS) if options.quick else None), list(DEFECTS), "--defects"
    )
    if options.list:
        torch.set_num_threads(1)
        for name in defects:
            print(f"{name:<20} {DEFECTS[name].what}")
        print()
        print("\n".join(defect_catalogue(archs, defects)))
        return 0
    peer = None
    if options.peer:
        problem = msprobe_problem()
        if problem:
            print(f"msprobe: cannot run here: {problem}")
        else:
            peer = MsprobePeer()
    started = time.perf_counter()
    results = run_zoo(settings, archs, defects, peer=peer)
    table = setting_table(results)
    print()
    print(format_table(table))
    elapsed_s = time.perf_counter() - started
    print(f"\n{len(results)} cases in {elapsed_s:.0f} s (torch {torch.__version__}, 1 thread)")
    if options.json:
        options.json.write_text(
            json.dumps(
                {"elapsed_s": round(elapsed_s, 1), "settings": table, "cases": [asdict(result) for result in results]},
                indent=1,
            )
        )
        print(f"wrote {options.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
