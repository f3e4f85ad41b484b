"""vLLM against transformers on SmolLM2-135M: clean runs and defects injected into vLLM, as llmcheck names them.

Each case runs a real vLLM (the V1 engine, eager mode) under ``llmcheck dump --backend vllm``
with a defect injected into its model in one decoder layer, and compares it against a
transformers golden of the same prompt (fp32), in fp32 and in bf16 (then with a
transformers-bf16 noise twin: the golden program under ``--as-dtype bf16``). A case is hit
when the culprit the compare names is the defect's vLLM module. Clean runs must name nothing.
It also times vLLM plain against vLLM under capture (statistics only, and full tensors).

Usage::

    LLMCHECK_VLLM_PYTHON=/path/to/venv-with-vllm/bin/python python benchmarks/vllm_zoo.py [--out DIR]

vLLM runs with the interpreter ``LLMCHECK_VLLM_PYTHON`` names (vLLM pins another transformers
than llmcheck's tests; it needs llmcheck installed too), else this one if it imports vLLM.
``tests/test_vllm_capture.py`` runs the same cases.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

VLLM_PYTHON_ENV = "LLMCHECK_VLLM_PYTHON"
#: About 40 tokens: a prompt of a few tokens hides what only far positions show (a rotary table's error).
PROMPT = (
    "The Eiffel Tower was built for the 1889 World's Fair in Paris. At first many artists criticised "
    "its design, but today it is one of the most visited monuments in the world, and its height is"
)
NEW_TOKENS = 8
#: The decoder layer each defect is injected into (SmolLM2-135M has 30).
LAYER = 14

GOLDEN_PROGRAM = """\
import json, sys
import torch
from llmcheck.bundled_model import load_smollm2

torch.set_num_threads(1)
model, tokenizer = load_smollm2()
ids = tokenizer(sys.argv[1], return_tensors="pt").input_ids
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=int(sys.argv[2]), do_sample=False)
print(json.dumps(out[0, ids.shape[1]:].tolist()))
"""

#: The vLLM program: an unmodified offline script but for the defect, injected through vLLM's own
#: ``LLM.apply_model`` (it reaches the model in whichever process runs it).
VLLM_PROGRAM = """\
import json, sys
from vllm import LLM, SamplingParams

model_path, dtype, defect, layer, prompt, new_tokens, mode = sys.argv[1:8]


def inject(model, defect=defect, layer=int(layer)):
    import copy
    import torch

    block = model.model.layers[layer]
    attention, mlp = block.self_attn, block.mlp
    if defect == "rope_theta":  # a wrong rope theta in this layer's rotary table
        rope = copy.deepcopy(attention.rotary_emb)
        rope.base = rope.base * 4
        rope.cos_sin_cache = rope._compute_cos_sin_cache().to(rope.cos_sin_cache.dtype)
        attention.rotary_emb = rope
    elif defect == "norm_eps":  # a fused norm kernel's hard-coded epsilon
        block.post_attention_layernorm.variance_epsilon = 1e-1
    elif defect == "kv_swap":  # k and v exchanged where the fused qkv output is split
        q, kv = attention.q_size, attention.kv_size

        def swap(module, args, output):
            qkv, bias = output
            q_part, k_part, v_part = qkv.split([q, kv, kv], dim=-1)
            return torch.cat([q_part, v_part, k_part], dim=-1), bias

        attention.qkv_proj.register_forward_hook(swap)
    elif defect == "o_proj_scale":  # a stray scale on one projection's output

        def scale(module, args, output):
            return output[0] * 1.05, output[1]

        attention.o_proj.register_forward_hook(scale)
    elif defect == "dropped_residual":  # the attention's residual add left out of the fused norm

        def drop(module, args):
            return (args[0], torch.zeros_like(args[1]))

        block.post_attention_layernorm.register_forward_pre_hook(drop)
    elif defect == "attn_scale":  # the attention kernel's softmax scale
        attention.attn.impl.scale = attention.attn.impl.scale * 1.25
    elif defect not in ("none", *CHECKPOINT_DEFECTS):
        raise SystemExit(f"unknown defect {defect}")


