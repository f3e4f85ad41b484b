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

import os
from collections.abc import Callable, Sequence

import numpy as np

from llmcheck.core.metric_engine import (
    WIDE_INTEGER_DTYPES,
    PairFold,
    PairJob,
    PairMeasurement,
    SideStats,
    measure_pair,
)
from llmcheck.core.pair_block import PairBlock
from llmcheck.core.pair_chunk import RELATIVE_FLOOR, PairChunk, Workspace
from llmcheck.core.records import DTYPE_ITEMSIZE, MetricSpec, TensorData
from llmcheck.core.sentinels import may_hold_sentinels, sentinel_limit_in_run
from llmcheck.core.tensor_chunks import layout

#: Pairs of at most this many values per side (and within one chunk) are measured in groups;
#: 0 streams every pair (the tests compare both ways).
SMALL_PAIR_VALUES = 1 << 16
#: Values per side of one group: 1 MB float64 buffers keep a group's working set in the CPU caches.
GROUP_VALUES = 1 << 17
#: Neighbouring pairs read together and sorted by size (a few MB of stored bytes per side).
WINDOW_PAIRS = 256
#: Byte ranges of one file at most this far apart are read by one ``pread`` (the gap is read too).
COALESCE_GAP_BYTES = 64 * 1024


def is_small(job: PairJob, chunk_values: int) -> bool:
    """Return whether a pair fits one chunk on both sides and is a plain byte range there."""
    values = _values(job.golden)
    return values == _values(job.my) and 0 < values <= min(chunk_values, SMALL_PAIR_VALUES) and job.crosses_processes


def _values(data: TensorData) -> int:
    """Return the float64 values a side streams as (-1 when it cannot be streamed from bytes)."""
    described = layout(data.dtype, strict=False)
    if described is None or data.loader is not None or data.nbytes != data.numel * DTYPE_ITEMSIZE.get(data.dtype, 0):
        return -1
    return data.numel * described[1]


def measure_small_pairs(
    jobs: Sequence[PairJob], specs: Sequence[MetricSpec], workspace: Workspace, chunk_values: int
) -> list[PairMeasurement]:
    """Return the measurements of small pairs (:func:`is_small`), measured group by group.

    A window of neighbouring pairs is read at once (nearby byte ranges of a shard in one
    ``pread``); within it, pairs of equal size are grouped, so a group is one block whose
    reductions are single numpy calls.
    """
    results: list[PairMeasurement] = []
    for window_start in range(0, len(jobs), WINDOW_PAIRS):
        window = jobs[window_start : window_start + WINDOW_PAIRS]
        golden_items, my_items = _read_items([job.golden for job in window]), _read_items([job.my for job in window])
        if golden_items is None or my_items is None:
            # a missing or cut file: streaming each pair names the file and the problem
            results.extend(measure_pair(job, specs, workspace, chunk_values) for job in window)
            continue
        items = {id(job): (golden, my) for job, golden, my in zip(window, golden_items, my_items)}
        group: list[PairJob] = []
        group_values = 0
        for job in sorted(window, key=lambda job: _values(job.golden)):
            values = _values(job.golden)
            if group and group_values + values > GROUP_VALUES:
                results.extend(_measure_group(group, items, specs, workspace))
                group, group_values = [], 0
            group.append(job)
            group_values += values
        if group:
            results.extend(_measure_group(group, items, specs, workspace))
    return results


def _read_items(datas: Sequence[TensorData]) -> list[np.ndarray] | None:
    """Return each byte range as an array of its stored items, or None if a file is missing or short.

    Ranges of one file at most :data:`COALESCE_GAP_BYTES` apart are read by one ``pread``.
    """
    order = sorted(range(len(datas)), key=lambda i: (str(datas[i].path), datas[i].offset))
    items: list[np.ndarray] = [None] * len(datas)  # type: ignore[list-item]
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
        try:
            descriptor = os.open(first.path, os.O_RDONLY)  # type: ignore[arg-type]
        except OSError:
            return None
        try:
            raw = os.pread(descriptor, span_end - first.offset, first.offset)
        finally:
            os.close(descriptor)
        if len(raw) != span_end - first.offset:
            return None
        for i in order[position:end]:
            data = datas[i]
            carrier, per_element, _ = layout(data.dtype)  # type: ignore[misc]
            items[i] = np.frombuffer(
                raw, dtype=carrier, count=data.numel * per_element, offset=data.offset - first.offset
            )
        position = end
    return items


