"""The records of a dump read from llmcheck's own index, and their statistics, held as rows of columns.

Why: a statistics-only dump (``dump -sd``) is nothing but records and their statistics, and
ten million of them is what a long decode of a large model writes. As objects of their own, a
record was 164 bytes (its 13 fields, and its ``order`` as an int object) and its statistics
176 (the object, and four float objects). Here a record is a row -- a :class:`RecordRow` of 64
bytes -- reading its values out of columns its block shares: references to the objects records
hold anyway (keys shared by both runs, interned texts), a byte a row naming one of a block's
few distinct objects (its op types, its parent modules), C doubles and integers, or, where a
block's rows all hold one value (the device, rank 0, no attrs, no data, NaN counts of zero), one
tuple every such block shares. Its dtype is its class's (one class of rows a dtype); a
statistics-only record's path is made from its key name. Its statistics are six more columns of
the same block, read through a :class:`StatsRow` (48 bytes) made when ``record.stats`` is asked
for and let go with it: held one a record, those were a tenth of what a statistics-only compare
holds at its peak. A statistics-only record and its statistics come to about 110 bytes in all,
instead of 350.

A row reads back each value exactly as it was given, object for object: a column of floats
or ints is held as C numbers only where every value in it is of that type, else the values
are kept as they are. A block holds :data:`ROWS_PER_BLOCK` rows, so each row's number within
its block is one of Python's cached small ints: a row holds no number of its own.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from llmcheck.core.records import RECORD_FIELDS, STATS_FIELDS, RecordKey, TensorData, TensorRecord, TensorStats


class _KeyNamedPath(str):
    """A ``source_path`` that is this text and the record's key name: a statistics-only record's ``index.jsonl:<name>``.

    Why: such a record's path says where its line is, ``<dump>/index.jsonl:<name>``; held, it
    was a reference a record (16 bytes a pair) to a text of each name. Every row of a dump reads
    its own path made again, equal to the one it was given.
    """

    __slots__ = ()


#: The rows a block holds: 256, so that each row's number within its block is one of Python's
#: shared small ints (0 to 256), not an int object of its own.
ROWS_PER_BLOCK = 256
#: The shared column of each value that fills whole blocks, by the value's type and the value
#: (or identity, for a value that cannot be hashed); at most this many, then blocks keep their own.
_SHARED_LIMIT = 4096
_shared_columns: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}


def _shared_column(value: Any) -> tuple[Any, ...] | None:
    """Return the one column of ``ROWS_PER_BLOCK`` times ``value`` that every block filled with it shares.

    Found by value for what reads alike whichever equal object it is (None, a text, an int, a
    tuple of ints: a shape), by identity for a mapping (the one empty ``attrs``); any other
    value (a float: ``0.0`` equals ``-0.0``) is not shared.
    """
    kind = type(value)
    if kind in _BY_VALUE or (kind is tuple and all(type(item) is int for item in value)):
        found_by: tuple[Any, ...] = (kind, value)
    elif isinstance(value, Mapping):
        found_by = (kind, id(value))
    else:
        return None
    entry = _shared_columns.get(found_by)
    if entry is None:
        if len(_shared_columns) >= _SHARED_LIMIT:
            return None
        entry = _shared_columns[found_by] = (value, (value,) * ROWS_PER_BLOCK)  # the value kept alive for its id
    return entry[1]


_BY_VALUE = frozenset({type(None), bool, int, str, _KeyNamedPath})


def _sealed(values: list[Any]) -> Sequence[Any] | _Coded | _FloatsOrNone:
    """Return a column in the least memory that gives back each value, object for object or bit for bit.

    A full block's column of one object is the column every such block shares; floats, where
    every value is a float, are C floats or doubles (:func:`_floats`), and so are they where the
    others are None (:class:`_FloatsOrNone`); ints, where every value is an int, C integers, or,
    where each is one more than the one before (the records' orders), a ``range`` of 48 bytes
    a block; other objects, where few distinct ones repeat (a block's op types and parent
    modules), a byte per row naming each (:class:`_Coded`); anything else is kept as the
    objects (a tuple of references).
    """
    first = values[0]
    if (
        len(values) == ROWS_PER_BLOCK
        and values[-1] is first  # most columns that hold many values differ here: no look at the rest
        and all(value is first for value in values)  # one object, not only equal ones (0 equals 0.0)
    ):
        shared = _shared_column(first)
        if shared is not None:
            return shared
    kinds = set(map(type, values))
    if kinds == {float}:
        return _floats(values)
    if kinds == {float, _NONE}:  # the statistics of a block that holds an empty tensor's
        return _FloatsOrNone(values)
    if kinds == {int}:
        counted = range(first, first + len(values))
        if values == list(counted):  # orders: a record's count from the dump's first, one more a row
            return counted
        if min(values) >= -(2**63) and max(values) < 2**63:
            return array("q", values)
    return _coded(values) or tuple(values)


def _floats(values: list[float]) -> array[float]:
    """Return floats as C floats (``array('f')``) where each is one, bit for bit, else as C doubles.

    Why: most statistics a dump holds are the values of float32, bfloat16 or float16
    tensors -- their min and max always, often their mean and norm where a tool measures in
    float32 -- and so float32s exactly: 4 bytes each, not 8, 16 bytes a pair for the min and
    max alone. A column with a value that is not one (a float64 mean, a NaN's payload beyond
    float32's, a double beyond float32's range) is held as doubles.
    """
    import numpy as np

    doubles = array("d", values)
    if not _is_single(values[0]):  # most columns of doubles are told by their first value
        return doubles
    with np.errstate(over="ignore"):  # a double beyond float32's range becomes an infinity: not the same bits
        singles = array("f", np.frombuffer(doubles, dtype=np.float64).astype(np.float32).tobytes())
    return singles if array("d", singles).tobytes() == doubles.tobytes() else doubles


def _is_single(value: float) -> bool:
    """Return whether a float is a float32's value (a NaN: perhaps; its payload is checked with the whole column)."""
    try:
        return value != value or _SINGLE.unpack(_SINGLE.pack(value))[0] == value
    except OverflowError:  # beyond float32's range
        return False


_SINGLE = struct.Struct("f")


_NONE = type(None)


class _FloatsOrNone:
    """A block's column of floats and some None: the floats as C numbers (:func:`_floats`), and the rows that hold None.

    Why: an empty tensor's statistics are None (an op-level dump holds a few in most blocks
    of 256 records), and a column of objects -- a reference and a float object a row, 40
    bytes -- was 5 to 10 times the C numbers the other rows need.
    """

    __slots__ = ("floats", "nones")

    def __init__(self, values: list[float | None]) -> None:
        self.nones = frozenset(row for row, value in enumerate(values) if value is None)
        self.floats = _floats([0.0 if value is None else value for value in values])

    def __getitem__(self, row: int) -> float | None:
        return None if row in self.nones else self.floats[row]

    def __len__(self) -> int:
        return len(self.floats)


class _Coded:
    """A block's column of a few distinct objects, repeated: a byte per row naming its object among them.

    Why: a block's op types and parent modules are a handful of texts over its 256 rows: as a
    tuple of references they were 8 bytes a row, 16 a pair, for what a byte names. The
    objects are told apart by identity, so each row reads back the very object it was given.
    """

    __slots__ = ("codes", "objects")

    def __init__(self, codes: bytes, objects: tuple[Any, ...]) -> None:
        self.codes = codes
        self.objects = objects

    def __getitem__(self, row: int) -> Any:
        return self.objects[self.codes[row]]

    def __len__(self) -> int:
        return len(self.codes)


def distinct_codes(values: Sequence[Any], by_value: bool) -> tuple[list[int], list[Any]]:
    """Return a code per value and the distinct values, by equality (texts, where equal ones read alike) or by identity."""
    keys = list(values) if by_value else list(map(id, values))
    first_of = dict(zip(reversed(keys), reversed(values)))  # each key's first value (the same object, by identity)
    code_of = {key: code for code, key in enumerate(dict.fromkeys(keys))}
    return list(map(code_of.__getitem__, keys)), [first_of[key] for key in code_of]


def _coded(values: list[Any]) -> _Coded | None:
    """Return ``values`` as a :class:`_Coded` column, or None where it would save less than half of a tuple's memory.

    A tuple is ``40 + 8 n`` bytes for ``n`` rows; coded, ``121 + n + 8 d`` for ``d`` distinct
    objects (at most 83 of a full block's 256 rows, so each code fits a byte).
    """
    codes, objects = distinct_codes(values, by_value=False)
    if 2 * (121 + len(values) + 8 * len(objects)) > 40 + 8 * len(values):
        return None
    return _Coded(bytes(codes), tuple(objects))


class _Block:
    """Up to :data:`ROWS_PER_BLOCK` rows: a column per field, lists while filling, compact once sealed."""

    __slots__ = ("columns",)

    def __init__(self, fields: int) -> None:
        self.columns: tuple[Any, ...] = tuple([] for _ in range(fields))

    def seal(self) -> None:
        """Hold each column in the least memory that gives its values back exactly."""
        self.columns = tuple(map(_sealed, self.columns))


#: How many columns a record's statistics take: the first of its block's columns.
STATS_COLUMNS = len(STATS_FIELDS)


class StatsRow(TensorStats):
    """A record's statistics as one row of a block's columns: read alike, equal and hashed alike to ``TensorStats(...)``.

    Each value is a property reading its column at the row's place: the first
    :data:`STATS_COLUMNS` columns of a block of :class:`RecordRows`, which ``record.stats``
    makes a row over when asked. Two rows reading the same place are equal, as one row is to
    itself (NaN included).
    """

    __slots__ = ("_block", "_row")

    _block: _Block
    _row: int

    def values(self) -> tuple[Any, ...]:
        """Return the six values, in :data:`~llmcheck.core.records.STATS_FIELDS` order (read at once: one call, not six)."""
        row = self._row
        mins, maxes, means, norms, nans, infs = self._block.columns[:STATS_COLUMNS]
        return mins[row], maxes[row], means[row], norms[row], nans[row], infs[row]

    def __eq__(self, other: object) -> bool:
        if type(other) is StatsRow and other._block is self._block and other._row == self._row:
            return True  # the same place: the same values, a NaN among them too
        return super().__eq__(other)

    __hash__ = TensorStats.__hash__


#: The fields a :class:`RecordRow` reads without its block's columns: the three read most (26, 12
#: and 6 times a record in a compare), at a slot's speed. The key and shape are slots of their own
#: (a record holds a key anyway; a shape is shared); the dtype is an attribute of the row's class
#: (:func:`_row_class`): a slot would be 8 bytes a record, 16 a pair.
SLOT_FIELDS = ("key", "dtype", "shape")
#: The fields a :class:`RecordRow` reads from its block's columns, in order, after the statistics' columns.
COLUMN_FIELDS = tuple(name for name in RECORD_FIELDS if name not in SLOT_FIELDS)
#: What a record's ``stats`` column holds where its statistics are the block's statistics columns at its place.
_STATS_IN_BLOCK = True


class RecordRow(TensorRecord):
    """A record as one row of a block's columns: read alike, equal alike to ``TensorRecord(...)``.

    Its key and shape are slots of its own, its dtype an attribute of its class: each dtype's
    rows are of a class of their own deriving from this one (:func:`_row_class`), so
    ``isinstance(record, RecordRow)`` tells a row. Each other field is a property reading the
    field's column at the row's place.
    """

    __slots__ = ("_block", "_row", "key", "shape")

    _block: _Block
    _row: int

    def values(self) -> tuple[Any, ...]:
        """Return the fields, in :data:`~llmcheck.core.records.RECORD_FIELDS` order."""
        row = self._row
        (order, device, rank, op_type, parent, stats, data, source_path, attrs, digest) = (
            column[row] for column in self._block.columns[STATS_COLUMNS:]
        )
        if stats is _STATS_IN_BLOCK:
            stats = _stats_row(self._block, row)
        if type(source_path) is _KeyNamedPath:
            source_path = source_path + self.key.name
        return (
            self.key,
            self.dtype,
            self.shape,
            order,
            device,
            rank,
            op_type,
            parent,
            stats,
            data,
            source_path,
            attrs,
            digest,
        )


def _column_reader(position: int, name: str, kind: str) -> property:
    """Return the property reading a row's field ``name`` from its block's column ``position``."""

    # the position is bound as a default argument, read faster than a closure's cell
    def read(row: StatsRow | RecordRow, position: int = position) -> Any:
        return row._block.columns[position][row._row]

    read.__name__ = name
    return property(read, doc=f"The {kind}'s ``{name}`` (see :class:`~llmcheck.core.records.Tensor{kind.title()}`).")


def _stats_reader(position: int) -> property:
    """Return the property reading a record row's statistics: its own column, or a :class:`StatsRow` at its place."""

    def stats(row: RecordRow, position: int = position) -> Any:
        block = row._block
        held = block.columns[position][row._row]
        return _stats_row(block, row._row) if held is _STATS_IN_BLOCK else held

    return property(stats, doc="The record's ``stats`` (see :class:`~llmcheck.core.records.TensorRecord`).")


def _source_path_reader(position: int) -> property:
    """Return the property reading a record row's ``source_path``: its column's text, or that and its key name."""

    def source_path(row: RecordRow, position: int = position) -> Any:
        held = row._block.columns[position][row._row]
        return held + row.key.name if type(held) is _KeyNamedPath else held

    return property(source_path, doc="The record's ``source_path`` (see :class:`~llmcheck.core.records.TensorRecord`).")


_SPECIAL_READERS: dict[str, Callable[[int], property]] = {"stats": _stats_reader, "source_path": _source_path_reader}
for _position, _name in enumerate(STATS_FIELDS):
    setattr(StatsRow, _name, _column_reader(_position, _name, "stats"))
for _position, _name in enumerate(COLUMN_FIELDS, start=STATS_COLUMNS):
    special = _SPECIAL_READERS.get(_name)
    setattr(RecordRow, _name, special(_position) if special else _column_reader(_position, _name, "record"))

_new = object.__new__
# the slots' descriptors, through which a row is set up without the frozen __setattr__
_set_stats_block = StatsRow.__dict__["_block"].__set__
_set_stats_row = StatsRow.__dict__["_row"].__set__


def _stats_row(block: _Block, place: int) -> StatsRow:
    """Return the statistics at ``place`` of ``block``'s statistics columns, as a row made now."""
    row: StatsRow = _new(StatsRow)
    _set_stats_block(row, block)
    _set_stats_row(row, place)
    return row


def is_stats_of(stats: TensorStats | None, record: TensorRecord) -> bool:
    """Return whether ``stats`` reads ``record``'s statistics from its very block: ``record.stats`` makes its equal anew.

    Why: a holder of a record's statistics beside the record (a compare's row) may hold the
    record alone and ask it again, instead of a 48-byte row of its own.
    """
    return (
        type(stats) is StatsRow
        and isinstance(record, RecordRow)
        and stats._block is record._block
        and stats._row == record._row
    )


_set_record_block = RecordRow.__dict__["_block"].__set__
_set_record_row = RecordRow.__dict__["_row"].__set__
_set_key = RecordRow.__dict__["key"].__set__
_set_shape = RecordRow.__dict__["shape"].__set__
#: Each dtype's class of rows, by the dtype's text (a dump holds a few dtypes).
_ROW_CLASSES: dict[str, type[RecordRow]] = {}


def _row_class(dtype: str) -> type[RecordRow]:
    """Return the class of the rows of ``dtype``: a :class:`RecordRow` whose ``dtype`` is this text, held by the class.

    Why: the dtype is the second field read most (12 times a record in a compare). As a slot
    it was 8 bytes a record; as a property reading a shared object, each read cost a third
    more. A class attribute is read as fast as a slot and costs nothing a record. The texts
    equal to ``dtype`` share its class (a reader interns them: one object).
    """
    kind = _ROW_CLASSES.get(dtype)
    if kind is None:
        namespace = {"__slots__": (), "__module__": __name__, "__qualname__": RecordRow.__qualname__, "dtype": dtype}
        kind = _ROW_CLASSES[dtype] = cast("type[RecordRow]", type(RecordRow.__name__, (RecordRow,), namespace))
    return kind


class _Blocks:
    """The block rows are being made into, and how full it is: sealed and replaced when full, and at :meth:`close`."""

    __slots__ = ("_block", "_fields", "_filled")

    def __init__(self, fields: int) -> None:
        self._fields = fields
        self._block = _Block(fields)
        self._filled = 0

    def _rotate(self) -> None:
        """Seal the full block and start the next (the makers below inline the rest of a row's placing)."""
        self._block.seal()
        self._block, self._filled = _Block(self._fields), 0

    def close(self) -> None:
        """Seal the block still filling; rows made after this go into a new block.

        A block still filling holds its values as lists: read alike, larger.
        """
        if self._filled:
            self._block.seal()
            self._block, self._filled = _Block(self._fields), 0


#: A record's statistics as :meth:`RecordRows.stats` gives them to its maker: the six values, in their order.
StatsValues = tuple[float | None, float | None, float | None, float | None, int | None, int | None]
_NO_STATS_VALUES: StatsValues = (None, None, None, None, None, None)


class RecordRows(_Blocks):
    """Makes a dump's records as :class:`RecordRow` s: call it with a record's 13 fields, in their order.

    A record's ``stats`` given as :meth:`stats` gives them go into its block's statistics
    columns; given as an object (or None), it is held as it is. :meth:`close` closes the block
    once the last record is made.
    """

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(STATS_COLUMNS + len(COLUMN_FIELDS))

    @staticmethod
    def key_named_path(prefix: str) -> str:
        """Return the ``source_path`` to give a row whose path is ``prefix`` and its key name: read back as that text."""
        return _KeyNamedPath(prefix)

    @staticmethod
    def stats(
        min: float | None,
        max: float | None,
        mean: float | None,
        l2norm: float | None,
        nan_count: int | None,
        inf_count: int | None,
    ) -> StatsValues:
        """Return a record's statistics as its maker takes them into columns (the arguments of ``TensorStats(...)``)."""
        return (min, max, mean, l2norm, nan_count, inf_count)

    def __call__(
        self,
        key: RecordKey,
        dtype: str,
        shape: tuple[int, ...],
        order: int,
        device: str,
        rank: int,
        op_type: str | None,
        parent: str | None,
        stats: TensorStats | StatsValues | None,
        data: TensorData | None,
        source_path: str,
        attrs: Mapping[str, Any],
        digest: str | None,
    ) -> RecordRow:
        if self._filled == ROWS_PER_BLOCK:
            self._rotate()
        block, place = self._block, self._filled
        self._filled = place + 1
        (
            mins,
            maxes,
            means,
            norms,
            nans,
            infs,
            orders,
            devices,
            ranks,
            op_types,
            parents,
            all_stats,
            datas,
            source_paths,
            all_attrs,
            digests,
        ) = block.columns
        values: StatsValues = _NO_STATS_VALUES
        held: object = stats
        if type(stats) is tuple:
            values, held = stats, _STATS_IN_BLOCK
        mins.append(values[0])
        maxes.append(values[1])
        means.append(values[2])
        norms.append(values[3])
        nans.append(values[4])
        infs.append(values[5])
        orders.append(order)
        devices.append(device)
        ranks.append(rank)
        op_types.append(op_type)
        parents.append(parent)
        all_stats.append(held)
        datas.append(data)
        source_paths.append(source_path)
        all_attrs.append(attrs)
        digests.append(digest)
        row: RecordRow = _new(_ROW_CLASSES.get(dtype) or _row_class(dtype))
        _set_record_block(row, block)
        _set_record_row(row, place)
        _set_key(row, key)
        _set_shape(row, shape)
        return row


#: Where a record's ``stats`` column is among its block's columns.
_HELD_STATS_COLUMN = STATS_COLUMNS + COLUMN_FIELDS.index("stats")
#: The statistics :func:`statistics_values` reads, in :data:`~llmcheck.core.records.STATS_FIELDS` order.
FLOAT_STATS = STATS_FIELDS[:4]


#: The C number types a block's float column is held in (:func:`_floats`), and numpy's name of each.
_FLOAT_TYPES = {"d": "float64", "f": "float32"}


def statistics_values(records: Sequence[TensorRecord | None]) -> tuple[Any, Any]:
    """Return each record's (min, max, mean, L2 norm) as a float64 array of (records, 4), and where all four are floats.

    Why: a value a record's statistics decide (a statistics row's errors) need not be held
    beside the record when it can be made from it again. A row of llmcheck's own index is read
    from its block's columns a block at a time, not as a statistics object each; a record
    with no statistics, or one of whose four is not a float (None, an int), is marked so
    (its values are NaN).
    """
    import numpy as np

    values = np.full((len(records), len(FLOAT_STATS)), np.nan)
    floats = np.zeros(len(records), dtype=bool)
    # per block: the block, the records' positions and rows in it, and whether its four columns are C numbers
    in_blocks: dict[int, tuple[_Block, list[int], list[int], bool]] = {}
    for position, record in enumerate(records):
        if isinstance(record, RecordRow):
            block, row = record._block, record._row
            found = in_blocks.get(id(block))
            if found is None:
                numbers = all(
                    type(column) is array and column.typecode in _FLOAT_TYPES
                    for column in block.columns[: len(FLOAT_STATS)]
                )
                found = in_blocks[id(block)] = (block, [], [], numbers)
            if found[3] and block.columns[_HELD_STATS_COLUMN][row] is _STATS_IN_BLOCK:
                found[1].append(position)
                found[2].append(row)
                continue
        stats = record.stats if record is not None else None
        if stats is not None:
            four = stats.values()[: len(FLOAT_STATS)]
            if all(type(value) is float for value in four):
                values[position] = four
                floats[position] = True
    for block, positions, rows, _ in in_blocks.values():
        if not positions:
            continue
        for place, column in enumerate(block.columns[: len(FLOAT_STATS)]):
            values[positions, place] = np.frombuffer(column, dtype=_FLOAT_TYPES[column.typecode])[rows]  # exactly
        floats[positions] = True
    return values, floats
