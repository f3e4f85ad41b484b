"""Progress as log lines, for when nobody watches a terminal: a CI job's log, output piped to a file.

A rich progress bar draws nothing when stderr is not a terminal, so a long compare in CI
would log nothing for minutes. :class:`ProgressLog` logs a line each time another tenth of
the work is done, at most one per ``min_interval_s`` (the last line, 100 %, always). Its
amounts are in the unit the total reads best in: a 3 GB compare counts GB, a 0.1 MB one kB,
never ``0.00 of 0.00 GB``.
"""

from __future__ import annotations

import logging
import time

#: Byte units from the largest down: the first whose size the total reaches is the one counted in.
_UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "bytes"))


def byte_unit(total_bytes: float) -> tuple[float, str]:
    """Return the size and name of the unit ``total_bytes`` reads best in (at least 1 of it)."""
    return next(((size, name) for size, name in _UNITS if total_bytes >= size), _UNITS[-1])


class ProgressLog:
    """Logs ``<what>: 40% (1.20 of 3.00 GB, 0.80 GB/s)`` lines as bytes of work are done."""

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
        size, unit = byte_unit(self.total_bytes)
        rate_bytes = self.done_bytes / max(now - self._started_s, 1e-9)
        rate_size, rate_unit = byte_unit(rate_bytes)
        self.log.info(
            "%s: %d%% (%.2f of %.2f %s, %.2f %s/s)",
            self.what,
            tenth * 10,
            self.done_bytes / size,
            self.total_bytes / size,
            unit,
            rate_bytes / rate_size,
            rate_unit,
        )
