"""Compare two runs: load both, pair their records, measure every pair, judge it, name the first divergence.

:func:`compare_dumps` is the in-process API (the demo and tests use it); :func:`compare_command`
is ``llmcheck compare``: it also writes the reports (by default ``cmp_report.csv``,
``summary.json``, ``pairs.json`` and ``report.html``; ``--report NAME`` adds a plugin's
format, see ``core/reporting/reporters.py``) and prints the terminal summary. A pair that cannot be measured (shapes
differ, no data in a statistics-only dump) is a row with verdict ``error`` and its reason --
never a dropped row.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from sys import intern as intern_text
from typing import TYPE_CHECKING, Any, Protocol

from llmcheck.core.dumps.store import AS_DTYPE_FIELD
from llmcheck.core.errors import EXIT_FAILURE, EXIT_FAILURES_FOUND, EXIT_OK, LlmcheckError, UsageError
from llmcheck.core.gc_pause import paused_cyclic_gc
from llmcheck.core.judging.digests import digest_row, judged_on_digests
from llmcheck.core.judging.divergence import (
    INTRODUCED,
    SUSPECT,
    TWIN_NOISE_ONLY,
    ErrorMeasure,
    NoiseTwin,
    attribute,
    code_owner,
    describe_row,
    first_divergence,
    first_introduced,
    twin_mode,
)
from llmcheck.core.judging.sentinels import sentinel_limit_in_run
from llmcheck.core.judging.stats_compare import (
    DECIDING_STAT,
    comparable_statistics,
    error_measure_spec,
    judge_statistics,
    masked_statistics,
    statistics_reason,
)
from llmcheck.core.judging.suspects import Suspects, find_suspects
from llmcheck.core.judging.verdicts import (
    NONFINITE_METRIC,
    TableJudge,
    ThresholdOverride,
    judging_class,
    least_precise,
    run_dtype,
    run_precision,
)
from llmcheck.core.judging.weights import check_weights
from llmcheck.core.pairing.merge import Pairing, merge_pairs
from llmcheck.core.records import (
    IO_OUTPUT,
    VERDICT_ERROR,
    VERDICT_FAIL,
    VERDICT_PASS,
    VERDICT_WARN,
    ComparisonRow,
    Dump,
    MetricResult,
    MetricSpec,
    Pair,
    TensorData,
    TensorRecord,
    UserMapping,
    build_row,
    is_float_dtype,
    metric_value,
)

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.core.measuring.worker_pool import WorkerPool

log = logging.getLogger("llmcheck.compare")

SUMMARY_FORMAT = "llmcheck-compare-summary"


@dataclass
class CompareResult:
    """Everything one compare found: both dumps, the pairing, one row per pair, how long it took."""

    golden: Dump
    my: Dump
    pairing: Pairing
    rows: list[ComparisonRow]
    metric_specs: list[MetricSpec]
    elapsed_s: float
    tensor_bytes_read: int
    tensor_bytes_compared: int = 0
    noise: Dump | None = None
    threshold_overrides: tuple[ThresholdOverride, ...] = ()  # the --thresholds entries, in file order
    #: How many rows' golden records have a twin record to measure the noise at (the others are judged without).
    rows_with_twin: int = 0
    #: How the twin judged the my-run: its bits ("same program") or only its error ("noise reference").
    twin_mode: str | None = None

    def counts(self) -> dict[str, int]:
        """Return the number of pairs, of rows per verdict, and of unmatched records per side.

        Unmatched records are also counted by kind: ``expected`` ones a pairing rule
        declared legitimately unmatched, ``unexpected`` ones nothing explains (unexpected
        golden records fail a compare unless ``--allow-unmatched``).
        """
        verdicts = [row.verdict for row in self.rows]
        pairing = self.pairing
        expected_golden = sum(item.expected for item in pairing.unmatched_golden)
        expected_my = sum(item.expected for item in pairing.unmatched_my)
        return {
            "pairs": len(self.rows),
            "passes": verdicts.count(VERDICT_PASS),
            "warnings": verdicts.count(VERDICT_WARN),
            "failures": verdicts.count(VERDICT_FAIL),
            "errors": verdicts.count(VERDICT_ERROR),
            "unmatched_golden": len(pairing.unmatched_golden),
            "unmatched_my": len(pairing.unmatched_my),
            "unmatched": len(pairing.unmatched_golden) + len(pairing.unmatched_my),
            "unmatched_golden_expected": expected_golden,
            "unmatched_golden_unexpected": len(pairing.unmatched_golden) - expected_golden,
            "unmatched_my_expected": expected_my,
            "unmatched_my_unexpected": len(pairing.unmatched_my) - expected_my,
        }

    @property
    def first_divergence(self) -> ComparisonRow | None:
        """Return the first failing row in execution order."""
        return first_divergence(self.rows)

    @property
    def first_introduced(self) -> ComparisonRow | None:
        """Return the first row whose error is introduced there (the deepest such module)."""
        return first_introduced(self.rows)

    @property
    def culprit(self) -> TensorRecord | None:
        """Return the record named as where the error starts: the first introduced row, else the first suspect.

        A defect that changes which ops run (an activation swapped for another, a stray scale)
        introduces its error through ops only one run has: no pair is introduced, the rows
        they feed are ``inherited_from_unmatched``, and the first of those ops is the culprit.
        """
        introduced = self.first_introduced
        if introduced is not None:
            return (self._code_owner or introduced).golden
        return self.suspects.first()

    @property
    def culprit_partner(self) -> TensorRecord | None:
        """Return the my-run's record paired with :attr:`culprit` (another name where the runs are laid out apart).

        A serving engine's ``qkv_proj`` is the partner of transformers' ``k_proj``: the report
        names both, so the culprit reads in the my-run's own modules too.
        """
        introduced = self.first_introduced
        if introduced is None:
            return self.suspects.first()
        if introduced.my.key.io == IO_OUTPUT and introduced.golden.key.io != IO_OUTPUT:
            # the golden computes this input in its module's own code; the my-run has a module for it
            # (an engine's attention core, its fused add-and-norm): that module made the error
            return introduced.my
        return (self._code_owner or introduced).my

    @functools.cached_property
    def _code_owner(self) -> ComparisonRow | None:
        """Return the output row of the module whose own code made the first introduced row, if that is an input."""
        introduced = self.first_introduced
        return code_owner(self.rows, introduced) if introduced is not None else None

    @property
    def culprit_seen_at(self) -> TensorRecord | None:
        """Return the introduced input the culprit module's own code made, where :attr:`culprit` names its module."""
        introduced = self.first_introduced
        return introduced.golden if introduced is not None and self._code_owner is not None else None

    @functools.cached_property
    def suspects(self) -> Suspects:
        """Return the operations only one run executes, where the error starts (``core/judging/suspects.py``)."""
        return find_suspects(self.rows, self.pairing, self.first_introduced or self.first_divergence)

    def summary(self) -> dict[str, Any]:
        """Return the content of summary.json."""
        introduced = [row for row in self.rows if row.attribution == INTRODUCED]
        throughput = self.tensor_bytes_read / self.elapsed_s / 1e9 if self.elapsed_s > 0 else None
        return {
            "format": SUMMARY_FORMAT,
            "format_version": 1,
            "golden": {
                "path": str(self.golden.root),
                "source": self.golden.source,
                "records": len(self.golden.records),
                "cut": self.golden.cut,
            },
            "my": {
                "path": str(self.my.root),
                "source": self.my.source,
                "records": len(self.my.records),
                "cut": self.my.cut,
            },
            "noise": (
                {
                    "path": str(self.noise.root),
                    "source": self.noise.source,
                    "records": len(self.noise.records),
                    "rows_with_twin": self.rows_with_twin,
                    "rows_without_twin": len(self.rows) - self.rows_with_twin,
                    "mode": self.twin_mode,
                    # how the twin was made, when its capture cast the golden program (dump --as-dtype)
                    "as_dtype": self.noise.manifest.get(AS_DTYPE_FIELD),
                }
                if self.noise is not None
                else None
            ),
            "counts": self.counts(),
            "first_divergence": describe_row(self.first_divergence),
            "first_introduced": describe_row(self.first_introduced),
            "suspects": self.suspects.as_json(),
            "culprit": (
                None
                if (culprit := self.culprit) is None
                else {
                    "name": culprit.key.name,
                    # the my-run's partner record: another module where the runs are laid out apart
                    "my_name": partner.key.name if (partner := self.culprit_partner) is not None else None,
                    "io": culprit.key.io,
                    "position": culprit.key.position,
                    "step": culprit.key.step,
                    "call_index": culprit.key.call_index,
                    "one_run_only": self.first_introduced is None,
                    # the module's own code made this input: the first record that shows the error
                    "seen_at": seen_at.key.label() if (seen_at := self.culprit_seen_at) is not None else None,
                }
            ),
            "noise_suspects": [describe_row(row) for row in self.rows if row.attribution == SUSPECT][:50],
            "introduced": [describe_row(row) for row in introduced[:50]],
            "metrics": [spec.name for spec in self.metric_specs],
            "thresholds": {
                spec.name: {cls: list(limits) for cls, limits in spec.thresholds.items()}
                for spec in self.metric_specs
                if spec.thresholds
            },
            "threshold_overrides": [override.as_json() for override in self.threshold_overrides],
            "elapsed_s": round(self.elapsed_s, 3),
            "tensor_bytes_read": self.tensor_bytes_read,
            "tensor_bytes_compared": self.tensor_bytes_compared,
            "throughput_gb_per_s": round(throughput, 3) if throughput is not None else None,
        }


