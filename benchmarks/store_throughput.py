"""Store throughput: llmcheck's dump writer and reader against raw sequential file I/O of the same bytes.

Prints MB/s for writing and reading ~1 GiB of mixed-dtype tensors through ``DumpWriter`` /
``read_dump`` beside a dd-style raw sequential write and read of exactly the same bytes,
measured in the same run, and the ratios (targets: write >= 80 %, read >= 80 % of raw).

    python benchmarks/store_throughput.py [--gib 1.0] [--dir /tmp] [--fsync]

``--fsync`` makes both sides fsync before the clock stops (disk speed instead of page-cache
speed). Reading is measured with a warm page cache on both sides.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from llmcheck.core.dumps.store import DumpWriter, read_dump
from llmcheck.core.dumps.tensor_io import dtype_name, tensor_bytes
from llmcheck.core.records import RecordKey, TensorRecord

MIB = 1024 * 1024
DTYPE_CYCLE = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.float8_e4m3fn, torch.int8]


def make_tensors(total_bytes: int) -> list[torch.Tensor]:
    """Return mixed-dtype tensors of 1-16 MiB adding up to about ``total_bytes``."""
    generator = torch.Generator().manual_seed(0)
    tensors, size, i = [], 0, 0
    while size < total_bytes:
        dtype = DTYPE_CYCLE[i % len(DTYPE_CYCLE)]
        nbytes = (1 + (i * 7) % 16) * MIB
        raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)
        tensors.append(raw.view(dtype))
        size += nbytes
        i += 1
    return tensors


def raw_write(path: Path, tensors: list[torch.Tensor], fsync: bool) -> float:
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as handle:
        for tensor in tensors:
            handle.write(tensor_bytes(tensor))
        if fsync:
            os.fsync(handle.fileno())
    return time.perf_counter() - start


def raw_read(path: Path, chunk_bytes: int = 4 * MIB) -> float:
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(view):
            pass
    return time.perf_counter() - start


def store_write(folder: Path, tensors: list[torch.Tensor], fsync: bool) -> tuple[float, Path]:
    start = time.perf_counter()
    with DumpWriter(folder, "benchmark", command_line=["store_throughput"]) as writer:
        for order, tensor in enumerate(tensors):
            record = TensorRecord(
                key=RecordKey(name=f"t{order}"), dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape), order=order
            )
            writer.add(record, tensor)
    if fsync:
        for shard in writer.path.glob("shard_*"):
            with open(shard, "rb") as handle:
                os.fsync(handle.fileno())
    return time.perf_counter() - start, writer.path


def store_read(dump_dir: Path, chunk_bytes: int = 4 * MIB) -> float:
    """Read every tensor's bytes through the index and memory map into one reused buffer.

    The same work as the raw read (page cache -> a reused buffer), plus parsing the index
    and mapping each tensor: what a streaming consumer such as compare does.
    """
    destination = torch.empty(chunk_bytes, dtype=torch.uint8)
    start = time.perf_counter()
    dump = read_dump(dump_dir)
    for record in dump.records:
        flat = record.data.load().reshape(-1).view(torch.uint8)
        for begin in range(0, flat.numel(), chunk_bytes):
            part = flat[begin : begin + chunk_bytes]
            destination[: part.numel()].copy_(part)
    return time.perf_counter() - start


def store_materialise(dump_dir: Path) -> float:
    """Read every tensor into a tensor of its own (fresh memory for each, as ``load().clone()`` gives)."""
    start = time.perf_counter()
    dump = read_dump(dump_dir)
    for record in dump.records:
        record.data.load().clone()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--fsync", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="take the best of N runs of each")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tensors = make_tensors(int(args.gib * 1024 * MIB))
    total_mb = sum(t.numel() * t.element_size() for t in tensors) / 1e6
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="llmcheck_store_bench_"))
    try:
        raw_w, store_w, raw_r, store_r, store_m = [], [], [], [], []
        for attempt in range(args.repeat):
            raw_file = work / f"raw{attempt}.bin"  # a new file each time, as the store writes new shards
            raw_w.append(raw_write(raw_file, tensors, args.fsync))
            seconds, dump_dir = store_write(work / f"dumps{attempt}", tensors, args.fsync)
            store_w.append(seconds)
            raw_read(raw_file)  # warm the page cache for both sides
            raw_r.append(raw_read(raw_file))
            store_read(dump_dir)
            store_r.append(store_read(dump_dir))
            store_m.append(store_materialise(dump_dir))
            shutil.rmtree(dump_dir.parent)
            raw_file.unlink()
        rw, sw, rr, sr, sm = (total_mb / min(times) for times in (raw_w, store_w, raw_r, store_r, store_m))
        mode = "with fsync" if args.fsync else "page cache, no fsync"
        print(
            f"store throughput: {total_mb:.0f} MB in {len(tensors)} mixed-dtype tensors ({mode}), best of {args.repeat}"
        )
        print(f"  write: raw {rw:8.0f} MB/s   llmcheck {sw:8.0f} MB/s   ratio {sw / rw:6.1%}")
        print(
            f"  read:  raw {rr:8.0f} MB/s   llmcheck {sr:8.0f} MB/s   ratio {sr / rr:6.1%}  (streamed into a reused buffer)"
        )
        print(
            f"  read into a new tensor per record: {sm:8.0f} MB/s   ratio {sm / rr:6.1%}  (page faults of fresh memory)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
