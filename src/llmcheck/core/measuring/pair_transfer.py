"""Pairs and their measurements as columns, so 10^5 of them cross to and from worker processes cheaply.

A ``generate()`` dump gives tens of thousands of small pairs, and pickling them as objects
costs about as much as measuring them: 50 000 :class:`~llmcheck.core.measuring.pair_measure.PairJob`
objects -- each with two :class:`~llmcheck.core.records.TensorData` holding a ``Path`` --
take 0.7 s to pickle and 1 s to unpickle, and their measurements (a dict of metric values
and two :class:`~llmcheck.core.records.TensorStats` each) as long again on the way back.
Here a batch travels as a few lists and numpy arrays: each file path once, each pair as a
row of plain numbers, each measurement as a row of a float64 matrix (one column per metric,
in the order of the metric specs). Every value crosses unchanged -- a float64 array holds a
Python float exactly, ``-0.0`` and NaN included.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llmcheck.core.measuring.measured_columns import MeasuredColumns
from llmcheck.core.measuring.pair_measure import PairJob, PairMeasurement
from llmcheck.core.records import TensorData, TensorStats
from llmcheck.core.records import build_stats as _build_stats

#: A batch of pairs as plain data: the file paths, then one tuple per pair.
PackedJobs = tuple[list[str], list[tuple[Any, ...]]]
#: Measurements as plain data (see :func:`pack_measurements`).
PackedMeasurements = dict[str, Any]

_FLOAT_STATS = ("min", "max", "mean", "l2norm")
_COUNT_STATS = ("nan_count", "inf_count")


def pack_jobs(jobs: Sequence[PairJob]) -> PackedJobs:
    """Return byte-range pairs (``job.crosses_processes``) as plain data, each file path once."""
    paths: dict[str, int] = {}
    rows = []
    for job in jobs:
        golden, my = job.golden, job.my
        rows.append(
            (
                job.index,
                paths.setdefault(str(golden.path), len(paths)),
                golden.offset,
                golden.nbytes,
                golden.dtype,
                golden.shape,
                paths.setdefault(str(my.path), len(paths)),
                my.offset,
                my.nbytes,
                my.dtype,
                my.shape,
                job.golden_needs_stats,
                job.my_needs_stats,
                job.golden_run_dtype,
                job.my_run_dtype,
            )
        )
    return list(paths), rows


def unpack_jobs(packed: PackedJobs) -> list[PairJob]:
    """Return the jobs :func:`pack_jobs` gave (one ``Path`` object per file)."""
    path_names, rows = packed
    paths = [Path(name) for name in path_names]
    return [
        PairJob(
            index,
            TensorData(golden_dtype, golden_shape, paths[golden_path], golden_offset, golden_nbytes),
            TensorData(my_dtype, my_shape, paths[my_path], my_offset, my_nbytes),
            golden_needs_stats,
            my_needs_stats,
            golden_run_dtype,
            my_run_dtype,
        )
        for (
            index,
            golden_path,
            golden_offset,
            golden_nbytes,
            golden_dtype,
            golden_shape,
            my_path,
            my_offset,
            my_nbytes,
            my_dtype,
            my_shape,
            golden_needs_stats,
            my_needs_stats,
            golden_run_dtype,
            my_run_dtype,
        ) in rows
    ]


def pack_measurements(
    measurements: Sequence[PairMeasurement], names: Sequence[str], rows: MeasuredColumns | None = None
) -> PackedMeasurements:
    """Return measurements, then the rows of small pairs' blocks, as arrays: metric values in the columns ``names``.

    ``rows``' metrics are ``names``; :func:`unpack_columns` gives them back as columns.

    A measurement whose metrics are not exactly ``names`` (a metric plugin that leaves one
    out) travels as its own dict.
    """
    names = list(names)
    folded = len(measurements)
    count = folded + (len(rows) if rows is not None else 0)
    values = np.zeros((count, len(names)))
    other_values: dict[int, dict[str, float]] = {}
    stats = np.zeros((2, count, len(_FLOAT_STATS)))
    stats_missing = np.zeros((2, count, len(_FLOAT_STATS)), dtype=np.bool_)
    counts = np.zeros((2, count, len(_COUNT_STATS)), dtype=np.int64)
    counts_missing = np.zeros((2, count, len(_COUNT_STATS)), dtype=np.bool_)
    for row, measurement in enumerate(measurements):
        if list(measurement.values) == names:
            values[row] = list(measurement.values.values())
        else:
            other_values[row] = measurement.values
        for side, side_stats in enumerate((measurement.golden_stats, measurement.my_stats)):
            for names_of, held, missing in (
                (_FLOAT_STATS, stats, stats_missing),
                (_COUNT_STATS, counts, counts_missing),
            ):
                for column, name in enumerate(names_of):
                    value = getattr(side_stats, name)
                    if value is None:
                        missing[side, row, column] = True
                    else:
                        held[side, row, column] = value
    agreement = [(m.nonfinite_mismatch, m.matching_nonfinite, m.masked, m.bytes_read) for m in measurements]
    index = [measurement.index for measurement in measurements]
    if rows:  # a block row's values are in the order of ``names``; its NaN/Inf counts are 0
        values[folded:] = rows.values
        stats[:, folded:] = np.where(rows.wanted[:, :, None], rows.stats, 0.0)
        stats_missing[:, folded:] = ~rows.wanted[:, :, None]
        agreement += [(0, 0, 0, bytes_read) for bytes_read in rows.bytes_read]
        index += rows.index
    return {
        "names": names,
        "block_start": folded,
        "index": index,
        "values": values,
        "other_values": other_values,
        "stats": stats,
        "stats_missing": stats_missing,
        "counts": counts,
        "counts_missing": counts_missing,
        "agreement": np.array(agreement, dtype=np.int64).reshape(count, 4),
        "notes": {row: m.notes for row, m in enumerate(measurements) if m.notes},
    }


def unpack_measurements(packed: PackedMeasurements) -> list[PairMeasurement]:
    """Return the measurements :func:`pack_measurements` gave, value for value."""
    measurements, columns = unpack_columns(packed)
    return measurements + columns.measurements()


def unpack_columns(packed: PackedMeasurements) -> tuple[list[PairMeasurement], MeasuredColumns]:
    """Return what :func:`pack_measurements` was given: the measurements, and the blocks' rows as columns."""
    names = packed["names"]
    folded = packed["block_start"]
    values = packed["values"][:folded].tolist()
    other_values = packed["other_values"]
    sides = [_side_stats(packed, side, folded) for side in (0, 1)]
    notes = packed["notes"]
    agreements = packed["agreement"].tolist()
    measurements = []
    for row, (index, agreement) in enumerate(zip(packed["index"][:folded], agreements)):
        mismatch, matching, masked, bytes_read = agreement
        measurements.append(
            PairMeasurement(
                index=index,
                values=other_values[row] if row in other_values else dict(zip(names, values[row])),
                golden_stats=sides[0][row],
                my_stats=sides[1][row],
                nonfinite_mismatch=mismatch,
                matching_nonfinite=matching,
                masked=masked,
                bytes_read=bytes_read,
                notes=notes.get(row, []),
            )
        )
    columns = MeasuredColumns(
        names=tuple(names),
        index=packed["index"][folded:],
        values=packed["values"][folded:],
        stats=packed["stats"][:, folded:],
        wanted=~packed["stats_missing"][:, folded:, 0],
        bytes_read=[agreement[3] for agreement in agreements[folded:]],
    )
    return measurements, columns


def _side_stats(packed: PackedMeasurements, side: int, rows: int) -> list[TensorStats]:
    """Return one side's statistics of the first ``rows`` measurements, ``None`` where :func:`pack_measurements` found it."""
    stats = packed["stats"][side, :rows].tolist()
    counts = packed["counts"][side, :rows].tolist()
    stats_missing = packed["stats_missing"][side, :rows]
    counts_missing = packed["counts_missing"][side, :rows]
    incomplete = set(np.flatnonzero(stats_missing.any(axis=1) | counts_missing.any(axis=1)).tolist())
    result: list[TensorStats] = []
    for row, (floats, integers) in enumerate(zip(stats, counts)):
        if row in incomplete:
            floats = [None if gone else value for value, gone in zip(floats, stats_missing[row].tolist())]
            integers = [None if gone else value for value, gone in zip(integers, counts_missing[row].tolist())]
        result.append(_build_stats(*floats, *integers))
    return result
