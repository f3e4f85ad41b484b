"""The rows of a compare, as measured and as judged, held as columns a block at a time; a row is made when it is asked for.

Why: as :class:`~llmcheck.core.records.ComparisonRow` objects, the judged rows of a
statistics-only compare cost 660 bytes a pair (the row's 24 slots, its metrics, its feeders'
labels, its errors as float objects): 6.6 GB for ten million pairs, held from judging to the
last report; the rows as measured, 450 more until judging ends. Held here, a step's rows are numbers in arrays: floats and ints as C values,
texts and shared objects (the metric layout, a growth range) as small codes into the
distinct values, the feeders' labels as codes a row. The records both sides point at are
held by reference, as the dumps hold them anyway.

A :class:`RowTable` is a read-only sequence of rows in the compare's row order: ``table[i]``,
``table[a:b]`` and iteration make the rows asked for, a block at a time, field for field and
bit for bit what judging made -- a value of any type a column does not hold as it is (an int
among floats, a numpy scalar, an object judging made afresh for each row) is kept as the
object itself. Nothing keeps a made row: two reads give equal rows, not the same object, so
a reader compares rows by ``index``. A reader that needs one field of every row asks
:meth:`RowTable.column` (or :func:`field_blocks`, a block of rows at a time) and makes no row at all.
"""

from __future__ import annotations

import itertools
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields
from operator import attrgetter
from typing import Any, Protocol, overload

import numpy as np

from llmcheck.core.dumps.record_rows import FLOAT_STATS, distinct_codes, is_stats_of, statistics_values
from llmcheck.core.judging.stats_compare import DECIDING_STAT, STAT_COLUMNS, STAT_FIELDS, statistics_error_columns
from llmcheck.core.records import ComparisonRow, JudgedMetrics, MetricLayout, build_row, error_growth

#: The golden and my records of a compare's pairs, by pair position (a table's row ``i`` measures pair ``i``).
PairSides = tuple[Sequence[Any], Sequence[Any]]
#: The fields of a row, in :class:`ComparisonRow`'s order: a block holds a column for each.
ROW_FIELDS = tuple(row_field.name for row_field in fields(ComparisonRow))
_FIELD_POSITION = {name: position for position, name in enumerate(ROW_FIELDS)}
_ROW_VALUES = attrgetter(*ROW_FIELDS)
_HELD_VALUES = attrgetter("_values")
#: How many rows iteration makes at a time: few enough that they cost nothing beside the table.
ROWS_PER_BATCH = 4096
_NONE_TYPE = type(None)


class _Column(Protocol):
    """One field of a block's rows, held one of the ways below."""

    def values(self, offsets: np.ndarray) -> list[Any]:
        """Return the field of the rows at ``offsets``, in turn."""


class _Constant:
    """A field every row of the block shares: the value, once."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def values(self, offsets: np.ndarray) -> list[Any]:
        return [self.value] * len(offsets)


class _Numbers:
    """Python floats (or ints) as C doubles (or integers), each read back as the number it was; ``None`` where ``absent``."""

    __slots__ = ("absent", "numbers")

    def __init__(self, numbers: np.ndarray, absent: np.ndarray | None) -> None:
        self.numbers, self.absent = numbers, absent

    def values(self, offsets: np.ndarray) -> list[Any]:
        values: list[Any] = self.numbers[offsets].tolist()
        if self.absent is not None:
            for position in np.flatnonzero(self.absent[offsets]).tolist():
                values[position] = None
        return values


class _Codes:
    """Values drawn from a few distinct ones: a small code per row into the distinct values."""

    __slots__ = ("codes", "distinct")

    def __init__(self, codes: np.ndarray, distinct: np.ndarray) -> None:
        self.codes, self.distinct = codes, distinct

    def values(self, offsets: np.ndarray) -> list[Any]:
        values: list[Any] = self.distinct[self.codes[offsets]].tolist()
        return values


class _Objects:
    """Values each row holds its own of (the records a row pairs): a reference per row."""

    __slots__ = ("objects",)

    def __init__(self, objects: np.ndarray) -> None:
        self.objects = objects

    def values(self, offsets: np.ndarray) -> list[Any]:
        values: list[Any] = self.objects[offsets].tolist()
        return values

    def at(self, offset: int) -> Any:
        """Return the value of the row at ``offset``."""
        return self.objects[offset]


class _PairSide:
    """One side's records of rows that are the compare's pairs at their positions: read from the pairs, not held again.

    A row's golden and my records are its pair's (the row at position ``i`` measures pair
    ``i``); the table's pairs hold them by reference already, so the rows hold where they lie
    among the pairs: nothing where the block's rows are consecutive pairs (a step's rows, as a
    decode dump holds them), 4 bytes a row elsewhere -- not another 8-byte reference a side.
    """

    __slots__ = ("places", "side", "start")

    def __init__(self, side: Sequence[Any], start: int, places: np.ndarray | None) -> None:
        self.side, self.start, self.places = side, start, places

    @classmethod
    def of(cls, values: list[Any], side: Sequence[Any], at: np.ndarray) -> _PairSide | None:
        """Return the column of ``values`` where each is the very record at its pair position in ``side``, else None."""
        if int(at.max()) >= len(side) or int(at.min()) < 0:  # not the pairs these rows measure
            return None
        if not all(value is held for value, held in zip(values, map(side.__getitem__, at.tolist()))):
            return None
        start = int(at[0])
        if np.array_equal(at, np.arange(start, start + len(at))):
            return cls(side, start, None)
        return cls(side, 0, at.astype(np.int32) if int(at.max()) < 2**31 else at)

    def values(self, offsets: np.ndarray) -> list[Any]:
        if self.places is not None:
            return list(map(self.side.__getitem__, self.places[offsets].tolist()))
        first = int(offsets[0]) if len(offsets) else 0
        if len(offsets) and int(offsets[-1]) - first + 1 == len(offsets) and (np.diff(offsets) == 1).all():
            return list(self.side[self.start + first : self.start + first + len(offsets)])  # a run of rows: a slice
        return list(map(self.side.__getitem__, (offsets + self.start).tolist()))

    def at(self, offset: int) -> Any:
        """Return the record of the row at ``offset``."""
        return self.side[self.start + offset if self.places is None else int(self.places[offset])]


#: A column of each row's golden or my record.
_RecordColumn = _Objects | _PairSide


class _Ragged:
    """A run of values per row, of a few distinct ones: a code per value and where each row's run starts.

    Holds a row's feeders' labels (a tuple of texts), or its metric values (an ``array('d')``
    of C doubles, sliced back out of one).
    """

    __slots__ = ("distinct", "flat", "make", "starts")

    def __init__(self, flat: Any, starts: np.ndarray | int, distinct: Any, make: Callable[[Any], Any]) -> None:
        """``starts``: where each row's run starts, and the last ends (:func:`_run_starts`), or the one length of every run."""
        self.flat, self.starts, self.distinct, self.make = flat, starts, distinct, make

    def values(self, offsets: np.ndarray) -> list[Any]:
        if len(offsets) == 0:
            return []
        if isinstance(self.starts, int):  # every row's run is as long
            starts = offsets.astype(np.int64) * self.starts
            ends = starts + self.starts
        else:
            starts, ends = self.starts[offsets], self.starts[offsets + 1]
        low = int(starts.min())
        flat = self.flat[low : int(ends.max())]  # the runs asked for lie together where the rows do
        if self.distinct is not None:
            flat = list(map(self.distinct.__getitem__, flat.tolist()))
        make = self.make
        return [make(flat[start:end]) for start, end in zip((starts - low).tolist(), (ends - low).tolist())]


