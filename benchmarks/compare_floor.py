"""The arithmetic floor of an exact compare: what one core can do at best, and what the engine does.

Issue #17 asks for >= 2.5 GB/s of tensor bytes on a 2-core machine while every metric column
stays bit-identical. Whether that is reachable is a question of these figures:

1. **The floor.** Each numpy pass the streaming engine makes over one chunk of 65 536
   float32 pairs (``core/measuring/pair_chunk.py`` and the built-in accumulators: decode to float64,
   difference, absolute values, relative error, float32 softmax weights, the sums, minima
   and maxima, and the single-threaded BLAS dots of cosine, RMSE, SQNR, relative distance
   and KL's series), timed one by one on arrays already in the CPU caches. Their sum is
   what one core needs per chunk with no file to read and no Python between the calls: the
   most any reordering of these calls can give while computing the same floats.
2. **The engine**, with ``--dump DIR`` (a ``compare_throughput.py --mode large --keep``
   folder): the same pairs measured by the metric engine in this process, reading the dumps
   from the page cache.

Two cores give at most twice the floor; the compare measured 1.65-1.76x its one-core rate
with two processes on the development machine. Fewer passes -- one fused loop per chunk --
need compiled code, whose summation and ``exp`` differ from numpy's in the last bits.

    python benchmarks/compare_floor.py [--dump /tmp/llmcheck_compare_bench_XXXX] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the engine's dots run on one BLAS thread

import numpy as np

CHUNK_VALUES = 1 << 16
GB = 1e9


def chunk_passes() -> list[tuple[str, Callable[[], object]]]:
    """Return the engine's passes over one chunk of float32 pairs, each a call on cached arrays."""
    generator = np.random.default_rng(0)
    golden32 = generator.standard_normal(CHUNK_VALUES).astype(np.float32)
    my32 = (golden32 * (1 + 1e-6 * generator.standard_normal(CHUNK_VALUES))).astype(np.float32)
    golden, my, diff, abs_diff, magnitude, relative, weights, weighted = (np.empty(CHUNK_VALUES) for _ in range(8))
    shifted, single = np.empty(CHUNK_VALUES, np.float32), np.empty(CHUNK_VALUES, np.float32)
    np.copyto(golden, golden32)
    np.copyto(my, my32)
    np.subtract(my, golden, out=diff)
    np.abs(diff, out=abs_diff)
    np.abs(golden, out=magnitude)
    shift = np.float32(golden32.max())
    np.subtract(golden32, shift, out=shifted)
    np.copyto(weights, np.exp(shifted))
    return [
        ("decode golden (float32 -> float64)", lambda: np.copyto(golden, golden32)),
        ("decode my", lambda: np.copyto(my, my32)),
        ("my - golden", lambda: np.subtract(my, golden, out=diff)),
        ("|my - golden|", lambda: np.abs(diff, out=abs_diff)),
        ("|golden|", lambda: np.abs(golden, out=magnitude)),
        ("min |golden| (relative error defined?)", magnitude.min),
        ("relative error (division)", lambda: np.divide(abs_diff, magnitude, out=relative)),
        ("golden min, max, sum", lambda: (golden.min(), golden.max(), golden.sum())),
        ("my min, max, sum", lambda: (my.min(), my.max(), my.sum())),
        ("relative error max, sum", lambda: (relative.max(), relative.sum())),
        ("|diff| max, sum", lambda: (abs_diff.max(), abs_diff.sum())),
        ("softmax shift (float32)", lambda: np.subtract(golden32, shift, out=shifted)),
        ("softmax exp (float32)", lambda: np.exp(shifted, out=single)),
        ("softmax weights to float64, sum", lambda: (np.copyto(relative, single), weights.sum())),
        ("dots g.g, m.m, g.m, d.d", lambda: (golden @ golden, my @ my, golden @ my, diff @ diff)),
        (
            "KL series: w.d, w*d, (w*d).d",
            lambda: (weights @ diff, np.multiply(weights, diff, out=weighted), weighted @ diff),
        ),
    ]


def time_passes(repeat: int) -> list[tuple[str, float]]:
    """Return each pass's best time per chunk in seconds."""
    timings = []
    for name, call in chunk_passes():
        call()
        best = min(timeit.repeat(call, number=200, repeat=repeat)) / 200
        timings.append((name, best))
    return timings


