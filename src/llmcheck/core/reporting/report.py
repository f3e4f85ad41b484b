"""What a compare says in the terminal, the words its reports share, and the names of the default report files.

The files themselves are written by reporters (``core/reporting/reporters.py``; the built-in
``reports`` plugin writes the four default ones). Their names stay here because
``export model-explorer`` reads a compare folder by them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcheck.core.judging.divergence import (
    CARRIED_METRIC,
    EXACT_INPUTS_METRIC,
    GROWTH_METRIC,
    TWIN_DIFFERENCE_METRIC,
    TWIN_METRIC,
    WEIGHTS_METRIC,
    given_other_inputs,
)
from llmcheck.core.judging.row_table import ROWS_PER_BATCH, field_blocks, rows_at
from llmcheck.core.records import (
    VERDICT_ERROR,
    VERDICT_FAIL,
    VERDICT_WARN,
    ComparisonRow,
    Dump,
    error_measure,
)
from llmcheck.core.reporting.depth_profile import row_error

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from llmcheck.core.judging.result import CompareResult

CSV_NAME = "cmp_report.csv"
SUMMARY_NAME = "summary.json"
PAIRS_NAME = "pairs.json"
HTML_NAME = "report.html"


def describe(value: Any) -> str:
    """Return a metric value as reports print it (``inf``, ``nan``, or 6 significant digits)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.6g}"
    return str(value)


_JSON_SCALARS = frozenset({str, int, bool, type(None)})


