"""ATB dump reading: records per second for a dump tree, and tensor GB/s, against the seed's way of reading.

One process, side by side, on files written in ATB's ``.bin`` layout:

* **tree**: an ATB dump tree of ``--ops`` LinearOperations (3 tensors each, 64 KiB) is loaded
  as records by the ``atb`` plugin (headers only, data left on disk);
* **tensor**: one ``--tensor-mib`` float16 tensor is read and summed, (a) through llmcheck's
  memory-mapped byte range, (b) as the seed tool does it (``msit``'s ``TensorBinFile``,
  restated: read the whole file, walk it byte by byte up to ``$End=1``, copy the payload,
  ``frombuffer``). The seed refuses files over 2 GiB; llmcheck has no such limit.

Page cache warmed by one untimed read; the median of ``--rounds`` rounds is printed.

    python benchmarks/atb_reader.py [--ops 1000] [--tensor-mib 512] [--rounds 3] [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from llmcheck.plugins.atb.bin_format import read_bin_header, tensor_data, write_bin
from llmcheck.plugins.atb.dump_tree import load_atb_dump

MiB = 1024 * 1024


def seed_style_read(path: Path) -> torch.Tensor:
    """Read a .bin file the way the seed tool does (whole file in memory, byte loop over the header)."""
    content = path.read_bytes()
    dims: list[int] = []
    start = 0
    payload = b""
    for index in range(len(content)):
        if content[index] == ord("\n"):
            name, value = content[start:index].decode().split("=")
            start = index + 1
            if name == "$End":
                payload = content[index + 1 :]
                break
            if name == "dims":
                dims = [int(size) for size in value.split(",")]
    return torch.from_numpy(np.frombuffer(payload, dtype=np.float16).copy()).view(dims)


def write_tree(root: Path, ops: int) -> int:
    step = root / "msit_dump_20240101_000000" / "tensors" / "0_1" / "0"
    generator = torch.Generator().manual_seed(0)
    tensor = torch.randn(128, 256, generator=generator).to(torch.float16)  # 64 KiB
    for op in range(ops):
        folder = step / f"{op}_LinearOperation"
        (folder / "before").mkdir(parents=True)
        (folder / "after").mkdir()
        write_bin(folder / "before" / "intensor0.bin", tensor)
        write_bin(folder / "before" / "intensor1.bin", tensor)
        write_bin(folder / "after" / "outtensor0.bin", tensor)
        (folder / "op_param.json").write_text('{"transposeB": true}')
    return ops * 3


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--tensor-mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output-dir", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.output_dir))
    try:
        files = write_tree(work / "tree", args.ops)
        load_atb_dump(work / "tree")  # warm
        tree_s = statistics.median(timed(lambda: load_atb_dump(work / "tree")) for _ in range(args.rounds))
        print(f"tree: {files} tensor files loaded as records in {tree_s:.3f} s = {files / tree_s:,.0f} records/s")

        numel = args.tensor_mib * MiB // 2
        big = work / "big.bin"
        write_bin(big, torch.full((numel,), 0.5, dtype=torch.float16))
        gigabytes = big.stat().st_size / 1e9
        big.read_bytes()  # warm the page cache

        def ours() -> None:
            float(tensor_data(read_bin_header(big)).load().sum(dtype=torch.float32))

        def seed() -> None:
            float(seed_style_read(big).sum(dtype=torch.float32))

        ours_s, seed_s = [], []
        for _ in range(args.rounds):  # interleaved so noise hits both alike
            ours_s.append(timed(ours))
            seed_s.append(timed(seed))
        ours_median, seed_median = statistics.median(ours_s), statistics.median(seed_s)
        print(
            f"tensor: {gigabytes:.2f} GB read and summed: llmcheck {gigabytes / ours_median:.2f} GB/s, "
            f"seed-style {gigabytes / seed_median:.2f} GB/s, ratio {seed_median / ours_median:.2f}x"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
