"""Measure many small pairs in one pass: one read per run of a shard, one element-wise pass per group.

A ``generate()`` dump holds mostly small tensors (one token's activations, a few KB each), and
there the cost of a pair is bookkeeping, not bytes: opening and mapping two files, allocating
chunk buffers, computing ``my - golden`` in a dozen small numpy calls. Here the small pairs
of a batch are measured in groups: a window of neighbouring pairs is read with one ``pread``
per run of nearby byte ranges in a shard; its pairs of equal size are decoded side by side
into one float64 buffer per side, a 2-D block, so the element-wise values several metrics
share (difference, absolute values, relative error, softmax weights) and the per-pair
reductions (sums, minima, maxima, dot products) are single numpy calls. Such a block is a
:class:`~llmcheck.core.pair_block.PairBlock`: metrics that know how give their value for every
row from it at once, so no per-pair objects are made. A pair that may hold NaN, Inf or mask
sentinels, or that a metric cannot measure from the block, folds its own slice through the same
:class:`~llmcheck.core.metric_engine.PairFold` the streaming path uses. Either way every
reduction -- and so every metric value -- is the one streaming gives, bit for bit.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from llmcheck.core.metric_engine import (
    WIDE_INTEGER_DTYPES,
    PairFold,
    PairJob,
    PairMeasurement,
    measure_pair,
)
from llmcheck.core.pair_block import PairBlock
from llmcheck.core.pair_chunk import RELATIVE_FLOOR, PairChunk, Workspace
from llmcheck.core.records import DTYPE_ITEMSIZE, MetricSpec, TensorData, TensorStats
from llmcheck.core.sentinels import may_hold_sentinels, sentinel_limit_in_run
from llmcheck.core.tensor_chunks import Decoder, layout

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


#: One side's ``(min, max, mean, l2norm)`` of a pair measured from its block (all its values are finite).
RowStats = tuple[float, float, float, float]
#: A pair measured from its block: index, metric values (in the order of the specs), each side's
#: statistics (None where not wanted), bytes read.
BlockRow = tuple[int, tuple[float, ...], RowStats | None, RowStats | None, int]


def measure_small_pairs(
    jobs: Sequence[PairJob],
    specs: Sequence[MetricSpec],
    workspace: Workspace,
    chunk_values: int,
    sizes: Sequence[int] | None = None,
) -> tuple[list[PairMeasurement], list[BlockRow]]:
    """Return the measurements of small pairs (``sizes`` from :func:`small_sizes`), measured group by group.

    A window of neighbouring pairs is read at once (nearby byte ranges of a shard in one
    ``pread``); within it, pairs of equal size are grouped, so a group is one block whose
    reductions are single numpy calls. The pairs measured from their block come back as
    plain rows (:func:`measurement_of_row` makes a measurement of one): a worker process
    sends them on as arrays, without making three objects per pair. The pairs folded one by
    one come back as measurements.
    """
    if sizes is None:
        sizes = small_sizes(jobs, chunk_values)
    measurements: list[PairMeasurement] = []
    rows: list[BlockRow] = []
    for window_start in range(0, len(jobs), WINDOW_PAIRS):
        window = jobs[window_start : window_start + WINDOW_PAIRS]
        window_sizes = sizes[window_start : window_start + WINDOW_PAIRS]
        golden_items = _read_items([job.golden for job in window], workspace, "window_golden")
        my_items = _read_items([job.my for job in window], workspace, "window_my")
        if golden_items is None or my_items is None:
            # a missing or cut file: streaming each pair names the file and the problem
            measurements.extend(measure_pair(job, specs, workspace, chunk_values) for job in window)
            continue
        group: list[int] = []
        group_values = 0
        for i in sorted(range(len(window)), key=lambda i: _group_order(window[i], window_sizes[i])):
            values = window_sizes[i]
            if group and group_values + values > GROUP_VALUES:
                _measure_group(
                    window, window_sizes, group, (golden_items, my_items), specs, workspace, measurements, rows
                )
                group, group_values = [], 0
            group.append(i)
            group_values += values
        if group:
            _measure_group(window, window_sizes, group, (golden_items, my_items), specs, workspace, measurements, rows)
    return measurements, rows


_NOT_WANTED = TensorStats(nan_count=0, inf_count=0)


def measurement_of_row(row: BlockRow, names: Sequence[str]) -> PairMeasurement:
    """Return a block row as the measurement ``PairFold`` gives for that pair alone."""
    index, values, golden, my, bytes_read = row
    return PairMeasurement(
        index=index,
        values=dict(zip(names, values)),
        golden_stats=_NOT_WANTED if golden is None else TensorStats(*golden, nan_count=0, inf_count=0),
        my_stats=_NOT_WANTED if my is None else TensorStats(*my, nan_count=0, inf_count=0),
        bytes_read=bytes_read,
    )


def _read_items(datas: Sequence[TensorData], workspace: Workspace, buffer_name: str) -> list[np.ndarray] | None:
    """Return each byte range as an array of its stored items, or None if a file is missing or short.

    Ranges of one file at most :data:`COALESCE_GAP_BYTES` apart are read by one ``pread``, into
    a buffer the workspace keeps (a fresh one per window would be mapped and faulted in anew).
    """
    order = sorted(range(len(datas)), key=lambda i: (str(datas[i].path), datas[i].offset))
    spans: list[tuple[int, int, int, int]] = []  # (first position in order, end position, file offset, bytes)
    position = 0
    while position < len(order):
        first = datas[order[position]]
        end = position + 1
        span_end = first.offset + first.nbytes
        while end < len(order):
            following = datas[order[end]]
            if following.path != first.path or not 0 <= following.offset - span_end <= COALESCE_GAP_BYTES:
                break
            span_end = max(span_end, following.offset + following.nbytes)
            end += 1
        spans.append((position, end, first.offset, span_end - first.offset))
        position = end
    raw = workspace.buffer(buffer_name, sum(span[3] for span in spans), np.uint8)
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
            items[i] = raw[begin : begin + data.nbytes].view(_carrier(data.dtype))
        start += length
    return items


@functools.cache
def _carrier(dtype: str) -> np.dtype:
    """Return the numpy dtype a dtype's stored items are read as."""
    return layout(dtype)[0]  # type: ignore[index]