def select_metrics(metric_names: Sequence[str] | None) -> list[MetricSpec]:
    """Return the registered metrics named (all of them when none are named), in table order."""
    from llmcheck.core.plugins import get_plugins

    registered = get_plugins().metrics()
    if not metric_names:
        return list(registered.values())
    unknown = [name for name in metric_names if name not in registered]
    if unknown:
        raise UsageError(
            f"unknown metric {unknown[0]!r}", where="--metric", hint=f"known: {', '.join(registered) or 'none'}"
        )
    # The error measure is always measured: attribution, growth and the statistics-only bound
    # work on it, whichever metrics the user wants to see judged.
    wanted = set(metric_names) | {name for name, spec in registered.items() if spec.error_measure}
    return [spec for name, spec in registered.items() if name in wanted]


def _shape_text(shape: Sequence[int]) -> str:
    return str(list(shape))


def incomparable_reason(golden: TensorRecord, my: TensorRecord) -> str | None:
    """Return why two paired records cannot be measured element by element, or None when they can.

    A mismatch of dtype or shape is named before missing data: a statistics-only pair is
    judged on its statistics unless its shapes differ, and then the shapes are why.
    """
    problem = _dtype_problem(golden.dtype, my.dtype) or _shape_problem(golden, my)
    if problem is not None:
        return problem
    if golden.data is None:
        return _NO_DATA["golden"]
    if my.data is None:
        return _NO_DATA["my"]
    return None