class _Metrics:
    """Each row's :class:`JudgedMetrics`: its layout and verdicts as codes, its values as C doubles."""

    __slots__ = ("layouts", "metric_values", "verdicts")

    def __init__(self, layouts: _Column, verdicts: _Column, metric_values: _Column) -> None:
        self.layouts, self.verdicts, self.metric_values = layouts, verdicts, metric_values

    def values(self, offsets: np.ndarray) -> list[Any]:
        layouts, verdicts = self.layouts.values(offsets), self.verdicts.values(offsets)
        return list(map(JudgedMetrics, layouts, self.metric_values.values(offsets), verdicts))


def _smallest_codes(codes: Sequence[int], distinct: int) -> np.ndarray:
    return np.fromiter(codes, dtype=np.min_scalar_type(max(distinct - 1, 0)), count=len(codes))


def _object_array(values: Sequence[Any]) -> np.ndarray:
    """Return ``values`` as an array of references (a tuple stays one element, not spread across several)."""
    return np.fromiter(values, dtype=object, count=len(values))


def _column(values: list[Any]) -> _Column:
    """Return the smallest column that gives ``values`` back exactly: each value's type, bits and, for objects, identity."""
    first = values[0]
    if all(value is first for value in values):
        return _Constant(first)
    kinds = set(map(type, values))
    number_kinds = kinds - {_NONE_TYPE}
    if number_kinds == {float} or (number_kinds == {int} and _fits_int64(values)):
        kind = np.float64 if number_kinds == {float} else np.int64
        absent = None
        if _NONE_TYPE in kinds:
            absent = np.array([value is None for value in values], dtype=bool)
            values = [0 if value is None else value for value in values]
        numbers = np.array(values, dtype=kind)
        return _Numbers(_narrowest_ints(numbers) if kind is np.int64 else numbers, absent)
    by_value = _texts(values, kinds)
    if len(set(values) if by_value else set(map(id, values))) * 2 > len(values):  # mostly distinct: a reference each
        return _Objects(_object_array(values))
    codes, distinct = distinct_codes(values, by_value)
    return _Codes(_smallest_codes(codes, len(distinct)), _object_array(distinct))


def _texts(values: Sequence[Any], kinds: set[type]) -> bool:
    """Return whether every value is a text, None or a tuple of texts (of ``kinds``): equal ones read alike, so they are coded by value.

    Any other object keeps its identity: equal floats may still differ (``-0.0`` and ``0.0``).
    """
    if kinds <= _TEXT_KINDS:
        return True
    return kinds <= {*_TEXT_KINDS, tuple} and _tuples_of_texts(value for value in values if type(value) is tuple)


_TEXT_KINDS = frozenset({str, _NONE_TYPE})


def _tuples_of_texts(tuples: Iterable[tuple[Any, ...]]) -> bool:
    return set(map(type, itertools.chain.from_iterable(tuples))) <= {str}


def _fits_int64(values: Sequence[Any]) -> bool:
    numbers = [value for value in values if value is not None]
    return bool(min(numbers) >= -(2**63) and max(numbers) < 2**63)


def _narrowest_ints(numbers: np.ndarray) -> np.ndarray:
    for kind in (np.int8, np.int16, np.int32):
        info = np.iinfo(kind)
        if numbers.size == 0 or (info.min <= numbers.min() and numbers.max() <= info.max):
            return numbers.astype(kind)
    return numbers.astype(np.int64)


class _TextPool:
    """Distinct texts as one UTF-8 buffer and where each ends: a text's bytes each, where a ``str`` costs 49 more.

    Nearly every row feeds another, so a compare holds about one feeder label a row
    (``model.layers.12.mlp.down_proj step 3 input.0 (before)``: 54 bytes here, a 103-byte
    ``str`` and its 8-byte slot in a list). A text read back is a new ``str`` equal to the one
    given, code point for code point (lone surrogates included).
    """

    __slots__ = ("buffer", "ends")

    def __init__(self, texts: Sequence[str]) -> None:
        encoded = [text.encode("utf-8", "surrogatepass") for text in texts]
        self.buffer = b"".join(encoded)
        ends = list(itertools.accumulate(map(len, encoded), initial=0))
        self.ends = array("I" if ends[-1] < 2**32 else "q", ends)  # C unsigned ints where they fit: 4 bytes a text

    def __getitem__(self, code: int) -> str:
        return self.buffer[self.ends[code] : self.ends[code + 1]].decode("utf-8", "surrogatepass")


