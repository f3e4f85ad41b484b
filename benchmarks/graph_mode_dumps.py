"""What graph-mode dumps cost: FX capture against the plain forward, and reading a GE dump tree.

One process, side by side:

* **FX capture** -- a seeded random Llama runs eagerly and under
  ``torch.compile(backend=make_fx_dump_backend(...))``; rounds interleave, the median is
  reported (compile time excluded: the first call of the compiled model is a warm-up). Every
  ATen call's arguments and results are written as ``.npy``, as torchair does, so this is
  the price of a full FX dump; the write speed is set beside plain sequential writes of the
  same bytes to the same folder.
* **GE reading** -- a tree of CANN dump files (framed form) is written, then loaded as
  records (every header parsed, no tensor read) and its tensors read through the records,
  against reading the same files whole with plain ``open().read()``.

    python benchmarks/graph_mode_dumps.py [--rounds 3] [--ge-ops 2000] [--output-dir DIR]
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
from llmcheck.plugins.torchair_fx import make_fx_dump_backend
from llmcheck.plugins.torchair_ge.ge_dump import GeDumpFileName, payload_from_tensor, write_ge_dump
from llmcheck.plugins.torchair_ge.ge_tree import load_ge_dump

MiB = 1024 * 1024


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _plain_write_seconds(folder: Path, total_bytes: int, file_bytes: int) -> float:
    """Return the seconds plain writes of ``total_bytes`` in files of ``file_bytes`` take in ``folder``."""
    target = folder / "plain"
    target.mkdir()
    block = os.urandom(min(file_bytes, 64 * MiB))
    start = time.perf_counter()
    written, index = 0, 0
    while written < total_bytes:
        with open(target / f"f{index}", "wb") as stream:
            stream.write(block)
        written += len(block)
        index += 1
    elapsed_s = time.perf_counter() - start
    shutil.rmtree(target)
    return elapsed_s


def fx_capture(rounds: int, root: Path) -> None:
    model = random_llama(seed=0, hidden_size=512, num_layers=4, vocab_size=2048)
    input_ids = torch.randint(0, 2048, (1, 128), generator=torch.Generator().manual_seed(0))
    dump_path = root / "fx"
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=make_fx_dump_backend(dump_path))
    with torch.no_grad():
        compiled(input_ids, use_cache=False)  # compiles; step 0
        plain_s, capture_s = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            model(input_ids, use_cache=False)
            plain_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            compiled(input_ids, use_cache=False)
            capture_s.append(time.perf_counter() - start)
    step_folders = sorted(p for p in dump_path.rglob("*") if p.is_dir() and p.name.isdigit())
    step_bytes = _folder_bytes(step_folders[-1])
    files_per_step = sum(1 for _ in step_folders[-1].iterdir())
    plain, capture = statistics.median(plain_s), statistics.median(capture_s)
    write_s = _plain_write_seconds(root, step_bytes, step_bytes // max(files_per_step, 1))
    print(f"FX capture, Llama hidden 512 x 4 layers, 128 tokens, fp32, {torch.get_num_threads()} thread(s)")
    print(f"  plain forward            {plain * 1e3:9.1f} ms")
    print(f"  forward with FX dump     {capture * 1e3:9.1f} ms   ({capture / plain:.1f}x plain)")
    print(
        f"  dump per step            {step_bytes / MiB:9.1f} MiB in {files_per_step} files "
        f"({step_bytes / MiB / capture:.0f} MiB/s; plain writes of the same files: {step_bytes / MiB / write_s:.0f} MiB/s)"
    )


def ge_reading(ge_ops: int, root: Path) -> None:
    step_folder = root / "ge" / "20240101120000" / "0" / "graph_1" / "1" / "0"
    generator = torch.Generator().manual_seed(0)
    tensor = torch.randn(128, 128, generator=generator)
    payload = payload_from_tensor(tensor)
    for index in range(ge_ops):
        write_ge_dump(
            step_folder,
            GeDumpFileName("Add", f"Add_{index}", index, 0, 1_700_000_000_000_000 + index),
            [payload, payload],
            [payload],
        )
    total_bytes = _folder_bytes(step_folder)
    start = time.perf_counter()
    dump = load_ge_dump(root / "ge")
    headers_s = time.perf_counter() - start
    start = time.perf_counter()
    checksum = sum(float(record.data.load()[0, 0]) for record in dump.records)
    tensors_s = time.perf_counter() - start
    start = time.perf_counter()
    for path in step_folder.iterdir():
        with open(path, "rb") as stream:
            stream.read()
    plain_s = time.perf_counter() - start
    print(
        f"GE reading, {ge_ops} framed dump files, {len(dump.records)} tensors, {total_bytes / MiB:.0f} MiB "
        f"(checksum {checksum:.3f})"
    )
    print(f"  records (headers only)   {headers_s:9.2f} s   ({ge_ops / headers_s:,.0f} files/s)")
    print(f"  first element of each    {tensors_s:9.2f} s   (memory-mapped byte ranges)")
    print(
        f"  plain read of every file {plain_s:9.2f} s   ({total_bytes / MiB / plain_s:.0f} MiB/s; the page cache is warm)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ge-ops", type=int, default=2000)
    parser.add_argument("--output-dir", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmcheck_graph_bench_", dir=args.output_dir))
    try:
        fx_capture(args.rounds, root)
        ge_reading(args.ge_ops, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
