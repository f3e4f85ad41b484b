"""Mutation fuzzing of every input kind llmcheck reads: a table of outcomes per kind (target: 0 internal errors,
0 hangs, 0 silent drops).

For each of the input kinds in ``tests/fuzz_inputs.py`` (llmcheck's own index, manifest,
topology and shards, an op-level dump read by opcheck, a manual ``metadata.json``, FX
``.npy``, ATB ``.bin``, op CSV and layer JSON, GE dump files and GE graph
text, a checkpoint's ``model.safetensors``, msprobe's ``dump.json``), ``--cases`` seeded
mutations of a valid seed are run through the CLI in this process; so are the hostile
kinds, each case a file of any of those seeds replaced by a FIFO, a link to a device or a
link loop, or JSON nested deep or a name too long for the system written into one. Each
ends as a clean error naming a file, a correct load, an internal error (a bug), a hang, or
a silent drop (a replaced file never named while the command succeeds). Every outcome but
the first two is listed with its message.

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

from fuzz_inputs import ALL_KINDS, HANG, INTERNAL_ERROR, OUTCOMES, SILENT_DROP, prepare, run_case

#: How much of an unexpected outcome's message is printed (a long-name case's path runs to 5,000 characters).
MESSAGE_CHARS = 400


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200, help="mutations per input kind")
    parser.add_argument("--first-case", type=int, default=0, help="seed of the first mutation")
    parser.add_argument("--kind", action="append", help="run only this kind (repeatable)")
    options = parser.parse_args()
    import logging

    import torch

    torch.set_num_threads(1)
    logging.disable(logging.INFO)  # warnings stay on: a case's warning naming the file is what tells a drop
    kinds = tuple(kind for kind in ALL_KINDS if not options.kind or kind.name in options.kind)
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
                if result.outcome in (INTERNAL_ERROR, HANG, SILENT_DROP):
                    internal.append(f"{kind.name} case {case}: {result.outcome}: {result.message[:MESSAGE_CHARS]}")
    width = max(len(kind.name) for kind in kinds)
    print(f"| {'input kind':<{width}} | cases | " + " | ".join(OUTCOMES) + " |")
    print(f"|{'-' * (width + 2)}|------:|" + "|".join("-" * (len(name) + 1) + ":" for name in OUTCOMES) + "|")
    for name, outcome_counts in counts.items():
        cells = " | ".join(f"{outcome_counts[outcome]:>{len(outcome)}}" for outcome in OUTCOMES)
        print(f"| {name:<{width}} | {sum(outcome_counts.values()):>5} | {cells} |")
    total: Counter[str] = Counter()
    for outcome_counts in counts.values():
        total.update(outcome_counts)
    cells = " | ".join(f"{total[outcome]:>{len(outcome)}}" for outcome in OUTCOMES)
    print(f"| {'all':<{width}} | {sum(total.values()):>5} | {cells} |")
    print(f"\n{sum(total.values())} cases in {time.perf_counter() - started:.0f} s")
    for line in internal:
        print(line)
    return 1 if total[INTERNAL_ERROR] or total[HANG] or total[SILENT_DROP] else 0


if __name__ == "__main__":
    sys.exit(main())