#: Why a side's record cannot be measured: one text per side, held by every such pair (10**6 of a statistics-only compare).
_NO_DATA = {side: f"{side} has no tensor data (a statistics-only dump)" for side in ("golden", "my")}


@functools.cache
def _dtype_problem(golden_dtype: str, my_dtype: str) -> str | None:
    """Return why tensors of these two dtypes cannot be measured together, or None (asked once per pair of dtypes)."""
    from llmcheck.core.dumps.tensor_chunks import streamable

    for side, dtype in (("golden", golden_dtype), ("my", my_dtype)):
        if not streamable(dtype):
            return f"{side} dtype {dtype} cannot be compared"
    if golden_dtype.startswith("complex") != my_dtype.startswith("complex"):
        return f"dtype mismatch: golden {golden_dtype} vs my {my_dtype} (complex against real)"
    return None


def _shape_problem(golden: TensorRecord, my: TensorRecord) -> str | None:
    """Return why two shapes cannot be compared element by element (size-1 dims aside), or None."""
    if golden.shape != my.shape and tuple(golden.shape) != tuple(my.shape):
        squeezed = [tuple(size for size in shape if size != 1) for shape in (golden.shape, my.shape)]
        if squeezed[0] != squeezed[1]:
            return f"shape mismatch: golden {_shape_text(golden.shape)} vs my {_shape_text(my.shape)}"
    return None


def _statistics_row(
    index: int,
    pair: Pair,
    specs: Sequence[MetricSpec],
    overrides: Sequence[ThresholdOverride],
    run_floor: str | None,
    run_dtypes: tuple[str | None, str | None] = (None, None),
    table: TableJudge | None = None,
) -> ComparisonRow | None:
    """Return the row of a pair judged on its recorded statistics when a side kept no data, else None."""
    golden, my = pair.golden, pair.my
    assert golden is not None and my is not None
    if (golden.data is not None and my.data is not None) or not comparable_statistics(golden.stats, my.stats):
        return None
    if _shape_problem(golden, my) is not None:
        return None
    judged_class = judging_class(golden.dtype, my.dtype, run_floor)
    limits = (sentinel_limit_in_run(golden.dtype, run_dtypes[0]), sentinel_limit_in_run(my.dtype, run_dtypes[1]))
    results, verdict, deciding, nonfinite = judge_statistics(
        golden.stats,  # type: ignore[arg-type]  # statistics-only pairs always carry both sides' stats
        my.stats,  # type: ignore[arg-type]
        specs,
        golden.key.name,
        judged_class,
        overrides,
        sentinel_limits=limits,
    )
    sides = " and ".join(side for side, record in (("golden", golden), ("my", my)) if record.data is None)
    bounded = error_measure_spec(specs)
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