CHECKPOINT_DEFECTS = ("up_shard",)  # in the weights vLLM loads: see write_checkpoint


def main():
    llm = LLM(
        model=model_path,
        dtype=dtype,
        enforce_eager=mode in ("eager", "timed"),
        gpu_memory_utilization=0.1,
        max_model_len=512,
        seed=0,
    )
    if defect not in ("none", *CHECKPOINT_DEFECTS):
        llm.apply_model(inject)
    import time

    started = time.perf_counter()
    sampling = SamplingParams(max_tokens=int(new_tokens), temperature=0, ignore_eos=mode == "timed")
    out = llm.generate([prompt], sampling)[0]
    print(json.dumps({"generate_s": time.perf_counter() - started}))
    print(json.dumps(list(out.outputs[0].token_ids)))


if __name__ == "__main__":  # vLLM's engine process is spawned: it imports this file again
    main()
"""


@dataclass(frozen=True)
class Defect:
    """A defect injected into vLLM's model in one layer, and the vLLM module llmcheck must name."""

    name: str
    module: str
    what: str


DEFECTS = (
    Defect("rope_theta", "self_attn", "rope theta x4 in the layer's rotary table"),
    Defect("norm_eps", "post_attention_layernorm", "post-attention RMSNorm epsilon 1e-1"),
    Defect("kv_swap", "self_attn.qkv_proj", "k and v swapped in the qkv split"),
    Defect("o_proj_scale", "self_attn.o_proj", "o_proj output x1.05"),
    Defect("dropped_residual", "post_attention_layernorm", "residual not added in the fused norm"),
    Defect("up_shard", "mlp.gate_up_proj", "up_proj rows' halves swapped in the checkpoint (a bad shard)"),
    Defect("attn_scale", "self_attn.attn", "attention softmax scale x1.25"),
)


#: Defects in the checkpoint vLLM loads rather than in the loaded model: vLLM's CPU linears pack
#: their weights at load time (``weight`` is left empty), so a weight edited afterwards is never read.
CHECKPOINT_DEFECTS = ("up_shard",)


def write_checkpoint(model: Path, folder: Path, defect: str) -> Path:
    """Return a copy of the checkpoint with the defect in its weights (a shard loaded in the wrong place)."""
    import torch
    from safetensors.torch import load_file, save_file

    target = folder / f"checkpoint_{defect}"
    if (target / "model.safetensors").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    for item in model.iterdir():
        if item.name != "model.safetensors":
            shutil.copy2(item, target / item.name)
    weights = load_file(str(model / "model.safetensors"))
    if defect == "up_shard":  # the two halves of up_proj's rows (two tensor-parallel shards) swapped
        name = f"model.layers.{LAYER}.mlp.up_proj.weight"
        half = weights[name].shape[0] // 2
        weights[name] = torch.cat([weights[name][half:], weights[name][:half]]).contiguous()
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def vllm_python() -> str | None:
    """Return an interpreter that imports vLLM: ``$LLMCHECK_VLLM_PYTHON``, else this one if it can, else ``None``."""
    named = os.environ.get(VLLM_PYTHON_ENV)
    if named:
        return named
    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, check=False)
    return sys.executable if probe.returncode == 0 else None


def llmcheck_command() -> list[str]:
    """Return the argv that runs this interpreter's ``llmcheck``."""
    found = shutil.which("llmcheck", path=str(Path(sys.executable).parent))
    return [found] if found else ["llmcheck"]


