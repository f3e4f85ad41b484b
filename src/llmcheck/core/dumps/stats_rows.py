"""A dump's statistics held as columns: each record's :class:`~llmcheck.core.records.TensorStats` is a row of them.

Why: a statistics-only dump (``dump -sd``) is nothing but records and their statistics, and
ten million of them is what a long decode of a large model writes. As objects of their own,
one record's statistics were 176 bytes: the object (80) and four float objects (96). Here
they are a :class:`StatsRow` of 48 bytes reading its values out of columns its block shares
-- C doubles and integers, or, where none is set or all are zero, one tuple every block
shares -- 80 bytes a record in all. A row reads back each value exactly as it was given: a
column that cannot hold its values as C numbers (a ``None`` among floats, an int among
floats) keeps them as the objects themselves.

A block holds :data:`ROWS_PER_BLOCK` rows: the row numbers within it are Python's cached
small ints, so a row holds no number of its own.
"""

from __future__ import annotations

from array import array
from typing import Any

from llmcheck.core.records import STATS_FIELDS, TensorStats

#: The rows a block holds: 256, so that each row's number within its block is one of Python's
#: shared small ints (0 to 256), not an int object of its own.
ROWS_PER_BLOCK = 256
#: The columns every full block of that kind shares: no value set, and all zero (NaN and Inf counts).
_ALL_NONE = (None,) * ROWS_PER_BLOCK
_ALL_ZERO = (0,) * ROWS_PER_BLOCK


class _Block:
    """Up to :data:`ROWS_PER_BLOCK` rows' statistics: a column per field, lists while filling, compact once sealed."""

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns: tuple[Any, ...] = tuple([] for _ in STATS_FIELDS)

    def seal(self) -> None:
        """Hold each column in the least memory that gives its values back exactly."""
        self.columns = tuple(map(_sealed, self.columns))


def _sealed(values: list[Any]) -> Any:
    """Return a column as C numbers where every value is a float (or every one an int), a shared tuple or a tuple."""
    if len(values) == ROWS_PER_BLOCK:
        if values.count(None) == ROWS_PER_BLOCK:
            return _ALL_NONE
        if set(map(type, values)) == {int} and not any(values):
            return _ALL_ZERO
    kinds = set(map(type, values))
    if kinds == {float}:
        return array("d", values)
    if kinds == {int} and min(values) >= -(2**63) and max(values) < 2**63:
        return array("q", values)
    return tuple(values)


class StatsRow(TensorStats):
    """A record's statistics as one row of a block's columns: read alike, equal and hashed alike to ``TensorStats(...)``."""

    __slots__ = ("_block", "_row")

    _block: _Block
    _row: int

    @property
    def min(self) -> float | None:
        """The smallest finite element."""
        return self._block.columns[0][self._row]  # type: ignore[no-any-return]

    @property
    def max(self) -> float | None:
        """The largest finite element."""
        return self._block.columns[1][self._row]  # type: ignore[no-any-return]

    @property
    def mean(self) -> float | None:
        """The mean of the finite elements."""
        return self._block.columns[2][self._row]  # type: ignore[no-any-return]

    @property
    def l2norm(self) -> float | None:
        """The L2 norm of the finite elements."""
        return self._block.columns[3][self._row]  # type: ignore[no-any-return]

    @property
    def nan_count(self) -> int | None:
        """How many elements are NaN."""
        return self._block.columns[4][self._row]  # type: ignore[no-any-return]

    @property
    def inf_count(self) -> int | None:
        """How many elements are infinite."""
        return self._block.columns[5][self._row]  # type: ignore[no-any-return]

    def values(self) -> tuple[Any, ...]:
        """Return the six values, in :data:`~llmcheck.core.records.STATS_FIELDS` order."""
        row = self._row
        return tuple(column[row] for column in self._block.columns)


_new_row = object.__new__
# the slots' descriptors, through which a row is set up without the frozen __setattr__
_set_block = StatsRow.__dict__["_block"].__set__
_set_row = StatsRow.__dict__["_row"].__set__


class StatsRows:
    """Makes the statistics of a dump's records as rows of shared columns, a block at a time.

    Call it with a record's six values, in :data:`~llmcheck.core.records.STATS_FIELDS` order,
    for its :class:`StatsRow`; :meth:`close` once the last is made (a block still filling
    holds its values as lists: read alike, larger).
    """

    __slots__ = ("_block", "_filled")

    def __init__(self) -> None:
        self._block = _Block()
        self._filled = 0

    def __call__(
        self,
        min: float | None,
        max: float | None,
        mean: float | None,
        l2norm: float | None,
        nan_count: int | None,
        inf_count: int | None,
    ) -> StatsRow:
        if self._filled == ROWS_PER_BLOCK:
            self._block.seal()
            self._block, self._filled = _Block(), 0
        block = self._block
        mins, maxes, means, norms, nans, infs = block.columns
        mins.append(min)
        maxes.append(max)
        means.append(mean)
        norms.append(l2norm)
        nans.append(nan_count)
        infs.append(inf_count)
        row = _new_row(StatsRow)
        _set_block(row, block)
        _set_row(row, self._filled)
        self._filled += 1
        return row

    def close(self) -> None:
        """Seal the block still filling; rows made after this go into a new block."""
        if self._filled:
            self._block.seal()
            self._block, self._filled = _Block(), 0