def _notes(golden: TensorRecord, my: TensorRecord) -> list[str]:
    notes = []
    # asked for every pair: equal shapes and equal dtypes (nearly every pair) are told apart without conversions
    if golden.shape != my.shape and tuple(golden.shape) != tuple(my.shape):
        notes.append(
            f"shapes differ only in size-1 dims ({_shape_text(golden.shape)} vs {_shape_text(my.shape)}); "
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


def _has_stats(record: TensorRecord) -> bool:
    return record.stats is not None and record.stats.max is not None


def _merged_stats(record: TensorRecord, measured: Any) -> Any:
    """Return the record's own statistics when the source recorded them, else the measured ones."""
    return record.stats if _has_stats(record) else measured


class PairExecutor(Protocol):
    """Measures pairs somewhere other than this machine's worker processes (``compare --executor``)."""

    def __call__(
        self, jobs: Sequence[Any], specs: Sequence[MetricSpec], on_measured: Callable[[Any], None] | None
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Return the measurements by pair index, and why each pair it could not measure failed."""


@paused_cyclic_gc()
def compare_dumps(
    golden: Dump,
    my: Dump,
    *,
    metric_names: Sequence[str] | None = None,
    user_mapping: UserMapping | None = None,
    threshold_overrides: Sequence[ThresholdOverride] = (),
    workers: int | None = None,
    noise: Dump | None = None,
    same_program: bool = False,
    on_pairs_known: Callable[[int, int], None] | None = None,
    on_measured: Callable[[int], None] | None = None,
    executor: PairExecutor | None = None,
    pool: WorkerPool | None = None,
    on_judging: Callable[[int], None] | None = None,
) -> CompareResult:
    """Return the comparison of two loaded dumps: pairs, a judged row per pair, attribution.

    ``noise`` is the noise twin (``compare --noise-path``): the golden program run at the
    my-run's precision. Its error against the golden at each tensor is the rounding noise
    expected there, and rows under the dtype table's fail line are judged against it
    (``docs/metrics.md``, "Verdicts in reduced precision"). A twin none of whose records
    pairs with a golden record raises :class:`LlmcheckError`; one that covers only some
    rows, or is identical to the my-run or the golden, is named in a warning. ``same_program`` says both runs
    are one program at one precision (the my-run against its twin): any difference behind
    bit-exact inputs is then introduced, however small.

    ``workers`` processes (default: one per CPU) measure large compares: this one and
    ``workers - 1`` workers started with ``spawn``, so a script calling this needs the usual
    ``if __name__ == "__main__":`` guard (or ``workers=1``). ``on_pairs_known(pairs,
    tensor_bytes)`` is called once the work is known, ``on_measured(tensor_bytes)`` after
    each pair and ``on_judging(rows)`` when the last is measured, for a progress bar.
    ``executor`` measures the pairs elsewhere instead (a Ray
    cluster, :class:`llmcheck.core.measuring.ray_executor.RayExecutor`); a pair it could not measure
    becomes an ``error`` row with its reason. ``pool`` holds worker processes started ahead of
    need (:func:`llmcheck.core.measuring.worker_pool.early_pool`), used if they measure with these metrics.
    """
    from llmcheck.core.plugins import get_plugins

    started = time.perf_counter()
    specs = select_metrics(metric_names)
    pairing = merge_pairs(golden, my, get_plugins().map_pairs(golden, my, user_mapping))
    run_dtypes = (
        run_dtype([record.dtype for record in golden.records]),
        run_dtype([record.dtype for record in my.records]),
    )
    run_classes = (run_precision([record.dtype for record in dump.records]) for dump in (golden, my))
    run_floor = least_precise([name for name in run_classes if name])
    measure_spec = error_measure_spec(specs)
    measure = ErrorMeasure(measure_spec.name, DECIDING_STAT) if measure_spec is not None else None
    twin, rows_with_twin = None, 0
    if noise is not None and measure is not None:  # before measuring: a twin that pairs with nothing fails fast
        twin, rows_with_twin = _noise_twin(
            golden, my, noise, measure, workers, [pair.golden for pair in pairing.pairs if pair.golden is not None]
        )
    table = TableJudge(judging_specs(specs, metric_names), threshold_overrides)
    made: list[ComparisonRow | None] = [None] * len(pairing.pairs)
    same_dump = _same_dump(golden, my)

    def row_of(index: int, problem: str | None, measurement: Any) -> ComparisonRow:
        pair = pairing.pairs[index]
        row = _row(index, pair, specs, problem, measurement, threshold_overrides, run_floor, table, run_dtypes)
        if row.verdict == VERDICT_ERROR and same_dump and _same_record(pair):
            return dataclasses.replace(row, verdict=VERDICT_PASS, reason=SAME_RECORD_REASON)
        return row

    def measured(index: int, measurement: Any) -> None:  # the row is made as the measurement arrives
        made[index] = row_of(index, None, measurement)

    problems, bytes_read = _measure(
        pairing, specs, run_dtypes, workers, executor, on_pairs_known, on_measured, pool, measured
    )
    rows = [row or row_of(index, problems.get(index), None) for index, row in enumerate(made)]
    if on_judging is not None:
        on_judging(len(rows))
    made.clear()  # the rows live in one list, which the judging replaces
    rows = attribute(
        rows, measure, twin, [item.record for item in pairing.unmatched_my], same_program, check_weights(rows)
    )
    return CompareResult(
        golden=golden,
        my=my,
        pairing=pairing,
        rows=rows,
        metric_specs=specs,
        elapsed_s=time.perf_counter() - started,
        tensor_bytes_read=bytes_read,
        tensor_bytes_compared=sum(pair_bytes(pair) for pair in pairing.pairs),
        threshold_overrides=tuple(threshold_overrides),
        noise=noise,
        rows_with_twin=rows_with_twin,
        twin_mode=twin.mode if twin is not None else None,
    )


#: Why a pair that could not be measured passes when a dump is compared with itself.
SAME_RECORD_REASON = "the same record of the same dump on both sides (nothing to measure)"


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


def _same_record(pair: Pair) -> bool:
    """Return whether a pair's two records are one record of one dump (a dump compared with itself)."""
    golden, my = pair.golden, pair.my
    assert golden is not None and my is not None
    return golden.key == my.key and golden.source_path == my.source_path


def _measure(
    pairing: Pairing,
    specs: Sequence[MetricSpec],
    run_dtypes: tuple[str | None, str | None],
    workers: int | None,
    executor: PairExecutor | None,
    on_pairs_known: Callable[[int, int], None] | None,
    on_measured: Callable[[int], None] | None,
    pool: WorkerPool | None,
    measured: Callable[[int, Any], None],
) -> tuple[dict[int, str], int]:
    """Measure every pair, handing each measurement to ``measured(index, measurement)`` as it arrives.

    Return why each pair that was not measured was not, and the tensor bytes read. A pair
    over the same bytes as an earlier one is handed that pair's measurement. Nothing keeps
    the measurements here: the caller makes each one's row (a third of a measurement's
    memory) as it arrives, so 10^5 of them are never held at once, and the rows cost no
    time after the last one. The jobs (one per distinct pair of byte ranges) live only here.
    """
    from llmcheck.core.measuring.metric_engine import PairJob, build_job, measure_pairs

    jobs: dict[tuple[Any, ...], PairJob] = {}
    same_data: dict[int, list[int]] = {}  # a measured pair's index -> the later pairs over its bytes
    problems: dict[int, str] = {}
    for index, pair in enumerate(pairing.pairs):
        assert pair.golden is not None and pair.my is not None
        problem = incomparable_reason(pair.golden, pair.my)
        if problem is not None:
            problems[index] = problem
            continue
        job = build_job(
            index=index,
            golden=pair.golden.data,  # pairs without data were set aside above
            my=pair.my.data,
            golden_needs_stats=not _has_stats(pair.golden),
            my_needs_stats=not _has_stats(pair.my),
            golden_run_dtype=run_dtypes[0],
            my_run_dtype=run_dtypes[1],
        )
        # A capture stores a tensor once however many records see it (a module's output is the
        # next one's input): pairs over the same bytes on both sides are measured once.
        identity = _data_identity(job.golden, job.my)
        first = jobs.get(identity)
        if first is None:
            jobs[identity] = job
        else:
            same_data.setdefault(first.index, []).append(index)
            jobs[identity] = dataclasses.replace(
                first,
                golden_needs_stats=first.golden_needs_stats or job.golden_needs_stats,
                my_needs_stats=first.my_needs_stats or job.my_needs_stats,
            )
    unique_jobs = sorted(jobs.values(), key=lambda job: job.index)
    jobs.clear()  # its keys, a tuple and a path per pair, are not held through the measuring
    if on_pairs_known is not None:
        on_pairs_known(len(unique_jobs), sum(job.nbytes for job in unique_jobs))
    bytes_read = 0

    def arrived(measurement: Any) -> None:
        nonlocal bytes_read
        bytes_read += measurement.bytes_read
        for index in (measurement.index, *same_data.get(measurement.index, ())):
            measured(index, measurement)
        if on_measured is not None:
            on_measured(measurement.bytes_read)

    if executor is None:
        measure_pairs(unique_jobs, specs, workers=workers, on_measured=arrived, pool=pool, keep=False)
    else:
        handed: set[int] = set()

        def handed_on(measurement: Any) -> None:
            handed.add(measurement.index)
            arrived(measurement)

        found, failures = executor(unique_jobs, specs, on_measured=handed_on)
        for measurement in found.values():  # an executor that returned some without handing them on
            if measurement.index not in handed:
                arrived(measurement)
        problems.update(failures)
        later = ((first, index) for first, indices in same_data.items() for index in indices)
        problems.update({index: failures[first] for first, index in later if first in failures})
    return problems, bytes_read


#: A twin's hint, wherever it says nothing about the noise.
TWIN_HINT = "give --noise-path the golden program run on the same input at the my-run's precision"


def _noise_twin(
    golden: Dump,
    my: Dump,
    noise: Dump,
    measure: ErrorMeasure,
    workers: int | None,
    paired_golden: Sequence[TensorRecord],
) -> tuple[NoiseTwin, int]:
    """Return the noise twin's error at each golden tensor and the my-run judged against the twin,
    with how many of the paired golden records have a twin record.

    Raise when none has (nothing would be judged against the twin, yet the reports would say it
    is in use); warn when some have not, and when the twin is identical to the my-run or to the
    golden: it then says nothing about the noise.
    """
    against_golden = compare_dumps(golden, noise, metric_names=[measure.metric], workers=workers)
    errors = {id(row.golden): error for row in against_golden.rows if (error := measure.of(row)) is not None}
    rows_with_twin = _twin_coverage(golden, noise, against_golden, paired_golden)
    against_my = compare_dumps(noise, my, metric_names=[measure.metric], workers=workers, same_program=True)
    for run, result in (("the my-run", against_my), ("the golden run", against_golden)):
        tensors = _identical_tensors(result, measure)
        if tensors:
            consequence = (
                "every row under the dtype table's fail line passes against it, so it tells no defect from "
                "the rounding noise, unless the my-run is the golden program itself at this precision"
                if run == "the my-run"
                else "it shows no rounding noise, so every row that differs by more than rounding fails against it"
            )
            log.warning(
                "%s: the noise twin is identical to %s (all %d float tensors they share agree exactly): %s (%s)",
                noise.root,
                run,
                tensors,
                consequence,
                TWIN_HINT,
            )
    if bool(my.batches) != bool(noise.batches):
        # a serving engine's batch against a per-request twin (or the reverse): another implementation by its layout
        log.info(
            "%s: the my-run is a serving engine's batch and the noise twin a run of one request: another "
            "implementation than the twin's program, so the twin's error is the expected noise, not its bits",
            noise.root,
        )
        return NoiseTwin(errors=errors, against_my={}, mode=TWIN_NOISE_ONLY), rows_with_twin
    mode, differing_calls = twin_mode(against_my.rows)
    if mode == TWIN_NOISE_ONLY:
        log.info(
            "%s: %d calls of the my-run differ from the noise twin behind bit-exact inputs: it is another "
            "implementation than the twin's program, so the twin's error is the expected noise, not its bits",
            noise.root,
            differing_calls,
        )
        return NoiseTwin(errors=errors, against_my={}, mode=mode), rows_with_twin
    return NoiseTwin(errors=errors, against_my={id(row.my): row for row in against_my.rows}, mode=mode), rows_with_twin


def _twin_coverage(
    golden: Dump, noise: Dump, against_golden: CompareResult, paired_golden: Sequence[TensorRecord]
) -> int:
    """Return how many paired golden records have a twin record to measure against; raise when none has."""
    measured = {id(row.golden) for row in against_golden.rows if row.verdict != VERDICT_ERROR}
    missing = [record for record in paired_golden if id(record) not in measured]
    if not missing:
        return len(paired_golden)
    if len(missing) < len(paired_golden):
        shown = ", ".join(record.key.label() for record in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        log.warning(
            "%s: %d of the %d golden records have no twin record: %s%s "
            "(their verdicts use the repeats and the dtype table instead)",
            noise.root,
            len(missing),
            len(paired_golden),
            shown,
            more,
        )
        return len(paired_golden) - len(missing)
    raise LlmcheckError(
        f"no golden record has a twin record to measure the noise at: {_why_nothing_pairs(golden, noise, against_golden)}",
        where=noise.root,
        hint=TWIN_HINT,
    )


def _why_nothing_pairs(golden: Dump, noise: Dump, against_golden: CompareResult) -> str:
    """Return why no golden record pairs with a measurable twin record: the names differ, or the shapes, or else."""
    if not against_golden.rows:
        first_golden = golden.records[0].key.label() if golden.records else "none"
        first_twin = noise.records[0].key.label() if noise.records else "none"
        return (
            f"none of its {len(noise.records)} records pairs with one of the golden's {len(golden.records)} "
            f"(the names differ: golden {first_golden}, twin {first_twin})"
        )
    failed = [row for row in against_golden.rows if row.verdict == VERDICT_ERROR]
    if not failed:
        return "its records pair only with golden records that have no my-run counterpart"
    first = failed[0]
    if _shape_problem(first.golden, first.my) is not None:
        return (
            f"{len(failed)} records pair by name but the shapes differ "
            f"(golden {first.golden.key.label()} {_shape_text(first.golden.shape)}, twin {_shape_text(first.my.shape)})"
        )
    return f"{len(failed)} records pair by name but none can be measured ({first.golden.key.label()}: {first.reason})"


def _identical_tensors(result: CompareResult, measure: ErrorMeasure) -> int:
    """Return how many float tensors the two runs share when every one agrees exactly, else 0."""
    errors = [
        metric_value(row.metrics, measure.metric)
        for row in result.rows
        if row.verdict != VERDICT_ERROR and is_float_dtype(row.golden.dtype) and is_float_dtype(row.my.dtype)
    ]
    return len(errors) if errors and all(error == 0.0 for error in errors) else 0


def pair_bytes(pair: Pair) -> int:
    """Return the tensor bytes of both records of a pair."""
    return sum(record.nbytes for record in (pair.golden, pair.my) if record is not None)


def _data_identity(golden: TensorData, my: TensorData) -> tuple[Any, ...]:
    """Return what identifies the bytes a pair reads (unique for data reached through a loader)."""
    return golden.identity() + my.identity()


def judging_specs(specs: Sequence[MetricSpec], chosen: Sequence[str] | None) -> list[MetricSpec]:
    """Return the specs with thresholds only on the metrics the user chose (all when none were named).

    The error measure is measured whatever ``--metric`` says (attribution works on it) but
    judges a full-tensor pair only when chosen; a statistics-only pair is judged on it always.
    """
    if not chosen:
        return list(specs)
    return [spec if spec.name in chosen else dataclasses.replace(spec, thresholds={}) for spec in specs]


def _row(
    index: int,
    pair: Pair,
    specs: Sequence[MetricSpec],
    problem: str | None,
    measurement: Any,
    overrides: Sequence[ThresholdOverride],
    run_floor: str | None,
    table: TableJudge,
    run_dtypes: tuple[str | None, str | None] = (None, None),
) -> ComparisonRow:
    golden, my = pair.golden, pair.my
    assert golden is not None and my is not None
    if problem is not None and judged_on_digests(pair):
        return digest_row(index, pair, _statistics_row(index, pair, specs, overrides, run_floor, run_dtypes, table))
    if problem is not None and (
        statistics_row := _statistics_row(index, pair, specs, overrides, run_floor, run_dtypes, table)
    ):
        return statistics_row
    if problem is not None or measurement is None:
        return ComparisonRow(
            index=index,
            golden=golden,
            my=my,
            rule=pair.rule,
            metrics={},
            verdict=VERDICT_ERROR,
            reason=problem or "not measured",
            golden_stats=golden.stats,
            my_stats=my.stats,
        )
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


@paused_cyclic_gc()
def compare_command(
    *,
    golden_path: Path,
    my_path: Path,
    golden_source: str | None,
    my_source: str | None,
    output_dir: Path,
    metric_names: Sequence[str],
    mapping_path: Path | None,
    jobs: int | None,
    thresholds_path: Path | None = None,
    noise_path: Path | None = None,
    noise_source: str | None = None,
    allow_unmatched: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    report_names: Sequence[str] = (),
    skipped_reports: Sequence[str] = (),
) -> int:
    """Run ``llmcheck compare`` and return its exit code: 0 all pass, 1 no pair at all, 3 failing or
    unmeasurable pairs, or golden records left unmatched that no pairing rule expects (unless ``allow_unmatched``).
    ``report_names`` are the reporters to run besides the default ones (``--report``),
    ``skipped_reports`` the default ones not to run (``--skip-report``).
    """
    from rich.console import Console

    from llmcheck.core.dumps.atomic_files import reports_written_into
    from llmcheck.core.judging.verdicts import load_threshold_overrides, warn_unmatched_overrides
    from llmcheck.core.measuring.worker_pool import early_pool
    from llmcheck.core.pairing.merge import load_user_mapping
    from llmcheck.core.plugins import get_plugins
    from llmcheck.core.reporting.report import print_summary
    from llmcheck.core.reporting.report_folder import prepare_report_folder
    from llmcheck.core.reporting.reporters import choose_reporters, write_reports

    if jobs is not None and jobs < 1:
        raise UsageError(f"invalid value {jobs}", where="-j/--jobs", hint="give 1 or more worker processes")
    output_dir = Path(output_dir)
    reporters = choose_reporters(get_plugins().reporters(), report_names, skipped_reports)
    prepare_report_folder(output_dir, [reporter.file_name for reporter in reporters])
    console = Console(soft_wrap=True)
    specs = select_metrics(metric_names)
    overrides = (
        load_threshold_overrides(Path(thresholds_path), {spec.name: spec for spec in specs})
        if thresholds_path is not None
        else []
    )
    named = [spec for spec in specs if not metric_names or spec.name in metric_names]
    if not any(spec.thresholds for spec in named) and not overrides:
        raise UsageError(
            f"none of the metrics {', '.join(spec.name for spec in named)} has thresholds, so no pair "
            "could pass or fail",
            where="--metric",
            hint="add relative_euclidean_distance or cosine_similarity, or give --thresholds",
        )
    user_mapping = load_user_mapping(Path(mapping_path)) if mapping_path is not None else None
    plugins = get_plugins()
    pair_executor = _executor(executor, ray_address)
    inputs = (Path(golden_path), Path(my_path))
    pool = early_pool(jobs, specs, inputs) if pair_executor is None else None  # started while the dumps load
    with pool or nullcontext():
        golden, my = plugins.load_runs(Path(golden_path), golden_source, Path(my_path), my_source)
        noise = (
            plugins.load_tensors(Path(noise_path), noise_source, "--noise-source") if noise_path is not None else None
        )
        result = compare_with_progress(
            golden,
            my,
            console=console,
            metric_names=list(metric_names) or None,
            user_mapping=user_mapping,
            threshold_overrides=overrides,
            workers=jobs,
            noise=noise,
            executor=pair_executor,
            pool=pool,
        )
    if overrides and thresholds_path is not None:
        warn_unmatched_overrides(Path(thresholds_path), overrides, result.rows)
    with reports_written_into(output_dir), _writing_reports(console, len(result.rows)):
        written = write_reports(result, output_dir, report_names, skipped_reports)
    print_summary(result, console, written)
    if not result.rows:
        return EXIT_FAILURE
    counts = result.counts()
    unexpected = counts["unmatched_golden_unexpected"]
    if unexpected:
        log.warning(
            "%d of the %d golden records have no counterpart and no pairing rule expects that (listed in %s)%s",
            unexpected,
            len(golden.records),
            written["pairs"],
            "; accepted by --allow-unmatched"
            if allow_unmatched
            else "; the compare fails unless --allow-unmatched is given",
        )
    failing = counts["failures"] or counts["errors"] or (unexpected and not allow_unmatched)
    return EXIT_FAILURES_FOUND if failing else EXIT_OK


def _executor(name: str, ray_address: str | None) -> PairExecutor | None:
    """Return the executor ``--executor NAME`` names (None: this machine's worker processes)."""
    if name == "ray":
        from llmcheck.core.measuring.ray_executor import RayExecutor

        return RayExecutor(ray_address)
    if ray_address is not None:
        raise UsageError("is only used by --executor ray", where="--ray-address")
    return None


#: From this many rows on, judging and writing the reports take a second or more: the CLI says it is doing them.
PROGRESS_ROWS = 10_000


@contextmanager
def _writing_reports(console: Any, rows: int) -> Iterator[None]:
    """Show that the reports are being written (a spinner on a terminal, a log line in a pipe), for a large compare."""
    if rows < PROGRESS_ROWS:
        yield
    elif console.is_terminal:
        with console.status(f"writing the reports of {rows} rows"):
            yield
    else:
        log.info("writing the reports of %d rows", rows)
        yield


def compare_with_progress(
    golden: Dump, my: Dump, *, console: Any, progress_interval_s: float = 2.0, **options: Any
) -> CompareResult:
    """Return :func:`compare_dumps` of two dumps while a progress bar (a log line per tenth when piped) counts bytes."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from llmcheck.core.reporting.progress_log import ProgressLog

    if not console.is_terminal:  # a CI log or a pipe: a bar would draw nothing there
        lines = ProgressLog("comparing", log, min_interval_s=progress_interval_s)

        def judging_line(rows: int) -> None:
            if rows >= PROGRESS_ROWS:
                log.info("judging %d rows against their feeders and repeats", rows)

        return compare_dumps(
            golden,
            my,
            on_pairs_known=lambda pairs, tensor_bytes: lines.start(tensor_bytes),
            on_measured=lines.advance,
            on_judging=judging_line,
            **options,
        )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=False),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("comparing", total=None)

        def known(pairs: int, tensor_bytes: int) -> None:
            progress.update(task, total=tensor_bytes)

        def measured(tensor_bytes: int) -> None:
            progress.advance(task, tensor_bytes)

        def judging(rows: int) -> None:
            progress.update(task, description=f"judging {rows} rows")

        return compare_dumps(golden, my, on_pairs_known=known, on_measured=measured, on_judging=judging, **options)
