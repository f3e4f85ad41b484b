"""Measure many small pairs in one pass: one read per run of a shard, one element-wise pass per group.

A ``generate()`` dump holds mostly small tensors (one token's activations, a few KB each), and
there the cost of a pair is bookkeeping, not bytes: opening and mapping two files, allocating
chunk buffers, computing ``my - golden`` in a dozen small numpy calls. Here the small pairs
of a batch are measured in groups: a window of neighbouring pairs is read with one ``pread``
per run of nearby byte ranges in a shard; its pairs of equal size are decoded side by side
into one float64 buffer per side, a 2-D block, so the element-wise values several metrics
share (difference, absolute values, relative error, softmax weights) and the per-pair
reductions (sums, minima, maxima, dot products) are single numpy calls. Such a block is a
:class:`~llmcheck.core.measuring.pair_block.PairBlock`: metrics that know how give their value for every
row from it at once, so no per-pair objects are made. A pair that may hold NaN, Inf or mask
sentinels, or that a metric cannot measure from the block, folds its own slice through the same
:class:`~llmcheck.core.measuring.pair_measure.PairFold` the streaming path uses. Either way every
reduction -- and so every metric value -- is the one streaming gives, bit for bit.

What is left is arithmetic streaming must do too, so the per-block bookkeeping is kept to a
few calls: a group's element-wise values are planes of one buffer (the five per-pair sums are
one reduction), pairs stored as float32 numbers (float32, bfloat16) are also kept as float32,
where the softmax shift, minima and maxima cost half the bytes and are provably the float64
ones, and the pairs measured from their blocks are gathered as columns for the whole batch.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

import numpy as np

from llmcheck.core.dtypes import DTYPE_ITEMSIZE
from llmcheck.core.dumps.tensor_chunks import Decoder, layout
from llmcheck.core.measuring.measured_columns import MeasuredColumns
from llmcheck.core.measuring.pair_block import PairBlock, stacked_row_dots
from llmcheck.core.measuring.pair_chunk import RELATIVE_FLOOR, PairChunk, Workspace
from llmcheck.core.measuring.pair_measure import WIDE_INTEGER_DTYPES, PairFold, PairJob, PairMeasurement, measure_pair
from llmcheck.core.measuring.sentinels import sentinel_limit_in_run
from llmcheck.core.records import MetricSpec, TensorData

#: Pairs of at most this many values per side (and within one chunk) are measured in groups;
#: 0 streams every pair (the tests compare both ways).
SMALL_PAIR_VALUES = 1 << 16
#: Values per side of one group: 1 MB float64 buffers keep a group's working set in the CPU caches.
GROUP_VALUES = 1 << 17
#: Neighbouring pairs read together and sorted by size (a few MB of stored bytes per side).
WINDOW_PAIRS = 256
#: Byte ranges of one file at most this far apart are read by one ``pread`` (the gap is read too).
COALESCE_GAP_BYTES = 64 * 1024


def small_sizes(jobs: Sequence[PairJob], chunk_values: int) -> list[int]:
    """Return the values per side of each pair measured in groups, 0 for a pair to stream.

    A pair is measured in a group when it fits one chunk on both sides and is a plain byte range there.
    """
    limit = min(chunk_values, SMALL_PAIR_VALUES)
    sizes = []
    for job in jobs:
        values = _values(job.golden)
        small = 0 < values <= limit and values == _values(job.my) and job.crosses_processes
        sizes.append(values if small else 0)
    return sizes


@functools.cache
def _element(dtype: str) -> tuple[int, int] | None:
    """Return (float64 values, stored bytes) per element of a dtype, None where it cannot be streamed from bytes."""
    described = layout(dtype, strict=False)
    return None if described is None else (described[1], DTYPE_ITEMSIZE.get(dtype, 0))


def _values(data: TensorData) -> int:
    """Return the float64 values a side streams as (-1 when it cannot be streamed from bytes)."""
    element = _element(data.dtype)
    if element is None or data.loader is not None:
        return -1
    numel = data.numel
    if data.nbytes != numel * element[1]:
        return -1
    return numel * element[0]


class BlockRows:
    """The pairs measured from their blocks, gathered block by block: :meth:`columns` gives them as one set of columns.

    :meth:`measurements` makes the measurements ``PairFold`` gives for those pairs alone.
    """

    def __init__(self, metrics: int) -> None:
        self.index: list[int] = []
        #: a column per metric, in the order of the specs
        self.values: list[list[float]] = [[] for _ in range(metrics)]
        #: per side (golden, my): each pair's minimum, maximum, sum and sum of squares (all its values are finite)
        self.reductions: list[list[list[float]]] = [[[] for _ in range(4)] for _ in range(2)]
        #: each pair's values per side: the count of its means
        self.sizes: list[int] = []
        #: per side: whether each pair's statistics were asked for
        self.wanted: list[list[bool]] = [[], []]
        self.bytes_read: list[int] = []

    def __len__(self) -> int:
        return len(self.index)

    def add(self, jobs: Sequence[PairJob], values: Sequence[list[float]], columns: _BlockColumns, size: int) -> None:
        """Add the pairs of one block: their metric values (a list per metric) and per-row reductions."""
        self.index += [job.index for job in jobs]
        for column, metric_values in zip(self.values, values):
            column += metric_values
        for side in (0, 1):
            for column, found in zip(self.reductions[side], columns):
                column += found[side]
        self.sizes += [size] * len(jobs)
        self.wanted[0] += [job.golden_needs_stats for job in jobs]
        self.wanted[1] += [job.my_needs_stats for job in jobs]
        self.bytes_read += [job.golden.nbytes + job.my.nbytes for job in jobs]  # byte ranges: no loader

    def columns(self, names: Sequence[str]) -> MeasuredColumns:
        """Return the pairs as columns, their metric values under ``names`` (the specs' order)."""
        reductions = np.array(self.reductions, dtype=np.float64).reshape(2, 4, len(self))
        stats = np.empty((2, len(self), 4))
        stats[:, :, 0], stats[:, :, 1] = reductions[:, 0], reductions[:, 1]
        stats[:, :, 2] = (0.0 + reductions[:, 2]) / np.array(self.sizes, dtype=np.float64)
        stats[:, :, 3] = np.sqrt(0.0 + reductions[:, 3])
        return MeasuredColumns(
            names=tuple(names),
            index=self.index,
            values=np.array(self.values, dtype=np.float64).reshape(len(self.values), len(self)).T,
            stats=stats,
            wanted=np.array(self.wanted, dtype=np.bool_).reshape(2, len(self)),
            bytes_read=self.bytes_read,
        )


def measure_small_pairs(
    jobs: Sequence[PairJob],
    specs: Sequence[MetricSpec],
    workspace: Workspace,
    chunk_values: int,
    sizes: Sequence[int] | None = None,
) -> tuple[list[PairMeasurement], BlockRows]:
    """Return the measurements of small pairs (``sizes`` from :func:`small_sizes`), measured group by group.

    A window of neighbouring pairs is read at once (nearby byte ranges of a shard in one
    ``pread``); within it, pairs of equal size are grouped, so a group is one block whose
    reductions are single numpy calls. The pairs measured from their block come back as
    columns (:class:`BlockRows`): a worker process sends them on as arrays, without making
    three objects per pair. The pairs folded one by one come back as measurements.
    """
    if sizes is None:
        sizes = small_sizes(jobs, chunk_values)
    measurements: list[PairMeasurement] = []
    rows = BlockRows(len(specs))
    for window_start in range(0, len(jobs), WINDOW_PAIRS):
        window = jobs[window_start : window_start + WINDOW_PAIRS]
        window_sizes = sizes[window_start : window_start + WINDOW_PAIRS]
        golden_items = _read_items([job.golden for job in window], workspace, "window_golden")
        my_items = _read_items([job.my for job in window], workspace, "window_my")
        if golden_items is None or my_items is None:
            # a missing or cut file: streaming each pair names the file and the problem
            measurements.extend(measure_pair(job, specs, workspace, chunk_values) for job in window)
            continue
        kinds = [_group_order(job, size) for job, size in zip(window, window_sizes)]
        group: list[int] = []
        group_values = 0
        with np.errstate(all="ignore"):  # NaN and Inf are found and handled pair by pair
            for i in sorted(range(len(window)), key=kinds.__getitem__):
                values = window_sizes[i]
                if group and group_values + values > GROUP_VALUES:
                    _measure_group(window, kinds, group, (golden_items, my_items), specs, workspace, measurements, rows)
                    group, group_values = [], 0
                group.append(i)
                group_values += values
            if group:
                _measure_group(window, kinds, group, (golden_items, my_items), specs, workspace, measurements, rows)
    return measurements, rows


def _read_items(datas: Sequence[TensorData], workspace: Workspace, buffer_name: str) -> list[np.ndarray] | None:
    """Return each byte range as an array of its stored items, or None if a file is missing or short.

    Ranges of one file at most :data:`COALESCE_GAP_BYTES` apart are read by one ``pread``, into
    a buffer the workspace keeps (a fresh one per window would be mapped and faulted in anew).
    """
    keys = [(str(data.path), data.offset) for data in datas]
    order = sorted(range(len(datas)), key=keys.__getitem__)
    spans: list[tuple[int, int, int, int]] = []  # (first position in order, end position, file offset, bytes)
    position = 0
    while position < len(order):
        first = datas[order[position]]
        name = keys[order[position]][0]
        end = position + 1
        span_end = first.offset + first.nbytes
        while end < len(order):
            following = datas[order[end]]
            if keys[order[end]][0] != name or not 0 <= following.offset - span_end <= COALESCE_GAP_BYTES:
                break
            span_end = max(span_end, following.offset + following.nbytes)
            end += 1
        spans.append((position, end, first.offset, span_end - first.offset))
        position = end
    raw = workspace.buffer(buffer_name, sum(span[3] for span in spans), np.uint8)
    typed: dict[np.dtype, np.ndarray] = {}  # the whole buffer viewed as each carrier: an aligned item is one slice
    items: list[np.ndarray] = [None] * len(datas)  # type: ignore[list-item]
    start = 0
    for position, end, offset, length in spans:
        path = datas[order[position]].path
        try:
            descriptor = os.open(path, os.O_RDONLY)  # type: ignore[arg-type]
        except OSError:
            return None
        try:
            read = os.preadv(descriptor, [raw[start : start + length].data], offset)
        finally:
            os.close(descriptor)
        if read != length:
            return None
        for i in order[position:end]:
            data = datas[i]
            begin = start + data.offset - offset
            carrier = _carrier(data.dtype)
            if begin % carrier.itemsize:
                items[i] = raw[begin : begin + data.nbytes].view(carrier)
                continue
            whole = typed.get(carrier)
            if whole is None:
                whole = typed[carrier] = raw[: raw.size - raw.size % carrier.itemsize].view(carrier)
            item_start = begin // carrier.itemsize
            items[i] = whole[item_start : item_start + data.nbytes // carrier.itemsize]
        start += length
    return items


@functools.cache
def _carrier(dtype: str) -> np.dtype:
    """Return the numpy dtype a dtype's stored items are read as."""
    return layout(dtype)[0]  # type: ignore[index]


def _measure_group(
    window: Sequence[PairJob],
    kinds: Sequence[tuple[int, bool, bool, str, str]],
    group: Sequence[int],
    items: tuple[Sequence[np.ndarray], Sequence[np.ndarray]],
    specs: Sequence[MetricSpec],
    workspace: Workspace,
    measurements: list[PairMeasurement],
    rows: BlockRows,
) -> None:
    """Measure a group of small pairs (positions in ``window``, in the order of their ``kinds``: :func:`_group_order`).

    Pairs of one size, stored as float32 numbers on the same sides, form one 2-D block.

    Appends the pairs measured from their block to ``rows``, those folded one by one to ``measurements``.
    """
    jobs = [window[i] for i in group]
    group_kinds = [kinds[i][:3] for i in group]  # a block: the pairs of one size and float32 storedness
    starts = list(itertools.accumulate((kind[0] for kind in group_kinds), initial=0))
    shared = _SharedValues(starts[-1], workspace)
    golden_items, my_items = items
    for side, side_items, dtypes in (
        (0, golden_items, [kinds[i][3] for i in group]),
        (1, my_items, [kinds[i][4] for i in group]),
    ):
        _decode_side(
            [side_items[i] for i in group], dtypes, starts, shared.planes[side], shared.singles[side], workspace
        )
    shared.compute()
    block_metrics = [getattr(spec.make_accumulator, "results_of_block", None) for spec in specs]
    first = 0
    while first < len(group):  # one block of alike pairs at a time
        kind = group_kinds[first]
        last = first + 1
        while last < len(group) and group_kinds[last] == kind:
            last += 1
        size, golden_stored, my_stored = kind
        block, columns = shared.block(starts[first], last - first, size, (golden_stored, my_stored))
        folded = (
            list(range(last - first))
            if None in block_metrics
            else _block_rows(jobs[first:last], block, columns, block_metrics, rows)  # type: ignore[arg-type]
        )
        for row in folded:
            begin = starts[first + row]
            chunk = PairChunk(shared.golden[begin : begin + size], shared.my[begin : begin + size], workspace)
            shared.share_row(chunk, block, row, begin, begin + size)
            fold = PairFold(jobs[first + row], specs)
            fold.fold(chunk, workspace)
            measurements.append(fold.measurement(specs))
        first = last


#: Stored dtypes whose items are float32 numbers: a group keeps them as float32 too, where float32
#: arithmetic on them gives bit for bit what float64 arithmetic rounded to float32 gives.
_FLOAT32_STORED = frozenset({"float32", "bfloat16", "complex64"})


def _group_order(job: PairJob, size: int) -> tuple[int, bool, bool, str, str]:
    """Return where a pair goes in its window's order: by size, then alike stored dtypes together.

    Pairs of one size and dtype are decoded by one call, and a block's rows stored as float32
    on a side (the second and third items) can be reduced from those float32 values.
    """
    golden, my = job.golden.dtype, job.my.dtype
    return size, golden in _FLOAT32_STORED, my in _FLOAT32_STORED, golden, my


def _decode_side(
    items: Sequence[np.ndarray],
    dtypes: Sequence[str],
    starts: Sequence[int],
    out: np.ndarray,
    single: np.ndarray,
    workspace: Workspace,
) -> None:
    """Decode one side of a group into ``out`` (float64), the pairs stored as float32 numbers also into ``single``.

    Pairs stored as float32 numbers (:data:`_FLOAT32_STORED`) are gathered into ``single``
    (one call per run of one dtype) and widened from there; ``single`` holds only their
    positions. Other pairs are decoded one by one straight into ``out``.
    """
    first = 0
    while first < len(items):
        dtype = dtypes[first]
        last = first + 1
        while last < len(items) and dtypes[last] == dtype:
            last += 1
        begin, end = starts[first], starts[last]
        if dtype in _FLOAT32_STORED:
            if dtype == "bfloat16":  # a bfloat16 is the high half of its float32
                bits = single[begin:end].view(np.uint32)
                np.concatenate(items[first:last], out=bits)
                np.left_shift(bits, 16, out=bits)
            else:
                np.concatenate(items[first:last], out=single[begin:end])
            np.copyto(out[begin:end], single[begin:end])
        else:
            decode = _decoder(dtype)
            for i in range(first, last):
                decode(items[i], out[starts[i] : starts[i + 1]], workspace.buffer)
        first = last


@functools.cache
def _decoder(dtype: str) -> Decoder:
    """Return the function decoding a dtype's stored items into float64."""
    return layout(dtype)[2]  # type: ignore[index]


def _block_rows(
    jobs: Sequence[PairJob],
    block: PairBlock,
    columns: _BlockColumns,
    block_metrics: Sequence[Callable[[PairBlock], list[float | None]]],
    rows: BlockRows,
) -> list[int]:
    """Add the rows measured from the block to ``rows``; return the rows to fold the ordinary way.

    A row is folded the ordinary way when it may hold NaN, Inf or mask sentinels (its sum of
    squares says so, :func:`~llmcheck.core.measuring.sentinels.may_hold_sentinels`), holds 64-bit
    integers (measured exactly as integers), or a metric cannot give its value from the block.
    """
    golden_squares, my_squares = columns.squares
    ordinary = [
        row
        for row, (job, golden, my) in enumerate(zip(jobs, golden_squares, my_squares))
        if golden < _ordinary_bound(job.golden.dtype, job.golden_run_dtype)
        and my < _ordinary_bound(job.my.dtype, job.my_run_dtype)
    ]
    folded = [] if len(ordinary) == len(jobs) else sorted(set(range(len(jobs))).difference(ordinary))
    if not ordinary:
        return folded
    if folded:  # metrics see only the ordinary rows: a NaN or Inf row would reach math functions that refuse it
        block = block.subset(ordinary)
        columns = columns.subset(ordinary)
        jobs = [jobs[row] for row in ordinary]
    per_metric = [results_of_block(block) for results_of_block in block_metrics]
    if any(None in values for values in per_metric):  # a metric cannot give some rows' values
        unknown = {row for values in per_metric for row, value in enumerate(values) if value is None}
        folded = sorted(folded + [ordinary[row] for row in unknown])
        kept = [row for row in range(len(ordinary)) if row not in unknown]
        if not kept:
            return folded
        per_metric = [[values[row] for row in kept] for values in per_metric]
        columns = columns.subset(kept)
        jobs = [jobs[row] for row in kept]
    rows.add(jobs, per_metric, columns, block.size)  # type: ignore[arg-type]
    return folded


@functools.cache
def _ordinary_bound(dtype: str, run_dtype: str | None) -> float:
    """Return what a row's sum of squares stays below when its pair is measured from the block; NaN: never.

    The square of :func:`sentinel_limit_in_run` (``may_hold_sentinels`` says no below it) for
    floats; 64-bit integers are measured exactly as integers, pair by pair.
    """
    if dtype in WIDE_INTEGER_DTYPES:
        return math.nan
    limit = sentinel_limit_in_run(dtype, run_dtype)
    return limit * limit


#: The float64 planes of a group, one row of its planes buffer each. The first :data:`_SUMMED`
#: are summed pair by pair, all by one reduction over the block's planes.
_GOLDEN, _MY, _ABS_DIFF, _RELATIVE, _WEIGHTS, _DIFF = range(6)
_SUMMED = 5


class _BlockColumns(NamedTuple):
    """A block's per-row reductions the engine itself uses: each a list per side (golden, my) of a value per row."""

    minima: list[list[float]]
    maxima: list[list[float]]
    sums: list[list[float]]
    squares: list[list[float]]

    def subset(self, rows: list[int]) -> _BlockColumns:
        return _BlockColumns(*([[side[row] for row in rows] for side in found] for found in self))


class _SharedValues:
    """The element-wise values of a whole group, and their per-pair reductions block by block.

    Every element-wise array is a plane of one buffer (``planes[_DIFF]``, ...), so the
    reductions several planes share are one numpy call over the block's planes. Every
    reduction is one numpy reduction along the rows of an equal-sized block, which gives
    each row exactly what the same reduction of that pair alone gives (numpy reduces each
    row of a C-ordered block in one inner loop).
    """

    def __init__(self, total: int, workspace: Workspace) -> None:
        self.total = total
        self.workspace = workspace
        self.planes = workspace.buffer("group_planes", 6 * total).reshape(6, total)
        #: golden and my as float32, at the positions of the pairs stored as float32 numbers
        self.singles = workspace.buffer("group_float32", 2 * total, np.float32).reshape(2, total)
        self.golden, self.my = self.planes[_GOLDEN], self.planes[_MY]
        self.diff, self.abs_diff = self.planes[_DIFF], self.planes[_ABS_DIFF]
        self.relative = self.planes[_RELATIVE]
        self.exponentials = workspace.buffer("group_exponentials", total, np.float32)
        self.undefined: np.ndarray | None = None

    def compute(self) -> None:
        """Compute the element-wise values of the decoded golden and my planes (NaN and Inf warnings silenced)."""
        np.subtract(self.my, self.golden, out=self.diff)
        np.abs(self.diff, out=self.abs_diff)
        magnitude = np.abs(self.golden, out=self.relative)  # |golden|, divided in place below
        # rare: only then pay for the mask (no mask: every block's count is its size); a NaN
        # minimum (a pair holding NaN) says nothing of the other pairs, so it builds the mask too
        if not float(magnitude.min()) > RELATIVE_FLOOR:
            self.undefined = np.less_equal(
                magnitude, RELATIVE_FLOOR, out=self.workspace.buffer("group_undefined", self.total, np.bool_)
            )
        np.divide(self.abs_diff, magnitude, out=self.relative)
        if self.undefined is not None:
            self.relative[self.undefined] = 0.0

    def block(self, begin: int, rows: int, size: int, stored32: tuple[bool, bool]) -> tuple[PairBlock, _BlockColumns]:
        """Return the ``rows`` pairs of ``size`` values starting at ``begin`` as a block with its reductions.

        NaN and Inf warnings are silenced by the caller (``np.errstate``): such pairs are handled one by one.

        ``stored32``: whether the block's rows of each side are all stored as float32 numbers
        (:func:`_decode_side` put them in ``singles`` too).
        """
        end = begin + rows * size
        planes = self.planes[:, begin:end].reshape(len(self.planes), rows, size)
        singles = self.singles[:, begin:end].reshape(2, rows, size)
        golden, my = planes[_GOLDEN], planes[_MY]
        maxima = _row_extremes(np.maximum, planes[:2], singles, stored32)
        exponentials = self.exponentials[begin:end].reshape(rows, size)
        if stored32[0]:
            # float32 arithmetic on float32 numbers is float64 arithmetic rounded to float32
            # (53 >= 2 * 24 + 2, Figueroa): the float32 maxima are the float64 ones
            np.subtract(singles[0], np.array(maxima[0], np.float32)[:, None], out=exponentials)
        else:
            np.subtract(golden, np.array(maxima[0])[:, None], out=exponentials, casting="same_kind")
        np.exp(exponentials, out=exponentials)
        weights = planes[_WEIGHTS]
        np.copyto(weights, exponentials)
        sums = planes[:_SUMMED].sum(axis=2).tolist()
        columns = _BlockColumns(
            minima=_row_extremes(np.minimum, planes[:2], singles, stored32),
            maxima=maxima,
            sums=sums[:2],
            squares=stacked_row_dots(planes[:2], planes[:2]).tolist(),
        )
        shared = {
            "golden_min": columns.minima[0],
            "golden_max": maxima[0],
            "golden_sum": sums[_GOLDEN],
            "my_min": columns.minima[1],
            "my_max": maxima[1],
            "my_sum": sums[_MY],
            "max_abs_diff": planes[_ABS_DIFF].max(axis=1, initial=0.0).tolist(),
            "sum_abs_diff": sums[_ABS_DIFF],
            "max_relative_error": planes[_RELATIVE].max(axis=1).tolist(),
            "sum_relative_error": sums[_RELATIVE],
            "relative_defined_count": (
                [size] * rows
                if self.undefined is None
                else (size - np.count_nonzero(self.undefined[begin:end].reshape(rows, size), axis=1)).tolist()
            ),
            "weight_sum": sums[_WEIGHTS],
            "sum_sq_golden": columns.squares[0],
            "sum_sq_my": columns.squares[1],
            "diff": planes[_DIFF],
            "softmax_weights": weights,
        }
        block = PairBlock(
            golden,
            my,
            shared,
            self.workspace.buffer,
            golden_float32=singles[0] if stored32[0] else None,
            my_float32=singles[1] if stored32[1] else None,
        )
        return block, columns

    def share_row(self, chunk: PairChunk, block: PairBlock, row: int, begin: int, end: int) -> None:
        """Give one pair's chunk its row of the block's reductions and its slices of the element-wise arrays."""
        for name in _ROW_REDUCTIONS:
            chunk.share(name, block.reduction(name)[row])
        weights, weight_sums = block.softmax_weights()
        chunk.share("softmax_weights", (block.reduction("golden_max")[row], weights[row], weight_sums[row]))
        chunk.share("diff", self.diff[begin:end])
        chunk.share("abs_diff", self.abs_diff[begin:end])
        chunk.share("relative_error", self.relative[begin:end])


def _row_extremes(
    extreme: np.ufunc, values: np.ndarray, singles: np.ndarray, stored32: tuple[bool, bool]
) -> list[list[float]]:
    """Return the minimum or maximum (``extreme``) of each row of both sides, from float32 where stored so.

    ``values`` and ``singles`` are both sides' block, (2, rows, size), in float64 and float32.
    The float64 of a row's float32 extreme is its float64 extreme, except for the sign of a
    zero (which of -0.0 and 0.0 comes out depends on how the reduction visits them) and the
    bits of a NaN: those rows are reduced again in float64.
    """
    if stored32 == (True, True):
        found: list[list[float]] = extreme.reduce(singles, axis=2).tolist()
    elif stored32 == (False, False):
        return cast(list[list[float]], extreme.reduce(values, axis=2).tolist())
    else:
        found = [extreme.reduce(singles[side] if stored32[side] else values[side], axis=1).tolist() for side in (0, 1)]
    for side, side_found in enumerate(found):
        if 0.0 in side_found or math.isnan(sum(side_found)):  # rare: a zero or a NaN (or +Inf and -Inf)
            for row, value in enumerate(side_found):
                if value == 0.0 or math.isnan(value):
                    side_found[row] = float(extreme.reduce(values[side, row]))
    return found


#: The per-row reductions of a block a pair's own chunk takes over when it is folded the ordinary way.
_ROW_REDUCTIONS = (
    "golden_min",
    "golden_max",
    "golden_sum",
    "my_min",
    "my_max",
    "my_sum",
    "max_abs_diff",
    "sum_abs_diff",
    "max_relative_error",
    "sum_relative_error",
    "relative_defined_count",
)
