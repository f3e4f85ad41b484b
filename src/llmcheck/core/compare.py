"""Compare two runs: load both, pair their records, measure every pair, judge it, name the first divergence.

:func:`compare_dumps` is the in-process API (the demo and tests use it); :func:`compare_command`
is ``llmcheck compare``: it also writes the reports (by default ``cmp_report.csv``,
``summary.json``, ``pairs.json`` and ``report.html``; ``--report NAME`` adds a plugin's
format, see ``core/reporting/reporters.py``) and prints the terminal summary. A pair that cannot be measured (shapes
differ, no data in a statistics-only dump) is a row with verdict ``error`` and its reason --
never a dropped row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcheck.core.errors import EXIT_FAILURE, EXIT_FAILURES_FOUND, EXIT_OK, UsageError
from llmcheck.core.gc_pause import paused_cyclic_gc
from llmcheck.core.judging.divergence import (
    ErrorMeasure,
    NoiseTwin,
    attribute,
)
from llmcheck.core.judging.noise_twin import read_noise_twin, twin_coverage
from llmcheck.core.judging.op_replay import OpReplay
from llmcheck.core.judging.result import CompareResult
from llmcheck.core.judging.row_table import RowCollector
from llmcheck.core.judging.rows import PairJudge
from llmcheck.core.judging.stats_compare import DECIDING_STAT
from llmcheck.core.judging.verdicts import (
    ThresholdOverride,
)
from llmcheck.core.judging.weights import check_weights
from llmcheck.core.measuring.pairing_jobs import PairExecutor, measure_pairing
from llmcheck.core.pairing.merge import merge_pairs
from llmcheck.core.pairing.pair_table import pair_side
from llmcheck.core.records import (
    Dump,
    MetricSpec,
    TensorRecord,
    UserMapping,
    error_measure,
)

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.core.measuring.measured_columns import MeasuredColumns
    from llmcheck.core.measuring.metric_engine import HeldWorkers

log = logging.getLogger("llmcheck.compare")


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
    pool: HeldWorkers | None = None,
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
    judge = PairJudge.of(golden, my, specs, metric_names, threshold_overrides)
    measure_spec = error_measure(specs)
    measure = ErrorMeasure(measure_spec.name, DECIDING_STAT) if measure_spec is not None else None
    twin, rows_with_twin = None, 0
    if noise is not None and measure is not None:  # before measuring: a twin that pairs with nothing fails fast
        twin, rows_with_twin = _noise_twin(
            golden,
            my,
            noise,
            measure,
            workers,
            [record for record in pair_side(pairing.pairs, "golden") if record is not None],
        )
    # the rows as measured, held as columns; a row's records are read from its pair's
    made = RowCollector(len(pairing.pairs), (pair_side(pairing.pairs, "golden"), pair_side(pairing.pairs, "my")))

    def measured(index: int, measurement: Any) -> None:  # the row is made as the measurement arrives
        made.add(index, judge.row(index, pairing.pairs[index], None, measurement))

    def measured_columns(columns: MeasuredColumns) -> None:  # small pairs' rows, made a block at a time
        for index, row in zip(columns.index, judge.rows_of(columns, pairing.pairs)):
            made.add(index, row)

    problems, bytes_read = measure_pairing(
        pairing,
        specs,
        judge.run_dtypes,
        workers,
        executor,
        on_pairs_known,
        on_measured,
        pool,
        measured,
        measured_columns,
    )
    unmeasured = made.missing()
    for index, row in zip(unmeasured, judge.unmeasured_rows(unmeasured, pairing.pairs, problems)):
        made.add(index, row)
    rows = made.table()  # every pair has its row now
    if on_judging is not None:
        on_judging(len(rows))
    del unmeasured, problems  # a statistics-only compare's reasons, one a pair: judging's peak is no place for them
    weights = check_weights(rows)
    replay = OpReplay(golden.records, my.records, get_plugins().op_reference)
    unmatched_my = [item.record for item in pairing.unmatched_my]
    judged = attribute(rows, measure, twin, unmatched_my, same_program, weights, replay)
    del rows  # judged: the rows as measured are let go before the reports
    return CompareResult(
        golden=golden,
        my=my,
        pairing=pairing,
        rows=judged,
        metric_specs=specs,
        elapsed_s=time.perf_counter() - started,
        tensor_bytes_read=bytes_read,
        tensor_bytes_compared=sum(  # both sides' records, read without making the pairs
            record.nbytes
            for side in ("golden", "my")
            for record in pair_side(pairing.pairs, side)
            if record is not None
        ),
        threshold_overrides=tuple(threshold_overrides),
        noise=noise,
        rows_with_twin=rows_with_twin,
        twin_mode=twin.mode if twin is not None else None,
    )


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
    rows_with_twin = twin_coverage(golden, noise, against_golden, paired_golden)  # raises before a second compare
    against_my = compare_dumps(noise, my, metric_names=[measure.metric], workers=workers, same_program=True)
    return read_noise_twin(my, noise, measure, against_golden, against_my), rows_with_twin


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
    plugins = get_plugins()
    registered_reporters = plugins.reporters()
    reporters = choose_reporters(registered_reporters, report_names, skipped_reports)
    prepare_report_folder(output_dir, [reporter.file_name for reporter in reporters], plugins.claimed_dump)
    console = Console(soft_wrap=True)
    specs = select_metrics(metric_names)
    overrides = (
        load_threshold_overrides(Path(thresholds_path), {spec.name: spec for spec in specs}, list(plugins.metrics()))
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
    user_mapping = load_user_mapping(Path(mapping_path), plugins.mapping_rules()) if mapping_path is not None else None
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
        written = write_reports(result, output_dir, registered_reporters, report_names, skipped_reports)
    print_summary(result, console, written, noise_twin_command=plugins.noise_twin_command)
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