def _measure_group(
    window: Sequence[PairJob],
    sizes: Sequence[int],
    group: Sequence[int],
    items: tuple[Sequence[np.ndarray], Sequence[np.ndarray]],
    specs: Sequence[MetricSpec],
    workspace: Workspace,
    measurements: list[PairMeasurement],
    rows: list[BlockRow],
) -> None:
    """Measure a group of small pairs (positions in ``window``, in :func:`_group_order`), so alike pairs form 2-D blocks.

    Appends the pairs measured from their block to ``rows``, those folded one by one to ``measurements``.
    """
    jobs = [window[i] for i in group]
    starts = list(itertools.accumulate((sizes[i] for i in group), initial=0))
    total = starts[-1]
    golden = workspace.buffer("group_golden", total)
    my = workspace.buffer("group_my", total)
    golden_items, my_items = items
    golden_single = _decode_side(
        [golden_items[i] for i in group], [job.golden.dtype for job in jobs], starts, golden, workspace, "golden"
    )
    my_single = _decode_side([my_items[i] for i in group], [job.my.dtype for job in jobs], starts, my, workspace, "my")
    shared = _SharedValues(golden, my, total, workspace)
    block_metrics = [getattr(spec.make_accumulator, "results_of_block", None) for spec in specs]
    first = 0
    while first < len(group):  # one block of alike pairs at a time
        kind = _block_kind(jobs[first], starts[first + 1] - starts[first])
        last = first + 1
        while last < len(group) and _block_kind(jobs[last], starts[last + 1] - starts[last]) == kind:
            last += 1
        size = kind[0]
        block = shared.block(
            starts[first],
            last - first,
            size,
            golden_single if kind[1] else None,
            my_single if kind[2] else None,
        )
        measured: list[BlockRow | None] = (
            [None] * (last - first) if None in block_metrics else _block_rows(jobs[first:last], block, block_metrics)  # type: ignore[arg-type]
        )
        for row, i in enumerate(range(first, last)):
            block_row = measured[row]
            if block_row is not None:
                rows.append(block_row)
                continue
            begin, end = starts[i], starts[i] + size
            chunk = PairChunk(golden[begin:end], my[begin:end], workspace)
            shared.share_row(chunk, block, row, begin, end)
            fold = PairFold(jobs[i], specs)
            fold.fold(chunk, workspace)
            measurements.append(fold.measurement(specs))
        first = last


#: Stored dtypes whose items are float32 numbers: a group keeps them as float32 too, where float32
#: arithmetic on them gives bit for bit what float64 arithmetic rounded to float32 gives.
_FLOAT32_STORED = frozenset({"float32", "bfloat16", "complex64"})


def _group_order(job: PairJob, size: int) -> tuple[int, bool, bool, str, str]:
    """Return where a pair goes in its window's order: by size, then alike stored dtypes together.

    Pairs of one size and dtype are decoded by one call, and a block's rows stored as float32
    on a side can be reduced from those float32 values.
    """
    golden, my = job.golden.dtype, job.my.dtype
    return size, golden in _FLOAT32_STORED, my in _FLOAT32_STORED, golden, my


