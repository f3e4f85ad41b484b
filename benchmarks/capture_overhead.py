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

``--small-tensors`` measures what each recorded tensor costs instead, where Python and
synchronisation per tensor dominate, not bytes: 64 blocks of LayerNorm -> Linear -> GELU
-> Linear at hidden 64 (642 module or 1984 op tensors of 2 KB a forward), one thread. It
prints microseconds of added time per recorded tensor -- (capture forward - plain
forward) / records -- for statistics only, full module tensors and op level: of the
forward's wall time, of the wall time until the dump is on disk, and of CPU time (all
threads, until on disk; steadier than wall time on a shared machine), the fastest round
each. With ``--baseline-src DIR`` (the ``src`` folder of an earlier checkout, e.g.
``git archive main src | tar -x -C /tmp/base``) the earlier code is timed in the same
run, alternating child processes, and printed beside the current code.
Targets (CPU, one thread): <= 10 us per tensor statistics only, <= 25 us full tensors.

    python benchmarks/capture_overhead.py --small-tensors [--baseline-src /tmp/base/src] [--rounds 7]

``--fx`` times the FX capture backend on the same stack, side by side in one process: the
``torch.export`` graph run plainly (the baseline of the ratios), the interpreter writing
torchair's ``.npy`` layout, and the fast path (the graph rewritten to record into an
llmcheck dump) with full tensors and with statistics only. The eager forward is printed
for reference. Both paths are what ``torch.compile(backend=make_fx_dump_backend(...))``
runs on the AOTAutograd graph; the exported graph spares the benchmark the slow compile.

    python benchmarks/capture_overhead.py --fx [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
    model(input_ids) if isinstance(model, torch.nn.Sequential) else model(input_ids, use_cache=False)
    _sync(input_ids.device)
    return time.perf_counter() - start


_last_cpu_s = 0.0  # CPU seconds (all threads) of the last _time_capture, from the forward until closed


def _time_capture(
    model: torch.nn.Module, input_ids: torch.Tensor, folder: Path, options: dict, records: bool = False
) -> tuple[float, float, int]:
    """Return (forward seconds, seconds until the dump is closed, bytes written or, with ``records``, records)."""
    session = register_hook(model, DumpConfig(dump_path=folder, token_range=None, **options))
    _sync(input_ids.device)
    global _last_cpu_s
    start_cpu = time.process_time()
    start = time.perf_counter()
    model(input_ids) if isinstance(model, torch.nn.Sequential) else model(input_ids, use_cache=False)
    _sync(input_ids.device)
    forward_s = time.perf_counter() - start
    session.close()
    closed_s = time.perf_counter() - start
    _last_cpu_s = time.process_time() - start_cpu
    amount = session.writer.records_written if records else session.writer.bytes_written
    shutil.rmtree(session.path)
    return forward_s, closed_s, amount


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


SMALL_VARIANTS = {
    "statistics only": dict(mode="module", statistics_only=True),
    "full module tensors": dict(mode="module"),
    "op level": dict(mode="op"),
}


class SmallBlock(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear with a residual: five modules, ten small tensors a call."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, hidden)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(hidden, hidden)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.down(self.act(self.up(self.norm(hidden_states))))


def small_tensor_model(blocks: int = 64, hidden: int = 64) -> torch.nn.Module:
    """Return the seeded many-small-tensors stack the per-tensor figures are measured on."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*(SmallBlock(hidden) for _ in range(blocks)))


def _without_weight_digests(options: dict) -> dict:
    """Return the options with weight digests off where the code under test has them.

    They hash every parameter once per dump (issue #10): a cost per session, not per
    recorded tensor, and code from before them would not accept the option.
    """
    has_digests = "weight_digests" in DumpConfig.__dataclass_fields__
    return {**options, "weight_digests": False} if has_digests else options


def small_tensor_child(rounds: int, device: torch.device, folder: Path) -> dict[str, dict[str, float]]:
    """Return, per variant, the fastest forward and to-disk seconds, the plain forward and records per forward."""
    model = small_tensor_model().to(device)
    variants = {variant: _without_weight_digests(options) for variant, options in SMALL_VARIANTS.items()}
    inputs = torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(1)).to(device)
    plain_s: list[float] = []
    plain_cpu_s: list[float] = []
    runs: dict[str, list[tuple[float, float, int]]] = {variant: [] for variant in SMALL_VARIANTS}
    cpu: dict[str, list[float]] = {variant: [] for variant in SMALL_VARIANTS}
    with torch.no_grad():
        for _ in range(2):  # warm-up: first calls of each path
            _time_plain(model, inputs)
            for options in variants.values():
                _time_capture(model, inputs, folder, options, records=True)
        for _ in range(rounds):
            started_cpu = time.process_time()
            plain_s.append(_time_plain(model, inputs))
            plain_cpu_s.append(time.process_time() - started_cpu)
            for variant, options in variants.items():
                runs[variant].append(_time_capture(model, inputs, folder, options, records=True))
                cpu[variant].append(_last_cpu_s)
    # the fastest round: on a shared machine the others measure its neighbours, not the capture
    plain, plain_cpu = min(plain_s), min(plain_cpu_s)
    return {
        variant: {
            "plain_s": plain,
            "forward_s": min(r[0] for r in timings),
            "closed_s": min(r[1] for r in timings),
            "records": timings[-1][2],
            "plain_cpu_s": plain_cpu,
            "closed_cpu_s": min(cpu[variant]),
        }
        for variant, timings in runs.items()
    }


def run_small_tensors(args: argparse.Namespace, folder: Path) -> None:
    """Time the per-tensor cost of the current code (and the baseline's) in alternating child processes."""
    versions = {"current": Path(__file__).resolve().parent.parent / "src"}
    if args.baseline_src is not None:
        versions["baseline"] = args.baseline_src.resolve()
    results: dict[str, list[dict[str, dict[str, float]]]] = {label: [] for label in versions}
    for _ in range(args.repeat):
        for label, src in versions.items():
            env = {**os.environ, "PYTHONPATH": str(src)}
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--small-tensors-child",
                    "--rounds",
                    str(args.rounds),
                    "--device",
                    args.device,
                    "--output-dir",
                    str(folder),
                ],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            results[label].append(json.loads(child.stdout.strip().splitlines()[-1]))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU, 1 thread"
    print(
        f"model: 64 x (LayerNorm -> Linear -> GELU -> Linear), hidden 64, input [1, 8, 64], on {name}; "
        f"fastest of {args.rounds} rounds in each of {args.repeat} child runs per version; weight digests off"
    )
    plain_ms = min(run["statistics only"]["plain_s"] for runs in results.values() for run in runs) * 1000
    print(f"plain forward: {plain_ms:.2f} ms")
    columns = [("fwd", "forward_s", "plain_s"), ("disk", "closed_s", "plain_s"), ("cpu", "closed_cpu_s", "plain_cpu_s")]
    print(
        f"{'us per recorded tensor':<22}{'records':>8}"
        + "".join(f"{label + ' ' + column:>16}" for label in versions for column, _, _ in columns)
    )
    for variant in SMALL_VARIANTS:
        line = f"{variant:<22}{int(results['current'][0][variant]['records']):>8}"
        for label in versions:
            for _, key, plain_key in columns:
                per_tensor = (
                    min(
                        (run[variant][key] - run[variant][plain_key]) / run[variant]["records"]
                        for run in results[label]
                    )
                    * 1e6
                )
                line += f"{per_tensor:>14.1f}us"
        print(line)
    print(
        "(added time per record -- fwd: the forward's wall time; disk: wall time until the dump is closed; "
        "cpu: CPU seconds of all threads until closed, steadier on a shared machine. "
        "Targets: <= 10 us statistics only, <= 25 us full tensors)"
    )


FX_VARIANTS = {
    "interpreter, torchair .npy": dict(layout="torchair"),
    "fast path, full tensors": dict(layout="llmcheck"),
    "fast path, statistics only": dict(layout="llmcheck", statistics_only=True),
}


def _time_fx(program: Any, inputs: torch.Tensor, folder: Path, options: dict) -> tuple[float, float, float, int]:
    """Return (forward seconds, seconds until on disk, CPU seconds until on disk, records) of one FX capture."""
    from llmcheck.core.dumps.store import find_dumps
    from llmcheck.plugins.torchair_fx.fx_backend import FxDumpInterpreter, new_graph_folder
    from llmcheck.plugins.torchair_fx.fx_recording import FxDump

    module = program.module()
    if options["layout"] == "torchair":
        interpreter = FxDumpInterpreter(module, new_graph_folder(folder))
        start_cpu, start = time.process_time(), time.perf_counter()
        interpreter.run(inputs)
        forward_s = time.perf_counter() - start
        closed_s, cpu_s = forward_s, time.process_time() - start_cpu  # written synchronously
        records = sum(1 for _ in interpreter.graph_folder.rglob("*.npy"))
    else:
        dump = FxDump(folder, statistics_only=options.get("statistics_only", False))
        recorder = dump.add_graph(module, [inputs])
        start_cpu, start = time.process_time(), time.perf_counter()
        recorder.run_step(module, inputs)
        forward_s = time.perf_counter() - start
        dump.close()
        closed_s, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
        records = dump.writer.records_written
    for dump_folder in [*find_dumps(folder), *folder.glob("worldsize*")]:
        shutil.rmtree(dump_folder)
    return forward_s, closed_s, cpu_s, records


def run_fx(rounds: int, folder: Path) -> None:
    """Time the FX backend's two layouts against the plain graph on the small-tensor stack, one thread."""
    model = small_tensor_model()
    inputs = torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(1))
    program = torch.export.export(model, (inputs,), strict=False)
    plain_module = program.module()
    eager_s: list[float] = []
    plain_s: list[float] = []
    plain_cpu_s: list[float] = []
    runs: dict[str, list[tuple[float, float, float, int]]] = {variant: [] for variant in FX_VARIANTS}
    with torch.no_grad():
        for round_index in range(rounds + 2):  # two warm-up rounds: first calls of each path
            eager_s.append(_time_plain(model, inputs))
            started_cpu, started = time.process_time(), time.perf_counter()
            plain_module(inputs)
            plain_s.append(time.perf_counter() - started)
            plain_cpu_s.append(time.process_time() - started_cpu)
            for variant, options in FX_VARIANTS.items():
                timing = _time_fx(program, inputs, folder, options)
                if round_index >= 2:
                    runs[variant].append(timing)
    # the fastest round: on a shared machine the others measure its neighbours, not the capture
    plain, plain_cpu, eager = min(plain_s[2:]), min(plain_cpu_s[2:]), min(eager_s[2:])
    records = runs["fast path, full tensors"][-1][3]
    print(
        f"model: 64 x (LayerNorm -> Linear -> GELU -> Linear), hidden 64, input [1, 8, 64], torch.export graph "
        f"({records} records a forward), CPU, 1 thread; fastest of {rounds} rounds"
    )
    print(f"plain graph forward: {plain * 1000:.2f} ms (eager module: {eager * 1000:.2f} ms)")
    print(
        f"{'FX capture':<28}{'records':>8}{'forward':>10}{'ratio':>8}{'to disk':>10}{'ratio':>8}"
        f"{'us/tensor fwd':>15}{'disk':>10}{'cpu':>10}"
    )
    for variant, timings in runs.items():
        forward_s = min(t[0] for t in timings)
        closed_s = min(t[1] for t in timings)
        cpu_s = min(t[2] for t in timings)
        print(
            f"{variant:<28}{timings[-1][3]:>8}{forward_s * 1000:>8.1f}ms{forward_s / plain:>7.2f}x"
            f"{closed_s * 1000:>8.1f}ms{closed_s / plain:>7.2f}x"
            f"{(forward_s - plain) / records * 1e6:>13.1f}us{(closed_s - plain) / records * 1e6:>8.1f}us"
            f"{(cpu_s - plain_cpu) / records * 1e6:>8.1f}us"
        )
    print(
        "(ratios to the plain graph forward; us/tensor: added time per record of the fast path -- of the forward, "
        "until the dump is closed, and CPU seconds of all threads until closed. The interpreter writes each file "
        "as it goes and also saves non-numeric arguments as text files, counted in its records column)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--output-dir", type=Path, default=None, help="where dumps are written (default: a temp dir)")
    parser.add_argument("--small-tensors", action="store_true", help="measure microseconds per recorded tensor")
    parser.add_argument("--small-tensors-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fx", action="store_true", help="time the FX backend's layouts on the small-tensor stack")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="--small-tensors: the src folder of an earlier checkout, timed beside the current code",
    )
    parser.add_argument("--repeat", type=int, default=2, help="--small-tensors: child runs per code version")
    args = parser.parse_args()
    if args.fx:
        torch.set_num_threads(1)
        folder = Path(args.output_dir or tempfile.mkdtemp(prefix="llmcheck_bench_"))
        folder.mkdir(parents=True, exist_ok=True)
        try:
            run_fx(args.rounds, folder)
        finally:
            if args.output_dir is None:
                shutil.rmtree(folder, ignore_errors=True)
        return
    if args.small_tensors or args.small_tensors_child:
        torch.set_num_threads(1)
        folder = Path(args.output_dir or tempfile.mkdtemp(prefix="llmcheck_bench_"))
        folder.mkdir(parents=True, exist_ok=True)
        try:
            if args.small_tensors_child:
                print(json.dumps(small_tensor_child(args.rounds, torch.device(args.device), folder)))
            else:
                run_small_tensors(args, folder)
        finally:
            if args.output_dir is None:
                shutil.rmtree(folder, ignore_errors=True)
        return

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = random_llama(
        seed=0,
        hidden_size=args.hidden,
        num_layers=args.layers,
        vocab_size=32000,
        intermediate_size=2816 if args.hidden == 1024 else None,
        num_heads=16 if args.hidden == 1024 else 4,
    ).to(device)
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
        print(
            f"{variant:<26}{forward_s * 1000:>9.1f}ms{forward_s / plain:>7.2f}x{closed_s * 1000:>9.1f}ms"
            f"{closed_s / plain:>7.2f}x{written / MiB:>12.1f}{rate:>8.0f}"
        )
    print("(forward: the model call; to disk: until the dump is closed; MB/s: MB written per second of added time)")
    if full_module is not None:
        written, rate = full_module
        raw_s = statistics.median(raw_write_seconds(folder, written, fsync=False) for _ in range(args.rounds))
        raw_sync_s = raw_write_seconds(folder, written, fsync=True)
        raw_rate = written / MiB / raw_s
        print(
            f"\nraw sequential write of the same {written / MiB:.1f} MB in 64 MiB blocks: {raw_rate:.0f} MB/s "
            f"without fsync (page cache, like the dump writer), {written / MiB / raw_sync_s:.0f} MB/s with fsync"
        )
        print(
            f"module-level full capture: {rate:.0f} MB/s of added time = {100 * rate / raw_rate:.0f} % of the raw "
            f"write speed without fsync"
        )
    if args.output_dir is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
