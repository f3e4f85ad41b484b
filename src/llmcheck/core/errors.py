"""Typed errors: every failure a user can cause or meet has one, and the CLI prints it as one line.

The CLI turns any :class:`LlmcheckError` into ``llmcheck: error: <where>: <what> (<hint>)``
and exit code 1 (:class:`UsageError` gives exit code 2). Anything else is a bug in
llmcheck and is shown with its traceback only under ``--log-level debug``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

#: Exit codes of every command: 0 done and nothing failed, 1 llmcheck failed (bad input, a
#: broken dump), 2 a usage error, 3 done and the analysis found failing tensors or ops.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_FAILURES_FOUND = 3


def closest_name(name: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """Return the one of ``known`` closest to a mistyped ``name`` (for a "did you mean" hint), or None when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


class LlmcheckError(Exception):
    """A failure the user can act on: names the file or flag, what is wrong and what to do."""

    exit_code = 1

    def __init__(self, what: str, *, where: str | Path | None = None, hint: str | None = None) -> None:
        self.what = what
        self.where = str(where) if where is not None else None
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """Return the message as the single line the CLI prints after ``llmcheck: error:``."""
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.hint:
            text += f" ({self.hint})"
        return text


class UsageError(LlmcheckError):
    """A wrong flag, a missing argument, an impossible combination of options."""

    exit_code = 2


class DumpFormatError(LlmcheckError):
    """A file does not follow the format it claims: truncated, corrupt, inconsistent.

    ``offset`` is the byte offset where reading went wrong, when one is known.
    """

    def __init__(
        self,
        what: str,
        *,
        where: str | Path | None = None,
        offset: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.offset = offset
        if offset is not None:
            what = f"{what} at byte {offset}"
        super().__init__(what, where=where, hint=hint)


class DumpNotFoundError(LlmcheckError):
    """A path holds no dump that any plugin recognises, or holds several where one is needed."""


class PathOutsideDumpError(LlmcheckError):
    """A reference inside a dump points outside the dump's root (refused, never followed)."""


class PluginError(LlmcheckError):
    """A plugin failed to load, clashed with another plugin, or broke its hook contract."""


class BackendUnavailableError(LlmcheckError):
    """The software a backend needs (Ascend toolkit, torch_npu, torchair, ...) is absent here."""


class ShapeMismatchError(LlmcheckError):
    """Two tensors that must have the same number of elements do not."""


class UnsupportedOpError(LlmcheckError):
    """An operator reference cannot compute this op or this variant of it (opcheck lists the op with this reason)."""


class WriteFailedError(LlmcheckError):
    """Writing a file failed (a full disk, a file size limit, no permission); ``errno`` is the OS's code."""

    def __init__(
        self, what: str, *, where: str | Path | None = None, errno: int | None = None, hint: str | None = None
    ) -> None:
        self.errno = errno
        self.reason: str | None = None  # the OS's words alone ("[Errno 28] No space left on device (ENOSPC)")
        super().__init__(what, where=where, hint=hint)
