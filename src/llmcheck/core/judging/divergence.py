"""First divergence and attribution: where the error shows first, and where it is introduced.

The *first divergence* is the first failing row in golden execution order. That is rarely
where the defect is -- everything downstream of a defect carries its error -- so each row is
held against the rows that fed it (:mod:`llmcheck.core.judging.feeders`) and judged by the error it
**adds**, against the error this place **should** add at this precision:

* **Noise twin** (``compare --noise-path``): a third run, the golden program at the my-run's
  precision. Its error at each tensor is the honest rounding noise there; a row fails when
  its error is well above its twin's (:data:`TWIN_FAIL_FACTOR`), even under the dtype table's
  fail line, and passes below that line when its error is the twin's. The twin never excuses
  a row past the table's fail line. A row whose golden record has no twin record is judged
  as without a twin (repeats, carried error, the dtype table).
* **Bit-exact feeders**: a row whose feeders agree bit for bit and which does not, by more
  than its dtype's rounding floor, introduces the difference itself.
* **Repeated structure** (:mod:`llmcheck.core.judging.repeats`): the same module in the other layers
  shows how much error this place grows and adds; a row far above that (at least
  :data:`OUTLIER_FACTOR` times its expected error, and :data:`SPREAD_Z` robust standard
  deviations past the siblings' own scatter, growing more than every sibling, adding more
  than the rounding floor) fails as introduced even under the dtype's fail threshold.
* **The dtype table** (:mod:`llmcheck.core.judging.verdicts`) still fails what is past it.

Trained weights added four guards (``benchmarks/real_model_zoo.py``): a module's output is also
held against the absolute errors of the parts of its sum (a cancelling residual add is not a
defect); a growth under :data:`MIN_GROWTH` never introduces; the rows before a step's first
introduced row are judged again without the siblings after it; and in reduced precision without
a twin, a modest excess is a *suspect* (a warning) until the failure it hands on confirms it.
Greedy decodes added two more: a row past the dtype table's line that grows what it received
less than :data:`MIN_GROWTH` times (or than its repeats predict) warns, as rounding noise
accumulated upstream; and a decode step's modest excess that its record showed half as large
at the first step (a generate's prefill) is a suspect.

A failing row is *introduced* when no feeder fails, *inherited* when a feeder fails and this
row carries that error on (rows that carry at least :data:`CARRY_FRACTION` of a failing
feeder's error fail with it), *amplified* when a feeder fails but this row adds error beyond
its baseline, *inherited from an unmatched op* when a record only one run has produced its
input, *encloses* when it is a module whose output fails only because an introduced row lies
inside it, and *unknown* when nothing fed it. A row that fails the dtype table alone (no rule
above says it adds error) after an introduced row of its step, outside that row, is
*inherited* too, as are another output of an introduced call and the same weights met again:
with one defect, one row is introduced. The first *introduced* row in execution order is the
deepest module whose inputs agree and whose output does not.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmcheck.core.dtypes import is_float_dtype
from llmcheck.core.judging.feeders import FeederIndex, Feeding, ParentLinks, unmatched_producers
from llmcheck.core.judging.op_replay import OpReplay
from llmcheck.core.judging.repeats import Baseline, SiblingGroup, SiblingLines, sibling_groups, structure_keys
from llmcheck.core.judging.row_table import (
    RowTable,
    c_integers,
    first_in_golden_order,
    in_order,
    row_field,
    rows_at,
    rows_where,
)
from llmcheck.core.judging.suspects import INHERITED_FROM_UNMATCHED, MY_ONLY_SUFFIX
from llmcheck.core.judging.verdicts import NONFINITE_METRIC, golden_more_precise
from llmcheck.core.judging.weights import WeightFinding
from llmcheck.core.op_calls import CallId
from llmcheck.core.records import (
    IO_INPUT,
    IO_OUTPUT,
    VERDICT_ERROR,
    VERDICT_FAIL,
    VERDICT_PASS,
    VERDICT_WARN,
    ComparisonRow,
    MetricResult,
    TensorRecord,
    build_row,
    error_growth,
    metric_value,
)

INTRODUCED = "introduced"
INHERITED = "inherited"
AMPLIFIED = "amplified"
ENCLOSES = "encloses"
#: A warning row whose excess over its expected error the evidence cannot separate from noise.
SUSPECT = "suspect"
UNKNOWN = "unknown"
#: A failing row whose error exceeds its failing feeders' by this factor is labelled amplified.
AMPLIFICATION_FACTOR = 10.0
#: A row fails with its failing feeder when it carries at least this fraction of the feeder's error.
CARRY_FRACTION = 0.5
#: A row fails as introduced when its error is this many times the error its siblings predict.
OUTLIER_FACTOR = 2.0
#: ... and add more than this many rounding floors beyond it: trained models have single layers
#: that add three units of round-off more than their siblings, a defect worth finding adds more.
GROWTH_FLOOR_FACTOR = 4.0
#: ... or this many on statistics alone across precisions, where the error is a bound on the L2 norms:
#: a tensor whose norm a few massive elements dominate (a trained model's MLP product) carries their
#: rounding undiluted into its norm, up to four units, while its inputs' norms average theirs away.
STATISTICS_FLOOR_FACTOR = 8.0
#: ... unless the row is this many times its expected error (a bound that small, that far out, is a defect).
STATISTICS_DECISIVE_FACTOR = 16.0
#: ... and grow the error it received at least this much: a row that passes on what it was fed
#: (``error grows 1.01x here``) adds nothing, whatever its siblings do with theirs.
MIN_GROWTH = 1.5
#: ... or this many robust standard deviations of the siblings' own scatter around their line, if more.
SPREAD_Z = 4.0
#: Without a noise twin, in a reduced precision against a more precise golden, a growth anomaly
#: under this many times its expected error is a suspect (a warning naming how to settle it),
#: not a failure: on SmolLM2's clean bf16 and fp16 runs honest anomalies reach 2.5x, and real
#: defects start near 2.2x (benchmarks/real_model_zoo.py).
DECISIVE_FACTOR = 4.0
#: ... unless it is this many times past the farthest of its siblings above their line: one
#: defective layer among repeats that agree stands out at a smaller excess than one among
#: repeats that scatter (SmolLM2's attention cores: 1.5x, its honest outlier 2.5x).
SIBLING_MARGIN = 2.0
#: The judged classes where honest rounding noise is large enough to look like a defect.
REDUCED_PRECISIONS = frozenset({"fp16", "bf16", "fp8"})
#: With a noise twin, a row warns / fails when its error is this many times its twin's.
TWIN_WARN_FACTOR = 1.5
TWIN_FAIL_FACTOR = 3.0
#: The smallest error that is a defect rather than rounding or reduction order, per judged class:
#: about one unit round-off in the low precisions, and what another kernel's summation order
#: gives in fp32. An error below it is never *introduced* on growth or exactness alone.
ROUNDING_FLOOR = {"fp64": 1e-12, "fp32": 1e-6, "fp16": 4.9e-4, "bf16": 3.9e-3, "fp8": 6.3e-2}

#: Below this, a difference behind bit-exact inputs at equal dtypes is summation order, not a defect:
#: another fp32 kernel reorders its sums; in fp16 and bf16 any difference behind exact inputs counts.
EXACT_FLOOR = {"fp64": 1e-12, "fp32": 1e-6}

#: How many times at most the rows before a step's first introduced row are judged again without the siblings after it.
CUTOFF_PASSES = 3

#: Pseudo-metrics naming why a row failed beyond the dtype table (``deciding_metric``).
GROWTH_METRIC = "error_vs_expected"
TWIN_METRIC = "error_vs_noise_twin"
TWIN_DIFFERENCE_METRIC = "differs_from_noise_twin"
EXACT_INPUTS_METRIC = "error_with_exact_inputs"
CARRIED_METRIC = "carried_error"
WEIGHTS_METRIC = "weights_beyond_rounding"
#: The label of each metric a row can fail on that is not a registered metric.
PSEUDO_METRICS = (
    GROWTH_METRIC,
    TWIN_METRIC,
    TWIN_DIFFERENCE_METRIC,
    EXACT_INPUTS_METRIC,
    CARRIED_METRIC,
    WEIGHTS_METRIC,
)


@dataclass(frozen=True)
class ErrorMeasure:
    """Which metric values are a row's error: the error measure, or its statistics-only lower bound."""

    metric: str
    statistics_bound: str | None = None

    def of(self, row: ComparisonRow) -> float | None:
        """Return the row's error, or None where it has none (an error row, an int tensor)."""
        for name in (self.metric, self.statistics_bound):
            value = metric_value(row.metrics, name) if name else None
            if value is not None and math.isfinite(value):
                return value
        return None


