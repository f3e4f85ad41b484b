"""``--type cpu_profiling`` for torch: per step, each operator's host time and call count, as CSV.

A step is profiled with ``torch.profiler`` (CPU activity) from the top-level model's
forward pre-hook to its forward hook. The capture's own work (copies, statistics) runs
inside a ``llmcheck::capture`` range and is left out, so the table shows the model alone.
Written to ``{dump}/cpu_profiling/operation_statistic_{step}.csv``.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import torch

#: Name of the profiler range that wraps the capture's own work.
CAPTURE_RANGE = "llmcheck::capture"
CSV_COLUMNS = ("op_name", "calls", "self_cpu_time_us", "cpu_time_total_us", "cpu_time_avg_us")


class StepProfiler:
    """Profiles one step at a time and writes its operator table."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._profile: Any = None
        self.files_written: list[Path] = []

    @property
    def running(self) -> bool:
        """Return whether a step is being profiled now."""
        return self._profile is not None

    def start(self) -> None:
        """Start profiling the step that begins now."""
        self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._profile.__enter__()

    def stop(self, step: int) -> Path:
        """Stop profiling and return the CSV written for ``step``."""
        profile, self._profile = self._profile, None
        profile.__exit__(None, None, None)
        rows = operator_table(profile.events())
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"operation_statistic_{step}.csv"
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(CSV_COLUMNS)
            writer.writerows(rows)
        os.replace(temporary, path)
        self.files_written.append(path)
        return path


def operator_table(events: Any) -> list[tuple[str, int, float, float, float]]:
    """Return ``(op, calls, self µs, total µs, average µs)`` per operator, slowest self time first.

    Events inside the capture's own range are left out.
    """
    totals: dict[str, list[float]] = {}
    for event in events:
        if event.name == CAPTURE_RANGE or _inside_capture(event):
            continue
        entry = totals.setdefault(event.name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += event.self_cpu_time_total
        entry[2] += event.cpu_time_total
    rows = [
        (name, int(calls), round(self_us, 3), round(total_us, 3), round(total_us / calls, 3))
        for name, (calls, self_us, total_us) in totals.items()
    ]
    rows.sort(key=lambda row: (-row[2], row[0]))
    return rows


def _inside_capture(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == CAPTURE_RANGE:
            return True
        parent = parent.cpu_parent
    return False