def c_integers(positions: np.ndarray) -> Sequence[int]:
    """Return row positions held in the least memory that reads each back as an int: a ``range``, or C integers.

    Why: row positions held for a whole phase (a compare's golden order, judging's step
    windows) were lists of ints, 40 bytes a row. Consecutive ones -- most often, where the
    rows are in golden order -- are a ``range`` (48 bytes); others an ``array('i')`` where each
    fits 32 bits (a row position does in any compare that fits in memory), else an ``array('q')``.
    """
    if len(positions) and int(positions[-1]) - int(positions[0]) == len(positions) - 1 and _consecutive(positions):
        return range(int(positions[0]), int(positions[-1]) + 1)
    narrow = len(positions) == 0 or (int(positions.min()) >= -(2**31) and int(positions.max()) < 2**31)
    held = array("i" if narrow else "q")
    # no copy on the way where the positions are already of that type
    held.frombytes(np.ascontiguousarray(positions, dtype=np.int32 if narrow else np.int64).data.cast("B"))
    return held


def _consecutive(positions: np.ndarray) -> bool:
    """Return whether each position is one more than the one before."""
    return bool((np.diff(positions) == 1).all())


def in_order(orders: np.ndarray) -> bool:
    """Return whether ``orders`` never go down: the rows are in that order already, and sorting them would keep them so."""
    return bool((orders[1:] >= orders[:-1]).all())


def _run_starts(lengths: list[int]) -> np.ndarray | int:
    """Return where each row's run starts in the flat values, and where the last ends: C uint32 where they fit (half of int64).

    Where every run is as long (one feeder a row, or no held metric values), that length alone.
    """
    if lengths and lengths.count(lengths[0]) == len(lengths):
        return lengths[0]
    ends = np.cumsum(lengths, dtype=np.int64)
    starts = np.zeros(len(lengths) + 1, dtype=np.uint32 if not len(ends) or ends[-1] < 2**32 else np.int64)
    starts[1:] = ends
    return starts


def _labels_column(values: list[Any], made: _MadeSoFar) -> _Column | None:
    """Return the feeders' labels as codes a row, or None where a value is not a tuple of texts.

    A label that is the label of one of the rows' golden records (a row's feeder is most
    often another row of its step) is held as that row's place, and made again from the
    record's key when read.
    """
    if set(map(type, values)) != {tuple} or not _tuples_of_texts(values):
        return None
    flat = [item for value in values for item in value]
    codes, distinct = distinct_codes(flat, by_value=True)
    starts = _run_starts([len(value) for value in values])
    pool = _RecordLabels.of(distinct, made.records["golden"], len(values)) if distinct else _TextPool(distinct)
    return _Ragged(_smallest_codes(codes, len(distinct)), starts, pool, tuple)


class _RecordLabels:
    """Distinct labels, each the label of a record of the rows (made again from its key when read) or a text of its own.

    A label such as ``model.layers.12.mlp.down_proj step 3 input.0`` is about 50 bytes of
    text, one a row; the record it labels is held by the rows anyway, and its place is 2 or 4
    bytes. A label of its own is held as text, its place -1 for the first such, -2 for the next.
    """

    __slots__ = ("places", "records", "texts")

    def __init__(self, places: np.ndarray, records: _RecordColumn, texts: _TextPool) -> None:
        self.places, self.records, self.texts = places, records, texts

    @classmethod
    def of(cls, labels: Sequence[str], records: _RecordColumn, count: int) -> _TextPool | _RecordLabels:
        """Return ``labels`` held so: by the place of the record among the ``count`` rows' ``records`` whose label each is, else as text."""
        place_of: dict[str, int] = {}
        for place, record in enumerate(records.values(np.arange(count))):
            if record is not None:
                place_of.setdefault(record.key.label(), place)
        found = [place_of.get(label, -1) for label in labels]
        texts = [label for label, place in zip(labels, found) if place < 0]
        if len(texts) == len(labels):
            return _TextPool(labels)
        own = itertools.count(-1, -1)
        places = np.array([place if place >= 0 else next(own) for place in found], dtype=np.int64)
        return cls(_narrowest_ints(places), records, _TextPool(texts))

    def __getitem__(self, code: int) -> str:
        place = int(self.places[code])
        if place < 0:
            return self.texts[-1 - place]
        label: str = self.records.at(place).key.label()
        return label


def _metrics_column(values: list[Any], made: _MadeSoFar) -> _Column | None:
    """Return each row's metrics as codes and C doubles, or None where most are not a :class:`JudgedMetrics` over C doubles.

    A row whose values are its records' statistics errors, bit for bit, holds none: they are
    made again from the rows' records when read. Where every row's are, those errors are
    left in ``made`` for the makers of the columns after this one (:func:`_bounds_column`).
    A few rows whose metrics are a mapping of another kind (judging adds a result to a row's
    metrics as a dict: a carried error's) keep theirs as they are (:class:`_Excepted`): the
    block's other rows are held so all the same.
    """
    kinds = set(map(type, values))
    if kinds != {JudgedMetrics}:
        others = {row: value for row, value in enumerate(values) if type(value) is not JudgedMetrics}
        if JudgedMetrics not in kinds or 2 * len(others) > len(values):
            return None
        column = _metrics_column([_NO_METRICS if row in others else value for row, value in enumerate(values)], made)
        return None if column is None else _Excepted(column, others)
    held = list(map(_HELD_VALUES, values))
    if set(map(type, held)) != {array}:
        return None
    derived = _statistics_errors_held(held, made)
    kept = held if derived is None else list(itertools.compress(held, np.logical_not(derived).tolist()))
    pool = array("d", itertools.chain.from_iterable(kept))
    lengths = list(map(len, held))
    if derived is not None:
        lengths = [0 if from_records else length for length, from_records in zip(lengths, derived.tolist())]
    metric_values: _Column = _Ragged(pool, _run_starts(lengths), None, _same)
    if derived is not None:
        metric_values = _StatisticsErrors(metric_values, derived, made)
    layouts = _column([metrics._layout for metrics in values])
    verdicts = _column([metrics._verdicts for metrics in values])
    return _Metrics(layouts, verdicts, metric_values)


