"""What torch capture costs: forward time with capture on, as a ratio to the plain forward, and write speed.

One process, one sitting, side by side: a seeded random Llama (hidden 1024, 8 layers,
sequence 256, fp32, 1 thread by default) runs

* plain,
* with module-level statistics-only capture,
* with module-level full tensor capture,
* with op-level full tensor capture,

rounds interleaved so machine noise hits every variant alike; the median of the rounds is
reported. "forward" is the model call alone (the dump writer may still be writing in the
background); "to disk" adds closing the dump, i.e. until every byte is written. Beside it,
the same number of bytes is written to the same folder by plain sequential 64 MiB writes
(no fsync, like the dump writer; and with fsync at the end, for reference).

    python benchmarks/capture_overhead.py [--device cuda] [--rounds 3] [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from llmcheck.bundled_model import random_llama
from llmcheck.plugins.torch_hooks.capture import register_hook
from llmcheck.plugins.torch_hooks.config import DumpConfig

MiB = 1024 * 1024
VARIANTS = {
    "module, statistics only": dict(mode="module", statistics_only=True),
    "module, full tensors": dict(mode="module"),
    "op, full tensors": dict(mode="op"),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_plain(model: torch.nn.Module, input_ids: torch.Tensor) -> float:
    _sync(input_ids.device)
    start = time.perf_counter()
    model(input_ids, use_cache=False)
    _sync(input_ids.device)
    return time.perf_counter() - start


def _time_capture(model: torch.nn.Module, input_ids: torch.Tensor, folder: Path, options: dict) -> tuple[float, float, int]:
    """Return (forward seconds, seconds until the dump is closed, bytes written)."""
    session = register_hook(model, DumpConfig(dump_path=folder, token_range=None, **options))
    _sync(input_ids.device)
    start = time.perf_counter()
    model(input_ids, use_cache=False)
    _sync(input_ids.device)
    forward_s = time.perf_counter() - start
    session.close()
    closed_s = time.perf_counter() - start
    bytes_written = session.writer.bytes_written
    shutil.rmtree(session.path)
    return forward_s, closed_s, bytes_written


def raw_write_seconds(folder: Path, total_bytes: int, fsync: bool) -> float:
    """Return the seconds a plain sequential write of ``total_bytes`` takes in ``folder``."""
    block = os.urandom(64 * MiB)
    path = folder / "raw_write.bin"
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as handle:
        left = total_bytes
        while left > 0:
            left -= handle.write(memoryview(block)[: min(left, len(block))])
        if fsync:
            os.fsync(handle.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--output-dir", type=Path, default=None, help="where dumps are written (default: a temp dir)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = random_llama(seed=0, hidden_size=args.hidden, num_layers=args.layers, vocab_size=32000,
                         intermediate_size=2816 if args.hidden == 1024 else None,
                         num_heads=16 if args.hidden == 1024 else 4).to(device)
    input_ids = torch.randint(0, 32000, (1, args.seq), generator=torch.Generator().manual_seed(0)).to(device)
    folder = Path(args.output_dir or tempfile.mkdtemp(prefix="llmcheck_bench_"))
    folder.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    print(f"model: Llama hidden {args.hidden}, {args.layers} layers, sequence {args.seq}, fp32 on {name}")
    print(f"dumps in: {folder}")

    plain_s: list[float] = []
    captured: dict[str, list[tuple[float, float, int]]] = {variant: [] for variant in VARIANTS}
    with torch.no_grad():
        _time_plain(model, input_ids)  # warm-up
        for _ in range(args.rounds):
            plain_s.append(_time_plain(model, input_ids))
            for variant, options in VARIANTS.items():
                captured[variant].append(_time_capture(model, input_ids, folder, options))

    plain = statistics.median(plain_s)
    print(f"\nplain forward: {plain * 1000:.1f} ms (median of {args.rounds})")
    print(f"{'capture':<26}{'forward':>11}{'ratio':>8}{'to disk':>11}{'ratio':>8}{'MB written':>12}{'MB/s':>8}")
    full_module: tuple[int, float] | None = None
    for variant, runs in captured.items():
        forward_s = statistics.median(run[0] for run in runs)
        closed_s = statistics.median(run[1] for run in runs)
        written = runs[-1][2]
        # bytes over the time capture added to the forward, i.e. what the capture wrote per second it cost
        rate = written / MiB / max(closed_s - plain, 1e-9) if written else 0.0
        if variant == "module, full tensors":
            full_module = (written, rate)
        print(f"{variant:<26}{forward_s * 1000:>9.1f}ms{forward_s / plain:>7.2f}x{closed_s * 1000:>9.1f}ms"
              f"{closed_s / plain:>7.2f}x{written / MiB:>12.1f}{rate:>8.0f}")
    print("(forward: the model call; to disk: until the dump is closed; MB/s: MB written per second of added time)")
    if full_module is not None:
        written, rate = full_module
        raw_s = statistics.median(raw_write_seconds(folder, written, fsync=False) for _ in range(args.rounds))
        raw_sync_s = raw_write_seconds(folder, written, fsync=True)
        raw_rate = written / MiB / raw_s
        print(f"\nraw sequential write of the same {written / MiB:.1f} MB in 64 MiB blocks: {raw_rate:.0f} MB/s "
              f"without fsync (page cache, like the dump writer), {written / MiB / raw_sync_s:.0f} MB/s with fsync")
        print(f"module-level full capture: {rate:.0f} MB/s of added time = {100 * rate / raw_rate:.0f} % of the raw "
              f"write speed without fsync")
    if args.output_dir is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
