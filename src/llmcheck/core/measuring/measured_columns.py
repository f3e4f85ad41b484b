"""Measurements of many pairs as columns: what small pairs' blocks give, handed to the judge without an object per pair.

A ``generate()`` dump's 10^5 small pairs are measured block by block
(:mod:`llmcheck.core.measuring.small_pairs`), and their values come out as columns. Turning
each into a :class:`~llmcheck.core.measuring.pair_measure.PairMeasurement` -- a dict of
values and two statistics objects -- only for the judge to take it apart again cost as much
as judging it. :class:`MeasuredColumns` keeps them as a matrix, which the judge compares
with the thresholds a column at a time (:meth:`~llmcheck.core.judging.rows.PairJudge.rows_of`);
:meth:`MeasuredColumns.measurements` gives the per-pair measurements where one pair at a time is
wanted, value for value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from llmcheck.core.measuring.pair_measure import PairMeasurement
from llmcheck.core.records import TensorStats, build_stats

#: The statistics of a side that were not asked for (the source recorded its own): no values, no NaN or Inf.
NOT_WANTED_STATS = TensorStats(nan_count=0, inf_count=0)


@dataclass(frozen=True)
class MeasuredColumns:
    """The measurements of pairs all of whose values are finite on both sides: a row per pair.

    Such a pair holds no NaN, Inf or mask sentinel (so no NaN/Inf counts and no notes), which
    is what lets its measurement be these few numbers. ``names`` are the metrics, in the
    order of the specs; ``values`` is (rows, metrics); ``stats`` each side's ``(min, max,
    mean, l2norm)`` per row, (2, rows, 4), meaningful where ``wanted`` (2, rows) says the
    statistics were asked for; ``bytes_read`` the tensor bytes each row's pair read.
    """

    names: tuple[str, ...]
    index: list[int]
    values: np.ndarray
    stats: np.ndarray
    wanted: np.ndarray
    bytes_read: list[int]

    def __len__(self) -> int:
        return len(self.index)

    def side_stats(self, side: int) -> list[TensorStats]:
        """Return one side's (0 golden, 1 my) statistics of every row, as the streaming measure gives them."""
        return [
            build_stats(*stats, 0, 0) if wanted else NOT_WANTED_STATS
            for stats, wanted in zip(self.stats[side].tolist(), self.wanted[side].tolist())
        ]

    def measurements(self) -> list[PairMeasurement]:
        """Return the rows as the measurements the streaming measure gives for each pair alone."""
        return [
            PairMeasurement(
                index=index, values=dict(zip(self.names, values)), golden_stats=golden, my_stats=my, bytes_read=read
            )
            for index, values, golden, my, read in zip(
                self.index, self.values.tolist(), self.side_stats(0), self.side_stats(1), self.bytes_read
            )
        ]

    def fanned_out(self, later_pairs: Mapping[int, Sequence[int]]) -> MeasuredColumns:
        """Return the columns with a copy of a row for each later pair over the same bytes (``later_pairs`` by index).

        A capture stores a tensor once however many records see it, so such pairs are
        measured once; each is handed the measurement, under its own index.
        """
        positions = [row for row, index in enumerate(self.index) if index in later_pairs]
        if not positions:
            return self
        index = list(self.index)
        gathered = list(range(len(self.index)))
        for row in positions:
            later = later_pairs[self.index[row]]
            index += later
            gathered += [row] * len(later)
        return MeasuredColumns(
            names=self.names,
            index=index,
            values=self.values[gathered],
            stats=self.stats[:, gathered],
            wanted=self.wanted[:, gathered],
            bytes_read=[self.bytes_read[row] for row in gathered],
        )