def _golden_size(row: ComparisonRow) -> float | None:
    """Return the golden tensor's L2 norm (its statistics), the scale its relative error is measured against."""
    stats = row.golden_stats or row.golden.stats
    norm = stats.l2norm if stats is not None else None
    return norm if norm is not None and math.isfinite(norm) and norm > 0 else None


def _floor(row: ComparisonRow) -> float:
    return ROUNDING_FLOOR.get(row.judged_as, ROUNDING_FLOOR["fp32"])


def _recast(metrics: Mapping[str, MetricResult], verdict: str, only: str | None = None) -> dict[str, MetricResult]:
    """Return the results with the verdict ``verdict`` (those whose verdict is ``only``, else all), values and thresholds kept."""
    return {
        name: result
        if only is not None and result.verdict != only
        else MetricResult(
            result.name, result.value, verdict, result.warn_threshold, result.fail_threshold, result.higher_is_better
        )
        for name, result in metrics.items()
    }


def _slot(row: ComparisonRow) -> Hashable:
    key = row.golden.key
    return (key.io, key.position, key.step, key.call_index, key.moment, row.golden.op_type, tuple(row.golden.shape))


def _excess_key(row: ComparisonRow) -> tuple[Hashable, ...]:
    """Return what names a record the same at every step: its name, io, position, call and moment."""
    key = row.golden.key
    return (key.name, key.io, key.position, key.call_index, key.moment)


def _label_text(record: TensorRecord) -> str:
    return record.key.label()


class ExcessHistory:
    """How far each record stood above its siblings' line at the compare's first step: a decode's prefill.

    A trained model has layers whose honest rounding noise grows more than their repeats'
    (SmolLM2's layer-8 attention core in bf16: 1.7x its siblings' line in the prefill, 1.9-3.0x
    at the decode steps after). Judged a step at a time, its excess at one decode step crossed
    the line a defect crosses, and a clean generate named it. The prefill runs the same code on
    every prompt token: a record that stood out there by half as much shows its own noise at a
    later step, not a defect that step introduced. A defect of the decode alone (a cache
    written wrong) is on the line in the prefill, and stands out from it. Only the first step
    is the reference: a decode-only defect's own first, smaller excess must not excuse its next.

    The ratios are noted in the first step's first judging pass alone, a step judged by its own
    rows: what a later step reads is the same however the steps are cut into windows.
    """

    __slots__ = ("_first", "_step")

    def __init__(self) -> None:
        #: record key -> (the first step, its largest ratio there)
        self._first: dict[tuple[Hashable, ...], tuple[int, float]] = {}
        self._step: int | None = None  # the compare's first step noted: the only one noted

    def takes(self, step: int) -> bool:
        """Return whether ratios of ``step`` are noted: the compare's first judged step alone (asked per row)."""
        return self._step is None or step == self._step

    def note(self, key: tuple[Hashable, ...], step: int, ratio: float) -> None:
        """Note a record's error over its siblings' prediction at the first step."""
        if self._step is None:
            self._step = step
        if step != self._step:
            return
        first = self._first.get(key)
        if first is None or ratio > first[1]:
            self._first[key] = (step, ratio)

    def before(self, key: tuple[Hashable, ...], step: int) -> tuple[int, float] | None:
        """Return the record's first step and its ratio there, where that step came before ``step``; else None."""
        first = self._first.get(key)
        return first if first is not None and first[0] < step else None


@dataclass
class AcrossSteps:
    """What the judges of a compare's steps share, made once: parent links, my-only producers, name templates.

    A step's records may be enclosed by a module whose parent link an earlier step's record
    gives; a my-only producer is found by the identity of the tensor it made; and every step
    of a decode dump repeats the same names, whose candidate templates are found once.
    """

    links: ParentLinks
    unmatched: Mapping[tuple[Hashable, ...], TensorRecord]
    templates: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    excess: ExcessHistory = field(default_factory=ExcessHistory)