def _block_kind(job: PairJob, size: int) -> tuple[int, bool, bool]:
    """Return what the pairs of one block share: the size, and on each side whether they are stored as float32."""
    return size, job.golden.dtype in _FLOAT32_STORED, job.my.dtype in _FLOAT32_STORED


def _decode_side(
    items: Sequence[np.ndarray],
    dtypes: Sequence[str],
    starts: Sequence[int],
    out: np.ndarray,
    workspace: Workspace,
    side: str,
) -> np.ndarray:
    """Decode one side of a group into ``out`` (float64) and return the float32 buffer beside it.

    Pairs stored as float32 numbers (:data:`_FLOAT32_STORED`) are gathered into the float32
    buffer (one call per run of one dtype) and widened from there; the float32 buffer holds
    only their positions. Other pairs are decoded one by one straight into ``out``.
    """
    single = workspace.buffer("group_float32_" + side, len(out), np.float32)
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
    return single


@functools.cache
def _decoder(dtype: str) -> Decoder:
    """Return the function decoding a dtype's stored items into float64."""
    return layout(dtype)[2]  # type: ignore[index]


def _block_rows(
    jobs: Sequence[PairJob],
    block: PairBlock,
    block_metrics: Sequence[Callable[[PairBlock], list[float | None]]],
) -> list[BlockRow | None]:
    """Return each row's measurement from the block's per-row values, None for a row to fold the ordinary way.

    A row is folded the ordinary way when it may hold NaN, Inf or mask sentinels (its sum of
    squares says so), holds 64-bit integers (measured exactly as integers), or a metric
    cannot give its value from the block.
    """
    golden_sq, my_sq = block.sum_sq_golden(), block.sum_sq_my()
    ordinary = [
        row
        for row, job in enumerate(jobs)
        if job.golden.dtype not in WIDE_INTEGER_DTYPES
        and job.my.dtype not in WIDE_INTEGER_DTYPES
        and not may_hold_sentinels(golden_sq[row], _sentinel_limit(job.golden.dtype, job.golden_run_dtype))
        and not may_hold_sentinels(my_sq[row], _sentinel_limit(job.my.dtype, job.my_run_dtype))
    ]
    measured: list[BlockRow | None] = [None] * len(jobs)
    if not ordinary:
        return measured
    # metrics see only the ordinary rows: a NaN or Inf row would reach math functions that refuse it
    block = block if len(ordinary) == len(jobs) else block.subset(ordinary)
    per_metric = [results_of_block(block) for results_of_block in block_metrics]
    golden_stats = _rows_stats(block, "golden", block.sum_sq_golden())
    my_stats = _rows_stats(block, "my", block.sum_sq_my())
    rows_values = zip(*per_metric) if per_metric else [()] * len(ordinary)
    for row, (block_row, values) in enumerate(zip(ordinary, rows_values)):
        if None in values:
            continue
        job = jobs[block_row]
        measured[block_row] = (
            job.index,
            tuple(map(float, values)),
            golden_stats[row] if job.golden_needs_stats else None,
            my_stats[row] if job.my_needs_stats else None,
            job.nbytes,
        )
    return measured


def _rows_stats(block: PairBlock, side: str, squares: list[float]) -> list[RowStats]:
    """Return ``(min, max, mean, l2norm)`` of one side of every row: ``SideStats`` arithmetic after one finite chunk."""
    count = block.size
    return [
        (min(math.inf, low), max(-math.inf, high), (0.0 + total) / count, math.sqrt(0.0 + sum_sq))
        for low, high, total, sum_sq in zip(
            block.reduction(side + "_min"), block.reduction(side + "_max"), block.reduction(side + "_sum"), squares
        )
    ]


#: :func:`sentinel_limit_in_run` computed once per (dtype, run dtype).
_sentinel_limit = functools.cache(sentinel_limit_in_run)


