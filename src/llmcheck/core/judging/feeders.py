"""Feeders: which paired rows fed a row, so a row's error can be held against the error it received.

Three rules, tried in order:

1. **An output's own inputs**: the input records of the same call (name, step, call index)
   saved before the output.
2. **The producer of an input**: the output that produced the same tensor earlier in the
   golden run. A capture stores one tensor once however many records see it, so the two
   records share their bytes (same file, offset and size); where a source keeps a copy per
   op (ATB, GE), the same shape, dtype and statistics identify it. An input row is fed by
   that producer -- ``model.layers.3.input_layernorm input.0`` by ``model.layers.2
   output.0`` -- never by whatever record happens to come just before it.
3. **The nearest earlier record** of the same step that is neither part of this call nor
   inside this module: the tensor most likely to have been its input. For an input that no
   recorded output produced (the product inside an MLP, a residual sum), the inputs of the
   enclosing module's call feed it too: whatever a module computes derives from them.

A record that only the my-run has (an extra op, unmatched) may be the producer too: the
my-side tensor of an input row is looked up among the my-run's unmatched records, and a
row fed by one is reported as *inherited from an unmatched op*.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import NamedTuple

from llmcheck.core.op_calls import CallId
from llmcheck.core.records import IO_INPUT, IO_OUTPUT, ComparisonRow, TensorRecord, TensorStats, lies_inside


class Feeding(NamedTuple):
    """The rows that fed one row (their positions in golden order), and the unmatched records (either run) that fed it, if any.

    ``guessed`` is set when the nearest earlier record stands in for feeders the dump does
    not name: good enough to say where an error starts, not to make a row fail with it.
    A named tuple, not a dataclass: one is made per row of a compare (10**5 in a decode dump).
    Positions, not rows: a judge looks up what it knows of a feeder (its error, its verdict so
    far) in lists by position, with no map keyed by ``id(row)``.
    """

    positions: tuple[int, ...] = ()
    unmatched: tuple[TensorRecord, ...] = ()
    guessed: bool = False


def inside(name: str, module: str, parents: dict[str, str]) -> bool:
    """Return whether record name ``name`` lies inside module ``module`` (by parent links or by path)."""
    if lies_inside(name, module):
        return True
    seen: set[str] = set()
    current = parents.get(name)
    while current is not None and current not in seen:  # a malformed dump may hold a cycle
        if current == module:
            return True
        seen.add(current)
        current = parents.get(current)
    return False


def _stats_signature(record: TensorRecord, stats: TensorStats | None) -> tuple[Hashable, ...] | None:
    if stats is None:
        return None
    values = stats.values()  # read at once (min, max, mean, l2norm, NaN and Inf counts): a row's are in columns
    if values[3] is None or values[1] is None:
        return None
    return ("stats", record.key.step, record.dtype, tuple(record.shape), *values)


def tensor_identities(record: TensorRecord, stats: TensorStats | None) -> list[tuple[Hashable, ...]]:
    """Return what identifies the tensor a record holds within its run: its bytes, then its statistics."""
    identities: list[tuple[Hashable, ...]] = []
    data = record.data
    if data is not None and data.loader is None and data.path is not None and data.nbytes:
        identities.append(("bytes", record.key.step, str(data.path), data.offset, data.nbytes, record.dtype))
    signature = _stats_signature(record, stats)
    if signature is not None:
        identities.append(signature)
    return identities


class ParentLinks:
    """Each golden record name's enclosing module or op, and which names lie inside which modules.

    One for a whole compare, shared by the feeder index of every step: a step's records may be
    enclosed by a module whose parent link an earlier step's record gives, and a decode dump
    asks whether the same names lie inside the same modules every step.
    """

    def __init__(self, ordered_golden: Iterable[TensorRecord]) -> None:
        """``ordered_golden``: the golden records of the rows, in golden order."""
        #: name -> parent, from the name's first record with one, in golden order
        self.parents: dict[str, str] = {}
        for record in ordered_golden:
            if record.parent:
                self.parents.setdefault(record.key.name, record.parent)
        self._inside: dict[tuple[str, str], bool] = {}

    def inside(self, name: str, module: str) -> bool:
        """Return :func:`inside` of a record name and a module by these parent links, once per pair of names."""
        known = self._inside.get((name, module))
        if known is None:
            known = self._inside[(name, module)] = inside(name, module, self.parents)
        return known


def unmatched_producers(unmatched_my: Iterable[TensorRecord]) -> dict[tuple[Hashable, ...], TensorRecord]:
    """Return identity -> the my-only output record that holds it (the last such record, on a repeated identity)."""
    producers: dict[tuple[Hashable, ...], TensorRecord] = {}
    for record in unmatched_my:
        if record.key.io == IO_OUTPUT:
            for identity in tensor_identities(record, record.stats):
                producers[identity] = record
    return producers


class FeederIndex:
    """Finds the feeders of the rows of one step (built once, queried row by row in golden order).

    ``links`` and ``unmatched`` (:func:`unmatched_producers`) are the whole compare's, made once
    and shared by the index of every step.
    """

    def __init__(
        self,
        ordered_rows: Sequence[ComparisonRow],
        links: ParentLinks,
        unmatched: Mapping[tuple[Hashable, ...], TensorRecord],
    ) -> None:
        self.ordered = list(ordered_rows)
        self.position = {id(row): index for index, row in enumerate(self.ordered)}
        # the call of each row, by position: compared for every row and its earlier neighbours
        self.call_ids = [CallId.of(row.golden) for row in self.ordered]
        self.inputs_of: dict[CallId, list[ComparisonRow]] = {}
        self.inputs_by_name: dict[tuple[str, int], list[ComparisonRow]] = {}
        self.links = links
        for row, call_id in zip(self.ordered, self.call_ids):
            if row.golden.key.io == IO_INPUT:
                self.inputs_of.setdefault(call_id, []).append(row)
                self.inputs_by_name.setdefault((row.golden.key.name, row.golden.key.step), []).append(row)
        self._producers: dict[tuple[Hashable, ...], list[ComparisonRow]] | None = None
        self.unmatched_producers = unmatched

    def release_lookups(self) -> None:
        """Let go of what finding feeders and parts needs (the parent links are the compare's, kept).

        A judge asks for every row's feeders and parts once, before it judges: the lookups by
        call, by name and by tensor (a row or two of entries each, 400 bytes a row) are then
        held through judging for nothing. :meth:`feeding` and :meth:`parts` must not be asked after.
        """
        self.ordered = []
        self.position, self.call_ids = {}, []
        self.inputs_of, self.inputs_by_name = {}, {}
        self._producers, self.unmatched_producers = None, {}

    def feeding(self, row: ComparisonRow) -> Feeding:
        """Return the rows (their positions) and unmatched records that fed ``row``."""
        position = self.position
        if row.golden.key.io == IO_OUTPUT:
            call_inputs = self.inputs_of.get(self.call_ids[position[id(row)]], ()) if self.inputs_of else ()
            own_inputs = [position[id(r)] for r in call_inputs if r.golden.order < row.golden.order]
            if own_inputs:
                return Feeding(positions=tuple(own_inputs))
        else:
            producer = self._producer(row)
            # The my-side tensor may come from an op only the my-run executes (a stray scale):
            # then that op, not the golden producer's counterpart, is where it was made.
            lone = self._unmatched_producer(row)
            if lone is not None:
                return Feeding(positions=(position[id(producer)],) if producer is not None else (), unmatched=(lone,))
            if producer is not None:
                return Feeding(positions=(position[id(producer)],))
        earlier = self._nearest_earlier(row)
        fed = [earlier] if earlier is not None else []
        if row.golden.key.io == IO_INPUT:
            # A tensor made inside a module from no recorded output (a residual sum, the product
            # inside an MLP, an attention's result) derives from the module's own inputs and from
            # whatever its children produced before it in this call.
            fed.extend(r for r in self._enclosing_call(row) if r is not earlier)
        return Feeding(positions=tuple([position[id(r)] for r in fed]), guessed=True)

    def parts(self, row: ComparisonRow) -> tuple[int, ...]:
        """Return what a module's output may be the sum of (their positions): its call's inputs and its direct children's records there.

        A module that adds tensors (a decoder layer: residual plus branch) can show a relative
        error far above its inputs' when the sum nearly cancels (a trained model's massive
        activations): each part's error, small against the part, is large against the sum.
        The parts, of the output's shape (a sum's operands have it), are its own inputs of
        that shape and the records of its direct children made in this call. A leaf module
        (nothing recorded inside it) has no parts: it transforms its input rather than adds.
        """
        own_inputs = self._own_inputs(row)
        if not own_inputs:
            return ()
        position = self.position[id(row)]
        name, shape = row.golden.key.name, row.golden.shape
        start = self.position[id(own_inputs[0])] + 1
        children = [
            start + offset
            for offset, r in enumerate(self.ordered[start:position])
            if r.golden.parent == name and r.golden.shape == shape
        ]
        if not children:
            return ()
        return tuple([self.position[id(r)] for r in own_inputs if r.golden.shape == shape] + children)

    def call_span(self, row: ComparisonRow) -> range:
        """Return the positions a module's call holds before this output of it: its own inputs, then what ran inside.

        Empty for a row that is no output, a call whose inputs were not recorded, and a dump of outputs alone.
        """
        own_inputs = self._own_inputs(row)
        return range(self.position[id(own_inputs[0])], self.position[id(row)]) if own_inputs else range(0)

    def _own_inputs(self, row: ComparisonRow) -> list[ComparisonRow]:
        """Return the input rows of an output row's own call recorded before it (none for an input row)."""
        if row.golden.key.io != IO_OUTPUT or not self.inputs_of:
            return []
        call_inputs = self.inputs_of.get(self.call_ids[self.position[id(row)]], ())
        return [r for r in call_inputs if r.golden.order < row.golden.order]

    def _enclosing_call(self, row: ComparisonRow) -> list[ComparisonRow]:
        """Return the inputs of the enclosing module's latest call and its children's outputs since then."""
        parent = row.golden.parent
        if not parent:
            return []
        calls = [
            r for r in self.inputs_by_name.get((parent, row.golden.key.step), ()) if r.golden.order < row.golden.order
        ]
        if not calls:
            return []
        latest_call = calls[-1].golden.key.call_index
        inputs = [r for r in calls if r.golden.key.call_index == latest_call]
        start = self.position[id(inputs[0])]
        children = [
            r
            for r in self.ordered[start : self.position[id(row)]]
            if r.golden.key.io == IO_OUTPUT and self.links.inside(r.golden.key.name, parent)
        ]
        return inputs + children

    @property
    def producers(self) -> dict[tuple[Hashable, ...], list[ComparisonRow]]:
        """Return identity -> the output rows that hold it, in golden order.

        Built when an input row first asks: a dump of outputs only (a decode dump of module
        outputs) never needs it.
        """
        if self._producers is None:
            self._producers = {}
            for row in self.ordered:
                if row.golden.key.io == IO_OUTPUT:
                    for identity in tensor_identities(row.golden, row.golden_stats):
                        self._producers.setdefault(identity, []).append(row)
        return self._producers

    def _producer(self, row: ComparisonRow) -> ComparisonRow | None:
        producers, call_id = self.producers, self.call_ids[self.position[id(row)]]
        for identity in tensor_identities(row.golden, row.golden_stats):
            candidates = [
                r
                for r in producers.get(identity, ())
                if r.golden.order < row.golden.order and self.call_ids[self.position[id(r)]] != call_id
            ]
            if candidates:
                return candidates[-1]
        return None

    def _unmatched_producer(self, row: ComparisonRow) -> TensorRecord | None:
        if not self.unmatched_producers:
            return None
        for identity in tensor_identities(row.my, row.my_stats):
            record = self.unmatched_producers.get(identity)
            if record is not None and record.order < row.my.order:
                return record
        return None

    def _nearest_earlier(self, row: ComparisonRow) -> ComparisonRow | None:
        name, step = row.golden.key.name, row.golden.key.step
        position = self.position[id(row)]
        call_id = self.call_ids[position]
        for earlier_position in range(position - 1, -1, -1):
            earlier = self.ordered[earlier_position]
            if earlier.golden.key.step != step:
                break
            if self.call_ids[earlier_position] == call_id or self.links.inside(earlier.golden.key.name, name):
                continue
            return earlier
        return None