class _Judge:
    """Walks the rows in golden order once, judging each against its feeders, siblings and twin.

    Everything a row is judged by is known by its position in golden order: its feeders and
    parts are positions (:class:`~llmcheck.core.judging.feeders.Feeding`), and what the walk
    has judged is a list by position, not a map keyed by ``id(row)``. A row is judged by the
    rows of its own step alone -- its feeders and its siblings lie in its step -- so a step can
    be judged again without the others (:meth:`rejudge`).
    """

    def __init__(
        self,
        rows: Sequence[ComparisonRow],
        measure: ErrorMeasure,
        twin: NoiseTwin | None,
        shared: AcrossSteps,
        same_program: bool = False,
        weights: Mapping[int, WeightFinding] | None = None,
        replay: OpReplay | None = None,
    ) -> None:
        self.same_program = same_program
        self.replay = replay
        self.excess = shared.excess
        #: whether the excess over the siblings' line is noted (the first pass; not a cutoff's pass again)
        self.noting = True
        #: positions of the op outputs a replay cleared, and of the inputs that are those very tensors
        self.cleared: set[int] = set()
        self.weights = weights or {}
        #: where each row of golden order stands in ``rows`` (the order :func:`attribute` gives them back in)
        # an array, not a list: a list holds an int object (28 bytes) per row through judging
        orders = np.fromiter((row.golden.order for row in rows), dtype=np.int64, count=len(rows))
        self.given_at = np.argsort(orders, kind="stable")  # as sorted() orders them, equal orders kept in turn
        self.ordered = [rows[given] for given in self.given_at]
        self.measure = measure
        self.twin = twin
        self.steps = [row.golden.key.step for row in self.ordered]
        # what each row holds, by its position in golden order
        self.error_at = [measure.of(row) for row in self.ordered]
        self.feeders = FeederIndex(self.ordered, shared.links, shared.unmatched)
        self.feeding = [self.feeders.feeding(row) for row in self.ordered]
        # each row's slot by a number (equal slots, equal numbers): hashed once here, not in every lookup after
        numbers: dict[Hashable, int] = {}
        slots = [numbers.setdefault(_slot(row), len(numbers)) for row in self.ordered]
        self.places = structure_keys(
            [(row.golden.key.name, slot) for row, slot in zip(self.ordered, slots)], shared.templates
        )
        self.feeder_errors = [self._received_error(row, feeding) for row, feeding in zip(self.ordered, self.feeding)]
        #: position -> what the recorded parts of a module output with bit-exact inputs carry, where its
        #: children rounded their own way inside it (:meth:`_rounded_inside`; see :meth:`_anomaly`)
        self.made_inside: dict[int, float] = {}
        for position, row in enumerate(self.ordered):  # in golden order: a call's inner rows are known before it ends
            # the common case, asked first: exact inputs, exact output
            if self.feeder_errors[position] == 0 and self.error_at[position]:
                carried = self._rounded_inside(row)
                if carried > 0:
                    self.made_inside[position] = carried
        self.feeders.release_lookups()  # every row's feeders and parts are known: only the parent links are read on
        # the sibling groups (positions, in golden order) and the step each lies in (its slot says it lies in one)
        self.groups = [(self.steps[positions[0]], positions) for positions in sibling_groups(self.places, slots)]
        #: each row's member number in its sibling group (0 without one): the same whatever a cutoff leaves out
        self.member_at = [0] * len(self.ordered)
        for _, positions in self.groups:
            for member, position in enumerate(positions):
                self.member_at[position] = member
        self.sibling_group = self._sibling_groups({}, None)
        #: each row as judged so far (the row itself until the walk reaches it), by position
        self.judged: list[ComparisonRow] = list(self.ordered)
        self.introduced_in_step: dict[int, list[ComparisonRow]] = {}  # step -> its introduced rows, in order
        self.twin_suspects: dict[int, list[int]] = {}  # step -> positions of rows suspected against the twin, in order
        # (step, parameter) -> the row that named it: each step the wrong weights enter the computation anew
        self.weights_named: dict[tuple[int, str], ComparisonRow] = {}
        #: the rows' labels as feeders (made when a row first feeds another) and the sibling growth ranges rows hold
        self.labels: list[str | None] = [None] * len(self.ordered)
        self.growth_ranges: dict[tuple[float, float], tuple[float, float]] = {}

    def _sibling_groups(self, cutoff: Mapping[int, int], steps: Set[int] | None) -> list[SiblingGroup | None]:
        """Return, by position, the row's sibling group (None without siblings); its member number there is :attr:`member_at`.

        A row before its step's cutoff (an earlier pass's first introduced row) sees only the
        siblings before that cutoff: what comes after a defect must not move a verdict before it.
        Only the groups of ``steps`` (None: all) are made: the others' rows are not judged.
        """
        by_position: list[SiblingGroup | None] = [None] * len(self.ordered)
        lines = SiblingLines()  # the groups of a size have their lines made together, as they are asked
        for step, positions in self.groups:
            if steps is not None and step not in steps:
                continue
            indexes = [self.places[position].index for position in positions]  # type: ignore[union-attr]
            points = [self._point(position) for position in positions]
            group = SiblingGroup(indexes, points, lines)
            limit = cutoff.get(step)
            before = (
                SiblingGroup(indexes, [point if p < limit else None for p, point in zip(positions, points)], lines)
                if limit is not None and positions[0] < limit <= positions[-1]
                else group
            )
            for position in positions:
                by_position[position] = before if limit is not None and position < limit else group
        return by_position

    def rejudge(self, cutoff: Mapping[int, int], steps: Set[int]) -> None:
        """Judge the rows of ``steps`` again, the rows before each step's cutoff by the siblings before it alone.

        The other steps' rows keep their verdicts: nothing of another step enters them.
        """
        self.noting = False
        self.sibling_group = self._sibling_groups(cutoff, steps)
        for position, step in enumerate(self.steps):
            if step in steps:
                self.judged[position] = self.ordered[position]
        for step in steps:
            self.introduced_in_step.pop(step, None)
            self.twin_suspects.pop(step, None)
        self.weights_named = {named: row for named, row in self.weights_named.items() if named[0] not in steps}
        self.run(steps)

    def _feeder_error(self, feeding: Feeding) -> float | None:
        known = [error for feeder in feeding.positions if (error := self.error_at[feeder]) is not None]
        return max(known) if known else None

    def _received_error(self, row: ComparisonRow, feeding: Feeding) -> float | None:
        """Return the error a row received: its largest feeder error, or what the parts of its sum carry, if more.

        The parts' errors are absolute: the two largest, added, bound the error of a sum of
        them (the triangle inequality), and relative to this row's own size they are the error
        its inputs explain. Where the parts nearly cancel, that is far more than any feeder's
        relative error -- and a module that only adds them must not be called the culprit.
        """
        feeder_error = self._feeder_error(feeding)
        if not feeder_error:  # bit-exact inputs explain no error, whatever the parts carry (but see made_inside)
            return feeder_error
        return max(feeder_error, self._carried_by_parts(row))

    def _rounded_inside(self, row: ComparisonRow) -> float:
        """Return what the parts of a module output carry when its children made that error by rounding alone, else 0.

        Across programs a module fed bit-exact inputs holds children that sum in their own order
        (a decoder layer fed the embedding: vLLM's projections against transformers'), and its
        output holds what they made. That is rounding only where every row of its call that was
        itself fed bit-exact inputs stays within its exact floor, and what its own parts carry
        where it is such a module: one that departs further (code no recorded submodule runs, an
        attention core with a wrong rotary base, seen at ``o_proj``'s input) made an error there
        that the module must not be excused.
        """
        if self.same_program:
            return 0.0
        carried = self._carried_by_parts(row)
        if not carried:
            return 0.0
        for inner in self.feeders.call_span(row):
            if self.feeder_errors[inner] == 0 and (self.error_at[inner] or 0.0) > EXACT_FLOOR.get(
                self.ordered[inner].judged_as, 0.0
            ) + self.made_inside.get(inner, 0.0):
                return 0.0
        return carried

    def _carried_by_parts(self, row: ComparisonRow) -> float:
        """Return the error the parts of a module's output carry, relative to its size (0 where it is no sum of parts).

        The two largest absolute errors of the parts, added, bound the error of their sum (the
        triangle inequality). Asked while the feeders' lookups are held (:meth:`__init__`).
        """
        parts = self.feeders.parts(row)  # most rows are no sum of parts: asked before the row's size
        size = _golden_size(row) if parts else None
        if not size:
            return 0.0
        carried = sorted(
            (
                error * part_size
                for part in parts
                if (error := self.error_at[part]) is not None and (part_size := _golden_size(self.ordered[part]))
            ),
            reverse=True,
        )
        return sum(carried[:2]) / size

    def _point(self, position: int) -> tuple[float, float] | None:
        """Return the row's (feeder error, error) as its siblings' baselines see it, None where one is unknown."""
        error, feeder_error = self.error_at[position], self.feeder_errors[position]
        return (feeder_error, error) if error is not None and feeder_error is not None else None

    def baseline(self, position: int) -> Baseline | None:
        """Return what the row's repeats in the other layers say, or None where it has none."""
        group = self.sibling_group[position]
        if group is None:
            return None
        return group.baseline(self.member_at[position], _floor(self.ordered[position]))

    def run(self, steps: Set[int] | None = None) -> list[ComparisonRow]:
        """Judge the rows of ``steps`` (None: all) in golden order; return every row as judged, by position."""
        for position, row in enumerate(self.ordered):
            if steps is None or self.steps[position] in steps:
                self.judged[position] = self._judge(position, row)
        self._mark_enclosing(steps)
        return self.judged

    def _judge(self, position: int, row: ComparisonRow) -> ComparisonRow:
        error = self.error_at[position]
        feeding = self.feeding[position]
        feeder_error = self.feeder_errors[position]
        place = self.places[position]
        baseline = self.baseline(position) if place is not None else None
        growth = error_growth(error, feeder_error)
        # a row whose golden record has no twin record is judged as without a twin
        twin = self.twin.errors.get(id(row.golden)) if self.twin is not None else None
        twin_row = self.twin.against_my.get(id(row.my)) if self.twin is not None and twin is not None else None
        expected = (
            twin
            if twin is not None
            else (baseline.expected(feeder_error) if baseline is not None and feeder_error is not None else None)
        )
        if self.noting and twin is None and error and expected and self.excess.takes(row.golden.key.step):
            self.excess.note(_excess_key(row), row.golden.key.step, error / expected)
        fed_by = tuple([self._feeder_label(feeder) for feeder in feeding.positions])
        if feeding.unmatched:
            fed_by += tuple(_label_text(record) + MY_ONLY_SUFFIX for record in feeding.unmatched)
        # most rows add no result: they share the measured ones rather than hold a copy each
        verdict, deciding = row.verdict, row.deciding_metric
        metrics: Mapping[str, MetricResult] = row.metrics
        evidence = ""
        judgeable = (
            error is not None
            and row.verdict != VERDICT_ERROR
            and not row.nonfinite_mismatch
            and is_float_dtype(row.golden.dtype)
            and is_float_dtype(row.my.dtype)
        )
        failing_feeders = [feeder for feeder in feeding.positions if self.judged[feeder].verdict == VERDICT_FAIL]
        anomaly: tuple[str, float, float, str] | None = None
        suspect = False
        if judgeable:
            assert error is not None
            if twin is not None:
                verdict, deciding, metrics, evidence = self._twin_verdict(row, error, twin, metrics)
                if verdict == VERDICT_FAIL and deciding == TWIN_METRIC and not failing_feeders:
                    verdict, metrics, evidence = self._twin_drift(feeding, error, twin, growth, metrics, evidence)
                elif (
                    verdict == VERDICT_WARN
                    and deciding == TWIN_METRIC
                    and not failing_feeders
                    and self._twin_suspect(feeding, error, twin, growth)
                ):
                    suspect = True
                    evidence += f"; its inputs are within {max(self._carried_twin_ratio(feeding), 1.0):.3g}x theirs"
            anomaly = (
                self._twin_anomaly(twin_row)
                if twin is not None
                else self._anomaly(
                    row, error, feeding, feeder_error, growth, baseline, self.made_inside.get(position, 0.0)
                )
            )
            if (
                anomaly is not None
                and verdict != VERDICT_FAIL
                and not failing_feeders
                and self._in_noise(row, anomaly, baseline)
            ):
                # reduced precision, no twin, a modest excess: the evidence cannot tell it from noise
                name, value, limit, evidence = anomaly
                verdict, deciding, suspect = VERDICT_WARN, name, True
                metrics = {**metrics, name: MetricResult(name, value, VERDICT_WARN, limit, DECISIVE_FACTOR)}
                first = self._stood_out_first(row, value)
                evidence += (
                    (f"; {first}" if first else "")
                    + f"; in {row.judged_as} against a more precise golden, siblings alone cannot tell this from "
                    "rounding noise: a noise twin settles it (compare --noise-path)"
                )
            elif anomaly is not None and verdict != VERDICT_FAIL and not failing_feeders:
                name, value, limit, evidence = anomaly
                verdict, deciding = VERDICT_FAIL, name
                metrics = {**metrics, name: MetricResult(name, value, VERDICT_FAIL, None, limit)}
            elif anomaly is not None and not evidence:
                evidence = anomaly[3]
            if (
                twin_row is not None
                and twin_row.verdict == VERDICT_FAIL
                and verdict != VERDICT_FAIL
                and failing_feeders
            ):
                # Downstream of a defect, the my-run departs from its twin: the error is carried on.
                verdict, deciding = VERDICT_FAIL, TWIN_DIFFERENCE_METRIC
                departs = MetricResult(TWIN_DIFFERENCE_METRIC, twin_row.error or 0.0, VERDICT_FAIL, None, 0.0)
                metrics = {**metrics, TWIN_DIFFERENCE_METRIC: departs}
                evidence = f"departs from the noise twin by {twin_row.error or 0.0:.3g}, as its inputs do"
            elif twin is None and failing_feeders and verdict != VERDICT_FAIL and not feeding.guessed:
                carried = max((self.error_at[feeder] or 0.0) for feeder in failing_feeders)
                if carried > 0 and error >= CARRY_FRACTION * carried and error > _floor(row):
                    verdict, deciding = VERDICT_FAIL, CARRIED_METRIC
                    carries = MetricResult(CARRIED_METRIC, error / carried, VERDICT_FAIL, None, CARRY_FRACTION)
                    metrics = {**metrics, CARRIED_METRIC: carries}
                    evidence = (
                        f"carries the error of {self.ordered[failing_feeders[0]].golden.key.label()} "
                        f"({carried:.3g} there, {error:.3g} here)"
                    )
        weight = self.weights.get(row.index)
        if weight is not None:  # a leaf: whatever fed the op, these values were loaded wrong
            verdict, deciding, evidence = VERDICT_FAIL, WEIGHTS_METRIC, weight.evidence
            metrics = {**metrics, WEIGHTS_METRIC: MetricResult(WEIGHTS_METRIC, weight.count, VERDICT_FAIL, None, 0.0)}
        self.cleared.discard(position)  # judged again after a cutoff: decided anew
        if verdict == VERDICT_FAIL and weight is None and twin is None and not failing_feeders:
            cleared = self._cleared_by_replay(row, error, feeding)
            if cleared is not None:
                self.cleared.add(position)
                verdict, metrics, evidence = VERDICT_WARN, _recast(metrics, VERDICT_WARN, only=VERDICT_FAIL), cleared
            elif anomaly is None and deciding == row.deciding_metric and deciding != NONFINITE_METRIC:
                accumulated = self._accumulated_noise(row, error, feeding, feeder_error, expected)
                if accumulated is not None:
                    verdict, metrics = VERDICT_WARN, _recast(metrics, VERDICT_WARN, only=VERDICT_FAIL)
                    evidence = accumulated
        if metrics is not row.metrics and metrics == row.metrics:
            metrics = row.metrics
        attribution = SUSPECT if suspect and verdict == VERDICT_WARN else row.attribution
        if attribution == SUSPECT and twin is not None:
            self.twin_suspects.setdefault(row.golden.key.step, []).append(position)
        if verdict == VERDICT_FAIL:
            attribution, why = self._attribution(row, error, feeding, failing_feeders, anomaly, weight, evidence)
            if why:
                evidence = why
            confirmed = (
                self._confirmed_suspect(feeding, error) if attribution == INTRODUCED and weight is None else None
            )
            if (
                confirmed is None
                and attribution == INTRODUCED
                and weight is None
                and twin is not None
                and error is not None
                and error < DECISIVE_FACTOR * twin
            ):
                confirmed = self._confirmed_twin_suspect(row)
            if confirmed is not None:
                attribution = INHERITED
                evidence = (
                    f"carries the error of {self.ordered[confirmed].golden.key.label()}, where it is introduced "
                    f"({self.error_at[confirmed] or 0.0:.3g} there, {error or 0.0:.3g} here)"
                )
            if attribution == INTRODUCED:
                self.introduced_in_step.setdefault(row.golden.key.step, []).append(row)
        # every field named, cheaper than with_changes once per row: a field ComparisonRow gains is carried here too
        return build_row(
            index=row.index,
            golden=row.golden,
            my=row.my,
            rule=row.rule,
            metrics=metrics,
            verdict=verdict,
            deciding_metric=deciding,
            reason=row.reason,
            golden_stats=row.golden_stats,
            my_stats=row.my_stats,
            nonfinite_mismatch=row.nonfinite_mismatch,
            attribution=attribution,
            fed_by=fed_by,
            judged_as=row.judged_as,
            error=error,
            feeder_error=feeder_error,
            growth=growth,
            structure=place.structure if place is not None else "",
            layer_index=place.index if place is not None else None,
            sibling_growth=(
                self._growth_range(baseline.growth_low, baseline.growth_high)
                if baseline is not None and math.isfinite(baseline.growth_low)
                else None
            ),
            sibling_count=baseline.sibling_count if baseline is not None else 0,
            noise_error=twin,
            expected_error=expected,
            evidence=evidence,
        )

    def _feeder_label(self, position: int) -> str:
        """Return the label of the golden record at ``position``, one string however many rows it feeds."""
        label = self.labels[position]
        if label is None:
            label = self.labels[position] = _label_text(self.ordered[position].golden)
        return label

    def _growth_range(self, low: float, high: float) -> tuple[float, float]:
        """Return ``(low, high)``, the tuple an earlier row of this step holds if one holds the same.

        Left out of a sibling group, a member sees the group's lowest and highest growth unless
        it is one of them: most of a group's rows hold one range, which one tuple serves.
        """
        growth_range = (low, high)
        return self.growth_ranges.setdefault(growth_range, growth_range)

    def _cleared_by_replay(self, row: ComparisonRow, error: float | None, feeding: Feeding) -> str | None:
        """Return why a row that would fail adds no error (the evidence), else None.

        An op output is cleared when its call, replayed, computes what it was given -- only
        where it is fed by its own call's inputs, each produced by a recorded op or within
        rounding of the golden's: an input that differs from nothing before it (a wrong weight,
        a buffer) is where an error enters, and a replay from it would clear the op that
        carries it in (:mod:`llmcheck.core.judging.op_replay`). The input of the next op that
        is the very tensor a cleared op made (no more error than it) is cleared with it.
        """
        if self.replay is None or feeding.guessed or not feeding.positions or error is None:
            return None
        if row.golden.key.io != IO_OUTPUT:
            if len(feeding.positions) != 1 or feeding.positions[0] not in self.cleared:
                return None
            producer = feeding.positions[0]
            carried = self.error_at[producer]
            if carried is None or error > carried:
                return None
            made = self.ordered[producer].golden.key.label()
            return f"the tensor {made} made, an op whose replay computes what it is given ({carried:.3g} there)"
        for position in feeding.positions:
            own = self.feeding[position]
            produced = not own.guessed and bool(own.positions or own.unmatched)
            received = self.error_at[position]
            if not produced and (received is None or received > _floor(self.ordered[position])):
                return None
        received = self._feeder_error(feeding)
        if received is None or received <= _floor(row):
            # inputs within rounding hand on no error to amplify: one that appears here was made here, even if
            # by an argument below the floor's notice (an epsilon of 1e-2 moves variance + eps by 7e-8, rsqrt
            # then shows it where the variance is small)
            return None
        replayed = self.replay.computes_its_inputs(row.golden, row.my)
        if replayed is None:
            return self._carried_from_cleared(row, error, feeding)
        return f"{replayed}; its error ({error:.3g}) came in with its inputs ({received:.3g}), which this op amplifies"

    def _accumulated_noise(
        self,
        row: ComparisonRow,
        error: float | None,
        feeding: Feeding,
        received: float | None,
        expected: float | None,
    ) -> str | None:
        """Return why a row past the dtype table's line adds no error of its own (the evidence), else None.

        In a reduced precision against a more precise golden, rounding noise accumulates layer
        by layer, and at some row it crosses the table's fixed line: a greedy decode's single
        tokens carry no massive activation to dilute it, so SmolLM2's clean fp16 decode crosses
        0.012 at step 6 in layer 12's ``down_proj``, which received 0.0117 and grew it 1.08x, as
        its repeats predicted. A row whose inputs already carry error, and whose own error is no
        more than :data:`MIN_GROWTH` times that, or than what its repeats predict from it (a
        product's error is its factors' added), shows nothing a defect added: it warns. A noise
        twin settles it; without one, a defect below that is below the noise. What it received
        is its inputs' error, or what the parts
        of its sum carry where more (:meth:`_received_error`: a residual add that nearly cancels);
        behind an introduced row of its step -- a part holding a defect is one, judged before the
        module it lies in -- a row past the line carries that defect on (:meth:`_attribution`),
        and fed by a suspect it settles that doubt (:meth:`_confirmed_suspect`): the error it
        received is the suspect's.
        """
        if (
            error is None
            or received is None
            or self.introduced_in_step.get(row.golden.key.step)
            or any(self.judged[feeder].attribution == SUSPECT for feeder in feeding.positions)
            or self.same_program
            or row.judged_as not in REDUCED_PRECISIONS
            or not golden_more_precise(row.golden.dtype, row.judged_as)
            or received <= _floor(row)
        ):
            return None
        explained = MIN_GROWTH * max(received, expected or 0.0)
        if error > explained:
            return None
        predicted = f"; its repeats predict {expected:.3g}" if expected is not None else ""
        return (
            f"past the {row.judged_as} line, but it grows the error its inputs carry {error / received:.3g}x "
            f"({received:.3g} -> {error:.3g}{predicted}): rounding noise accumulated upstream crosses the line "
            f"here, in {row.judged_as} against a more precise golden; a noise twin settles it (compare --noise-path)"
        )

    def _carried_from_cleared(self, row: ComparisonRow, error: float, feeding: Feeding) -> str | None:
        """Return why a statistics-only op output no replay speaks for carries on a cleared op's error, else None.

        On statistics alone only a pointwise op replays, on its recorded extremes. The op after
        a cleared one (a norm's mean of the squares) receives the error that op amplified:
        where each of its inputs is a tensor a cleared op made and it grows their error less
        than :data:`MIN_GROWTH` times, nothing tells its own error from what it was handed.
        """
        if row.golden.data is not None and row.my.data is not None:
            return None
        if not feeding.positions or any(position not in self.cleared for position in feeding.positions):
            return None
        received = max((self.error_at[position] or 0.0) for position in feeding.positions)
        if not received > 0 or error >= MIN_GROWTH * received:
            return None
        made = self.ordered[feeding.positions[0]].golden.key.label()
        return (
            f"on statistics alone no replay speaks for this op; it grows the error of {made}, the tensor a cleared "
            f"op made, {error / received:.3g}x ({received:.3g} -> {error:.3g}): it carries that error on"
        )

    def _attribution(
        self,
        row: ComparisonRow,
        error: float | None,
        feeding: Feeding,
        failing_feeders: Sequence[int],
        anomaly: tuple[str, float, float, str] | None,
        weight: WeightFinding | None,
        evidence: str,
    ) -> tuple[str, str]:
        """Return a failing row's label, and the evidence that replaces its own when one defect was named already.

        One defect, one introduced row: another output of a call already introduced, the same
        weights met again (a transposed view of them), and a row that fails the dtype table
        alone behind an introduced row carry that defect on rather than introduce one.
        """
        earlier = self.introduced_in_step.get(row.golden.key.step, [])
        same_call = next((r for r in earlier if CallId.of(r.golden) == CallId.of(row.golden)), None)
        if same_call is not None:
            return INHERITED, f"the same call's {same_call.golden.key.label()} is where the error is introduced"
        if weight is not None:  # a leaf: whatever fed the op, these values were loaded wrong
            named = (row.golden.key.step, weight.parameter)
            if named in self.weights_named:
                first = self.weights_named[named]
                return INHERITED, f"the same weights as {first.golden.key.label()}: {weight.evidence}"
            self.weights_named[named] = row
            return INTRODUCED, ""
        label = self._label(row, error, feeding, failing_feeders, anomaly)
        if label == INHERITED and not failing_feeders and not evidence and earlier:
            return label, (
                f"fails the dtype table, but nothing shows it adds error here: "
                f"it most likely carries on {earlier[0].golden.key.label()}"
            )
        return label, ""

    def _twin_verdict(
        self, row: ComparisonRow, error: float, twin: float, metrics: Mapping[str, MetricResult]
    ) -> tuple[str, str | None, dict[str, MetricResult], str]:
        """Return the verdict against the noise twin: the error against the twin's error at this tensor.

        The twin tells noise from defect under the dtype table's fail line, and fails a row the
        table passes; it never passes a row past that line: a twin as wrong as the my-run (the
        my-run itself, a twin with the same defect) would hide the defect.
        """
        floor = _floor(row)
        fail_limit = max(TWIN_FAIL_FACTOR * twin, twin + floor)
        warn_limit = max(TWIN_WARN_FACTOR * twin, twin + floor / 2)
        verdict = VERDICT_FAIL if error > fail_limit else VERDICT_WARN if error > warn_limit else VERDICT_PASS
        ratio = error / twin if twin > 0 else (math.inf if error > 0 else 1.0)
        against_twin = MetricResult(TWIN_METRIC, ratio, verdict, TWIN_WARN_FACTOR, TWIN_FAIL_FACTOR)
        if row.verdict == VERDICT_FAIL and verdict != VERDICT_FAIL:
            table = row.metrics.get(row.deciding_metric or "")
            past = (
                f" ({table.name} {table.value:.6g} {'<' if table.higher_is_better else '>'} {table.fail_threshold:.6g})"
                if table is not None and table.value is not None and table.fail_threshold is not None
                else ""
            )
            evidence = (
                f"fails the dtype table{past}, which the noise twin never excuses "
                f"(error {error:.3g} here, {twin:.3g} in the twin)"
            )
            return VERDICT_FAIL, row.deciding_metric, {**metrics, TWIN_METRIC: against_twin}, evidence
        metrics = _recast(metrics, VERDICT_PASS)
        metrics[TWIN_METRIC] = against_twin
        evidence = (
            f"error {error:.3g} against {twin:.3g} in the noise twin ({ratio:.3g}x)" if verdict != VERDICT_PASS else ""
        )
        return verdict, TWIN_METRIC, metrics, evidence

    def _carried_twin_ratio(self, feeding: Feeding) -> float:
        """Return the largest error-over-twin ratio among a row's feeders (0 where none has a twin)."""
        carried = 0.0
        for feeder in feeding.positions:
            feeder_twin = self.twin.errors.get(id(self.ordered[feeder].golden)) if self.twin is not None else None
            feeder_error = self.error_at[feeder]
            if feeder_twin and feeder_error is not None:
                carried = max(carried, feeder_error / feeder_twin)
        return carried

    def _twin_suspect(self, feeding: Feeding, error: float, twin: float, growth: float | None) -> bool:
        """Return whether a row that warns against the twin jumps past its inputs' excess: a defect too small to fail.

        Its excess over the twin is :data:`MIN_GROWTH` times what its inputs carry or more, and it
        grows the error it received as much: where a bf16 port scales one projection by 5 %,
        2.4x the twin's noise there. A suspect is named where a failure it hands on confirms it.
        """
        ratio = error / twin if twin > 0 else math.inf
        carried = max(self._carried_twin_ratio(feeding), 1.0)
        return ratio >= MIN_GROWTH * carried and growth is not None and growth >= MIN_GROWTH

    def _twin_drift(
        self,
        feeding: Feeding,
        error: float,
        twin: float,
        growth: float | None,
        metrics: dict[str, MetricResult],
        evidence: str,
    ) -> tuple[str, dict[str, MetricResult], str]:
        """Return a twin failure as a warning when its inputs are as far past their twins already.

        Another implementation (a serving engine's fused kernels) rounds the residual stream
        its own way: against the twin, its error drifts up layer by layer, 2.8x, 3.1x, 4.1x,
        and crosses the fail line somewhere without any layer adding to it. Like a growth
        under :data:`MIN_GROWTH` (no defect grows an error it received by less), an excess
        over the twin no more than :data:`MIN_GROWTH` times its inputs' own excess is what
        they carry, not a defect here; so is one whose error is smaller than the error its
        inputs handed it (a residual sum the attention's noise enters diluted). A defect's
        excess jumps where it sits: ~1x to 100x, and its error outgrows what it was handed.
        """
        carried = self._carried_twin_ratio(feeding)
        ratio = error / twin if twin > 0 else math.inf
        shrinks = growth is not None and growth < 1.0  # smaller than the error it was handed
        if carried <= 1.0 or (ratio > MIN_GROWTH * carried and not shrinks):
            return VERDICT_FAIL, metrics, evidence
        against_twin = metrics[TWIN_METRIC]
        metrics = {
            **metrics,
            TWIN_METRIC: MetricResult(
                TWIN_METRIC, against_twin.value, VERDICT_WARN, against_twin.warn_threshold, against_twin.fail_threshold
            ),
        }
        return (
            VERDICT_WARN,
            metrics,
            f"{evidence}, but its inputs are {carried:.3g}x theirs already: a drift it carries, not added here",
        )

    def _confirmed_twin_suspect(self, row: ComparisonRow) -> int | None:
        """Return the step's latest twin suspect before ``row``, made introduced, for a failure too weak to be its own.

        Against a noise twin a defect under the fail line warns where it sits and fails further
        on, where the model amplifies it (the logits): a failure no more than
        :data:`DECISIVE_FACTOR` times its twin's, behind a suspect of its step, carries it.
        """
        step = row.golden.key.step
        for earlier in reversed(self.twin_suspects.get(step, [])):
            if self.ordered[earlier].golden.order < row.golden.order:
                return self._confirm(earlier)
        return None

    def _confirm(self, feeder: int) -> int:
        """Make a suspect introduced (its position): the failure it hands on settles the doubt."""
        judged = self.judged[feeder]
        deciding = judged.deciding_metric or GROWTH_METRIC
        settled = judged.metrics.get(deciding)
        metrics = dict(judged.metrics)
        if settled is not None:
            metrics[deciding] = MetricResult(
                settled.name, settled.value, VERDICT_FAIL, None, settled.warn_threshold, settled.higher_is_better
            )
        self.judged[feeder] = judged.with_changes(
            verdict=VERDICT_FAIL,
            attribution=INTRODUCED,
            metrics=metrics,
            evidence=judged.evidence.split("; in ", 1)[0] + "; confirmed by the failure it hands on",
        )
        self.introduced_in_step.setdefault(self.steps[feeder], []).append(self.ordered[feeder])
        return feeder

    def _confirmed_suspect(self, feeding: Feeding, error: float | None) -> int | None:
        """Return a suspect feeder that a failing row confirms, made introduced; None where there is none.

        A suspect is a row whose excess the siblings cannot tell from noise. When the error it
        hands on makes the row it feeds fail (that row carries at least :data:`CARRY_FRACTION`
        of it), the doubt is settled: the error starts at the suspect, and the failing row
        inherits it -- a clean run's noise does not fail the dtype table.
        """
        if error is None or feeding.guessed:
            return None
        for feeder in feeding.positions:
            carried = self.error_at[feeder]
            if self.judged[feeder].attribution != SUSPECT or not carried or error < CARRY_FRACTION * carried:
                continue
            return self._confirm(feeder)
        return None

    def _in_noise(self, row: ComparisonRow, anomaly: tuple[str, float, float, str], baseline: Baseline | None) -> bool:
        """Return whether a growth anomaly is too small to call a defect without a noise twin.

        A golden more precise than the my-run, judged in a reduced precision: there the
        siblings' baseline is a rough guess (a trained model's attention amplifies rounding
        noise by a factor that varies from layer to layer and prompt to prompt), and an excess
        under :data:`DECISIVE_FACTOR` is as often noise as defect -- unless it lies
        :data:`SIBLING_MARGIN` times beyond the farthest sibling, and beyond what the same
        record stood out by at its first step (:class:`ExcessHistory`). Such a row is a
        suspect (it warns, and says how to settle it), never a failure with exit code 3.
        """
        name, ratio = anomaly[0], anomaly[1]
        if (
            name != GROWTH_METRIC
            or self.twin is not None
            or self.same_program
            or row.judged_as not in REDUCED_PRECISIONS
            or not golden_more_precise(row.golden.dtype, row.judged_as)
        ):
            return False
        if _bounds_only(row):
            return ratio < STATISTICS_DECISIVE_FACTOR
        if ratio >= DECISIVE_FACTOR:
            return False
        if self._stood_out_first(row, ratio) is not None:
            return True  # it stood out half as much at its first step: its own noise, not a defect this step introduced
        # far beyond the farthest honest repeat: it stands out, whatever the siblings' line says
        return baseline is None or ratio < SIBLING_MARGIN * baseline.widest_sibling_excess

    def _stood_out_first(self, row: ComparisonRow, ratio: float) -> str | None:
        """Return how far the record stood out at its first step, where that was half this ``ratio`` or more; else None."""
        first = self.excess.before(_excess_key(row), row.golden.key.step)
        if first is None or SIBLING_MARGIN * first[1] < ratio:
            return None
        return f"it stood {first[1]:.3g}x its siblings' line at step {first[0]} too"

    @staticmethod
    def _twin_anomaly(twin_row: ComparisonRow | None) -> tuple[str, float, float, str] | None:
        """Return the anomaly the my-run shows against the noise twin (same precision), if it introduces one there."""
        if twin_row is None or twin_row.verdict != VERDICT_FAIL or twin_row.attribution != INTRODUCED:
            return None
        value = twin_row.error if twin_row.error is not None else math.nan
        why = twin_row.evidence or f"{twin_row.deciding_metric} fails"
        deciding = twin_row.metrics.get(twin_row.deciding_metric or "")
        limit = deciding.fail_threshold if deciding is not None and deciding.fail_threshold is not None else 0.0
        return (
            TWIN_DIFFERENCE_METRIC,
            value,
            limit,
            f"against the noise twin (same program, same precision) it is introduced here: {why}",
        )

    def _anomaly(
        self,
        row: ComparisonRow,
        error: float,
        feeding: Feeding,
        feeder_error: float | None,
        growth: float | None,
        baseline: Baseline | None,
        made_inside: float = 0.0,
    ) -> tuple[str, float, float, str] | None:
        """Return (pseudo-metric, value, limit, evidence) when this row adds error it should not, else None.

        ``made_inside`` is what the recorded parts of a module output with bit-exact inputs carry.

        A row whose input an op only the my-run has produced is judged the same way: it then
        fails as inherited from that op (the label says so), not as introduced.
        """
        if feeder_error is None:
            return None
        # Same precision on both sides: exact inputs must give exact outputs, whatever the
        # size of the difference -- except that another fp32 kernel sums in another order, and
        # another program's module holds children that each did so: its output then differs by
        # what its recorded parts carry (each judged where it was made) and its own sums' order.
        exact_floor = 0.0 if self.same_program else EXACT_FLOOR.get(row.judged_as, 0.0)
        limit = exact_floor + made_inside
        if feeder_error == 0 and row.golden.dtype == row.my.dtype and error > limit and not feeding.guessed:
            why = f"its inputs are bit-exact and it differs by {error:.3g}"
            if made_inside:
                why += f", more than its recorded parts carry ({made_inside:.3g})"
            return (EXACT_INPUTS_METRIC, error, limit, why)
        floor = _floor(row)
        if error <= floor or baseline is None or (feeder_error > 0 and not baseline.saw_received_error):
            return None  # siblings that all received exact inputs say nothing about growing an error
        expected = baseline.expected(feeder_error)
        grows_most = (
            growth is not None
            and growth > MIN_GROWTH
            and (math.isnan(baseline.growth_high) or growth > baseline.growth_high)
        )
        added = math.sqrt(max(error * error - expected * expected, 0.0))
        # on statistics alone across precisions, a small bound needs a large excess to count
        weak = _bounds_only(row) and not error >= STATISTICS_DECISIVE_FACTOR * expected
        floors = STATISTICS_FLOOR_FACTOR if weak else GROWTH_FLOOR_FACTOR
        if not (grows_most and added > floors * floor):
            return None  # the common case: the siblings' scatter is then not needed
        factor = max(OUTLIER_FACTOR, math.exp(SPREAD_Z * baseline.log_spread))
        if not error + floor > factor * (expected + floor):
            return None
        ratio = error / expected if expected > 0 else math.inf
        low, high = baseline.growth_low, baseline.growth_high
        grows = (
            f"error grows {growth:.3g}x here ({feeder_error:.3g} -> {error:.3g})"
            if feeder_error > 0
            else f"error {error:.3g} appears here with bit-exact inputs"
        )
        others = (
            f"this module grows it {low:.3g}-{high:.3g}x in the other {baseline.sibling_count} repeats"
            if math.isfinite(low)
            else f"its {baseline.sibling_count} other repeats add {expected:.3g}"
        )
        return GROWTH_METRIC, ratio, factor, f"{grows}; {others}"

    def _label(
        self,
        row: ComparisonRow,
        error: float | None,
        feeding: Feeding,
        failing_feeders: Sequence[int],
        anomaly: tuple[str, float, float, str] | None,
    ) -> str:
        if feeding.unmatched:
            return INHERITED_FROM_UNMATCHED
        if not feeding.positions:
            return UNKNOWN
        if not failing_feeders:
            if any(self.judged[feeder].verdict == VERDICT_ERROR for feeder in feeding.positions):
                return UNKNOWN
            step = row.golden.key.step
            earlier = self.introduced_in_step.get(step, [])
            encloses = any(self.feeders.links.inside(r.golden.key.name, row.golden.key.name) for r in earlier)
            if earlier and not encloses and (anomaly is None or row.golden.data is None or row.my.data is None):
                # An earlier row of this step already differs, and nothing says this one adds more
                # than it should (it fails the dtype table alone), or statistics only judged it:
                # agreeing norms do not prove agreeing inputs. It most likely carries that error on.
                return INHERITED
            return INTRODUCED
        inherited = [self.error_at[feeder] for feeder in failing_feeders]
        finite = (
            error is not None
            and None not in inherited
            and not row.nonfinite_mismatch
            and not any(self.judged[feeder].nonfinite_mismatch for feeder in failing_feeders)
        )
        if anomaly is not None or (finite and error > AMPLIFICATION_FACTOR * max(inherited)):  # type: ignore[operator,type-var]
            return AMPLIFIED
        return INHERITED

    def _mark_enclosing(self, steps: Set[int] | None) -> None:
        """Relabel an introduced module output of ``steps`` (None: all) that only encloses an earlier introduced row of its call."""
        introduced = [
            (position, row)
            for position, row in enumerate(self.judged)
            if row.attribution == INTRODUCED and (steps is None or self.steps[position] in steps)
        ]
        links = self.feeders.links
        for number, (position, row) in enumerate(introduced):
            name, step = row.golden.key.name, row.golden.key.step
            inner = next(
                (
                    earlier
                    for _, earlier in introduced[:number]
                    if earlier.golden.key.step == step and links.inside(earlier.golden.key.name, name)
                ),
                None,
            )
            if inner is not None:
                self.judged[position] = row.with_changes(
                    attribution=ENCLOSES, evidence=f"encloses {inner.golden.key.label()}, where the error is introduced"
                )


