"""Pause Python's cyclic garbage collector while a command builds its many small objects.

A compare of a decode dump holds 10**5 records, pairs, measurements and rows, about ten
objects each, all alive until the reports are written. The cyclic collector runs after
every few hundred net allocations and a full collection walks every live object, so with
that many objects it took about 40 % of the main process's time (3.8 s of 9.5 s on 50 000
pairs), freeing nothing: these objects are released by reference counting when the
command ends, and they form no cycles worth collecting meanwhile. Reference counting still
frees everything else at once; only garbage *cycles* wait until the pause ends.
"""

from __future__ import annotations

import gc
from contextlib import ContextDecorator
from typing import Any


class paused_cyclic_gc(ContextDecorator):
    """Disable the cyclic collector inside the block (or decorated function); restore it after.

    Nested use is safe: only the outermost pause turns the collector back on, and a caller
    that had it disabled keeps it disabled.
    """

    def _recreate_cm(self) -> paused_cyclic_gc:
        # A decorator keeps one instance; each call needs its own saved state, or a decorated
        # function calling itself (compare_dumps for the noise twin) would leave the collector off.
        return type(self)()

    def __enter__(self) -> paused_cyclic_gc:
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._was_enabled:
            gc.enable()