def vllm_environment(in_process: bool = True) -> dict[str, str]:
    """Return the environment of a vLLM run: the engine in this process or its own, one thread, quiet."""
    env = dict(os.environ)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _run(command: list[str], env: dict[str, str] | None = None, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"{' '.join(command[:6])}... exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def tokens_printed(stdout: str) -> list[int]:
    """Return the token ids a program printed as its last JSON list (vLLM may log to stdout after it)."""
    return next(json.loads(line) for line in reversed(stdout.splitlines()) if line.startswith("["))


def write_programs(folder: Path) -> tuple[Path, Path]:
    """Write the golden and the vLLM program into ``folder``; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    golden, engine = folder / "golden.py", folder / "offline.py"
    golden.write_text(GOLDEN_PROGRAM, encoding="utf-8")
    engine.write_text(VLLM_PROGRAM, encoding="utf-8")
    return golden, engine


def dump_golden(folder: Path, program: Path, out: Path, *, as_dtype: str | None = None) -> list[int]:
    """Dump the transformers golden (every step) into ``out``; return the tokens it generated."""
    command = [*llmcheck_command(), "dump", "--backend", "torch", "-o", str(out), "-er", "all", "-l", "warning"]
    if as_dtype:
        command += ["--as-dtype", as_dtype]
    done = _run([*command, "--exec", shlex.join(["python", str(program), PROMPT, str(NEW_TOKENS)])])
    return tokens_printed(done.stdout)


def vllm_argv(
    python: str, program: Path, model: Path, dtype: str, defect: str, mode: str = "eager", new_tokens: int = NEW_TOKENS
) -> list[str]:
    """Return the argv of one vLLM run of the program."""
    return [python, str(program), str(model), dtype, defect, str(LAYER), PROMPT, str(new_tokens), mode]


def generate_seconds(stdout: str) -> float:
    """Return how long the program's ``generate`` took, as it printed it (the line before its tokens)."""
    return float(
        next(json.loads(line) for line in reversed(stdout.splitlines()) if '"generate_s"' in line)["generate_s"]
    )


def dump_vllm(
    python: str, program: Path, model: Path, out: Path, dtype: str, defect: str, *, extra: tuple[str, ...] = ()
) -> tuple[list[int], subprocess.CompletedProcess[str]]:
    """Dump one vLLM run (every engine step) into ``out``; return its tokens and the finished dump command."""
    if defect in CHECKPOINT_DEFECTS:
        model = write_checkpoint(model, program.parent, defect)
    argv = vllm_argv(python, program, model, dtype, defect)
    command = [*llmcheck_command(), "dump", "--backend", "vllm", "-o", str(out), "-er", "all", "-l", "warning", *extra]
    done = _run([*command, "--exec", shlex.join(argv)], env=vllm_environment())
    return tokens_printed(done.stdout), done


def compare(golden: Path, my: Path, out: Path, twin: Path | None = None) -> dict:
    """Compare two dumps with the real CLI; return its summary.json."""
    command = [*llmcheck_command(), "compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-l", "error"]
    if twin is not None:
        command += ["--noise-path", str(twin)]
    _run(command)
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


def culprit_text(summary: dict) -> str:
    """Return the compare's culprit as one text: the vLLM module, and its transformers partner where it differs."""
    culprit = summary.get("culprit") or {}
    if not culprit:
        return ""
    mine, golden = culprit.get("my_name") or culprit["name"], culprit["name"]
    return mine if mine == golden else f"{mine} (transformers: {golden})"


def names_module(summary: dict, defect: Defect) -> bool:
    """Return whether the culprit is the defect's vLLM module (or a module inside it) in the defect's layer."""
    culprit = summary.get("culprit") or {}
    named = str(culprit.get("my_name") or culprit.get("name") or "")
    wanted = f"model.layers.{LAYER}.{defect.module}"
    return named == wanted or named.startswith(wanted + ".")


#: Tokens generated by each timed run: the tokens per second of vLLM's ``generate``, plain and under capture.
TIMED_TOKENS = 64


def time_runs(
    python: str, program: Path, model: Path, folder: Path, repeats: int = 2
) -> dict[str, tuple[float, float]]:
    """Return, per mode (plain, statistics only, full tensors), the best tokens/s of ``generate`` and the run's wall s.

    Every engine step is dumped. The modes alternate within each repeat, so a slower machine
    moment hits them alike; the best of the repeats is kept.
    """
    argv = vllm_argv(python, program, model, "float32", "none", mode="timed", new_tokens=TIMED_TOKENS)
    env = vllm_environment()
    modes = {
        "plain": argv,
        "statistics only": [*llmcheck_command(), "dump", "--backend", "vllm", "-sd", "-er", "all", "-l", "error", "-o"],
        "full tensors": [*llmcheck_command(), "dump", "--backend", "vllm", "-er", "all", "-l", "error", "-o"],
    }
    best: dict[str, tuple[float, float]] = {}
    for _ in range(repeats):
        for mode, command in modes.items():
            if mode != "plain":
                target = Path(tempfile.mkdtemp(dir=folder))
                command = [*command, str(target), "--exec", shlex.join(argv)]
            started = time.perf_counter()
            done = _run(command, env=env)
            wall = time.perf_counter() - started
            rate = TIMED_TOKENS / generate_seconds(done.stdout)
            if mode not in best or rate > best[mode][0]:
                best[mode] = (rate, wall)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="keep the dumps and reports here")
    parser.add_argument("--no-timing", action="store_true", help="skip the capture-cost timing")
    options = parser.parse_args()
    python = vllm_python()
    if python is None:
        print(f"no vLLM: set {VLLM_PYTHON_ENV} to a Python that imports vllm (see docs/sources/vllm.md)")
        return 2
    from llmcheck.bundled_model import smollm2_folder

    model = smollm2_folder()
    folder = options.out or Path(tempfile.mkdtemp(prefix="llmcheck_vllm_zoo_"))
    golden_program, engine_program = write_programs(folder)
    started = time.perf_counter()
    golden_tokens = dump_golden(folder, golden_program, folder / "golden")
    dump_golden(folder, golden_program, folder / "twin", as_dtype="bf16")
    print(f"golden (transformers fp32): {golden_tokens}")
    rows = []
    for dtype in ("float32", "bfloat16"):
        twin = folder / "twin" if dtype == "bfloat16" else None
        for defect in (Defect("none", "", "clean"), *DEFECTS):
            run = folder / f"vllm_{dtype}_{defect.name}"
            tokens, _ = dump_vllm(python, engine_program, model, run, dtype, defect.name)
            summary = compare(folder / "golden", run, folder / f"report_{dtype}_{defect.name}", twin)
            counts = summary["counts"]
            if defect.name == "none":
                verdict = "clean" if not summary.get("culprit") else "FALSE CULPRIT"
            else:
                verdict = "hit" if names_module(summary, defect) else "miss"
            rows.append(
                (dtype, defect.what, verdict, counts["failures"], culprit_text(summary), tokens == golden_tokens)
            )
    print(f"\n{len(rows)} cases in {time.perf_counter() - started:.0f} s (vLLM eager, CPU; defects in layer {LAYER})")
    print("| vLLM dtype | case | verdict | failing rows | culprit (golden record, my: vLLM module) | same tokens |")
    print("|---|---|---|---|---|---|")
    for dtype, what, verdict, failures, culprit, same in rows:
        print(f"| {dtype} | {what} | {verdict} | {failures} | {culprit or '-'} | {'yes' if same else 'no'} |")
    if not options.no_timing:
        best = time_runs(python, engine_program, model, folder)
        plain_rate = best["plain"][0]
        print(
            f"\n| vLLM fp32, {TIMED_TOKENS} tokens, every step dumped (best of 2) | generate tokens/s | plain / this | whole run s |"
        )
        print("|---|---|---|---|")
        for mode, (rate, wall) in best.items():
            print(f"| {mode} | {rate:.1f} | {plain_rate / rate:.2f}x | {wall:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