#: The my-run is the twin's program plus a defect: rows before the defect agree with the twin bit for bit.
TWIN_SAME_PROGRAM = "same program"
#: The my-run is another implementation (other kernels, another engine): the twin's error is the expected noise.
TWIN_NOISE_ONLY = "noise reference"


@dataclass(frozen=True)
class NoiseTwin:
    """What the noise twin says: its error against the golden at each tensor, and the my-run judged against it.

    ``errors`` maps ``id()`` of a golden record to the twin's error there (the rounding noise
    expected at that tensor). ``against_my`` maps ``id()`` of a my record to the row of the
    my-run compared with the twin: same program, same precision, so everything before a
    defect agrees bit for bit and the defect stands out however small it is against the noise.
    """

    errors: Mapping[int, float]
    against_my: Mapping[int, ComparisonRow]
    #: :data:`TWIN_SAME_PROGRAM` where its bits judge the my-run, :data:`TWIN_NOISE_ONLY` where only its error does
    mode: str = TWIN_SAME_PROGRAM


#: More calls than this that differ from the twin behind bit-exact inputs make the my-run another implementation.
SAME_PROGRAM_MAX_DIFFERENCES = 2


def twin_mode(against_twin: Sequence[ComparisonRow]) -> tuple[str, int]:
    """Return whether a my-run is its noise twin's program plus a defect, and how many calls of a step differ behind exact inputs.

    A defect makes one call differ from the twin while its inputs still agree bit for bit
    (everything after it receives the difference). A port to other kernels -- vLLM, an NPU, a
    fused library -- differs from the twin wherever its kernels do: many calls behind
    bit-exact inputs (each branch fed by the same tensor, each step). Its bits then say
    nothing: the twin serves as the noise to expect, not as the program to match.
    """
    calls_per_step: dict[int, set[CallId]] = {}
    for row in against_twin:
        if row.attribution == INTRODUCED and row.deciding_metric == EXACT_INPUTS_METRIC:
            calls_per_step.setdefault(row.golden.key.step, set()).add(CallId.of(row.golden))
    most = max(map(len, calls_per_step.values()), default=0)  # a defect differs once in every step it runs in
    return (TWIN_NOISE_ONLY if most > SAME_PROGRAM_MAX_DIFFERENCES else TWIN_SAME_PROGRAM), most


