"""How a capture is going, for the person waiting on it: step, records, megabytes written and the rate.

A long prefill with every step dumped used to run for minutes in silence between
``capturing ... into ...`` and ``wrote ...``. The sink reports each batch it hands to the
writer here. On a terminal the report is one live status line (rich), redrawn in place; in
a log (stderr piped, a CI job) it is one plain line per finished step. It follows the
``llmcheck`` logger: ``-l warning`` silences it, and an in-process ``register_hook`` is
silent unless the program turned llmcheck's INFO logging on.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

log = logging.getLogger("llmcheck.torch.progress")


class DumpProgress:
    """Reports a capture's progress: a live line when ``live``, else a log line per finished step."""

    def __init__(self, *, live: bool, stream: TextIO | None = None) -> None:
        self.live = live
        self.stream = stream
        self.step: int | None = None
        self.records = 0
        self.bytes_written = 0
        self._started_s = time.monotonic()
        self._display: Any = None  # rich.live.Live once the first batch arrived (live mode only)

    @classmethod
    def for_this_process(cls) -> DumpProgress | None:
        """Return the reporter this process wants: ``None`` when INFO is off, live when stderr is a terminal."""
        if not log.isEnabledFor(logging.INFO):
            return None
        return cls(live=sys.stderr.isatty())

    def status_line(self) -> str:
        """Return the current state in words, e.g. ``step 3: 412 records, 96.40 MB written, 31.20 MB/s``."""
        elapsed_s = max(time.monotonic() - self._started_s, 1e-9)
        megabytes = self.bytes_written / 1e6
        step = "-" if self.step is None else str(self.step)
        return f"step {step}: {self.records} records, {megabytes:.2f} MB written, {megabytes / elapsed_s:.2f} MB/s"

    def batch_written(self, *, step: int, records: int, tensor_bytes: int, step_done: bool) -> None:
        """Take the totals after a batch was handed to the writer; ``step_done`` when it closed a step."""
        self.step, self.records, self.bytes_written = step, records, tensor_bytes
        if self.live:
            self._redraw()
        elif step_done:
            log.info("dumped %s", self.status_line())

    def close(self) -> None:
        """Leave the last live line on screen (plain mode has nothing to end)."""
        if self._display is not None:
            self._redraw("dumped")
            self._display.stop()
            self._display = None

    def _redraw(self, verb: str = "dumping") -> None:
        from rich.text import Text

        text = Text(f"llmcheck: {verb} {self.status_line()}")
        if self._display is None:
            from rich.console import Console
            from rich.live import Live

            console = Console(stderr=True) if self.stream is None else Console(file=self.stream, force_terminal=True)
            # no refresh thread: the line is redrawn when a batch is written, inside the user's program
            self._display = Live(text, console=console, auto_refresh=False, transient=False)
            self._display.start()
        self._display.update(text, refresh=True)