def _measure_group(
    group: Sequence[PairJob],
    items: dict[int, tuple[np.ndarray, np.ndarray]],
    specs: Sequence[MetricSpec],
    workspace: Workspace,
) -> list[PairMeasurement]:
    """Measure a group of small pairs laid out by size, so equal-sized pairs form one 2-D block."""
    sizes = [_values(job.golden) for job in group]
    starts = [0] * len(group)
    for i in range(1, len(group)):
        starts[i] = starts[i - 1] + sizes[i - 1]
    total = starts[-1] + sizes[-1]
    golden = workspace.buffer("group_golden", total)
    my = workspace.buffer("group_my", total)
    for job, start, size in zip(group, starts, sizes):
        golden_items, my_items = items[id(job)]
        layout(job.golden.dtype)[2](golden_items, golden[start : start + size], workspace.buffer)  # type: ignore[index]
        layout(job.my.dtype)[2](my_items, my[start : start + size], workspace.buffer)  # type: ignore[index]
    shared = _SharedValues(golden, my, total, workspace)
    block_metrics = [getattr(spec.make_accumulator, "results_of_block", None) for spec in specs]
    results = []
    first = 0
    while first < len(group):  # one block of equal-sized pairs at a time
        size = sizes[first]
        last = first
        while last < len(group) and sizes[last] == size:
            last += 1
        block = shared.block(starts[first], last - first, size)
        folded = None if None in block_metrics else _block_measurements(group[first:last], block, specs, block_metrics)  # type: ignore[arg-type]
        for row, i in enumerate(range(first, last)):
            measured = folded[row] if folded is not None else None
            if measured is not None:
                results.append(measured)
                continue
            begin, end = starts[i], starts[i] + size
            chunk = PairChunk(golden[begin:end], my[begin:end], workspace)
            shared.share_row(chunk, block, row, begin, end)
            fold = PairFold(group[i], specs)
            fold.fold(chunk, workspace)
            results.append(fold.measurement(specs))
        first = last
    return results


def _block_measurements(
    jobs: Sequence[PairJob],
    block: PairBlock,
    specs: Sequence[MetricSpec],
    block_metrics: Sequence[Callable[[PairBlock], list[float | None]]],
) -> list[PairMeasurement | None]:
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
        and not may_hold_sentinels(golden_sq[row], sentinel_limit_in_run(job.golden.dtype, job.golden_run_dtype))
        and not may_hold_sentinels(my_sq[row], sentinel_limit_in_run(job.my.dtype, job.my_run_dtype))
    ]
    measurements: list[PairMeasurement | None] = [None] * len(jobs)
    if not ordinary:
        return measurements
    # metrics see only the ordinary rows: a NaN or Inf row would reach math functions that refuse it
    measured = block if len(ordinary) == len(jobs) else block.subset(ordinary)
    per_metric = [results_of_block(measured) for results_of_block in block_metrics]
    golden_min, golden_max, golden_sum = (
        measured.reduction(name) for name in ("golden_min", "golden_max", "golden_sum")
    )
    my_min, my_max, my_sum = (measured.reduction(name) for name in ("my_min", "my_max", "my_sum"))
    golden_sq, my_sq = measured.sum_sq_golden(), measured.sum_sq_my()
    names = [spec.name for spec in specs]
    for row, block_row in enumerate(ordinary):
        job = jobs[block_row]
        values = [results[row] for results in per_metric]
        if None in values:
            continue
        golden_stats = SideStats.of_one_chunk(
            job.golden_needs_stats, golden_min[row], golden_max[row], golden_sum[row], block.size, golden_sq[row]
        )
        my_stats = SideStats.of_one_chunk(
            job.my_needs_stats, my_min[row], my_max[row], my_sum[row], block.size, my_sq[row]
        )
        metric_values = {name: float(value) for name, value in zip(names, values) if value is not None}
        measurements[block_row] = PairMeasurement(
            index=job.index,
            values=metric_values,
            golden_stats=golden_stats.result(),
            my_stats=my_stats.result(),
            bytes_read=job.nbytes,
        )
    return measurements


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
            self.undefined = np.less_equal(
                self.abs_golden, RELATIVE_FLOOR, out=workspace.buffer("group_undefined", total, np.bool_)
            )
            if self.undefined.any():
                self.relative[self.undefined] = 0.0
        self.weights = workspace.buffer("group_weights", total)
        self.single = workspace.buffer("group_single", total, np.float32)

    def block(self, begin: int, rows: int, size: int) -> PairBlock:
        """Return the ``rows`` pairs of ``size`` values starting at ``begin`` as a block with its reductions."""
        end = begin + rows * size

        def block(values: np.ndarray) -> np.ndarray:
            return values[begin:end].reshape(rows, size)

        golden, my = block(self.golden), block(self.my)
        with np.errstate(all="ignore"):
            golden_max = golden.max(axis=1)
            single = block(self.single)
            np.subtract(golden, golden_max[:, None], out=single, casting="same_kind")
            np.exp(single, out=single)
            weights = block(self.weights)
            np.copyto(weights, single)
            relative = block(self.relative)
            undefined = np.count_nonzero(block(self.undefined), axis=1)
            shared = {
                "golden_min": golden.min(axis=1).tolist(),
                "golden_max": golden_max.tolist(),
                "golden_sum": golden.sum(axis=1).tolist(),
                "my_min": my.min(axis=1).tolist(),
                "my_max": my.max(axis=1).tolist(),
                "my_sum": my.sum(axis=1).tolist(),
                "max_abs_diff": block(self.abs_diff).max(axis=1, initial=0.0).tolist(),
                "sum_abs_diff": block(self.abs_diff).sum(axis=1).tolist(),
                "max_relative_error": relative.max(axis=1).tolist(),
                "sum_relative_error": relative.sum(axis=1).tolist(),
                "relative_defined_count": (size - undefined).tolist(),
                "diff": block(self.diff),
                "softmax_weights": weights,
                "weight_sum": weights.sum(axis=1).tolist(),
            }
        return PairBlock(golden, my, shared, self.workspace.buffer)

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