def attribute(
    rows: Sequence[ComparisonRow],
    measure: ErrorMeasure | None = None,
    twin: NoiseTwin | None = None,
    unmatched_my: Sequence[TensorRecord] = (),
    same_program: bool = False,
    weights: Mapping[int, WeightFinding] | None = None,
    replay: OpReplay | None = None,
) -> RowTable:
    """Judge the rows against their feeders, siblings and noise twin; return the judged rows, in the same order, as a table.

    ``measure`` names the error measure (without one, rows keep their table verdicts and are
    only labelled); ``twin`` is what the noise twin says; ``unmatched_my`` are the my-run
    records no pair holds (possible producers of a row's input). ``same_program`` says the
    two runs are one program at one precision on one machine (the my-run against its noise
    twin): there any difference behind bit-exact inputs is introduced, however small. ``weights``
    maps a row's ``index`` to what :func:`llmcheck.core.judging.weights.check_weights` found: parameters that
    differ from the golden beyond rounding fail as introduced. ``replay`` replays an op output
    that would fail without a twin or a failing feeder: one that computes what it was given
    only warns (:mod:`llmcheck.core.judging.op_replay`).

    A row is judged by the rows of its step alone (its feeders and siblings lie there), so where
    each step's rows lie together in golden order -- a decode dump's, a step after another --
    the steps are judged a window of whole steps at a time (:func:`step_windows`; small steps
    share one up to :data:`WINDOW_ROWS` rows): what judging holds besides the rows (feeder
    look-ups, sibling lines, the walk's state: more than the rows themselves) is one window's:
    its rows as measured are made (``rows`` may be a
    :class:`~llmcheck.core.judging.row_table.RowTable`, whose rows are made when read), judged, and
    held as columns in the table returned. A table given is let go of a block at a time as its
    rows are judged (:meth:`~llmcheck.core.judging.row_table.RowTable.release`): it is read no more.
    """
    measure = measure or ErrorMeasure(metric="")
    windows = step_windows(rows)
    golden = row_field(rows, "golden")
    shared = AcrossSteps(
        ParentLinks(golden[given] for window in windows for given in window), unmatched_producers(unmatched_my)
    )
    del golden
    table = RowTable(len(rows), rows.pairs if isinstance(rows, RowTable) else None)  # judged rows, of the same pairs
    other_inputs = _OtherInputs()
    for window in windows:
        judge = _Judge(rows_at(rows, window), measure, twin, shared, same_program, weights, replay)
        table.put([window[given] for given in judge.given_at], other_inputs.relabel(_judged_with_cutoffs(judge)))
        if isinstance(rows, RowTable):
            rows.release(window)
    return table


