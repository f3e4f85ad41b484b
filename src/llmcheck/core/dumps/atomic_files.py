"""Files written whole or not at all: a temporary name beside the target, renamed into place.

Why: a report, a manifest or a tensor file that a full disk or a kill cut short must never
be left where a reader would take it for the real thing (a 0-byte ``cmp_report.csv``), and
a failed write must leave no temporary file behind. Temporary names hold the process and
the thread (``tempfile`` picks a fresh one), so threads and processes writing the same
target at once never write into each other's file; the last rename wins whole.

A failed write raises :class:`~llmcheck.core.errors.WriteFailedError` naming the target
and the errno, which the CLI prints as one line.
"""

from __future__ import annotations

import errno as errno_names
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from llmcheck.core.errors import WriteFailedError

#: Every temporary file written here ends so; a reader or a clean-up can recognise leftovers.
TEMPORARY_SUFFIX = ".tmp"

_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")

# ``tempfile`` creates files readable by their owner only; a written file gets the mode a plain
# ``open`` would give it. The umask is read once (reading it means setting it).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def write_failed(path: Path | str, exc: BaseException, what: str = "cannot write") -> WriteFailedError:
    """Return the typed error for a failed write of ``path``: the errno by number and name when the OS gave one."""
    code = getattr(exc, "errno", None)
    if not isinstance(code, int):  # libraries in Rust (safetensors) say "(os error 28)" in their message
        found = _RUST_OS_ERROR.search(str(exc))
        code = int(found.group(1)) if found else None
    if isinstance(code, int):
        reason = f"[Errno {code}] {os.strerror(code)} ({errno_names.errorcode.get(code, '?')})"
    else:
        reason = str(exc) or type(exc).__name__
    error = WriteFailedError(f"{what}: {reason}", where=path, errno=code)
    error.reason = reason
    return error


@contextmanager
def reports_written_into(folder: Path | str) -> Iterator[None]:
    """Turn a failed report write inside the block into one error naming the output folder (``-o``)."""
    try:
        yield
    except WriteFailedError as exc:
        name = Path(exc.where).name if exc.where else "a report"
        raise WriteFailedError(
            f"cannot write {name}: {exc.reason or exc.what}",
            where=folder,
            errno=exc.errno,
            hint="free some space there or pass another folder with -o",
        ) from exc


def remove_quietly(path: Path | str) -> None:
    """Remove a file if it is there; a removal that fails is left alone (it was a best effort)."""
    with suppress(OSError):
        os.unlink(path)


def _temporary_beside(target: Path) -> tuple[int, str]:
    """Return an open descriptor and the name of a fresh temporary file in ``target``'s folder."""
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TEMPORARY_SUFFIX, dir=target.parent)
        os.fchmod(descriptor, 0o666 & ~_UMASK)
    except OSError as exc:
        raise write_failed(target, exc) from exc
    return descriptor, temporary


@contextmanager
def _replacing(temporary: str, target: Path, failures: type[BaseException]) -> Iterator[None]:
    """Move ``temporary`` onto ``target`` when the block succeeds; else remove it (``failures`` become write errors)."""
    try:
        yield
        os.replace(temporary, target)
    except failures as exc:
        remove_quietly(temporary)
        raise write_failed(target, exc) from exc
    except BaseException:
        remove_quietly(temporary)
        raise


@contextmanager
def atomic_output(path: Path | str, mode: str = "w", **open_options: Any) -> Iterator[IO[Any]]:
    """Yield a file open on a temporary name beside ``path``; on success it replaces ``path``, else it is removed."""
    target = Path(path)
    descriptor, temporary = _temporary_beside(target)
    with _replacing(temporary, target, OSError), os.fdopen(descriptor, mode, **open_options) as handle:
        yield handle


def atomic_write_text(path: Path | str, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` whole or not at all."""
    with atomic_output(path, "w", encoding=encoding, newline="") as handle:
        handle.write(text)


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all."""
    with atomic_output(path, "wb") as handle:
        handle.write(data)


def atomic_write_with(path: Path | str, write: Callable[[str], Any]) -> None:
    """Have ``write(temporary_path)`` (a library that takes a file name) write ``path`` whole or not at all.

    Any exception of ``write`` other than an interrupt is a failed write of ``path``:
    libraries report a full disk in their own types (``SafetensorError``, ...).
    """
    target = Path(path)
    descriptor, temporary = _temporary_beside(target)
    os.close(descriptor)
    with _replacing(temporary, target, Exception):
        write(temporary)
