"""Reports phase of ``llmcheck compare``: the seconds each default report takes on many small pairs.

Why apart from ``compare_throughput.py``: that benchmark times the whole command; here each
reporter (``cmp_report.csv``, ``summary.json``, ``pairs.json``, ``report.html``) is timed
alone, wall and CPU seconds, on the result of one compare of the small-records dumps
(``compare_throughput.py --mode small``, 50 000 records of 4-64 KB per side by default).
With ``--baseline-src DIR`` (the src folder of an earlier checkout, e.g. after
``git worktree add --detach /tmp/base main``) the earlier code writes its reports from the
same dumps in the same run, printed side by side, and the files of both are compared:
cmp_report.csv and pairs.json byte for byte, report.html with its timing fields blanked.

Each version runs in a child process (its own ``PYTHONPATH``): it loads and compares the
dumps once, then writes the reports ``--repeat`` times and keeps each reporter's fastest
run. The cyclic garbage collector is paused while they are written, as ``llmcheck
compare`` runs them (``core/gc_pause.py``).

    python benchmarks/report_writing.py [--records 50000] [--baseline-src /tmp/base/src] [--repeat 3]
        [--dir /tmp] [--keep | --reuse DIR]
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

#: Fields of summary.json (and of the page's copy of it) that differ from run to run.
TIMING_FIELDS = re.compile(rb'"(elapsed_s|throughput_gb_per_s)": ?[-0-9.e+]+')


def child(golden_path: Path, my_path: Path, output: Path, repeat: int) -> None:
    """Compare the dumps with the llmcheck on ``PYTHONPATH``, then time its default reporters; print JSON."""
    import gc

    from llmcheck.core.compare import compare_dumps
    from llmcheck.core.plugins import get_plugins
    from llmcheck.core.reporters import choose_reporters

    plugins = get_plugins()
    golden, my = plugins.load_runs(golden_path, None, my_path, None)
    result = compare_dumps(golden, my)
    output.mkdir(parents=True, exist_ok=True)
    best: dict[str, tuple[float, float]] = {}
    gc.disable()
    for _ in range(repeat):
        for reporter in choose_reporters(plugins.reporters()):
            wall_started, cpu_started = time.perf_counter(), time.process_time()
            reporter.write(result, output / reporter.file_name)
            timing = (time.perf_counter() - wall_started, time.process_time() - cpu_started)
            if reporter.name not in best or timing[0] < best[reporter.name][0]:
                best[reporter.name] = timing
    print(json.dumps({"pairs": len(result.rows), "reports": best}))


def run_child(src: Path, golden: Path, my: Path, output: Path, repeat: int) -> dict:
    """Run :func:`child` with the llmcheck under ``src`` and return what it printed."""
    from compare_throughput import plugins_missing_from

    shutil.rmtree(output, ignore_errors=True)
    environment = {**os.environ, "PYTHONPATH": str(src)}
    missing = plugins_missing_from(src)
    if missing:  # an earlier checkout predates a plugin this environment registers
        environment["LLMCHECK_DISABLE_PLUGINS"] = ",".join(missing)
    command = [sys.executable, __file__, "--child", str(golden), str(my), str(output), "--repeat", str(repeat)]
    done = subprocess.run(command, capture_output=True, text=True, env=environment)
    if done.returncode != 0:
        raise SystemExit(f"the reports of {src} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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
        "--repeat", type=int, default=3, help="times each version writes its reports; the fastest counts"
    )
    parser.add_argument("--dir", default=None, help="where the dumps are written (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the dumps afterwards (rerun with --reuse)")
    parser.add_argument("--reuse", default=None, help="a folder kept by --keep: use its dumps again")
    parser.add_argument("--child", nargs=3, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, args.repeat)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare_throughput import write_small_dumps

    root = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="llmcheck_reports_bench_", dir=args.dir))
    current_src = Path(__file__).resolve().parent.parent / "src"
    versions = {"current": current_src, **({"baseline": args.baseline_src} if args.baseline_src else {})}
    try:
        if args.reuse:
            golden, my = (next((root / side).glob("llmcheck_dump_*")) for side in ("golden", "my"))
        else:
            golden, my = write_small_dumps(root, args.records)
        timings = {
            label: run_child(src, golden, my, root / f"reports_{label}", args.repeat) for label, src in versions.items()
        }
        pairs = timings["current"]["pairs"]
        print(
            f"reports of {pairs} pairs, fastest of {args.repeat} writes each; seconds wall (CPU), load {os.getloadavg()[0]:.1f}"
        )
        names = list(timings["current"]["reports"])
        print(f"{'':9s}" + "".join(f"{name:>16s}" for name in [*names, "all"]))
        for label, timing in reversed(list(timings.items())):
            reports = timing["reports"]
            cells = [reports[name] for name in names] + [
                (sum(wall for wall, _ in reports.values()), sum(cpu for _, cpu in reports.values()))
            ]
            print(f"{label:9s}" + "".join(f"{wall:8.2f} ({cpu:5.2f})" for wall, cpu in cells))
        if "baseline" in timings:
            current_all = sum(wall for wall, _ in timings["current"]["reports"].values())
            baseline_all = sum(wall for wall, _ in timings["baseline"]["reports"].values())
            print(f"speed-up of the reports phase: {baseline_all / current_all:.2f}x")
            for line in same_reports(root / "reports_current", root / "reports_baseline"):
                print("  " + line)
    finally:
        for label in versions:
            shutil.rmtree(root / f"reports_{label}", ignore_errors=True)
        if args.keep or args.reuse:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