class _OtherInputs:
    """Finds where the runs were given other inputs, and names no row introduced from that step on.

    A generating run that picked another token feeds it to the next step: from there the runs
    compute on other inputs, and a row that fails while the rows feeding it agree (a norm's
    output brings a token's L2 norm back in line, so its statistics agree) compares no same
    computation. When the compare's first failing row is such an input
    (:func:`given_other_inputs`), every row that step on would be introduced is inherited from
    it: the culprit, if any, lies in the steps before, judged as they were.
    """

    def __init__(self) -> None:
        self.failure_seen = False
        self.step: int | None = None
        self.evidence = ""

    def relabel(self, judged: list[ComparisonRow]) -> list[ComparisonRow]:
        """Return a window's rows, in golden order, with those introduced on other inputs inherited from them."""
        if not self.failure_seen:
            first = next((row for row in judged if row.verdict == VERDICT_FAIL), None)
            if first is not None:
                self.failure_seen = True
                if given_other_inputs(first):
                    self.step = first.golden.key.step
                    self.evidence = (
                        f"the runs were given other values at {_label_text(first.golden)}: from that step on they "
                        "compute on other inputs, not the same computation"
                    )
        if self.step is None:
            return judged
        step = self.step
        return [
            dataclasses.replace(row, attribution=INHERITED, evidence=self.evidence)
            if row.attribution == INTRODUCED and row.golden.key.step >= step
            else row
            for row in judged
        ]


