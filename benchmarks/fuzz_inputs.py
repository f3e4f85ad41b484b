"""Mutation fuzzing of every input kind llmcheck reads: a table of outcomes per kind (target: 0 internal errors).

For each of the input kinds in ``tests/fuzz_inputs.py`` (llmcheck's own index, manifest,
topology and shards, an op-level dump read by opcheck, a manual ``metadata.json``, FX
``.npy``, ATB ``.bin`` and op CSV, GE dump files and GE graph text), ``--cases`` seeded
mutations of a valid seed are run through the CLI in this process. Each ends as a clean
error naming a file, a correct load, an internal error (a bug) or a hang. Internal errors
are listed with their message.

    python benchmarks/fuzz_inputs.py [--cases 200] [--kind "FX .npy"] [--first-case 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_inputs import INTERNAL_ERROR, KINDS, OUTCOMES, prepare, run_case


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200, help="mutations per input kind")
    parser.add_argument("--first-case", type=int, default=0, help="seed of the first mutation")
    parser.add_argument("--kind", action="append", help="run only this kind (repeatable)")
    options = parser.parse_args()
    import logging

    import torch

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # the cases' own warnings would drown the table
    kinds = tuple(kind for kind in KINDS if not options.kind or kind.name in options.kind)
    counts: dict[str, Counter[str]] = {}
    internal: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as base:
        seeds = prepare(kinds, Path(base))
        for kind in kinds:
            counts[kind.name] = Counter()
            for case in range(options.first_case, options.first_case + options.cases):
                result = run_case(kind, seeds[kind.name], Path(base) / "work", case)
                counts[kind.name][result.outcome] += 1
                if result.outcome not in ("clean error", "loaded"):
                    internal.append(f"{kind.name} case {case}: {result.outcome}: {result.message}")
    width = max(len(kind.name) for kind in kinds)
    print(f"| {'input kind':<{width}} | cases | " + " | ".join(OUTCOMES) + " |")
    print(f"|{'-' * (width + 2)}|------:|" + "|".join("-" * (len(name) + 1) + ":" for name in OUTCOMES) + "|")
    for name, outcome_counts in counts.items():
        cells = " | ".join(f"{outcome_counts[outcome]:>{len(outcome)}}" for outcome in OUTCOMES)
        print(f"| {name:<{width}} | {sum(outcome_counts.values()):>5} | {cells} |")
    total = Counter()
    for outcome_counts in counts.values():
        total.update(outcome_counts)
    cells = " | ".join(f"{total[outcome]:>{len(outcome)}}" for outcome in OUTCOMES)
    print(f"| {'all':<{width}} | {sum(total.values()):>5} | {cells} |")
    print(f"\n{sum(total.values())} cases in {time.perf_counter() - started:.0f} s")
    for line in internal:
        print(line)
    return 1 if total[INTERNAL_ERROR] or total["hang"] else 0


if __name__ == "__main__":
    sys.exit(main())
