"""Memory a phase of the compare freed inside the C heap goes back to the system before the next phase."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from llmcheck.core.measuring import heap


def _resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux") or heap._malloc_trim() is None, reason="needs glibc")
def test_freed_heap_memory_under_a_live_object_is_returned() -> None:
    # 64 KB buffers come from the heap (below malloc's mmap threshold); the last one stays alive
    # above the others, so the heap cannot shrink from its top when they are freed
    buffers = [np.ones(8192) for _ in range(800)]  # 52 MB
    pinned = buffers.pop()
    del buffers
    before = _resident_mb()
    heap.return_free_memory()
    assert _resident_mb() < before - 30
    assert pinned.sum() == 8192  # still there


def test_without_glibc_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    heap._malloc_trim.cache_clear()
    monkeypatch.setattr(heap.ctypes.util, "find_library", lambda name: None)
    try:
        assert heap._malloc_trim() is None
        heap.return_free_memory()  # no error, nothing to call
    finally:
        heap._malloc_trim.cache_clear()