#: Rows a judging window holds at most, unless one step holds more: whole steps are judged together up to it.
WINDOW_ROWS = 4096


def _bounds_only(row: ComparisonRow) -> bool:
    """Return whether a row is judged on statistics alone across precisions: its error a bound on the L2 norms."""
    return (row.golden.data is None or row.my.data is None) and golden_more_precise(row.golden.dtype, row.judged_as)


def step_windows(rows: Sequence[ComparisonRow]) -> list[Sequence[int]]:
    """Return the indexes of ``rows`` in golden order, cut into windows of whole steps where each step's rows lie together.

    Consecutive steps share a window while it holds at most :data:`WINDOW_ROWS` rows
    (:func:`_window_starts`); a larger step is a window of its own.

    Where steps interleave in golden order (records of two steps taken turn about), the
    nearest earlier record of a row's step may lie behind another step's: all the rows are
    then one window, judged together as they always could be. Each window is C integers read
    back as ints (:func:`~llmcheck.core.judging.row_table.c_integers`): held through judging,
    lists of ints were 40 bytes a row.
    """
    golden = row_field(rows, "golden")
    orders = np.fromiter((record.order for record in golden), dtype=np.int64, count=len(rows))
    steps = np.fromiter((record.key.step for record in golden), dtype=np.int64, count=len(rows))
    del golden
    if in_order(orders):  # the rows are in golden order: each window a range of them
        golden_order = np.arange(len(rows))
    else:
        golden_order = np.argsort(orders, kind="stable")  # as sorted() orders them, equal orders kept in turn
        steps = steps[golden_order]  # in golden order: read so, not through a list of the positions (36 bytes a row)
    del orders
    starts = (np.flatnonzero(steps[1:] != steps[:-1]) + 1).tolist()
    if len(starts) + 1 != len(np.unique(steps)):  # a step in two runs or more
        return [c_integers(golden_order)] if len(rows) else []
    return [c_integers(window) for window in np.split(golden_order, _window_starts(starts, len(rows)))]


