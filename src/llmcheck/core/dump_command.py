"""``llmcheck dump``: check the request, then hand the user's program to the chosen capture backend.

The command line (``core/cli.py``) only collects flags; here they become a
:class:`~llmcheck.core.records.CaptureRequest`: the backend's declared options parsed
(a wrong value is one usage error naming its flag), the program split into argv (never a
shell), and the output folder checked -- all before the program runs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmcheck.core.backend_options import option_values
from llmcheck.core.errors import UsageError
from llmcheck.core.records import CaptureRequest
from llmcheck.core.seed_flags import split_command


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
    from llmcheck.core.plugins import get_plugins
    from llmcheck.core.store import check_output_folder

    plugins = get_plugins()
    chosen = plugins.capture_backend(backend)
    options = option_values(plugins.backend_options(chosen.name), given_options)
    argv = split_command(exec_text, trailing_command)
    check_output_folder(output_dir, "new dumps")
    request = CaptureRequest(
        backend=chosen.name, command=argv, output_dir=output_dir, options=options, log_level=log_level
    )
    return chosen.run(request)


def run_program(command: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[bytes]:
    """Return the finished run of the user's program (never a shell); one that cannot start is a usage error naming --exec.

    Every capture backend runs the program this way, so a missing or non-executable program
    reads the same whichever backend was chosen.
    """
    try:
        return subprocess.run(list(command), env=dict(env), check=False)
    except FileNotFoundError as exc:
        raise UsageError(
            f"cannot run {command[0]!r}: no such program",
            where="--exec",
            hint="check the program name, or give its full path",
        ) from exc
    except PermissionError as exc:
        raise UsageError(f"cannot run {command[0]!r}: permission denied", where="--exec") from exc