#: What a row whose metrics are held apart (:class:`_Excepted`) holds in the metrics' columns: no metric.
_NO_METRICS = JudgedMetrics(MetricLayout([], [], [], []), array("d"), ())


class _Excepted:
    """A column but for a few rows, whose values are held apart as they are and read instead of the column's."""

    __slots__ = ("column", "held", "rows")

    def __init__(self, column: _Column, others: dict[int, Any]) -> None:
        """``others``: the values held apart, by row offset (ascending)."""
        self.column = column
        self.rows = np.fromiter(others, dtype=np.int64, count=len(others))
        self.held = list(others.values())

    def values(self, offsets: np.ndarray) -> list[Any]:
        values = self.column.values(offsets)
        at = np.minimum(np.searchsorted(self.rows, offsets), len(self.rows) - 1)
        apart = self.rows[at] == offsets
        for position, found in zip(np.flatnonzero(apart).tolist(), at[apart].tolist()):
            values[position] = self.held[found]
        return values


def _statistics_errors(golden: Sequence[Any], my: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Return the statistics errors of each (golden, my) record pair, as statistics rows hold them, and which pairs have them.

    :func:`~llmcheck.core.judging.stats_compare.statistics_error_columns` of both sides'
    (max, min, mean, L2 norm), where each side's four are floats.
    """
    golden_values, golden_floats = statistics_values(golden)
    my_values, my_floats = statistics_values(my)
    with np.errstate(all="ignore"):  # an infinity among them: its row's errors are NaN, and are checked so
        errors = statistics_error_columns(golden_values[:, _STAT_ORDER], my_values[:, _STAT_ORDER])
    return errors, golden_floats & my_floats


#: From :data:`~llmcheck.core.dumps.record_rows.FLOAT_STATS` (min, max, mean, L2 norm) to the (max, min, mean, L2 norm) of STAT_FIELDS.
_STAT_ORDER = [FLOAT_STATS.index(field) for field in STAT_FIELDS]


class _LastErrors:
    """A table's statistics errors made last, and of which block's rows: a batch of rows read field by field makes them once.

    Why: a statistics row's metric values, its error and (through its error) its growth are
    each made from its records' statistics errors; the reports read a batch of rows a field at
    a time, which made them three times. One table holds one of these, shared by its blocks:
    it keeps one batch's errors, never a block's each.
    """

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: tuple[Any, Any, np.ndarray, tuple[np.ndarray, np.ndarray]] | None = None

    def of(self, golden: _RecordColumn, my: _RecordColumn, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return :func:`_statistics_errors` of the records at ``offsets`` of a block's ``golden`` and ``my`` columns."""
        last = self.last  # read once: what is asked and what was made come from one assignment
        if last is not None and last[0] is golden and last[1] is my and np.array_equal(last[2], offsets):
            return last[3]
        made = _statistics_errors(golden.values(offsets), my.values(offsets))
        self.last = (golden, my, offsets.copy(), made)
        return made


def _statistics_errors_held(held: list[array[float]], made: _MadeSoFar) -> np.ndarray | None:
    """Return which rows hold their records' statistics errors, bit for bit (so need not hold them), or None where none does.

    Where every row does, the errors are left in ``made.statistics_errors``.
    """
    width = len(STAT_COLUMNS)
    candidates = np.flatnonzero(np.fromiter(map(len, held), dtype=np.int64, count=len(held)) == width)
    if not len(candidates):
        return None
    errors, have = _statistics_errors(made.records["golden"].values(candidates), made.records["my"].values(candidates))
    given = np.frombuffer(array("d", itertools.chain.from_iterable(held[at] for at in candidates.tolist())))
    same = (given.reshape(-1, width).view(np.uint64) == errors.view(np.uint64)).all(axis=1) & have
    if not same.any():
        return None
    if same.all() and len(candidates) == len(held):
        made.statistics_errors = errors
    derived = np.zeros(len(held), dtype=bool)
    derived[candidates[same]] = True
    return derived


class _StatisticsErrors:
    """Rows' metric values, where a row's are its records' statistics errors made again from the records when read."""

    __slots__ = ("derived", "golden", "held", "last_errors", "my")

    def __init__(self, held: _Column, derived: np.ndarray, made: _MadeSoFar) -> None:
        self.held, self.derived = held, derived
        self.golden, self.my, self.last_errors = made.records["golden"], made.records["my"], made.last_errors

    def values(self, offsets: np.ndarray) -> list[Any]:
        values = self.held.values(offsets)
        chosen = np.flatnonzero(self.derived[offsets])
        if len(chosen):
            at = offsets[chosen]
            errors, _ = self.last_errors.of(self.golden, self.my, at)
            for position, row in zip(chosen.tolist(), errors):
                made = array("d")
                made.frombytes(row.tobytes())
                values[position] = made
        return values


def _same(value: Any) -> Any:
    return value


class _Growths:
    """Each row's ``growth`` where it is :func:`~llmcheck.core.records.error_growth` of its two errors: made again from their columns when read.

    Judging sets every judged row's growth so; held, it was 9 bytes a row (a C double and
    whether it is None).
    """

    __slots__ = ("errors", "feeder_errors")

    def __init__(self, errors: _Column, feeder_errors: _Column) -> None:
        self.errors, self.feeder_errors = errors, feeder_errors

    @classmethod
    def of(cls, values: list[Any], made: _MadeSoFar) -> _Growths | None:
        """Return the column of ``values`` where each is, bit for bit, the growth of its row's two errors; else None."""
        if all(map(_identical, values, map(error_growth, made.values["error"], made.values["feeder_error"]))):
            return cls(made.columns["error"], made.columns["feeder_error"])
        return None

    def values(self, offsets: np.ndarray) -> list[Any]:
        return list(map(error_growth, self.errors.values(offsets), self.feeder_errors.values(offsets)))


#: Where a statistics row's error -- the relative error of the L2 norms, its lower bound of the
#: error measure -- lies among its statistics errors.
_BOUND_AT = STAT_COLUMNS.index(DECIDING_STAT)


def _bounds(errors: np.ndarray) -> list[float | None]:
    """Return the error judging takes from each row's statistics errors: the L2 norms' where it is finite, else None."""
    bounds = errors[:, _BOUND_AT]
    return [bound if finite else None for bound, finite in zip(bounds.tolist(), np.isfinite(bounds).tolist())]


def _bounds_column(values: list[Any], made: _MadeSoFar) -> _StatisticsBounds | None:
    """Return the rows' errors as :class:`_StatisticsBounds` where each is, bit for bit, its statistics' bound; else None."""
    if made.statistics_errors is None or not all(map(_identical, values, _bounds(made.statistics_errors))):
        return None
    return _StatisticsBounds(made)


class _StatisticsBounds:
    """Each row's ``error`` where it is its records' statistics bound: made again from the records when read.

    A statistics row's error is the relative error of its L2 norms (None where that is not
    finite), one of the statistics errors its metric values are; where every row's metric
    values are made again from its records (:class:`_StatisticsErrors`), so is its error. Held,
    it was 9 bytes a row (a C double and whether it is None).
    """

    __slots__ = ("golden", "last_errors", "my")

    def __init__(self, made: _MadeSoFar) -> None:
        self.golden, self.my, self.last_errors = made.records["golden"], made.records["my"], made.last_errors

    def values(self, offsets: np.ndarray) -> list[Any]:
        errors, _ = self.last_errors.of(self.golden, self.my, offsets)
        return _bounds(errors)


def _identical(given: Any, made: Any) -> bool:
    """Return whether ``made`` reads back as ``given``: the same object, or floats of the same bits."""
    return given is made or (type(given) is float and type(made) is float and _DOUBLE(given) == _DOUBLE(made))


_DOUBLE = struct.Struct("d").pack


#: Held in a statistics column where a row's statistics are its record's (:func:`is_stats_of`): asked of it again.
_FROM_RECORD = object()


class _StatsOfRecords:
    """A side's statistics where most rows' are their record's own: those are asked of the record again, not held.

    A record read from llmcheck's own index makes its statistics when asked, from its
    block's columns (:mod:`~llmcheck.core.dumps.record_rows`); held here, each would be a
    48-byte object a row. A row whose statistics are another object (measured, not recorded)
    keeps that object.
    """

    __slots__ = ("held", "records")

    def __init__(self, records: _Column, held: _Column) -> None:
        self.records = records
        self.held = held

    def values(self, offsets: np.ndarray) -> list[Any]:
        return [
            record.stats if held is _FROM_RECORD else held
            for record, held in zip(self.records.values(offsets), self.held.values(offsets))
        ]


def _stats_column(side: str) -> Callable[[list[Any], _MadeSoFar], _StatsOfRecords | None]:
    """Return the maker of a statistics column whose rows' statistics are most often their ``side`` record's own."""

    def stats_column(values: list[Any], made: _MadeSoFar) -> _StatsOfRecords | None:
        records = made.values[side]
        own = [_FROM_RECORD if is_stats_of(stats, record) else stats for stats, record in zip(values, records)]
        if not any(stats is _FROM_RECORD for stats in own):
            return None
        return _StatsOfRecords(made.records[side], _column(own))

    return stats_column


class _MadeSoFar:
    """What the maker of a block's special column reads: the columns made before its own, and some fields' values.

    Why: a column may be made from others when read -- a row's growth from its two errors, its
    error and metric values from its records' statistics -- and each maker checks, bit for bit,
    that its values are what those columns give. The makers run in field order.
    """

    __slots__ = ("columns", "last_errors", "records", "statistics_errors", "values")

    def __init__(self, last_errors: _LastErrors) -> None:
        self.last_errors = last_errors  # the table's, for the columns made from the records' statistics errors
        self.columns: dict[str, _Column] = {}  # by field, in field order
        self.records: dict[str, _RecordColumn] = {}  # the golden and my records' columns
        self.values: dict[str, list[Any]] = {}  # of the fields in _KEPT_VALUES
        #: every row's statistics errors, where the metrics' maker found each row's metric values to be those
        self.statistics_errors: np.ndarray | None = None


#: The fields whose values, besides their columns, a later maker reads.
_KEPT_VALUES = frozenset({"golden", "my", "error", "feeder_error"})
_RECORDS = frozenset({"golden", "my"})
#: The fields held by a column of their own kind, where their maker finds their values fit it (else it gives None).
_SPECIAL_COLUMNS: dict[str, Callable[[list[Any], _MadeSoFar], _Column | None]] = {
    "metrics": _metrics_column,
    "golden_stats": _stats_column("golden"),
    "my_stats": _stats_column("my"),
    "fed_by": _labels_column,
    "error": _bounds_column,
    "growth": _Growths.of,
}
# each maker reads the fields before its own
assert ROW_FIELDS.index("my") < ROW_FIELDS.index("metrics") < ROW_FIELDS.index("error")
assert max(ROW_FIELDS.index("error"), ROW_FIELDS.index("feeder_error")) < ROW_FIELDS.index("growth")


class _Block:
    """Some rows (one judged step's) as a column per field."""

    __slots__ = ("columns",)

    def __init__(
        self,
        rows: Sequence[ComparisonRow],
        at: np.ndarray | None = None,
        pairs: PairSides | None = None,
        last_errors: _LastErrors | None = None,
    ) -> None:
        """Hold ``rows``, the rows at positions ``at`` of a table whose rows measure ``pairs``' pairs (where given).

        A row whose records are its pair's reads them from ``pairs`` (:class:`_PairSide`). ``last_errors``: the
        table's (:class:`_LastErrors`).
        """
        made = _MadeSoFar(last_errors or _LastErrors())
        for name, held in zip(ROW_FIELDS, zip(*map(_ROW_VALUES, rows))):
            values = list(held)
            column: _Column | None
            if name in _RECORDS:  # each row's own records, held by the dumps (and by their pairs)
                column = None if pairs is None or at is None else _PairSide.of(values, pairs[name == "my"], at)
                if column is None:
                    column = _Objects(_object_array(values))
                made.records[name] = column
            else:
                special = _SPECIAL_COLUMNS.get(name)
                column = special(values, made) if special is not None else None
                if column is None:
                    column = _column(values)
            made.columns[name] = column
            if name in _KEPT_VALUES:
                made.values[name] = values
        self.columns = list(made.columns.values())

    def rows(self, offsets: np.ndarray) -> list[ComparisonRow]:
        return list(map(build_row, *(column.values(offsets) for column in self.columns)))

    def values(self, name: str, offsets: np.ndarray) -> list[Any]:
        return self.columns[_FIELD_POSITION[name]].values(offsets)


class RowTable(Sequence[ComparisonRow]):
    """A compare's rows as columns, in row order: a read-only sequence that makes each row when asked.

    Filled a block at a time (:meth:`put`): the rows at some row positions, held as one block
    of columns -- a batch of rows as measured (:class:`RowCollector`), one step's rows as
    judged. Every position is filled before it is read.
    """

    def __init__(self, size: int, pairs: PairSides | None = None) -> None:
        """Make a table of ``size`` rows; ``pairs``: the golden and my records of the pairs its rows measure, by position."""
        self._pairs = pairs
        self._last_errors = _LastErrors()  # shared by the blocks: one batch of statistics errors at a time
        self._blocks: list[_Block | None] = []  # None: a block whose rows were all released
        self._unreleased: list[int] = []  # per block, how many of its rows are not released
        # Where each position's row is: its block's number (-1: none yet), and its offset in that
        # block. A block whose rows lie at consecutive positions -- a batch of rows as measured, a
        # step's rows as judged, in most compares -- holds its first position (else -1), and its
        # rows' offsets follow from it; the offsets are held for the positions of the other blocks
        # alone, in an array made when the first such block is put. Held so, a table's index is 2
        # bytes a row (a block's number, in int16 until 32 767 blocks), where it was 8.
        self._block_of = np.full(size, -1, dtype=np.int16)
        self._starts = array("q")
        self._offset: np.ndarray | None = None
        #: whether each row its blocks hold is one of its rows: no position put twice, not a part of another table
        self._blocks_hold_its_rows = True

    def put(self, positions: Sequence[int], rows: Sequence[ComparisonRow]) -> None:
        """Hold ``rows``, the rows at row positions ``positions`` (in turn), as one block."""
        if not rows:
            return
        at = np.asarray(positions, dtype=np.int64)
        block = len(self._blocks)
        if block > np.iinfo(self._block_of.dtype).max:
            self._block_of = self._block_of.astype(np.int32)
        if self._blocks_hold_its_rows and (self._block_of[at] >= 0).any():  # put again: a block holds rows replaced
            self._blocks_hold_its_rows = False
        self._block_of[at] = block
        if _consecutive(at):
            self._starts.append(int(at[0]))
        else:
            self._starts.append(-1)
            if self._offset is None:
                self._offset = np.zeros(len(self._block_of), dtype=np.int32)
            self._offset[at] = np.arange(len(rows), dtype=np.int32)
        self._blocks.append(_Block(rows, at, self._pairs, self._last_errors))
        self._unreleased.append(len(rows))

    def _offsets(self, positions: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Return the offsets of the rows at ``positions`` in their blocks, ``blocks``."""
        starts = np.frombuffer(self._starts, dtype=np.int64)[blocks]
        offsets: np.ndarray = positions - starts
        if self._offset is not None:
            listed = starts < 0
            if listed.any():
                offsets[listed] = self._offset[positions[listed]]
        return offsets

    def unfilled(self) -> np.ndarray:
        """Return the positions no row was put at, ascending."""
        unfilled: np.ndarray = np.flatnonzero(self._block_of < 0)
        return unfilled

    def release(self, positions: Sequence[int]) -> None:
        """Say the rows at ``positions`` are read for the last time: a block whose rows all are is let go.

        How judging lets go of the rows as measured, a block at a time, as it judges them.
        Reading a row of a block let go raises ``LookupError``.
        """
        blocks = self._block_of[np.asarray(positions, dtype=np.int64)]
        released = np.bincount(blocks[blocks >= 0], minlength=len(self._blocks))
        for block in np.flatnonzero(released).tolist():
            self._unreleased[block] -= int(released[block])
            if self._unreleased[block] <= 0:
                self._blocks[block] = None

    def _block(self, block: int) -> _Block:
        held = self._blocks[block]
        if held is None:
            raise LookupError(f"the rows of block {block} of this table were released")
        return held

    @classmethod
    def of(cls, rows: Sequence[ComparisonRow]) -> RowTable:
        """Return a table holding ``rows`` as they are (one block)."""
        table = cls(len(rows))
        table.put(range(len(rows)), rows)
        return table

    def reordered(self, positions: Sequence[int]) -> RowTable:
        """Return a table of the rows at ``positions``, in that order: the same columns, read in another order."""
        table = RowTable(0, self._pairs)
        table._blocks, table._unreleased = self._blocks, self._unreleased  # the same blocks, let go together
        at = np.asarray(positions, dtype=np.int64)
        table._block_of = self._block_of[at]
        table._starts = array("q", [-1]) * len(self._starts)  # at other positions: each offset held
        table._offset = self._offsets(at, table._block_of).astype(np.int32)
        table._blocks_hold_its_rows = (
            self._blocks_hold_its_rows
            and len(at) == len(self)
            and bool((np.bincount(at, minlength=len(self)) == 1).all())  # every row, each once
        )
        return table

    @property
    def pairs(self) -> PairSides | None:
        """Return the golden and my records of the pairs the rows measure, by position, where the table was given them."""
        return self._pairs

    def __len__(self) -> int:
        return len(self._block_of)

    @overload
    def __getitem__(self, index: int) -> ComparisonRow: ...

    @overload
    def __getitem__(self, index: slice) -> list[ComparisonRow]: ...

    def __getitem__(self, index: int | slice) -> ComparisonRow | list[ComparisonRow]:
        if isinstance(index, slice):
            return self.rows_at(np.arange(len(self))[index])
        if not -len(self) <= index < len(self):
            raise IndexError("row index out of range")
        return self.rows_at(np.array([index % len(self)]))[0]

    def __iter__(self) -> Iterator[ComparisonRow]:
        for block in field_blocks(self, ROWS_PER_BATCH):
            yield from block.rows()

    def rows_at(self, positions: np.ndarray) -> list[ComparisonRow]:
        """Return the rows at row positions ``positions``, in turn."""
        return self._gathered(positions, _Block.rows)

    def column(self, name: str) -> list[Any]:
        """Return field ``name`` of every row, in row order, making no row (``table.column("verdict")``)."""
        if name not in _FIELD_POSITION:
            raise KeyError(f"ComparisonRow has no field {name!r}")
        # a batch of positions at a time: what finds each position's block (its number, offset, a
        # sort by block, the values gathered by block) is then a batch's, not 40 bytes a row at once
        values: list[Any] = []
        read = _field_reader(name)
        for start in range(0, len(self), ROWS_PER_BATCH):
            values += self._gathered(np.arange(start, min(start + ROWS_PER_BATCH, len(self))), read)
        return values

    def values_at(self, name: str, positions: np.ndarray) -> list[Any]:
        """Return field ``name`` of the rows at ``positions``, in turn, making no row."""
        return self._gathered(positions, _field_reader(name))

    def _gathered(self, positions: np.ndarray, read: Callable[[_Block, np.ndarray], list[Any]]) -> list[Any]:
        """Return what ``read`` gives for each position, in turn, asking each block once for its positions."""
        return _read_groups(self._groups(positions), len(positions), read)

    def _groups(self, positions: np.ndarray) -> list[tuple[_Block, np.ndarray, np.ndarray | None]]:
        """Return, for each block holding some of ``positions``, the block, its offsets and where they go (None: all, in turn)."""
        if len(positions) == 0:
            return []
        positions = np.asarray(positions, dtype=np.int64)
        blocks = self._block_of[positions]
        offsets = self._offsets(positions, blocks)
        if (blocks[0] == blocks).all():  # the usual case: one step's rows
            return [(self._block(int(blocks[0])), offsets, None)]
        by_block = np.argsort(blocks, kind="stable")  # the positions of each block together, in turn
        starts = np.flatnonzero(np.diff(blocks[by_block])) + 1
        return [(self._block(int(blocks[chosen[0]])), offsets[chosen], chosen) for chosen in np.split(by_block, starts)]

    def metric_names(self) -> frozenset[str]:
        """Return the names of the metrics any row holds, from what its blocks' rows share where they say it.

        Why: the reports ask which metrics the rows hold (the CSV's statistics columns, the page's
        plots) before writing a row. A block of judged rows holds its rows' metric layouts as a
        few distinct ones, which name them; reading every row's metrics made each row's
        :class:`JudgedMetrics` (a statistics row's values from its records) for the names alone.
        """
        names: set[str] = set()
        if self._blocks_hold_its_rows:
            metrics = _FIELD_POSITION["metrics"]
            for block in self._blocks:
                found = None if block is None else _metric_names(block.columns[metrics])
                if found is None:
                    break
                names |= found
            else:
                return frozenset(names)
        return frozenset(name for row_metrics in iter_field(self, "metrics") for name in row_metrics)

    def __repr__(self) -> str:
        return f"RowTable({len(self)} rows in {len(self._blocks)} blocks)"


def _metric_names(column: _Column) -> set[str] | None:
    """Return the metric names the rows of a block's ``metrics`` column hold, or None where only its rows say them.

    Every distinct layout (or mapping) a column holds is some row's: a code, a constant or an
    object is held only for a row.
    """
    if isinstance(column, _Excepted):  # the rows held apart: mappings; the others' placeholder names none
        names = _metric_names(column.column)
        return None if names is None else names.union(*column.held)
    if isinstance(column, _Metrics):
        layouts = column.layouts
        if isinstance(layouts, _Constant):
            return set(layouts.value.names)
        if isinstance(layouts, _Codes):
            return set().union(*(layout.names for layout in layouts.distinct.tolist()))
        return None
    if isinstance(column, _Constant):
        return set(column.value)
    if isinstance(column, _Codes):
        return set().union(*column.distinct.tolist())
    if isinstance(column, _Objects):
        return set().union(*column.objects.tolist())
    return None


def row_field(rows: Sequence[ComparisonRow], name: str) -> list[Any]:
    """Return field ``name`` of every row, in turn: of a :class:`RowTable`, read from its column, making no row."""
    if isinstance(rows, RowTable):
        return rows.column(name)
    return [getattr(row, name) for row in rows]


def iter_field(rows: Sequence[ComparisonRow], name: str) -> Iterator[Any]:
    """Yield field ``name`` of every row, in turn, a batch at a time: for a field whose values are made (``metrics``)."""
    for block in field_blocks(rows, ROWS_PER_BATCH):
        yield from getattr(block, name)


def metric_names(rows: Sequence[ComparisonRow]) -> frozenset[str]:
    """Return the names of the metrics any row holds: of a :class:`RowTable`, read from its blocks, making no row."""
    if isinstance(rows, RowTable):
        return rows.metric_names()
    return frozenset(name for row in rows for name in row.metrics)


def rows_at(rows: Sequence[ComparisonRow], positions: Sequence[int]) -> list[ComparisonRow]:
    """Return the rows at ``positions``, in turn: of a :class:`RowTable`, making those rows alone."""
    if isinstance(rows, RowTable):
        return rows.rows_at(np.asarray(positions, dtype=np.int64))
    return [rows[position] for position in positions]


def rows_where(rows: Sequence[ComparisonRow], name: str, keep: Callable[[Any], bool]) -> list[ComparisonRow]:
    """Return the rows whose field ``name`` ``keep`` accepts, in row order, making no other row."""
    kept: list[int] = []
    start = 0
    for block in field_blocks(rows, ROWS_PER_BATCH):  # a batch at a time: never the whole column at once
        kept += [start + offset for offset, value in enumerate(getattr(block, name)) if keep(value)]
        start += len(block)
    return rows_at(rows, kept)


def first_in_golden_order(rows: Sequence[ComparisonRow], name: str, value: Any) -> ComparisonRow | None:
    """Return the row earliest in golden execution order whose field ``name`` equals ``value`` (of equal orders, the first)."""
    first, first_order = None, None
    start = 0
    for block in field_blocks(rows, ROWS_PER_BATCH):  # a batch at a time: never two whole columns at once
        for offset, held in enumerate(getattr(block, name)):
            if held == value:
                order = block.golden[offset].order
                if first_order is None or order < first_order:
                    first, first_order = start + offset, order
        start += len(block)
    return None if first is None else rows_at(rows, [first])[0]


def golden_order(rows: Sequence[ComparisonRow]) -> Sequence[int]:
    """Return the row positions in golden execution order, rows of equal order in turn (as ``sorted`` keeps them).

    As C integers read back as ints (:func:`c_integers`): a list of them was 40 bytes a row,
    held while a report is written.
    """
    orders = np.fromiter((record.order for record in iter_field(rows, "golden")), dtype=np.int64, count=len(rows))
    if in_order(orders):  # rows in golden order already: no sort, and the order is a range
        return range(len(rows))
    order = np.argsort(orders, kind="stable")
    del orders  # 8 bytes a row fewer while the order is copied out
    return c_integers(order)


def in_golden_order(rows: Sequence[ComparisonRow]) -> Sequence[ComparisonRow]:
    """Return the rows sorted by golden execution order, as ``sorted(rows, key=golden order)`` gives them.

    Of a :class:`RowTable`, a sequence that makes the rows as they are read, a batch at a time.
    """
    if isinstance(rows, RowTable):
        order = golden_order(rows)
        return rows if order == range(len(rows)) else rows.reordered(order)
    return sorted(rows, key=lambda row: row.golden.order)


def _field_reader(name: str) -> Callable[[_Block, np.ndarray], list[Any]]:
    """Return what reads field ``name`` of a block's rows at some offsets."""
    return lambda block, offsets: block.values(name, offsets)


def _read_groups(
    groups: list[tuple[_Block, np.ndarray, np.ndarray | None]],
    count: int,
    read: Callable[[_Block, np.ndarray], list[Any]],
) -> list[Any]:
    """Return what ``read`` gives for the rows of ``groups`` (:meth:`RowTable._groups`), in turn."""
    if not groups:
        return []
    if groups[0][2] is None:
        return read(groups[0][0], groups[0][1])
    gathered = np.empty(count, dtype=object)
    for block, offsets, chosen in groups:
        gathered[chosen] = _object_array(read(block, offsets))
    values: list[Any] = gathered.tolist()
    return values


class RowCollector:
    """Gathers rows made one at a time, in any order, into a :class:`RowTable`, a batch of them a block.

    How a compare holds its rows as measured: each pair's row is made as its measurement
    arrives, and held as columns once a batch of rows is made, not as an object until judging.
    """

    def __init__(self, size: int, pairs: PairSides | None = None) -> None:
        """Gather ``size`` rows; ``pairs``: the records of the pairs they measure, by position (see :class:`RowTable`)."""
        self._table = RowTable(size, pairs)
        self._positions: list[int] = []
        self._rows: list[ComparisonRow] = []

    def add(self, position: int, row: ComparisonRow) -> None:
        """Hold ``row`` as the row at ``position``."""
        self._positions.append(position)
        self._rows.append(row)
        if len(self._rows) >= ROWS_PER_BATCH:
            self._flush()

    def _flush(self) -> None:
        self._table.put(self._positions, self._rows)
        self._positions, self._rows = [], []

    def missing(self) -> Sequence[int]:
        """Return the positions no row was added at, ascending.

        As C integers (4 bytes each, read back as ints): in a statistics-only compare that is
        every pair, held while their rows are made, where a list of ints is 40 bytes a pair.
        """
        self._flush()
        return c_integers(self._table.unfilled())

    def table(self) -> RowTable:
        """Return the table of the rows added, and let it go: the collector is done."""
        self._flush()
        table, self._table = self._table, RowTable(0)
        return table


class RowFields:
    """Some rows' fields, a list each, read when first asked for (``fields.verdict``), making no row.

    What a report that writes every row reads, a block of rows at a time (:func:`field_blocks`):
    from a :class:`RowTable`, each field is read from its column; :meth:`rows` makes the rows
    themselves, for what a field alone does not tell.
    """

    def __init__(self, rows: Sequence[ComparisonRow], positions: np.ndarray) -> None:
        self._source, self._positions = rows, positions
        self._read: dict[str, list[Any]] = {}
        self._rows: list[ComparisonRow] | None = None
        self._groups = rows._groups(positions) if isinstance(rows, RowTable) else None  # found once for every field

    def __len__(self) -> int:
        return len(self._positions)

    def __getattr__(self, name: str) -> list[Any]:
        if name not in _FIELD_POSITION:
            raise AttributeError(name)
        values = self._read.get(name)
        if values is None:
            if self._groups is not None:
                values = _read_groups(self._groups, len(self._positions), _field_reader(name))
            else:
                values = [getattr(row, name) for row in self.rows()]
            self._read[name] = values
        return values

    def rows(self) -> list[ComparisonRow]:
        """Return the rows themselves (made once)."""
        if self._rows is None:
            self._rows = rows_at(self._source, self._positions.tolist())
        return self._rows


def field_blocks(rows: Sequence[ComparisonRow], size: int, order: Sequence[int] | None = None) -> Iterator[RowFields]:
    """Yield the fields of ``size`` rows at a time, in row order or in ``order`` (row positions)."""
    positions = range(len(rows)) if order is None else order
    for start in range(0, len(positions), size):  # a batch's positions at a time, not 8 bytes a row at once
        yield RowFields(rows, np.asarray(positions[start : start + size], dtype=np.int64))