def _window_starts(step_starts: Sequence[int], rows: int) -> list[int]:
    """Return where the windows start: at step starts, a window taking on the next step while it stays within WINDOW_ROWS.

    Why: a decode dump's steps may hold a hundred rows each, and judging a window costs a few
    milliseconds beyond its rows (numpy passes, the judged rows' block): judged one at a time,
    small steps spent more there than on their rows. A step is judged by its own rows alone,
    so a window of several steps judges each as it would be judged alone. A step of more
    rows than WINDOW_ROWS is a window of its own.
    """
    starts: list[int] = []
    window_start = 0
    for start, end in zip(step_starts, [*step_starts[1:], rows]):
        if end - window_start > WINDOW_ROWS:  # the step from ``start`` would take the window past the limit
            starts.append(start)
            window_start = start
    return starts


def _judged_with_cutoffs(judge: _Judge) -> list[ComparisonRow]:
    """Return a judge's rows judged, and judged again before each step's first introduced row while that moves.

    A row's siblings include the layers after it. Once a step has an introduced row, the rows
    before it are judged again by the siblings before it alone: a defect in layer 14 (and the
    error it hands to layers 15-29) must not decide a verdict in layer 10. A new first
    introduced row moves the cutoff; it only moves earlier, and a few passes settle it.
    A step is judged by its own rows alone: only the steps whose cutoff moved are judged again.
    """
    judged = judge.run()
    cutoff: dict[int, int] = {}
    for _ in range(CUTOFF_PASSES):
        first = _first_introduced_positions(judge.steps, judged)
        if first == cutoff or not first:
            break
        moved = {step for step in first.keys() | cutoff.keys() if first.get(step) != cutoff.get(step)}
        cutoff = first
        judge.rejudge(cutoff, moved)
    return judged


def _first_introduced_positions(steps: Sequence[int], judged: Sequence[ComparisonRow]) -> dict[int, int]:
    """Return, per step, the golden-order position of its first introduced row (``steps`` and ``judged`` by position)."""
    first: dict[int, int] = {}
    for position, row in enumerate(judged):
        if row.attribution == INTRODUCED:
            first.setdefault(steps[position], position)
    return first


def first_divergence(rows: Sequence[ComparisonRow]) -> ComparisonRow | None:
    """Return the first failing row in golden execution order, or None when nothing fails."""
    return first_in_golden_order(rows, "verdict", VERDICT_FAIL)


def given_other_inputs(row: ComparisonRow) -> bool:
    """Return whether a row is a program input the runs were given other values of: integers (token ids) nothing fed.

    Why: a generating run that picked another token feeds it to the next step; from there on
    the runs compute on other inputs, and no later row compares the same computation.
    """
    return not is_float_dtype(row.golden.dtype) and row.golden.key.io == IO_INPUT and not row.fed_by


def first_introduced(rows: Sequence[ComparisonRow]) -> ComparisonRow | None:
    """Return the first row whose error is introduced here (the deepest such module), or None."""
    return first_in_golden_order(rows, "attribution", INTRODUCED)


def code_owner(rows: Sequence[ComparisonRow], row: ComparisonRow) -> ComparisonRow | None:
    """Return the output row of the module whose own code made an introduced input, or None.

    An input that is where an error is introduced was produced by no recorded output (had one
    produced it, that output would hold the same tensor and fail first): code of the
    enclosing module that no recorded submodule runs made it -- the attention core seen at
    ``o_proj input.0``, a residual add seen at ``post_attention_layernorm input.0``. That
    module is what a reader must open; its output row of the same call stands for it.
    """
    parent = row.golden.parent
    if row.golden.key.io != IO_INPUT or not parent:
        return None
    step, order = row.golden.key.step, row.golden.order

    def made_there(golden: TensorRecord) -> bool:
        key = golden.key
        return key.name == parent and key.io == IO_OUTPUT and key.step == step and golden.order > order

    return min(rows_where(rows, "golden", made_there), key=lambda candidate: candidate.golden.order, default=None)


def _rounded(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(f"{value:.6g}")


def describe_row(row: ComparisonRow | None) -> dict[str, Any] | None:
    """Return a row as summary.json shows it: where, which measure, by how much, against what, and why."""
    if row is None:
        return None
    key = row.golden.key
    described: dict[str, Any] = {
        "data_id": row.index,
        "name": key.name,
        "step": key.step,
        "io": key.io,
        "position": key.position,
        "call_index": key.call_index,
        "op_type": row.golden.op_type,
        "my_name": row.my.key.name,
        "verdict": row.verdict,
        "metric": row.deciding_metric,
        "value": None,
        "threshold": None,
        "warn_threshold": None,
        "attribution": row.attribution,
        "fed_by": list(row.fed_by),
        "reason": row.reason,
        "evidence": row.evidence,
        "error": _rounded(row.error),
        "feeder_error": _rounded(row.feeder_error),
        "growth": _rounded(row.growth),
        "structure": row.structure,
        "layer_index": row.layer_index,
        "sibling_growth": [_rounded(value) for value in row.sibling_growth] if row.sibling_growth else None,
        "sibling_count": row.sibling_count,
        "noise_error": _rounded(row.noise_error),
        "expected_error": _rounded(row.expected_error),
    }
    if row.deciding_metric == NONFINITE_METRIC:
        described.update(value=row.nonfinite_mismatch, threshold=0, warn_threshold=0)
    elif row.deciding_metric is not None and row.deciding_metric in row.metrics:
        result = row.metrics[row.deciding_metric]
        described.update(value=result.value, threshold=result.fail_threshold, warn_threshold=result.warn_threshold)
    return described