def reading_rate(dump_root: Path) -> float:
    """Return GB/s of decoding the dumps' stored float32 bytes from the page cache into a float64 chunk, as the engine reads."""
    import mmap
    import time

    out = np.empty(CHUNK_VALUES)
    shards = sorted(dump_root.glob("*/*/shard_*.safetensors"))
    read_bytes = 0
    started = time.perf_counter()
    for shard in shards:
        with shard.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            stored = np.frombuffer(mapped, np.float32, count=len(mapped) // 4)
            for start in range(0, stored.size - CHUNK_VALUES + 1, CHUNK_VALUES):
                np.copyto(out, stored[start : start + CHUNK_VALUES])
            read_bytes += stored.size * 4
            del stored
    return read_bytes / (time.perf_counter() - started) / GB


def engine_rate(dump_root: Path) -> tuple[int, float, float]:
    """Return (pairs, tensor bytes, seconds) of the metric engine measuring a kept benchmark's pairs in this process."""
    import time

    from llmcheck.core import compare
    from llmcheck.core.measuring import metric_engine
    from llmcheck.core.measuring.pair_chunk import Workspace, single_threaded_blas
    from llmcheck.core.plugins import get_plugins

    plugins = get_plugins()
    golden = plugins.load_tensors(next((dump_root / "golden").iterdir()))
    my = plugins.load_tensors(next((dump_root / "my").iterdir()))
    caught: dict[str, list] = {}

    def catch(jobs, specs, *args, **options):  # the jobs and specs compare would measure; measure none
        caught["jobs"], caught["specs"] = list(jobs), list(specs)
        return {}

    real = metric_engine.measure_pairs
    metric_engine.measure_pairs = catch
    try:
        compare.compare_dumps(golden, my, workers=1)
    finally:
        metric_engine.measure_pairs = real
    jobs, specs = caught["jobs"], caught["specs"]
    tensor_bytes = sum(job.nbytes for job in jobs)
    with single_threaded_blas():
        metric_engine.measure_jobs(jobs, specs, Workspace(CHUNK_VALUES), CHUNK_VALUES)  # the page cache warm
        started = time.perf_counter()
        metric_engine.measure_jobs(jobs, specs, Workspace(CHUNK_VALUES), CHUNK_VALUES)
        return len(jobs), tensor_bytes, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", type=Path, help="a compare_throughput.py --keep folder (golden/ and my/ inside)")
    parser.add_argument("--repeat", type=int, default=5, help="timing repeats per pass (the best is kept)")
    options = parser.parse_args()
    chunk_bytes = 2 * CHUNK_VALUES * 4  # both sides' stored float32 bytes
    timings = time_passes(options.repeat)
    print(f"one chunk of {CHUNK_VALUES} float32 pairs ({chunk_bytes / 1e6:.2f} MB stored), arrays in cache, one core:")
    for name, seconds in timings:
        print(f"  {seconds * 1e6:7.1f} us  {name}")
    floor_s = sum(seconds for _, seconds in timings)
    print(f"  {floor_s * 1e6:7.1f} us  in all: the floor is {chunk_bytes / floor_s / GB:.2f} GB/s per core")
    if options.dump is not None:
        reading = reading_rate(options.dump)
        reading_us = chunk_bytes / reading / GB * 1e6
        print(
            f"decoding both sides from the page cache instead: {reading:.2f} GB/s, {reading_us:.0f} us per chunk "
            f"({reading_us - timings[0][1] * 1e6 - timings[1][1] * 1e6:.0f} us more than from the CPU caches)"
        )
        pairs, tensor_bytes, seconds = engine_rate(options.dump)
        rate = tensor_bytes / seconds / GB
        per_chunk_us = seconds / (tensor_bytes / chunk_bytes) * 1e6
        print(
            f"the engine, this process, {pairs} pairs ({tensor_bytes / GB:.2f} GB) from the page cache: "
            f"{rate:.2f} GB/s per core, {per_chunk_us:.0f} us per chunk ({per_chunk_us / (floor_s * 1e6):.2f}x the floor)"
        )


if __name__ == "__main__":
    main()