class _SharedValues:
    """The element-wise values of a whole group, and their per-pair reductions block by block.

    Every reduction is one numpy reduction along the rows of an equal-sized block, which gives
    each row exactly what the same reduction of that pair alone gives (numpy reduces each row
    of a C-ordered block in one inner loop).
    """

    def __init__(self, golden: np.ndarray, my: np.ndarray, total: int, workspace: Workspace) -> None:
        self.golden, self.my = golden, my
        self.workspace = workspace
        with np.errstate(all="ignore"):  # NaN and Inf are found and handled pair by pair
            self.diff = np.subtract(my, golden, out=workspace.buffer("group_diff", total))
            self.abs_diff = np.abs(self.diff, out=workspace.buffer("group_abs_diff", total))
            self.abs_golden = np.abs(golden, out=workspace.buffer("group_abs_golden", total))
            self.relative = np.divide(self.abs_diff, self.abs_golden, out=workspace.buffer("group_relative", total))
            # rare: only then pay for the mask (no mask: every block's count is its size); a NaN
            # minimum (a pair holding NaN) says nothing of the other pairs, so it builds the mask too
            self.undefined: np.ndarray | None = None
            if not float(self.abs_golden.min()) > RELATIVE_FLOOR:
                self.undefined = np.less_equal(
                    self.abs_golden, RELATIVE_FLOOR, out=workspace.buffer("group_undefined", total, np.bool_)
                )
                self.relative[self.undefined] = 0.0
        self.weights = workspace.buffer("group_weights", total)
        self.single = workspace.buffer("group_single", total, np.float32)

    def block(
        self,
        begin: int,
        rows: int,
        size: int,
        golden_float32: np.ndarray | None = None,
        my_float32: np.ndarray | None = None,
    ) -> PairBlock:
        """Return the ``rows`` pairs of ``size`` values starting at ``begin`` as a block with its reductions.

        ``golden_float32`` / ``my_float32``: the group's float32 buffer of a side whose rows of this
        block were all stored as float32 numbers (:func:`_decode_side`), else None.
        """
        end = begin + rows * size

        def block(values: np.ndarray) -> np.ndarray:
            return values[begin:end].reshape(rows, size)

        golden, my = block(self.golden), block(self.my)
        golden_single = None if golden_float32 is None else block(golden_float32)
        my_single = None if my_float32 is None else block(my_float32)
        with np.errstate(all="ignore"):
            golden_max = _row_extremes(np.maximum, golden, golden_single)
            single = block(self.single)
            if golden_single is not None:
                # float32 arithmetic on float32 numbers is float64 arithmetic rounded to float32
                # (53 >= 2 * 24 + 2, Figueroa): the float32 maxima are the float64 ones
                np.subtract(golden_single, golden_max.astype(np.float32)[:, None], out=single)
            else:
                np.subtract(golden, golden_max[:, None], out=single, casting="same_kind")
            np.exp(single, out=single)
            weights = block(self.weights)
            np.copyto(weights, single)
            relative = block(self.relative)
            defined_counts = (
                [size] * rows
                if self.undefined is None
                else (size - np.count_nonzero(block(self.undefined), axis=1)).tolist()
            )
            shared = {
                "golden_min": _row_extremes(np.minimum, golden, golden_single).tolist(),
                "golden_max": golden_max.tolist(),
                "golden_sum": golden.sum(axis=1).tolist(),
                "my_min": _row_extremes(np.minimum, my, my_single).tolist(),
                "my_max": _row_extremes(np.maximum, my, my_single).tolist(),
                "my_sum": my.sum(axis=1).tolist(),
                "max_abs_diff": block(self.abs_diff).max(axis=1, initial=0.0).tolist(),
                "sum_abs_diff": block(self.abs_diff).sum(axis=1).tolist(),
                "max_relative_error": relative.max(axis=1).tolist(),
                "sum_relative_error": relative.sum(axis=1).tolist(),
                "relative_defined_count": defined_counts,
                "diff": block(self.diff),
                "softmax_weights": weights,
                "weight_sum": weights.sum(axis=1).tolist(),
            }
        return PairBlock(golden, my, shared, self.workspace.buffer, golden_float32=golden_single, my_float32=my_single)

    def share_row(self, chunk: PairChunk, block: PairBlock, row: int, begin: int, end: int) -> None:
        """Give one pair's chunk its row of the block's reductions and its slices of the element-wise arrays."""
        for name in _ROW_REDUCTIONS:
            chunk.share(name, block.reduction(name)[row])
        weights, weight_sums = block.softmax_weights()
        chunk.share("softmax_weights", (block.reduction("golden_max")[row], weights[row], weight_sums[row]))
        chunk.share("diff", self.diff[begin:end])
        chunk.share("abs_diff", self.abs_diff[begin:end])
        chunk.share("abs_golden", self.abs_golden[begin:end])
        chunk.share("relative_error", self.relative[begin:end])


def _row_extremes(extreme: np.ufunc, values: np.ndarray, single: np.ndarray | None) -> np.ndarray:
    """Return the minimum or maximum (``extreme``) of each row of ``values``, from its float32 numbers where given.

    The float64 of a row's float32 extreme is its float64 extreme, except for the sign of a
    zero (which of -0.0 and 0.0 comes out depends on how the reduction visits them) and the
    bits of a NaN: those rows are reduced again in float64.
    """
    if single is None:
        return cast(np.ndarray, extreme.reduce(values, axis=1))
    found = extreme.reduce(single, axis=1).astype(np.float64)
    for row in np.flatnonzero((found == 0.0) | np.isnan(found)).tolist():
        found[row] = extreme.reduce(values[row])
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
