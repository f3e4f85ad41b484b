"""``llmcheck dump``: check the request, then hand the user's program to the chosen capture backend.

The command line (``core/cli.py``) only collects flags; here they become a
:class:`~llmcheck.core.records.CaptureRequest`: the backend's declared options parsed
(a wrong value is one usage error naming its flag), the program split into argv (never a
shell), and the output folder checked -- all before the program runs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from llmcheck.core.capture.backend_options import option_values
from llmcheck.core.capture.seed_flags import split_command
from llmcheck.core.errors import UsageError
from llmcheck.core.records import CaptureRequest

log = logging.getLogger("llmcheck.dump")

#: The signals ``llmcheck dump`` passes on to the program it runs, instead of dying of them.
RELAYED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def dump_command(
    *,
    backend: str | None,
    exec_text: str | None,
    trailing_command: Sequence[str],
    output_dir: Path,
    given_options: Mapping[str, Any],
    log_level: str = "info",
) -> int:
    """Run ``llmcheck dump`` and return the program's exit code.

    ``backend`` ``None`` is the backend that declares itself the default. ``given_options`` holds what the user gave for the backend's declared options, by name
    (the left-out ones take their defaults); the program is ``exec_text`` split like a
    shell would, or ``trailing_command`` (the words after ``--``).
    """
    from llmcheck.core.dumps.store import check_output_folder
    from llmcheck.core.plugins import get_plugins

    plugins = get_plugins()
    chosen = plugins.capture_backend(backend)
    options = option_values(plugins.backend_options(chosen.name), given_options)
    argv = split_command(exec_text, trailing_command)
    check_output_folder(output_dir, "new dumps")
    request = CaptureRequest(
        backend=chosen.name, command=argv, output_dir=output_dir, options=options, log_level=log_level
    )
    return chosen.run(request)


@dataclass(frozen=True)
class ProgramRun:
    """How the user's program ended, and whether ``llmcheck dump`` was asked to stop it while it ran."""

    #: as :mod:`subprocess` gives it: the exit code, or ``-N`` when the program was killed by signal N
    returncode: int
    #: the signal that asked the run to stop (``"SIGINT"``, ``"SIGTERM"``), ``None`` when it ran to its own end
    interrupted_by: str | None = None
    #: a second signal stopped the wait: llmcheck killed the program before its clean-up ended
    wait_stopped: bool = False
    #: the capture ended the program after this step, the last one asked for (``--exit-after-range``)
    ended_after_step: int | None = None

    def ended_by_capture(self, step: int) -> ProgramRun:
        """Return this run as ended by the capture after ``step``, as asked: a success, whatever code it gave.

        A program whose engine ran in another process may fail when the capture ends that
        process (vLLM's front end sees its engine die); the run still did what was asked.
        """
        returncode = self.returncode if self.interrupted_by is not None else 0
        return dataclasses.replace(self, returncode=returncode, ended_after_step=step)

    @property
    def exit_code(self) -> int:
        """Return the code ``llmcheck dump`` exits with: the program's own, 128+N when signal N killed it."""
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    @property
    def ended(self) -> str:
        """Return how the program ended, in words: ``the program exited with code 7 after SIGINT``."""
        if self.wait_stopped:
            return f"the program was killed by llmcheck after a second {self.interrupted_by}, before it finished"
        if self.ended_after_step is not None and self.interrupted_by is None:
            return f"the capture ended the program after step {self.ended_after_step}, the last one asked for"
        how = (
            f"the program was killed by signal {-self.returncode}"
            if self.returncode < 0
            else f"the program exited with code {self.returncode}"
        )
        return how if self.interrupted_by is None else f"{how} after {self.interrupted_by}"

    @property
    def cut_reason(self) -> str | None:
        """Return why a dump of this run is cut although its capture closed it (``None``: the run was not stopped)."""
        if self.interrupted_by is None:
            return None
        return (
            f"interrupted: llmcheck dump got {self.interrupted_by} while the program ran, so its records may end early"
        )


def run_program(command: Sequence[str], env: Mapping[str, str]) -> ProgramRun:
    """Return how the user's program (never a shell) ended; one that cannot start is a usage error naming --exec.

    Every capture backend runs the program this way, so a missing or non-executable program
    reads the same whichever backend was chosen -- and so does a Ctrl-C: the program is
    asked to stop, never killed. SIGINT and SIGTERM sent to llmcheck are passed on to it
    (a Ctrl-C typed at the terminal reaches it directly, so that one is not sent twice), and
    llmcheck waits until the program finishes as it chooses -- its clean-up, its output,
    its exit code. A second signal stops the wait: the program is killed, and a warning says
    so. The returned run names the signal, so the dump is marked cut.
    """
    try:
        process = subprocess.Popen(list(command), env=dict(env))
    except FileNotFoundError as exc:
        raise UsageError(
            f"cannot run {command[0]!r}: no such program",
            where="--exec",
            hint="check the program name, or give its full path",
        ) from exc
    except PermissionError as exc:
        raise UsageError(f"cannot run {command[0]!r}: permission denied", where="--exec") from exc
    with _SignalRelay(process) as relay:
        returncode = process.wait()
    return ProgramRun(returncode, relay.interrupted_by, relay.wait_stopped)


class _SignalRelay:
    """While the program runs: pass SIGINT and SIGTERM on to it, and note the first one (a second stops the wait)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.interrupted_by: str | None = None
        self.wait_stopped = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalRelay:
        if threading.current_thread() is threading.main_thread():  # Python handles signals there only
            for number in RELAYED_SIGNALS:
                self._previous[number] = signal.signal(number, self._relay)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _relay(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        pid = self.process.pid
        if self.interrupted_by is not None:
            self.wait_stopped = True
            log.warning(
                "a second %s: stopped waiting for the program (pid %d) and killed it; its clean-up did not finish",
                name,
                pid,
            )
            self.process.kill()
            return
        self.interrupted_by = name
        if number == signal.SIGINT and _terminal_reaches_program():
            passed = "the terminal's Ctrl-C reached it too"
        else:
            self.process.send_signal(number)
            passed = f"passed {name} on to it"
        log.warning(
            "%s: %s; waiting for the program (pid %d) to finish as it chooses (send it again to stop waiting)",
            name,
            passed,
            pid,
        )


def _terminal_reaches_program() -> bool:
    """Return whether a Ctrl-C typed at a terminal reaches the program by itself.

    The terminal sends it to its foreground process group: when that is llmcheck's, the
    program, started in llmcheck's group, got the same SIGINT; sending another would be a
    second Ctrl-C, which many programs take as "stop now, skip the clean-up".
    """
    try:
        terminal = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # no controlling terminal: the signal was sent to llmcheck alone
        return False
    try:
        return os.tcgetpgrp(terminal) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(terminal)
