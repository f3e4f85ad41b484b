"""Reports phase of ``llmcheck compare``: the seconds each default report takes on many small pairs.

Why apart from ``compare_throughput.py``: that benchmark times the whole command; here each
reporter (``cmp_report.csv``, ``summary.json``, ``pairs.json``, ``report.html``) is timed
alone, wall and CPU seconds, on the result of one compare of the small-records dumps
(``compare_throughput.py --mode small``, 50 000 records of 4-64 KB per side by default).
With ``--baseline-src DIR`` (the src folder of an earlier checkout, e.g. after
``git worktree add --detach /tmp/base main``) the earlier code writes the same reports in
the same run, printed side by side, and the files of both are compared: cmp_report.csv and
pairs.json byte for byte, report.html with its timing fields blanked.

Both versions write from ONE result: the earlier version (else the current one) compares
the dumps once and pickles the result (``--result FILE`` keeps it for the next run); each
version then loads it in a child process of its own ``PYTHONPATH``, and the parent asks
the two children in turn to write each report, ``--repeat`` rounds, keeping each one's
fastest run -- so both are timed on the same rows under the same load of a shared machine.
The cyclic garbage collector is paused while they are written, as ``llmcheck compare``
runs them (``core/gc_pause.py``).

    python benchmarks/report_writing.py [--records 50000] [--baseline-src /tmp/base/src] [--repeat 3]
        [--dir /tmp] [--keep | --reuse DIR] [--result FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Fields of summary.json (and of the page's copy of it) that differ from run to run.
TIMING_FIELDS = re.compile(rb'"(elapsed_s|throughput_gb_per_s)": ?[-0-9.e+]+')


def build_result(golden_path: Path, my_path: Path, result_path: Path) -> None:
    """Compare the dumps with the llmcheck on ``PYTHONPATH`` and pickle the result to ``result_path``."""
    import gc
    import pickle

    from llmcheck.core.compare import compare_dumps
    from llmcheck.core.plugins import get_plugins

    golden, my = get_plugins().load_runs(golden_path, None, my_path, None)
    result = compare_dumps(golden, my)
    gc.disable()
    result_path.write_bytes(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))


def serve(result_path: Path, output: Path) -> None:
    """Load the pickled result, then write the reporter named on each stdin line and print its seconds as JSON.

    The parent asks both versions' servers in turn, report by report, so both are timed
    on the same result under the same load.
    """
    import gc
    import pickle

    from llmcheck.core.plugins import get_plugins
    from llmcheck.core.reporting.reporters import choose_reporters

    gc.disable()  # as llmcheck compare writes them (and unpickling 10**6 objects runs no collection)
    result = pickle.loads(result_path.read_bytes())
    reporters = {reporter.name: reporter for reporter in choose_reporters(get_plugins().reporters())}
    output.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"pairs": len(result.rows), "reporters": list(reporters)}), flush=True)
    for line in sys.stdin:
        reporter = reporters[line.strip()]
        wall_started, cpu_started = time.perf_counter(), time.process_time()
        reporter.write(result, output / reporter.file_name)
        timing = (time.perf_counter() - wall_started, time.process_time() - cpu_started)
        print(json.dumps(timing), flush=True)


def child_environment(src: Path) -> dict[str, str]:
    """Return the environment running the llmcheck under ``src``."""
    from compare_throughput import plugins_missing_from

    environment = {**os.environ, "PYTHONPATH": str(src)}
    missing = plugins_missing_from(src)
    if missing:  # an earlier checkout predates a plugin this environment registers
        environment["LLMCHECK_DISABLE_PLUGINS"] = ",".join(missing)
    return environment


class Server:
    """A child process of one version's llmcheck holding the result, writing reports when asked."""

    def __init__(self, src: Path, result_path: Path, output: Path) -> None:
        shutil.rmtree(output, ignore_errors=True)
        command = [sys.executable, __file__, "--serve", str(result_path), str(output)]
        self.src = src
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_environment(src)
        )
        self.started = self._answer()

    def _answer(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the reports of {self.src} failed ({self.process.wait()})")
        return json.loads(line)

    def time(self, reporter: str) -> tuple[float, float]:
        """Return the wall and CPU seconds the reporter took to write its file."""
        assert self.process.stdin is not None
        self.process.stdin.write(reporter + "\n")
        self.process.stdin.flush()
        wall, cpu = self._answer()
        return wall, cpu

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def same_reports(current: Path, baseline: Path) -> list[str]:
    """Return a line per report file saying whether both versions wrote the same."""
    lines = []
    for name in sorted(path.name for path in current.iterdir()):
        mine, theirs = (folder / name for folder in (current, baseline))
        if not theirs.is_file():
            lines.append(f"{name}: only the current version writes it")
            continue
        exact = mine.read_bytes() == theirs.read_bytes()
        blanked = TIMING_FIELDS.sub(b"T", mine.read_bytes()) == TIMING_FIELDS.sub(b"T", theirs.read_bytes())
        verdict = "byte-identical" if exact else "identical but for timing fields" if blanked else "DIFFERENT"
        lines.append(f"{name}: {verdict}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000, help="records per dump")
    parser.add_argument("--baseline-src", type=Path, default=None, help="the src folder of an earlier checkout")
    parser.add_argument(
        "--repeat", type=int, default=3, help="times each version writes each report; the fastest counts"
    )
    parser.add_argument("--dir", default=None, help="where the dumps are written (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the dumps afterwards (rerun with --reuse)")
    parser.add_argument("--reuse", default=None, help="a folder kept by --keep: use its dumps (and result) again")
    parser.add_argument(
        "--result",
        type=Path,
        default=None,
        help="the pickled compare result to use, built first if missing (default: in the dumps' folder)",
    )
    parser.add_argument("--only", default=None, help="the reporters to time, comma-separated (default: all)")
    parser.add_argument("--build", nargs=3, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        build_result(*args.build)
        return
    if args.serve:
        serve(*args.serve)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare_throughput import write_small_dumps

    root = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="llmcheck_reports_bench_", dir=args.dir))
    current_src = Path(__file__).resolve().parent.parent / "src"
    versions = {**({"baseline": args.baseline_src} if args.baseline_src else {}), "current": current_src}
    servers: dict[str, Server] = {}
    outputs = Path(tempfile.mkdtemp(prefix="llmcheck_reports_", dir=args.dir))
    try:
        if args.reuse:
            golden, my = (next((root / side).glob("llmcheck_dump_*")) for side in ("golden", "my"))
        else:
            golden, my = write_small_dumps(root, args.records)
        result_path = args.result or root / "compare_result.pickle"
        if not result_path.is_file():  # the earliest version compares: the later one reads what it found
            build_src = next(iter(versions.values()))
            command = [sys.executable, __file__, "--build", str(golden), str(my), str(result_path)]
            done = subprocess.run(command, capture_output=True, text=True, env=child_environment(build_src))
            if done.returncode != 0:
                raise SystemExit(f"the compare of {build_src} failed ({done.returncode}):\n{done.stderr}")
        servers = {label: Server(src, result_path, outputs / label) for label, src in versions.items()}
        names = args.only.split(",") if args.only else servers["current"].started["reporters"]
        best: dict[str, dict[str, tuple[float, float]]] = {label: {} for label in servers}
        for _ in range(args.repeat):
            for name in names:
                for label, server in servers.items():  # each report of both versions in turn
                    timing = server.time(name)
                    if name not in best[label] or timing[0] < best[label][name][0]:
                        best[label][name] = timing
        pairs = servers["current"].started["pairs"]
        print(
            f"reports of {pairs} pairs, fastest of {args.repeat} writes each, both versions in turn on one result; "
            f"seconds wall (CPU), load {os.getloadavg()[0]:.1f}"
        )
        print(f"{'':9s}" + "".join(f"{name:>16s}" for name in [*names, "all"]))
        for label, reports in best.items():
            cells = [reports[name] for name in names] + [
                (sum(wall for wall, _ in reports.values()), sum(cpu for _, cpu in reports.values()))
            ]
            print(f"{label:9s}" + "".join(f"{wall:8.2f} ({cpu:5.2f})" for wall, cpu in cells))
        if "baseline" in best:
            current_all = sum(wall for wall, _ in best["current"].values())
            baseline_all = sum(wall for wall, _ in best["baseline"].values())
            print(f"speed-up of the reports phase: {baseline_all / current_all:.2f}x")
            for line in same_reports(outputs / "current", outputs / "baseline"):
                print("  " + line)
    finally:
        for server in servers.values():
            server.close()
        shutil.rmtree(outputs, ignore_errors=True)
        if args.keep or args.reuse:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
