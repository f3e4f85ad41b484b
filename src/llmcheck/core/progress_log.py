"""Progress as log lines, for when nobody watches a terminal: a CI job's log, output piped to a file.

A rich progress bar draws nothing when stderr is not a terminal, so a long compare in CI
would log nothing for minutes. :class:`ProgressLog` logs a line each time another tenth of
the work is done, at most one per ``min_interval_s`` (the last line, 100 %, always).
"""

from __future__ import annotations

import logging
import time


class ProgressLog:
    """Logs ``<what>: 40% (1.2 of 3.0 GB, 0.8 GB/s)`` lines as bytes of work are done."""

    def __init__(self, what: str, log: logging.Logger, *, min_interval_s: float = 2.0) -> None:
        self.what = what
        self.log = log
        self.min_interval_s = min_interval_s
        self.total_bytes = 0
        self.done_bytes = 0
        self._started_s = time.monotonic()
        self._last_line_s = float("-inf")
        self._last_tenth = -1

    def start(self, total_bytes: int) -> None:
        """Set the amount of work (bytes) and log the first line."""
        self.total_bytes = total_bytes
        self._started_s = time.monotonic()
        self._line(0)

    def advance(self, done_bytes: int) -> None:
        """Count ``done_bytes`` more bytes done; log when another tenth is reached and the interval has passed."""
        self.done_bytes += done_bytes
        if self.total_bytes <= 0:
            return
        tenth = min(10, self.done_bytes * 10 // self.total_bytes)
        if tenth > self._last_tenth and (tenth == 10 or time.monotonic() - self._last_line_s >= self.min_interval_s):
            self._line(tenth)

    def _line(self, tenth: int) -> None:
        now = time.monotonic()
        self._last_tenth, self._last_line_s = tenth, now
        rate = self.done_bytes / 1e9 / max(now - self._started_s, 1e-9)
        self.log.info(
            "%s: %d%% (%.2f of %.2f GB, %.2f GB/s)",
            self.what,
            tenth * 10,
            self.done_bytes / 1e9,
            self.total_bytes / 1e9,
            rate,
        )
