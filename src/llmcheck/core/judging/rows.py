"""A measured pair judged into its row: the dtype table's verdict, the statistics-only and digest-only ways, and the notes a reader needs.

Attribution (feeders, repeats, the noise twin) judges the rows again, all together, in
:mod:`llmcheck.core.judging.divergence`; this is the judging each pair gets alone, as its
measurement arrives.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from sys import intern as intern_text
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from llmcheck.core.dtypes import is_float_dtype
from llmcheck.core.judging.digests import digest_row, judged_on_digests
from llmcheck.core.judging.stats_compare import (
    DECIDING_STAT,
    EXACT_CLASSES,
    STAT_COLUMNS,
    comparable_statistics,
    judge_statistics,
    masked_statistics,
    statistics_error_columns,
    statistics_reason,
)
from llmcheck.core.judging.verdicts import (
    NONFINITE_METRIC,
    VERDICT_OF_CODE,
    TableJudge,
    ThresholdOverride,
    judging_class,
    least_precise,
    run_dtype,
    run_precision,
)
from llmcheck.core.measuring.pairing_jobs import has_recorded_stats, shape_problem, shape_text
from llmcheck.core.measuring.sentinels import sentinel_limit_in_run, sentinel_range_in_run
from llmcheck.core.records import (
    VERDICT_ERROR,
    VERDICT_FAIL,
    VERDICT_PASS,
    ComparisonRow,
    Dump,
    JudgedMetrics,
    MetricResult,
    MetricSpec,
    Pair,
    TensorRecord,
    build_row,
    error_measure,
)

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.core.measuring.measured_columns import MeasuredColumns

log = logging.getLogger("llmcheck.compare")


def judging_specs(specs: Sequence[MetricSpec], chosen: Sequence[str] | None) -> list[MetricSpec]:
    """Return the specs with thresholds only on the metrics the user chose (all when none were named).

    The error measure is measured whatever ``--metric`` says (attribution works on it) but
    judges a full-tensor pair only when chosen; a statistics-only pair is judged on it always.
    """
    if not chosen:
        return list(specs)
    return [spec if spec.name in chosen else dataclasses.replace(spec, thresholds={}) for spec in specs]


def _statistics_row(
    index: int,
    pair: Pair,
    specs: Sequence[MetricSpec],
    overrides: Sequence[ThresholdOverride],
    run_floor: str | None,
    run_dtypes: tuple[str | None, str | None] = (None, None),
    table: TableJudge | None = None,
    bound_table: TableJudge | None = None,
) -> ComparisonRow | None:
    """Return the row of a pair judged on its recorded statistics when a side kept no data, else None.

    ``bound_table`` judges the error measure alone, ``table`` (the compare's judged metrics) integers
    and booleans (:func:`judge_statistics`).
    """
    golden, my = pair.golden, pair.my
    assert golden is not None and my is not None
    if golden.data is not None and my.data is not None:
        return None
    if _both_empty(golden, my):
        reason = intern_text(f"both tensors are empty (shape {shape_text(golden.shape)}): nothing to compare")
        return _unmeasured_row(index, pair, VERDICT_PASS, reason, judging_class(golden.dtype, my.dtype, run_floor))
    if not comparable_statistics(golden.stats, my.stats) or shape_problem(golden, my) is not None:
        return None
    judged_class = judging_class(golden.dtype, my.dtype, run_floor)
    limits = (sentinel_range_in_run(golden.dtype, run_dtypes[0]), sentinel_range_in_run(my.dtype, run_dtypes[1]))
    results, verdict, deciding, nonfinite = judge_statistics(
        golden.stats,  # type: ignore[arg-type]  # statistics-only pairs always carry both sides' stats
        my.stats,  # type: ignore[arg-type]
        specs,
        golden.key.name,
        judged_class,
        overrides,
        sentinel_limits=limits,
        bound_table=bound_table,
        exact_table=table,
    )
    sides = " and ".join(side for side, record in (("golden", golden), ("my", my)) if record.data is None)
    bounded = error_measure(specs)
    reason = intern_text(
        statistics_reason(
            golden.stats,  # type: ignore[arg-type]
            my.stats,  # type: ignore[arg-type]
            sides,
            bounded.name if bounded else "the error measure",
            masked=masked_statistics(golden.stats, my.stats, limits),  # type: ignore[arg-type]
        )
    )  # one text for the rows that share it, not one each (180 bytes a row)
    return build_row(
        index=index,
        golden=golden,
        my=my,
        rule=pair.rule,
        metrics=results if table is None else table.held_alike(results),
        verdict=verdict,
        deciding_metric=deciding,
        reason=reason,
        golden_stats=golden.stats,
        my_stats=my.stats,
        nonfinite_mismatch=nonfinite,
        judged_as=judged_class,
    )


def _unmeasured_row(index: int, pair: Pair, verdict: str, reason: str, judged_as: str = "") -> ComparisonRow:
    """Return the row of a pair with no metrics: its verdict and why (an error, or two empty tensors passing)."""
    golden, my = pair.golden, pair.my
    assert golden is not None and my is not None
    return ComparisonRow(
        index=index,
        golden=golden,
        my=my,
        rule=pair.rule,
        metrics={},
        verdict=verdict,
        reason=reason,
        golden_stats=golden.stats,
        my_stats=my.stats,
        judged_as=judged_as,
    )


def _both_empty(golden: TensorRecord, my: TensorRecord) -> bool:
    """Return whether both records hold no element, in shapes that agree: such a pair agrees, as measured data does.

    A statistics-only dump records no statistic of an empty tensor (a ``lift_fresh`` of ``[]``,
    a ``cat`` of empty caches: 180 pairs of one forward of SmolLM2 at op level), so there are
    none to judge; measured, two empty tensors are identical.
    """
    return (
        golden.shape is not None
        and my.shape is not None
        and 0 in golden.shape
        and 0 in my.shape
        and shape_problem(golden, my) is None
    )


def _notes(golden: TensorRecord, my: TensorRecord) -> list[str]:
    notes = []
    # asked for every pair: equal shapes and equal dtypes (nearly every pair) are told apart without conversions
    if golden.shape != my.shape and tuple(golden.shape) != tuple(my.shape):
        notes.append(
            f"shapes differ only in size-1 dims ({shape_text(golden.shape)} vs {shape_text(my.shape)}); "
            "compared element by element"
        )
    if golden.dtype != my.dtype and is_float_dtype(golden.dtype) != is_float_dtype(my.dtype):
        notes.append(f"dtype kinds differ: golden {golden.dtype} vs my {my.dtype}")
    return notes


def _nonfinite_note(measurement: Any) -> str | None:
    if not (measurement.nonfinite_mismatch or measurement.matching_nonfinite or measurement.masked):
        return None  # the common case, asked for every pair
    golden, my = measurement.golden_stats, measurement.my_stats
    counts = f"golden {golden.nan_count} NaN, {golden.inf_count} Inf; my {my.nan_count} NaN, {my.inf_count} Inf"
    if measurement.nonfinite_mismatch:
        return (
            f"{measurement.nonfinite_mismatch} positions are NaN/Inf on one side only, or a mask sentinel "
            f"on one side only ({counts})"
        )
    notes = []
    if measurement.matching_nonfinite:
        notes.append(
            f"{measurement.matching_nonfinite} positions are the same NaN/Inf on both sides, "
            f"left out of the metrics ({counts})"
        )
    if measurement.masked:
        notes.append(
            f"{measurement.masked} positions hold the dtype's infinity sentinel (a mask) on both sides, "
            "left out of the metrics"
        )
    return "; ".join(notes) or None


def _merged_stats(record: TensorRecord, measured: Any) -> Any:
    """Return the record's own statistics when the source recorded them, else the measured ones."""
    return record.stats if has_recorded_stats(record) else measured


def _pair_row(
    index: int,
    pair: Pair,
    specs: Sequence[MetricSpec],
    problem: str | None,
    measurement: Any,
    overrides: Sequence[ThresholdOverride],
    run_floor: str | None,
    table: TableJudge,
    run_dtypes: tuple[str | None, str | None] = (None, None),
    bound_table: TableJudge | None = None,
) -> ComparisonRow:
    golden, my = pair.golden, pair.my
    assert golden is not None and my is not None
    if problem is not None and judged_on_digests(pair):
        return digest_row(
            index, pair, _statistics_row(index, pair, specs, overrides, run_floor, run_dtypes, table, bound_table)
        )
    if problem is not None and (
        statistics_row := _statistics_row(index, pair, specs, overrides, run_floor, run_dtypes, table, bound_table)
    ):
        return statistics_row
    if problem is not None or measurement is None:
        return _unmeasured_row(index, pair, VERDICT_ERROR, problem or "not measured")
    judged_class = judging_class(golden.dtype, my.dtype, run_floor)
    results, verdict, deciding = table.judge(measurement.values, golden.key.name, judged_class)
    notes = _notes(golden, my)
    nonfinite = _nonfinite_note(measurement)
    if nonfinite:
        notes.append(nonfinite)
    if measurement.nonfinite_mismatch:
        verdict, deciding = VERDICT_FAIL, NONFINITE_METRIC
        results = {
            **results,
            NONFINITE_METRIC: MetricResult(
                NONFINITE_METRIC, float(measurement.nonfinite_mismatch), VERDICT_FAIL, 0.0, 0.0
            ),
        }
    return build_row(
        index=index,
        golden=golden,
        my=my,
        rule=pair.rule,
        metrics=results,
        verdict=verdict,
        deciding_metric=deciding,
        reason="; ".join(notes),
        golden_stats=_merged_stats(golden, measurement.golden_stats),
        my_stats=_merged_stats(my, measurement.my_stats),
        nonfinite_mismatch=measurement.nonfinite_mismatch,
        judged_as=judged_class,
    )


#: Why a pair that could not be measured passes when a dump is compared with itself.
SAME_RECORD_REASON = "the same record of the same dump on both sides (nothing to measure)"


def same_record(pair: Pair) -> bool:
    """Return whether a pair's two records are one record of one dump (a dump compared with itself)."""
    golden, my = pair.golden, pair.my
    assert golden is not None and my is not None
    return golden.key == my.key and golden.source_path == my.source_path


def _same_dump(golden: Dump, my: Dump) -> bool:
    """Return whether both sides are one dump on disk, and say so: every record is then compared with itself."""
    try:
        same = golden.root.resolve() == my.root.resolve()
    except OSError:
        return False
    if same:  # a smoke test does this on purpose: a notice, not a warning
        log.info(
            "%s: golden and my-run are the same dump: every record is compared with itself, so every pair passes "
            "(give another run's dump to find where they differ)",
            my.root,
        )
    return same


@dataclass(frozen=True)
class PairJudge:
    """How one compare judges each pair alone, as its measurement arrives: the facts every row shares, found once.

    ``run_dtypes`` are the dtypes most tensors of each run have (a run's mask sentinel is its
    own dtype's "minus infinity"), ``run_floor`` the least precise of the two runs (its
    thresholds judge a pair of mixed precisions), ``same_dump`` whether both sides are one dump
    on disk (a pair with nothing to measure then passes). ``bound_table`` judges the error
    measure alone, as statistics-only pairs are (None when no metric is the error measure).
    """

    specs: Sequence[MetricSpec]
    overrides: Sequence[ThresholdOverride]
    table: TableJudge
    run_dtypes: tuple[str | None, str | None]
    run_floor: str | None
    same_dump: bool
    bound_table: TableJudge | None = None

    @classmethod
    def of(
        cls,
        golden: Dump,
        my: Dump,
        specs: Sequence[MetricSpec],
        chosen: Sequence[str] | None,
        overrides: Sequence[ThresholdOverride],
    ) -> PairJudge:
        """Return the judge of a compare of ``golden`` with ``my``, measuring ``specs``; ``chosen`` are the ``--metric`` names."""
        run_dtypes = (
            run_dtype([record.dtype for record in golden.records]),
            run_dtype([record.dtype for record in my.records]),
        )
        run_classes = (run_precision([record.dtype for record in dump.records]) for dump in (golden, my))
        bounded = error_measure(specs)
        return cls(
            specs=specs,
            overrides=overrides,
            table=TableJudge(judging_specs(specs, chosen), overrides),
            run_dtypes=run_dtypes,
            run_floor=least_precise([name for name in run_classes if name]),
            same_dump=_same_dump(golden, my),
            bound_table=TableJudge([bounded], overrides) if bounded is not None else None,
        )

    def row(self, index: int, pair: Pair, problem: str | None, measurement: Any) -> ComparisonRow:
        """Return the row of pair ``index``: measured (``measurement``), or not, and why (``problem``)."""
        row = _pair_row(
            index,
            pair,
            self.specs,
            problem,
            measurement,
            self.overrides,
            self.run_floor,
            self.table,
            self.run_dtypes,
            self.bound_table,
        )
        if row.verdict == VERDICT_ERROR and self.same_dump and same_record(pair):
            return dataclasses.replace(row, verdict=VERDICT_PASS, reason=SAME_RECORD_REASON)
        return row

    def rows_of(self, columns: MeasuredColumns, pairs: Sequence[Pair]) -> list[ComparisonRow]:
        """Return the row of each pair measured in ``columns`` (``columns.index`` its place in ``pairs``), in their order.

        The rows :meth:`row` gives, made a block at a time: such a pair's values are all
        finite (no NaN/Inf note, no ``nonfinite_mismatch``, never an ``error``), so its row is
        its thresholds' verdicts, judged a column at a time
        (:meth:`~llmcheck.core.judging.verdicts.TableJudge.judge_columns`), its statistics and
        the notes on its shapes and dtypes.
        """
        paired = [pairs[index] for index in columns.index]
        goldens = [pair.golden for pair in paired]
        mys = [pair.my for pair in paired]
        classes = [
            judging_class(golden.dtype, my.dtype, self.run_floor)  # type: ignore[union-attr]  # measured pairs have both
            for golden, my in zip(goldens, mys)
        ]
        metrics, verdicts, deciding = self.table.judge_columns(
            columns.names,
            columns.values,
            [golden.key.name for golden in goldens],  # type: ignore[union-attr]
            classes,
        )
        rows = []
        for index, pair, golden, my, row_metrics, verdict, decided, judged_class, golden_measured, my_measured in zip(
            columns.index,
            paired,
            goldens,
            mys,
            metrics,
            verdicts,
            deciding,
            classes,
            columns.side_stats(0),
            columns.side_stats(1),
        ):
            assert golden is not None and my is not None
            rows.append(
                build_row(
                    index=index,
                    golden=golden,
                    my=my,
                    rule=pair.rule,
                    metrics=row_metrics,
                    verdict=verdict,
                    deciding_metric=decided,
                    reason="; ".join(_notes(golden, my)),
                    golden_stats=_merged_stats(golden, golden_measured),
                    my_stats=_merged_stats(my, my_measured),
                    judged_as=judged_class,
                )
            )
        return rows

    def unmeasured_rows(
        self, indices: Sequence[int], pairs: Sequence[Pair], problems: Mapping[int, str]
    ) -> Iterator[ComparisonRow]:
        """Yield the row of each pair ``indices`` names that was not measured (``problems`` says why), in that order.

        :meth:`row` of each, the statistics-only pairs with plain statistics
        (:meth:`_plain_statistics`) made a block at a time: their errors are computed and
        their bounds judged a column at a time, and the rows alike in all but their values
        -- the same table of limits, sides without data and verdict -- share the figures of
        the first, which :meth:`row` makes. A statistics-only dump's 10**5 pairs spent most
        of their judging making each row's results, reason and verdict anew. A block is
        :data:`PLAIN_BLOCK` pairs: its figures and their columns, as Python floats, cost more
        than the rows they make (800 bytes a pair), so they are held for one block at a time;
        and the rows are yielded a block at a time, for the caller to hold as it will (a compare
        holds them as columns: :class:`~llmcheck.core.judging.row_table.RowTable`).
        """
        first_rows: dict[tuple[object, ...], ComparisonRow | None] = {}  # shared by every block
        for start in range(0, len(indices), PLAIN_BLOCK):
            block = indices[start : start + PLAIN_BLOCK]
            rows: list[ComparisonRow | None] = [None] * len(block)
            plain: list[int] = []  # positions in block
            plain_figures: list[tuple[tuple[float, ...], tuple[float, ...]]] = []
            for position, index in enumerate(block):
                pair, problem = pairs[index], problems.get(index)
                figures = self._plain_statistics(pair) if problem is not None else None
                if figures is None:
                    rows[position] = self.row(index, pair, problem, None)
                else:
                    plain.append(position)
                    plain_figures.append(figures)
            if plain:
                self._plain_statistics_rows(
                    [block[position] for position in plain], pairs, problems, plain_figures, rows, plain, first_rows
                )
            yield from cast("list[ComparisonRow]", rows)  # every position is set

    def _plain_statistics(self, pair: Pair) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """Return both sides' (max, min, mean, L2 norm) when a pair is judged on plain statistics, else None.

        Plain: one side kept no data, no digests decide, the shapes agree, and each side's
        statistics are finite floats, short of its mask sentinels, with no NaN or Inf counted.
        Such a pair's row is the statistics row whatever its values, with no NaN/Inf or mask story.
        """
        golden, my = pair.golden, pair.my
        assert golden is not None and my is not None
        if self.bound_table is None or (golden.data is not None and my.data is not None):
            return None
        if judged_on_digests(pair) or shape_problem(golden, my) is not None:
            return None
        if judging_class(golden.dtype, my.dtype, self.run_floor) in EXACT_CLASSES:  # judged exactly: row by row
            return None
        sides = []
        for stats, limit in (
            (golden.stats, _sentinel_limit(golden.dtype, self.run_dtypes[0])),
            (my.stats, _sentinel_limit(my.dtype, self.run_dtypes[1])),
        ):
            if stats is None:
                return None
            low, high, mean, l2norm, nan_count, inf_count = stats.values()  # read at once: a row's are in columns
            if nan_count not in (0, None) or inf_count not in (0, None):
                return None
            # an int would keep its type in the results
            if not (type(high) is float and type(low) is float and type(mean) is float and type(l2norm) is float):
                return None
            if not (abs(high) < limit and abs(low) < limit and math.isfinite(mean) and math.isfinite(l2norm)):
                return None
            sides.append((high, low, mean, l2norm))
        return sides[0], sides[1]

    def _plain_statistics_rows(
        self,
        indices: Sequence[int],
        pairs: Sequence[Pair],
        problems: Mapping[int, str],
        figures: Sequence[tuple[tuple[float, ...], tuple[float, ...]]],
        rows: list[ComparisonRow | None],
        positions: Sequence[int],
        first_rows: dict[tuple[object, ...], ComparisonRow | None],
    ) -> None:
        """Set ``rows[positions[i]]`` to the row of pair ``indices[i]``, judged on its plain statistics ``figures[i]``.

        ``first_rows`` holds, by what makes rows alike, the first row made (None: one that cannot be shared).
        """
        assert self.bound_table is not None
        errors = statistics_error_columns(
            np.array([golden for golden, _ in figures], dtype=np.float64).reshape(len(figures), 4),
            np.array([my for _, my in figures], dtype=np.float64).reshape(len(figures), 4),
        )
        paired = [pairs[index] for index in indices]
        names = [pair.golden.key.name for pair in paired]  # type: ignore[union-attr]  # paired records have both sides
        classes = [judging_class(pair.golden.dtype, pair.my.dtype, self.run_floor) for pair in paired]  # type: ignore[union-attr]
        bound = _BOUND_COLUMN
        codes = self.bound_table.verdict_code_columns(
            [self.bound_table.specs[0].name], errors[:, bound : bound + 1], names, classes
        )
        keyed = bool(self.overrides)
        for index, position, pair, name, judged_class, code, row_errors in zip(
            indices,
            positions,
            paired,
            names,
            classes,
            [None] * len(indices) if codes is None else codes[:, 0].tolist(),
            errors.tolist(),
        ):
            golden, my = pair.golden, pair.my
            assert golden is not None and my is not None
            key = (name if keyed else None, judged_class, golden.data is None, my.data is None, code)
            first = first_rows.get(key, _UNSEEN) if code is not None else None
            if first is None or first is _UNSEEN:
                made = self.row(index, pair, problems[index], None)
                if first is _UNSEEN:
                    first_rows[key] = made if _judged_alike(made, row_errors, code) else None
                rows[position] = made
                continue
            assert isinstance(first, ComparisonRow)
            rows[position] = build_row(
                index=index,
                golden=golden,
                my=my,
                rule=pair.rule,
                metrics=cast(JudgedMetrics, first.metrics).alike(array("d", row_errors)),
                verdict=first.verdict,
                deciding_metric=first.deciding_metric,
                reason=first.reason,
                golden_stats=golden.stats,
                my_stats=my.stats,
                nonfinite_mismatch=first.nonfinite_mismatch,
                judged_as=first.judged_as,
            )


#: :func:`sentinel_limit_in_run` of a (dtype, run dtype), found once: asked twice per statistics-only pair.
_sentinel_limit = functools.cache(sentinel_limit_in_run)
#: Where a statistics row's L2-norm bound is among its :data:`STAT_COLUMNS`.
_BOUND_COLUMN = STAT_COLUMNS.index(DECIDING_STAT)
#: Pairs :meth:`PairJudge.unmeasured_rows` judges on plain statistics together: enough to spread numpy's cost per call.
PLAIN_BLOCK = 8192
#: A key of :meth:`PairJudge._plain_statistics_rows` whose first row is not made yet.
_UNSEEN: object = object()


def _judged_alike(row: ComparisonRow, errors: list[float], code: int) -> bool:
    """Return whether a plain statistics row holds ``errors``, its bound judged ``code``, so rows alike may share its figures.

    Always, as the statistics judging reads (a row that does not is made alone, as are the rows alike).
    """
    metrics = row.metrics
    return (
        type(metrics) is JudgedMetrics
        and list(metrics) == list(STAT_COLUMNS)
        and [metrics.value(column) for column in STAT_COLUMNS] == errors
        and metrics.verdicts[_BOUND_COLUMN] == VERDICT_OF_CODE[code]
        and row.nonfinite_mismatch == 0
    )
