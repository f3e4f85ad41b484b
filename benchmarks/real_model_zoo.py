"""The real-model zoo: hit rate and false culprits on the bundled SmolLM2-135M, whose weights are trained.

The bug zoo (``bug_zoo.py``) measures llmcheck on seeded random-weight models. Trained models
are different: they carry massive activations (a few channels of the residual stream hundreds
of times larger than the rest), outlier channels, and layers whose residual branch nearly
cancels the stream. Relative error is not conserved through such a sum, so a rule tuned on
random weights can blame a clean layer. This script asks the user's question on the real
model: after a golden fp32 run and a run in lower precision -- clean, or with one defect --
does llmcheck name nothing, or the broken module?

Prompts (``PROMPTS``): eight, of different lengths and kinds -- prose, a question, code, a
chat template, a list of numbers, French, a story, and a long text near 512 tokens.

Clean controls: every prompt, the my-run being the golden program at bf16 or fp16, captured
at module level (full tensors), statistics only, op level (bf16) and op level on statistics
alone (``-op-stats``; the op-level settings on four shorter prompts). Any failing row or
named culprit is a FALSE CULPRIT.

Defects (``DEFECTS``), each injected into one decoder layer: the first (0), a middle (14) and
the last (29); each case takes its own prompt (defects and layers rotate over the prompts).
Weight defects (a weight x1.02, int8 rounding, 1 % of the gate/up rows swapped) and code
defects (a norm epsilon, the softmax scale, GELU for SiLU, the rotary base of another model
version, the residual stream scaled by 0.98 before the attention branch is added). Settings:
the my-run at fp32, fp16 and bf16 against the fp32 golden, and bf16 with a noise twin (the
golden program cast to bf16, as ``llmcheck dump --as-dtype bf16`` makes it); each with the
modules' weight digests and without them (``-nodigest``: only the activations decide, so
the method's own power on weight defects stays visible).

Scoring is the bug zoo's (``bug_zoo.score``): a HIT when the culprit llmcheck names is the
defective module, or for a defect in code that no recorded submodule runs (the attention
core, the residual add), the enclosing module or the input of the module that first receives
the result.

    python benchmarks/real_model_zoo.py                    # everything (about 20 minutes here)
    python benchmarks/real_model_zoo.py --clean-only       # the clean controls alone
    python benchmarks/real_model_zoo.py --settings bf16/fp32,bf16/fp32+twin --defects norm_eps_1e-2
    python benchmarks/real_model_zoo.py --settings fp32/fp32-op,bf16/fp32-op-defects   # by hand: op level
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bug_zoo  # the bug zoo's defects, capture and scoring, shared

SMOLLM2 = bug_zoo.Arch(
    "smollm2", "LlamaConfig", 30, {}, "sdpa", fused_qkv=False, fused_gate_up=False, activation="act_fn"
)
DEFECT_LAYERS = (0, 14, 29)
LONG_PARAGRAPH = (
    "The history of computing is a history of abstraction. Early machines were programmed by "
    "rewiring panels; later, instructions were stored in memory beside the data they changed. "
    "Assembly languages named the instructions, compilers translated formulas into them, and "
    "operating systems hid the hardware behind files and processes. Each layer let people think "
    "about a problem rather than the machine, and each layer, in turn, became the machine that "
    "the next generation took for granted. "
)
PROMPTS: dict[str, str | list[dict[str, str]]] = {
    "prose": "The capital of France is Paris. The capital of Germany is",
    "question": "Why is the sky blue during the day but red at sunset? Explain it simply.",
    "code": "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\nprint(",
    "chat": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Give me three tips for writing clear documentation."},
    ],
    "numbers": "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987,",
    "french": "Il était une fois, dans un petit village au bord de la mer, une vieille femme qui",
    "story": (
        "Once upon a time, a curious robot named Pip lived in a lighthouse. Every night it counted "
        "the ships that passed, and every morning it wrote their names in a big blue book. One day"
    ),
    "long": LONG_PARAGRAPH * 6 + "In short, the lesson of this history is that",
}


def prompt_ids(tokenizer: Any, prompt: str | list[dict[str, str]]) -> torch.Tensor:
    """Return the token ids of one prompt (a chat is laid out by the model's own chat template)."""
    if isinstance(prompt, list):
        encoded = tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        return encoded["input_ids"]
    return tokenizer(prompt, return_tensors="pt").input_ids


# --------------------------------------------------------------------------- defects of this zoo

Accepted = bug_zoo.Accepted


def inject_down_proj_x102(model: torch.nn.Module, arch: bug_zoo.Arch, layer: str) -> list[Accepted]:
    path = f"{layer}.mlp.down_proj"
    with torch.no_grad():
        model.get_submodule(path).weight.mul_(1.02)
    return [Accepted(path)]


def inject_gate_up_rows_swapped(model: torch.nn.Module, arch: bug_zoo.Arch, layer: str) -> list[Accepted]:
    """Swap 1 % of the rows between gate_proj and up_proj (a shard laid out in the wrong order)."""
    mlp = model.get_submodule(f"{layer}.mlp")
    rows = slice(0, max(1, mlp.gate_proj.weight.shape[0] // 100))
    with torch.no_grad():
        gate = mlp.gate_proj.weight[rows].clone()
        mlp.gate_proj.weight[rows] = mlp.up_proj.weight[rows]
        mlp.up_proj.weight[rows] = gate
    return [Accepted(f"{layer}.mlp.gate_proj"), Accepted(f"{layer}.mlp.up_proj")]


def inject_residual_scale(model: torch.nn.Module, arch: bug_zoo.Arch, layer: str) -> list[Accepted]:
    """Scale the residual stream by 0.98 where the attention branch is added to it (code of the layer itself)."""
    decoder = model.get_submodule(layer)

    def forward(original: Callable[..., Any], hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        residual = hidden_states
        attended, _ = decoder.self_attn(hidden_states=decoder.input_layernorm(hidden_states), **kwargs)
        hidden_states = 0.98 * residual + attended
        return hidden_states + decoder.mlp(decoder.post_attention_layernorm(hidden_states))

    bug_zoo._wrap_forward(decoder, forward)
    # the sum is made by the layer's own code: the layer, or where it is first seen
    return [Accepted(layer), Accepted(f"{layer}.post_attention_layernorm", ("input",))]


@dataclass(frozen=True)
class Defect:
    name: str
    what: str
    inject: Callable[[torch.nn.Module, bug_zoo.Arch, str], list[Accepted]]


DEFECTS: dict[str, Defect] = {
    defect.name: defect
    for defect in [
        Defect("down_proj_x1.02", "mlp.down_proj weight x1.02", inject_down_proj_x102),
        Defect("o_proj_int8", "o_proj weight rounded to per-tensor int8", bug_zoo.inject_o_proj_int8),
        Defect("gate_up_rows_1pct", "1 % of the gate/up projection rows swapped", inject_gate_up_rows_swapped),
        Defect("norm_eps_1e-2", "post_attention_layernorm epsilon 1e-5 -> 1e-2", bug_zoo.inject_norm_epsilon),
        Defect("softmax_scale_x1.1", "attention softmax scale x1.1", bug_zoo.inject_softmax_scale),
        Defect("act_silu_to_gelu", "MLP activation SiLU -> GELU", bug_zoo.inject_activation_swap),
        Defect("rope_theta_5e5", "rotary base 1e5 -> 5e5 in one layer", bug_zoo.inject_rope_theta),
        Defect("residual_x0.98", "residual stream x0.98 before the attention branch is added", inject_residual_scale),
    ]
}
CLEAN = bug_zoo.CLEAN


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setting:
    name: str
    my_dtype: str
    capture: str  # "module", "stats", "op", "op-stats", "generate" or "generate-stats"
    noise_twin: bool = False
    weight_digests: bool = True
    clean_only: bool = False  # a clean control only: no defect cases
    defects_only: bool = False  # defect cases only: another setting holds its clean controls
    by_hand: bool = False  # run only when --settings names it (op-level defect cases take long)


SETTINGS: dict[str, Setting] = {
    setting.name: setting
    for setting in [
        Setting("bf16/fp32", "bf16", "module"),
        Setting("fp16/fp32", "fp16", "module"),
        Setting("bf16/fp32-stats", "bf16", "stats", clean_only=True),
        Setting("fp16/fp32-stats", "fp16", "stats", clean_only=True),
        Setting("bf16/fp32-op", "bf16", "op", clean_only=True),
        # op level on statistics alone: the norms' upcast ops hold the massive activations squared
        Setting("bf16/fp32-op-stats", "bf16", "op-stats", clean_only=True),
        Setting("fp16/fp32-op-stats", "fp16", "op-stats", clean_only=True),
        # a greedy decode of 8 tokens: the steps after the prefill, one token each
        Setting("bf16/fp32-generate", "bf16", "generate", clean_only=True),
        Setting("fp16/fp32-generate", "fp16", "generate", clean_only=True),
        Setting("bf16/fp32-generate-stats", "bf16", "generate-stats", clean_only=True),
        Setting("fp16/fp32-generate-stats", "fp16", "generate-stats", clean_only=True),
        Setting("fp32/fp32", "fp32", "module"),
        Setting("bf16/fp32+twin", "bf16", "module", noise_twin=True),
        Setting("fp32/fp32-nodigest", "fp32", "module", weight_digests=False),
        Setting("fp16/fp32-nodigest", "fp16", "module", weight_digests=False),
        Setting("bf16/fp32-nodigest", "bf16", "module", weight_digests=False),
        Setting("bf16/fp32+twin-nodigest", "bf16", "module", noise_twin=True, weight_digests=False),
        Setting("fp32/fp32-op", "fp32", "op", by_hand=True),
        Setting("bf16/fp32-op-defects", "bf16", "op", defects_only=True, by_hand=True),
        Setting("bf16/fp32-op-stats-defects", "bf16", "op-stats", defects_only=True, by_hand=True),
        Setting("fp16/fp32-op-stats-defects", "fp16", "op-stats", defects_only=True, by_hand=True),
        # statistics alone, activations alone (no digests name a weight defect): the statistics rules' hit rate
        Setting("bf16/fp32-stats-nodigest", "bf16", "stats", weight_digests=False, defects_only=True, by_hand=True),
        Setting("fp16/fp32-stats-nodigest", "fp16", "stats", weight_digests=False, defects_only=True, by_hand=True),
    ]
}
#: op-level dumps of the long prompt are large: the op-level control runs on the shorter prompts
OP_LEVEL_PROMPTS = ("prose", "question", "code", "chat")
#: ... and the op-level defect cases leave out those that fall on the long prompt (21 cases of 24)
OP_LEVEL_SKIPPED_PROMPTS = ("long",)


def case_prompt(defect: str, layer: int) -> str:
    """Return the prompt a defect case runs on: defects and layers rotate over the prompts."""
    names = list(PROMPTS)
    return names[(list(DEFECTS).index(defect) * len(DEFECT_LAYERS) + DEFECT_LAYERS.index(layer)) % len(names)]


def cast(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """Return the model at ``dtype`` as ``from_pretrained(dtype=...)`` gives it: the rotary frequencies stay fp32.

    ``model.to(torch.bfloat16)`` also rounds the rotary embedding's ``inv_freq`` buffer, which
    ``from_pretrained`` keeps in fp32: at position 600 the angles are then off by up to a
    radian, a real defect of the cast that llmcheck names (``model.rotary_emb``), not the
    rounding noise of a bf16 run. The clean controls run the model as a user loads it.
    """
    frequencies = {name: buffer.clone() for name, buffer in model.named_buffers() if name.endswith("inv_freq")}
    model.to(bug_zoo.DTYPES[dtype])
    for name, buffer in frequencies.items():
        model.get_buffer(name).data = buffer
    return model


#: Tokens a generate setting decodes greedily: the prefill is step 0, each new token a step after it.
GENERATED_TOKENS = 8


def capture(model: torch.nn.Module, ids: torch.Tensor, dump_path: Path, setting: Setting) -> Path:
    """Run one forward pass (or a greedy generate) under the bug zoo's capture of this setting's mode."""
    if not setting.capture.startswith("generate"):
        return bug_zoo.capture_run(model, ids, dump_path, setting.capture, weight_digests=setting.weight_digests)
    from llmcheck import DumpConfig, register_hook

    config = DumpConfig(
        dump_path=str(dump_path),
        token_range=list(range(GENERATED_TOKENS)),
        tensor_part=2,
        statistics_only=setting.capture == "generate-stats",
        weight_digests=setting.weight_digests,
    )
    with register_hook(model, config) as handle, torch.no_grad():
        model.generate(ids, max_new_tokens=GENERATED_TOKENS, do_sample=False)
    assert handle.path is not None
    return Path(handle.path)


class RealZoo:
    """Runs cases on SmolLM2, keeping one golden per (prompt, capture, digests) and one twin per (prompt, dtype)."""

    def __init__(self, workdir: Path) -> None:
        from llmcheck.bundled_model import load_smollm2

        self.workdir = workdir
        self.model, self.tokenizer = load_smollm2()
        self.ids = {name: prompt_ids(self.tokenizer, prompt) for name, prompt in PROMPTS.items()}
        self._dumps: dict[tuple[Any, ...], Path] = {}
        self._runs = 0

    def _dump(self, key: tuple[Any, ...], prompt: str, dtype: str, setting: Setting) -> Path:
        if key not in self._dumps:
            self._runs += 1
            model = self.model if dtype == "fp32" else cast(copy.deepcopy(self.model), dtype)
            folder = self.workdir / f"{self._runs:04d}_{'_'.join(map(str, key))}".replace("/", "-")
            self._dumps[key] = capture(model, self.ids[prompt], folder, setting)
        return self._dumps[key]

    def golden(self, prompt: str, setting: Setting) -> Path:
        return self._dump(("golden", prompt, setting.capture, setting.weight_digests), prompt, "fp32", setting)

    def twin(self, prompt: str, setting: Setting) -> Path:
        key = ("twin", prompt, setting.my_dtype, setting.capture, setting.weight_digests)
        return self._dump(key, prompt, setting.my_dtype, setting)

    def run_case(self, setting: Setting, defect: str, layer: int | None, prompt: str) -> bug_zoo.CaseResult:
        from llmcheck.core.compare import compare_dumps
        from llmcheck.core.plugins import get_plugins

        started = time.perf_counter()
        golden = self.golden(prompt, setting)
        accepted: list[Accepted] = []
        if defect == CLEAN:
            my_path = self.twin(prompt, setting) if setting.my_dtype != "fp32" else None
            if my_path is None:
                raise ValueError("an fp32 clean control compares the golden with itself")
            owned = False
        else:
            model = copy.deepcopy(self.model)
            assert layer is not None
            accepted = DEFECTS[defect].inject(model, SMOLLM2, SMOLLM2.layer(layer))
            cast(model, setting.my_dtype)
            self._runs += 1
            my_path = capture(model, self.ids[prompt], self.workdir / f"{self._runs:04d}_my", setting)
            del model
            owned = True
        plugins = get_plugins()
        options: dict[str, Any] = {}
        if setting.noise_twin:
            options["noise"] = plugins.load_tensors(self.twin(prompt, setting))
        result = compare_dumps(plugins.load_tensors(golden), plugins.load_tensors(my_path), workers=1, **options)
        scoring = bug_zoo.Setting(setting.name, setting.my_dtype, "fp32", setting.capture, setting.noise_twin)
        case = bug_zoo.score(scoring, prompt, defect, layer, accepted, result, time.perf_counter() - started)
        if owned:
            shutil.rmtree(my_path.parent, ignore_errors=True)
        return case


def plan(settings: Sequence[str], defects: Sequence[str], clean: bool) -> list[tuple[Setting, str, int | None, str]]:
    """Return the cases: (setting, defect or clean, layer, prompt)."""
    cases: list[tuple[Setting, str, int | None, str]] = []
    for name in settings:
        setting = SETTINGS[name]
        if clean and setting.my_dtype != "fp32" and not setting.noise_twin and not setting.defects_only:
            prompts = OP_LEVEL_PROMPTS if setting.capture in ("op", "op-stats") else tuple(PROMPTS)
            cases.extend((setting, CLEAN, None, prompt) for prompt in prompts)
        if not setting.clean_only:
            cases.extend(
                (setting, defect, layer, case_prompt(defect, layer))
                for defect in defects
                for layer in DEFECT_LAYERS
                if not (
                    setting.capture in ("op", "op-stats") and case_prompt(defect, layer) in OP_LEVEL_SKIPPED_PROMPTS
                )
            )
    return cases


def table(results: Sequence[bug_zoo.CaseResult]) -> str:
    """Return one table: per setting, the hit rate over defects and the false culprits over clean controls."""
    lines = [f"{'setting':<24} {'hits':>12} {'false culprits':>16} {'suspects':>9}  missed"]
    for name in dict.fromkeys(result.setting for result in results):
        mine = [result for result in results if result.setting == name]
        defects = [result for result in mine if not result.is_clean]
        clean = [result for result in mine if result.is_clean]
        hits = sum(1 for result in defects if result.hit)
        false = sum(1 for result in clean if result.false_culprit)
        hit_text = f"{hits}/{len(defects)} {100 * hits / len(defects):.0f}%" if defects else "-"
        false_text = f"{false}/{len(clean)}" if clean else "-"
        missed = ", ".join(f"{r.defect}@L{r.layer}{' (suspect)' if r.suspected else ''}" for r in defects if not r.hit)
        suspected = sum(1 for result in defects if result.suspected)  # misses still named as a noise suspect
        lines.append(f"{name:<24} {hit_text:>12} {false_text:>16} {suspected:>9}  {missed}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settings", help=f"comma-separated, of: {', '.join(SETTINGS)}")
    parser.add_argument("--defects", help=f"comma-separated, of: {', '.join(DEFECTS)}")
    parser.add_argument("--clean-only", action="store_true", help="run the clean controls alone")
    parser.add_argument("--no-clean", action="store_true", help="run the defect cases alone")
    parser.add_argument("--json", type=Path, help="write every case's result here")
    options = parser.parse_args(argv)
    settings = bug_zoo._names(options.settings, list(SETTINGS), "--settings", "real_model_zoo")
    if not options.settings:  # the op-level defect cases run when named
        settings = [name for name in settings if not SETTINGS[name].by_hand]
    defects = (
        [] if options.clean_only else bug_zoo._names(options.defects, list(DEFECTS), "--defects", "real_model_zoo")
    )
    torch.set_num_threads(1)
    started = time.perf_counter()
    results = []
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="real_zoo_")))
        zoo = RealZoo(root)
        for name in PROMPTS:
            print(f"prompt {name:<9} {zoo.ids[name].shape[1]:>4} tokens")
        for setting, defect, layer, prompt in plan(settings, defects, clean=not options.no_clean):
            result = zoo.run_case(setting, defect, layer, prompt)
            print(result.line().replace(f" {result.arch:<6} ", f" {prompt:<8} "), flush=True)
            results.append(result)
    print()
    print(table(results))
    elapsed_s = time.perf_counter() - started
    print(f"\n{len(results)} cases in {elapsed_s:.0f} s (SmolLM2-135M, torch {torch.__version__}, 1 thread)")
    if options.json:
        options.json.write_text(json.dumps([asdict(result) for result in results], indent=1))
        print(f"wrote {options.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
