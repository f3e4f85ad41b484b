"""The kept pairs of a compare as columns: each side's records by reference, the rest as a small code a pair.

Why: a :class:`~llmcheck.core.records.Pair` object and its place in a list are 88 bytes, held
from pairing to the last report; ten million pairs made it 880 MB. Held here a pair is its two
records' references and a code into the distinct (rule, priority, note, expected) its pairing
rules gave -- a handful of them in any compare -- 17 to 20 bytes. A :class:`PairTable` is a
read-only sequence of :class:`~llmcheck.core.records.Pair`: ``table[i]`` and iteration make the
pairs asked for, equal field for field to the pairs kept (two reads give equal pairs, not the
same object); :meth:`PairTable.side` gives one side's records without making a pair.

Two runs captured alike hold the same keys in the same order: their pairs are the two dumps'
record lists side by side, position by position (:func:`pairs_in_order`). Such a table holds
those very lists, not copies, and one code a pair: pairing ten million records then costs 1
byte a pair, where a ``Pair`` proposal each and the merge's lookups were about 300 at once.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

from llmcheck.core.records import Pair, TensorRecord, slot_builder

_build_pair = slot_builder(Pair)


class PairTable(Sequence[Pair]):
    """Pairs in order, held as the golden records, the my records and a code each for what else a pair says."""

    __slots__ = ("_codes", "_golden", "_kinds", "_my")

    def __init__(self, pairs: Sequence[Pair]) -> None:
        self._golden: list[TensorRecord | None] = [pair.golden for pair in pairs]
        self._my: list[TensorRecord | None] = [pair.my for pair in pairs]
        code_of: dict[tuple[Any, ...], int] = {}
        kinds: list[tuple[Any, ...]] = []
        codes = []
        for pair in pairs:
            rule, priority, note, expected = pair.rule, pair.priority, pair.note, pair.expected
            # types in the key too: an IntEnum priority equals its int, but prints and reads as itself
            kind = (rule, type(rule), priority, type(priority), note, type(note), expected, type(expected))
            code = code_of.get(kind)
            if code is None:
                code = code_of[kind] = len(kinds)
                kinds.append((rule, priority, note, expected))
            codes.append(code)
        self._kinds = kinds
        self._codes = array("B" if len(kinds) <= 1 << 8 else "H" if len(kinds) <= 1 << 16 else "I", codes)

    @classmethod
    def _in_order(cls, golden: Sequence[TensorRecord], my: Sequence[TensorRecord], kind: tuple[Any, ...]) -> PairTable:
        table = cls.__new__(cls)
        table._golden, table._my = golden, my  # type: ignore[assignment]  # read only, as every side is
        table._kinds = [kind]
        table._codes = array("B", bytes(len(golden)))
        return table

    def __len__(self) -> int:
        return len(self._codes)

    @overload
    def __getitem__(self, index: int) -> Pair: ...

    @overload
    def __getitem__(self, index: slice) -> list[Pair]: ...

    def __getitem__(self, index: int | slice) -> Pair | list[Pair]:
        if isinstance(index, slice):
            return [self[position] for position in range(*index.indices(len(self)))]
        return _build_pair(self._golden[index], self._my[index], *self._kinds[self._codes[index]])

    def __iter__(self) -> Iterator[Pair]:
        kinds = self._kinds
        for golden, my, code in zip(self._golden, self._my, self._codes):
            yield _build_pair(golden, my, *kinds[code])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(mine == theirs for mine, theirs in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # a sequence compared by its pairs, like a list

    def __repr__(self) -> str:
        return f"PairTable({list(self)!r})"

    def side(self, name: str) -> Sequence[TensorRecord | None]:
        """Return each pair's ``"golden"`` or ``"my"`` record, in order, without making the pairs."""
        if name == "golden":
            return self._golden
        if name == "my":
            return self._my
        raise ValueError(f"a pair has the sides 'golden' and 'my', not {name!r}")


def pairs_in_order(golden: Sequence[TensorRecord], my: Sequence[TensorRecord], rule: str, priority: int) -> PairTable:
    """Return the pairs of ``golden[i]`` and ``my[i]`` for every ``i``, all made by ``rule`` at ``priority``.

    For a pairing rule whose pairs are two record lists side by side (two runs captured alike):
    the table holds the lists given, which the caller must not change afterwards, and makes each
    pair when read. It is a sequence of :class:`~llmcheck.core.records.Pair` like any other.
    """
    if len(golden) != len(my):
        raise ValueError(f"pairs in order need sides of one length, not {len(golden)} golden and {len(my)} my records")
    return PairTable._in_order(golden, my, (rule, priority, "", False))


def pair_side(pairs: Sequence[Pair], name: str) -> Sequence[TensorRecord | None]:
    """Return each pair's ``"golden"`` or ``"my"`` record, in order: a table's column, else read from each pair."""
    if isinstance(pairs, PairTable):
        return pairs.side(name)
    return [getattr(pair, name) for pair in pairs]
