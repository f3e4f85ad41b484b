"""Compare throughput: ``llmcheck compare`` on two multi-gigabyte dumps, in GB/s and peak memory.

Writes two dumps of a seeded random Llama (hidden 1024, intermediate 2816, 8 layers, full module-level
capture of inputs and outputs, about 2.1 GB each at the default 3072 tokens) with llmcheck's own torch
capture -- golden, and "my" with every weight perturbed by 1e-6 relative noise -- warms the
page cache by reading both once, then runs ``llmcheck compare`` in a child process (so torch,
used only to write the dumps, is not counted) while sampling the resident memory of the child
and its worker processes every 20 ms. Prints:

* tensor GB/s: tensor bytes read from both sides / time the compare took (summary.json: pairing,
  measuring and judging, after both dumps are loaded);
* end-to-end GB/s: the same bytes / wall time of the whole command (load, pair, measure,
  write the four reports);
* CPU seconds of the compare and its workers, and the GB/s that makes on idle cores (the
  machine this was written on is shared, so wall-clock figures vary with its load);
* peak RSS: the largest sum of the resident memory of the compare process and its workers,
  against the target ``2 x largest tensor + 300 MB``.

Targets on a 2-core machine: >= 1 GB/s, peak RSS <= 2 x largest tensor + 300 MB. The
best-known peer compared the same kind of dumps at about 0.12 GB/s.

    python benchmarks/compare_throughput.py [--tokens 3072] [--dir /tmp] [--jobs N] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GB = 1e9
MB = 1e6


def write_dumps(root: Path, tokens: int) -> tuple[Path, Path]:
    """Write the golden and my dumps with the torch capture and return their folders."""
    import torch

    from llmcheck import DumpConfig, register_hook
    from llmcheck.bundled_model import random_llama

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = random_llama(seed=0, hidden_size=1024, num_layers=8, vocab_size=512, num_heads=8,
                         intermediate_size=2816)
    input_ids = torch.randint(0, 512, (1, tokens), generator=torch.Generator().manual_seed(1))
    folders = []
    for side in ("golden", "my"):
        if side == "my":
            generator = torch.Generator().manual_seed(2)
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.mul_(1 + 1e-6 * torch.randn(parameter.shape, generator=generator))
        handle = register_hook(model, DumpConfig(dump_path=str(root / side), token_range=[0], tensor_part=2))
        with torch.no_grad():
            model(input_ids)
        handle.close()
        folders.append(Path(handle.path))
    return folders[0], folders[1]


def tree_bytes(folder: Path) -> int:
    """Return the size of every file under ``folder``."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def warm_page_cache(folder: Path) -> None:
    """Read every file once so the timed run reads from memory, not disk."""
    buffer = bytearray(16 << 20)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb", buffering=0) as handle:
                while handle.readinto(buffer):
                    pass


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemorySampler(threading.Thread):
    """Samples the summed RSS of a process and all its descendants; keeps the peak."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.peak_bytes = 0
        self.peak_processes = 0
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            pids, frontier = [], [self.pid]
            while frontier:
                pid = frontier.pop()
                pids.append(pid)
                frontier.extend(_children(pid))
            total = sum(_rss_bytes(pid) for pid in pids)
            if total > self.peak_bytes:
                self.peak_bytes, self.peak_processes = total, len(pids)
            self._stopped.wait(self.interval_s)

    def stop(self) -> None:
        self._stopped.set()
        self.join()


def largest_tensor_bytes(dump: Path) -> int:
    """Return the size of the largest tensor in a dump (from its index)."""
    from llmcheck.core.store import read_dump

    return max(record.nbytes for record in read_dump(dump).records)


def run_compare(golden: Path, my: Path, output: Path, jobs: int | None) -> tuple[float, float, TreeMemorySampler, dict]:
    """Run ``llmcheck compare`` in a child process; return wall and CPU seconds, the memory sampler, summary.json."""
    command = [sys.executable, "-m", "llmcheck.core.cli", "compare", "-gp", str(golden), "-mp", str(my),
               "-o", str(output)]
    if jobs:
        command += ["-j", str(jobs)]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = TreeMemorySampler(child.pid)
    sampler.start()
    out, _ = child.communicate()
    wall_s = time.perf_counter() - started
    sampler.stop()
    if child.returncode not in (0, 3):  # 3: the compare finished and found failing pairs
        raise SystemExit(f"compare failed ({child.returncode}):\n{out}")
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the compare and the workers it joined
    cpu_s = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    return wall_s, cpu_s, sampler, json.loads((output / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=3072, help="sequence length (3072 gives ~2.1 GB per dump)")
    parser.add_argument("--dir", default=None, help="where the dumps are written (default: a temporary folder)")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    parser.add_argument("--keep", action="store_true", help="keep the dumps afterwards (rerun with --reuse)")
    parser.add_argument("--reuse", default=None, help="a folder kept by --keep: compare its dumps again")
    args = parser.parse_args()
    root = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="llmcheck_compare_bench_", dir=args.dir))
    try:
        started = time.perf_counter()
        if args.reuse:
            golden, my = (next((root / side).glob("llmcheck_dump_*")) for side in ("golden", "my"))
        else:
            golden, my = write_dumps(root, args.tokens)
        print(f"{'reused' if args.reuse else 'wrote'} two dumps in {time.perf_counter() - started:.1f} s: "
              f"golden {tree_bytes(golden) / GB:.2f} GB, "
              f"my {tree_bytes(my) / GB:.2f} GB ({golden.parent.parent})")
        warm_page_cache(golden)
        warm_page_cache(my)
        largest = max(largest_tensor_bytes(golden), largest_tensor_bytes(my))
        wall_s, cpu_s, sampler, summary = run_compare(golden, my, root / "report", args.jobs)
        tensor_gb = summary["tensor_bytes_read"] / GB
        rss_target = 2 * largest + 300 * MB
        print(f"pairs: {summary['counts']['pairs']}, tensor bytes read (both sides): {tensor_gb:.2f} GB "
              f"({summary['tensor_bytes_compared'] / GB:.2f} GB compared: records sharing bytes are read once), "
              f"largest tensor {largest / MB:.1f} MB, CPUs {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
        print(f"tensor throughput:     {summary['throughput_gb_per_s']:.2f} GB/s "
              f"({summary['elapsed_s']:.2f} s comparing; target >= 1 GB/s; peer ~0.12 GB/s)")
        print(f"end-to-end throughput: {tensor_gb / wall_s:.2f} GB/s ({wall_s:.2f} s wall for the whole command, "
              f"process start and the four reports included)")
        cores = len(os.sched_getaffinity(0))
        print(f"CPU time:              {cpu_s:.2f} s in all processes = {tensor_gb / cpu_s:.2f} GB per CPU-second; "
              f"on {cores} otherwise idle cores the whole command would run at {cores * tensor_gb / cpu_s:.2f} GB/s "
              f"(this machine is shared: the wall figures above depend on its load)")
        print(f"peak RSS: {sampler.peak_bytes / MB:.0f} MB over {sampler.peak_processes} processes "
              f"(target <= 2 x largest tensor + 300 MB = {rss_target / MB:.0f} MB)")
    finally:
        shutil.rmtree(root / "report", ignore_errors=True)
        if args.keep or args.reuse:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