def json_safe(value: Any) -> Any:
    """Return ``value`` with NaN and infinities as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON)."""
    kind = type(value)  # exact types first: a report holds millions of plain values
    if kind in _JSON_SCALARS:
        return value
    if kind is float:
        return value if math.isfinite(value) else describe(value)
    if kind is dict:
        return {str(k): json_safe(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return describe(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# --- terminal ----------------------------------------------------------------------------------


_STYLE = {VERDICT_FAIL: "bold red", VERDICT_WARN: "yellow", VERDICT_ERROR: "magenta"}
_SEVERITY = {VERDICT_FAIL: 3, VERDICT_ERROR: 2, VERDICT_WARN: 1}


def worst_rows(result: CompareResult, count: int = 10) -> list[ComparisonRow]:
    """Return up to ``count`` non-passing rows, worst first: verdict, NaN/Inf mismatch, then the error measure.

    The rows' fields are read a block at a time, and only the non-passing rows' scores kept:
    the three fields of every row at once were 56 bytes a row, the peak of a large compare.
    """
    measure = error_measure(result.metric_specs)
    rows = result.rows

    def scored() -> Iterator[tuple[tuple[int, int, float], int]]:
        """Yield each non-passing row's badness and position, in row order."""
        offset = 0
        for fields in field_blocks(rows, ROWS_PER_BATCH):
            verdicts = fields.verdict
            chosen = [at for at, verdict in enumerate(verdicts) if verdict in _SEVERITY]
            if chosen:
                nonfinite, errors = fields.nonfinite_mismatch, list(fields.error)
                unjudged = [at for at in chosen if errors[at] is None]  # their error: the measured metric
                for at, row in zip(unjudged, rows_at(rows, [offset + at for at in unjudged])):
                    errors[at] = row_error(row, measure)
                for at in chosen:
                    error = errors[at]
                    value = -1.0 if error is None or math.isnan(error) else error
                    yield (_SEVERITY[verdicts[at]], nonfinite[at], value), offset + at
            offset += len(fields)

    return rows_at(rows, [position for _, position in heapq.nlargest(count, scored(), key=itemgetter(0))])


#: What each of the verdict's own measures is, for a reader meeting one in a line (docs/metrics.md says more).
VERDICT_MEASURE_WORDS = {
    GROWTH_METRIC: "its error over the error its repeats in the other layers predict here",
    TWIN_METRIC: "its error over the noise twin's error here",
    TWIN_DIFFERENCE_METRIC: "its difference from the noise twin, whose inputs agree bit for bit",
    EXACT_INPUTS_METRIC: "its error although its inputs agree bit for bit",
    CARRIED_METRIC: "the error it carries on from a failing input",
    WEIGHTS_METRIC: "its weights that differ from golden beyond rounding",
}
#: Where a reader finds how the verdict's own measures decide.
VERDICT_MEASURE_DOCS = "docs/metrics.md, Verdicts in reduced precision"


def verdict_measure_notes(rows: Sequence[ComparisonRow]) -> list[str]:
    """Return a line saying what each of the verdict's own measures deciding ``rows`` is, once each, in order met.

    Such a measure (``error_vs_expected inf > 2``, ``weights_beyond_rounding 1 > 0``) is no
    metric the user registered: a few words say what it is, and where to read more.
    """
    notes: dict[str, str] = {}
    for row in rows:
        name = row.deciding_metric or ""
        words = VERDICT_MEASURE_WORDS.get(name)
        if words is None or name in notes:
            continue
        deciding = row.metrics.get(name)
        if deciding is not None and math.isinf(deciding.value) and name in (GROWTH_METRIC, TWIN_METRIC):
            words += " (inf: none was expected)"
        notes[name] = f"{name}: {words}"
    return list(notes.values())


def measure_text(row: ComparisonRow) -> str:
    """Return the deciding metric against its fail threshold in the metric's own direction (``psnr 10 < 20``)."""
    deciding = row.metrics.get(row.deciding_metric or "")
    if deciding is None or deciding.fail_threshold is None:
        return row.reason or row.verdict
    if deciding.verdict == VERDICT_WARN and deciding.warn_threshold is not None:
        return (
            f"{deciding.name} {describe(deciding.value)} {deciding.comparison} "
            f"{describe(deciding.warn_threshold)} (warn threshold)"
        )
    if deciding.verdict == VERDICT_FAIL or math.isnan(deciding.value):
        return f"{deciding.name} {describe(deciding.value)} {deciding.comparison} {describe(deciding.fail_threshold)}"
    within = "\u2265" if deciding.higher_is_better else "\u2264"  # a passing value is on the good side
    return f"{deciding.name} {describe(deciding.value)} {within} {describe(deciding.fail_threshold)}"


def divergence_line(row: ComparisonRow) -> str:
    """Return one line naming a failing row: where, which metric, its value against the threshold, attribution."""
    key = row.golden.key
    where = key.label()
    if row.my.key.name != key.name:
        where += f" (my: {row.my.key.name})"
    attribution = f", {row.attribution}" if row.attribution else ""
    return f"{where}: {measure_text(row)}{attribution}"


#: How the loaded plugins say to record a golden run's noise twin (``Plugins.noise_twin_command``):
#: from the golden dump, the precision and the folder to write, the command, or None.
NoiseTwinCommand = Callable[[Dump, str, Path], str | None]


def print_summary(
    result: CompareResult,
    console: Console,
    written: Mapping[str, Path] | None = None,
    *,
    noise_twin_command: NoiseTwinCommand,
) -> None:
    """Print counts, the first divergence, the first introduced divergence and the ten worst rows.

    ``noise_twin_command`` words the hint to record a noise twin when the runs differ in precision.
    """
    counts = result.counts()
    read = result.tensor_bytes_read
    size = f"{read / 1e9:.2f} GB" if read >= 1e9 else f"{read / 1e6:.1f} MB"
    speed = f", {read / 1e9 / result.elapsed_s:.2f} GB/s" if result.elapsed_s > 0 and read >= 1e8 else ""
    console.print(
        f"compared {counts['pairs']} pairs ({size} of tensors read) in {result.elapsed_s:.2f} s{speed}", highlight=False
    )
    console.print(
        f"  [green]pass {counts['passes']}[/]  [yellow]warn {counts['warnings']}[/]  "
        f"[bold red]fail {counts['failures']}[/]  [magenta]error {counts['errors']}[/]  "
        f"unmatched golden {counts['unmatched_golden']}, my {counts['unmatched_my']}"
    )
    first, introduced = result.first_divergence, result.first_introduced
    if not result.rows:
        console.print(
            "[bold yellow]no pairs: no pairing rule matched a golden record to a my record; check the "
            "paths and sources, or pair them with --mapping[/]",
            highlight=False,
        )
    elif first is None and result.counts()["errors"]:
        console.print(
            f"[bold magenta]no failing pair, but {result.counts()['errors']} pairs could not be measured "
            "(see cmp_fail_reason)[/]",
            highlight=False,
        )
    elif first is None and result.counts()["unmatched"]:
        console.print(
            f"[yellow]no divergence among the {len(result.rows)} pairs, but {result.counts()['unmatched']} "
            "records have no counterpart and were not compared (see pairs.json)[/]",
            highlight=False,
        )
    elif first is None:
        console.print("[green]no divergence: every pair is within its thresholds[/]")
    else:
        same = introduced is not None and introduced.index == first.index
        if not same:  # the same row: one line says both
            console.print(f"first divergence: {divergence_line(first)}", markup=False)
        if given_other_inputs(first):
            console.print(
                f"  the runs were given other values at {first.golden.key.label()}: when a generating run "
                "picked other tokens, every later step compares other inputs, not the same computation"
                + (
                    f"; judge the steps before it (dump with -er 0,{first.golden.key.step - 1})"
                    if first.golden.key.step > 0
                    else ""
                ),
                markup=False,
                highlight=False,
            )
        if introduced is not None:
            also = " (the first divergence too)" if same else ""
            console.print(f"[bold]first introduced divergence: {divergence_line(introduced)}{also}[/]", highlight=False)
            if introduced.fed_by:
                console.print(f"  its inputs agree: {', '.join(introduced.fed_by)}", markup=False)
            if introduced.evidence:
                console.print(f"  evidence: {introduced.evidence}", markup=False, highlight=False)
        suspects = result.suspects.sentence()
        if suspects:
            console.print(f"[bold]suspects:[/] {suspects}", highlight=False)
    hint = twin_hint(result, noise_twin_command)
    if hint:
        console.print(f"hint: {hint}", markup=False, highlight=False)
    made = twin_cast_line(result)
    if made:
        console.print(made, markup=False, highlight=False)
    shown = [row for row in (first, introduced) if row is not None]
    if result.golden.is_tensor_files and result.my.is_tensor_files and len(result.rows) <= 20:
        _print_metric_table(result, console)
    else:
        shown += _print_worst_rows(result, console)
    notes = verdict_measure_notes(shown)
    if notes:
        console.print(f"what the verdict's own measures are ({VERDICT_MEASURE_DOCS}):", highlight=False)
        for note in notes:
            console.print(f"  {note}", markup=False, highlight=False)
    if written:
        console.print("wrote " + ", ".join(str(path) for path in written.values()), markup=False)


def twin_hint(result: CompareResult, noise_twin_command: NoiseTwinCommand) -> str:
    """Return advice when the runs differ in precision and no noise twin was given, else ''.

    A golden run less precise than the my-run is most likely the two paths given the wrong way
    round, so the advice asks that first; otherwise it is to record a noise twin, with the
    command that does from the plugin of the golden's capture (hook ``llmcheck_noise_twin_command``),
    or in words without one.
    """
    from llmcheck.core.judging.verdicts import PRECISION_ORDER, run_precision

    if result.noise is not None:
        return ""
    golden, my = (run_precision([record.dtype for record in dump.records]) for dump in (result.golden, result.my))
    if golden is None or my is None or golden == my:
        return ""
    if PRECISION_ORDER.index(golden) > PRECISION_ORDER.index(my):
        return (
            f"the golden run is less precise than the my-run ({golden} golden, {my} my): are -gp and -mp swapped? "
            "-gp takes the trusted run, -mp the one under suspicion (docs/commands/compare.md)"
        )
    why = (
        f"the runs differ in precision ({golden} golden, {my} my): a defect smaller than {my} rounding noise "
        "passes unseen here; "
    )
    twin_dir = twin_folder(result.golden.root)
    command = noise_twin_command(result.golden, my, twin_dir)
    if command is None:
        return why + (
            "record the golden program at the my-run's precision and give it as --noise-path (docs/commands/compare.md)"
        )
    return (
        why
        + f"record the golden program at {my}, its noise twin, and add --noise-path {twin_dir} to this compare:\n  {command}"
    )


def twin_folder(golden_root: Path) -> Path:
    """Return the folder to suggest for a golden run's noise twin: ``golden_twin`` beside the folder given to ``dump -o``."""
    from llmcheck.core.dumps.store import DUMP_DIR_PREFIX

    base = golden_root.parent if golden_root.name.startswith(DUMP_DIR_PREFIX) else golden_root
    return base.with_name(f"{base.name}_twin")


def twin_cast_line(result: CompareResult) -> str:
    """Return what the noise twin's manifest says of its making when its capture cast the golden program (``as_dtype``), else ''.

    Also says when the twin was cast to another precision than the my-run's.
    """
    from llmcheck.core.dumps.store import AS_DTYPE_FIELD
    from llmcheck.core.judging.verdicts import run_precision

    noise = result.noise
    cast = noise.manifest.get(AS_DTYPE_FIELD) if noise is not None else None
    if noise is None or not isinstance(cast, Mapping) or not isinstance(cast.get("to"), str):
        return ""
    cast_from = cast.get("from")
    counted = cast_from.items() if isinstance(cast_from, Mapping) else ()
    was = ", ".join(f"{count} {dtype}" for dtype, count in counted) or "no floating"
    line = (
        f"noise twin {noise.root}: the golden program with its model cast to {cast['to']} as it ran "
        f"({was} parameters and buffers)"
    )
    twin, my = run_precision([cast["to"]]), run_precision([record.dtype for record in result.my.records])
    if twin != my and my is not None:
        line += f"; but the my-run is {my}: this twin shows {twin} noise (record it again at {my})"
    return line


def _print_worst_rows(result: CompareResult, console: Console) -> list[ComparisonRow]:
    """Print the worst rows with the measure they are sorted by (the error measure), and what decided each; return them."""
    worst = worst_rows(result)
    if not worst:
        return worst
    measure = error_measure(result.metric_specs)
    shown = measure.name if measure is not None else "deciding metric"
    console.print(
        f"{_count(len(worst), 'worst row')} by {shown} (data_id, verdict, record, {shown}, attribution, deciding):",
        highlight=False,
    )
    for row in worst:
        error = row_error(row, measure)
        value = describe(error) if error is not None else (row.reason or "-")
        decided = "" if row.deciding_metric == (measure.name if measure else None) else f"  ({measure_text(row)})"
        console.print(
            f"  {row.index:>5} [{_STYLE[row.verdict]}]{row.verdict:<5}[/] {row.golden.key.label()}  "
            f"{value}  {row.attribution or '-'}{decided}",
            highlight=False,
            markup=True,
        )
    return worst


def _count(count: int, noun: str) -> str:
    """Return ``count`` and the noun, plural unless one (``1 worst row``, ``10 worst rows``)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _print_metric_table(result: CompareResult, console: Console) -> None:
    """Print every metric of every pair, one per line (the two-single-files case)."""
    width = max(len(spec.name) for spec in result.metric_specs) if result.metric_specs else 0
    for row in result.rows:
        style = _STYLE.get(row.verdict, "green")
        console.print(
            f"{row.golden.key.name}: [{style}]{row.verdict}[/]" + (f" ({row.reason})" if row.reason else ""),
            highlight=False,
        )
        for spec in result.metric_specs:
            metric = row.metrics.get(spec.name)
            if metric is None:
                continue
            judged = ""
            if metric.fail_threshold is not None:
                judged = (
                    f"  ({metric.verdict}: warn {describe(metric.warn_threshold)}, "
                    f"fail {describe(metric.fail_threshold)})"
                )
            console.print(f"  {spec.name:<{width}}  {describe(metric.value)}{judged}", highlight=False)
