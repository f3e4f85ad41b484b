"""Compare throughput of the local and the Ray executor, side by side, on the same two dumps.

Writes two dumps of a seeded random Llama with llmcheck's torch capture (as
``benchmarks/compare_throughput.py`` does, smaller by default: about 0.35 GB each at 512
tokens), warms the page cache, then compares them in this process twice:

* ``local``: :func:`llmcheck.core.compare.compare_dumps` with its worker processes
  (``--jobs``, default one per CPU);
* ``ray``: the same call with ``executor=RayExecutor()`` on a Ray cluster -- a local one
  with as many CPUs (``ray.init(num_cpus=...)``, its start-up timed apart), or the one at
  ``--ray-address``.

Prints the tensor GB/s of each (tensor bytes read / seconds the compare took) and checks
that every metric value is the same, bit for bit.

    python benchmarks/compare_executors.py [--tokens 512] [--jobs N] [--ray-address ADDR]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

GB = 1e9
HERE = Path(__file__).resolve().parent


def _throughput_helpers():
    spec = importlib.util.spec_from_file_location("compare_throughput", HERE / "compare_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _bits(metrics) -> dict[str, bytes]:
    """Return each metric value's IEEE-754 bytes (so NaN equals NaN, and 0.0 differs from -0.0)."""
    return {name: struct.pack("<d", result.value) for name, result in metrics.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512, help="sequence length (512 gives ~0.35 GB per dump)")
    parser.add_argument(
        "--jobs", type=int, default=None, help="local worker processes and local Ray CPUs (default: CPU count)"
    )
    parser.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: start a local one)")
    parser.add_argument("--dir", default=None, help="where the dumps are written (default: a temporary folder)")
    args = parser.parse_args()
    import ray

    from llmcheck.core.compare import compare_dumps
    from llmcheck.core.dumps.store import read_dump
    from llmcheck.core.measuring.ray_executor import RayExecutor

    helpers = _throughput_helpers()
    cpus = args.jobs or len(os.sched_getaffinity(0))
    root = Path(tempfile.mkdtemp(prefix="llmcheck_executor_bench_", dir=args.dir))
    try:
        golden_path, my_path = helpers.write_dumps(root, args.tokens)
        for folder in (golden_path, my_path):
            helpers.warm_page_cache(folder)
        golden, my = read_dump(golden_path), read_dump(my_path)
        local = compare_dumps(golden, my, workers=cpus)
        started = time.perf_counter()
        ray.init(
            address=args.ray_address,
            num_cpus=None if args.ray_address else cpus,
            include_dashboard=False,
            log_to_driver=False,
        )
        start_s = time.perf_counter() - started
        remote = compare_dumps(golden, my, executor=RayExecutor())
        identical = len(local.rows) == len(remote.rows) and all(
            _bits(a.metrics) == _bits(b.metrics) for a, b in zip(local.rows, remote.rows)
        )
        nodes = len([node for node in ray.nodes() if node.get("Alive")])
        print(
            f"two dumps of {helpers.tree_bytes(golden_path) / GB:.2f} GB each, {len(local.rows)} pairs, "
            f"{local.tensor_bytes_read / GB:.2f} GB of tensors read, {cpus} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        print(f"{'executor':<10}{'seconds':>10}{'GB/s':>8}")
        for name, result in (("local", local), ("ray", remote)):
            print(f"{name:<10}{result.elapsed_s:>10.2f}{result.tensor_bytes_read / result.elapsed_s / GB:>8.2f}")
        print(
            f"ray: {nodes} node(s), cluster start {start_s:.1f} s (not counted above); "
            f"metric values identical to local: {identical}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
