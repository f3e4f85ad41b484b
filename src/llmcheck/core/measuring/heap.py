"""Give the memory the C heap holds free back to the system, between the phases of a large compare.

Why: glibc's malloc keeps memory freed inside its heap for reuse, and returns it only from
the top of the heap. A compare frees tens of MB at the end of a phase -- the measuring's
read windows and chunk buffers, 10^5 transient objects -- under objects that live on, so
the process keeps that memory while the next phase allocates more: 40 MB more at the peak
of a 50 000-pair compare in which this process measured half the pairs. ``malloc_trim``
hands such free pages back. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


def return_free_memory() -> None:
    """Return the free pages of the C heap to the system (glibc ``malloc_trim``; a no-op elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
