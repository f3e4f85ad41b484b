"""The nouns every plugin speaks: records of tensors, dumps, pairs, metrics, capture requests.

Plugins exchange only these. Nothing here imports torch: dtypes are the canonical torch
dtype names as strings (``"float32"``, ``"bfloat16"``, ``"float8_e4m3fn"``), so a loader
can describe a dump without paying for a torch import, and the data itself is reached
through a :class:`TensorData` handle only when a pair is measured.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import MISSING, FrozenInstanceError, dataclass, field, fields, replace
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, cast

from llmcheck.core.dtypes import DTYPE_ITEMSIZE, dtype_class

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

    from llmcheck.core.measuring.pair_chunk import PairChunk

#: A class :func:`slot_builder` builds.
_Built = TypeVar("_Built")

#: Where a tensor sits relative to the call that saw it.
IO_INPUT = "input"
IO_OUTPUT = "output"
IO_KINDS = (IO_INPUT, IO_OUTPUT)

#: When the tensor was saved: before the call ran (inputs as they were before an in-place op) or after.
MOMENT_BEFORE = "before"
MOMENT_AFTER = "after"

#: The rank of a record gathered from the shards every rank of a multi-rank run holds.
ALL_RANKS = -1

#: How a module-tree source names records (the torch capture writes them, pairings and
#: reports read them): module paths from ``named_modules()`` joined by ``.``, the model
#: itself ``root``, and an op called inside a module ``{module path}/{op type}``.
ROOT_MODULE = "root"
MODULE_SEPARATOR = "."
OP_SEPARATOR = "/"


def module_parent(name: str) -> str | None:
    """Return the path of a module's parent (``"root"`` for a top-level child, ``None`` for the root)."""
    if name == ROOT_MODULE:
        return None
    return name.rpartition(MODULE_SEPARATOR)[0] or ROOT_MODULE


def module_ancestors(name: str) -> list[str]:
    """Return the paths of a module's ancestors, nearest first, ``"root"`` last (empty for the root)."""
    ancestors: list[str] = []
    while (parent := module_parent(ancestors[-1] if ancestors else name)) is not None:
        ancestors.append(parent)
    return ancestors


def module_depth(name: str) -> int:
    """Return how many levels below the model a module is: 0 for ``"root"``, 3 for ``model.layers.3``."""
    return 0 if name == ROOT_MODULE else name.count(MODULE_SEPARATOR) + 1


#: A model's blocks are the shallowest levels of its module tree holding at least this many modules.
BLOCK_LEVEL_MODULES = 8
#: The depth (``dump --max-depth blocks``) that means "down to the model's blocks", as :func:`block_depth` finds it.
DEPTH_BLOCKS = "blocks"


def block_depth(names: Iterable[str]) -> int:
    """Return the depth of a model's blocks (``--max-depth blocks``): a Llama's or GPT-2's decoder layers, 3.

    The shallowest depth down to which the module tree (its module paths, ``"root"`` included)
    holds :data:`BLOCK_LEVEL_MODULES` modules, and at least 1: a model is first split into a
    few parts (embedding, layer list, norm, head), then into its repeated layers.
    """
    depths = sorted(module_depth(name) for name in names)
    if not depths:
        return 1
    return max(1, depths[min(BLOCK_LEVEL_MODULES, len(depths)) - 1])


def op_record_name(module: str, op_type: str) -> str:
    """Return the record name of an op called inside a module (``model.layers.0.mlp/aten.mm.default``)."""
    return f"{module}{OP_SEPARATOR}{op_type}"


def is_op_record_name(name: str) -> bool:
    """Return whether a record name names an op inside a module rather than a module."""
    return OP_SEPARATOR in name


def op_record_module(name: str) -> str | None:
    """Return the module path an op record's name places it in, or ``None`` for a module's record."""
    module, separator, _ = name.rpartition(OP_SEPARATOR)
    return module if separator else None


def lies_inside(name: str, module: str) -> bool:
    """Return whether record name ``name`` is a submodule of, or an op inside, module path ``module``."""
    return name.startswith((module + MODULE_SEPARATOR, module + OP_SEPARATOR))


@dataclass(frozen=True, slots=True)
class RecordKey:
    """Where in the model a tensor came from; equal keys in two runs name the same tensor.

    ``name`` is the module path (``model.layers.3.mlp``), the op id (``3_1``) or the graph
    node name; ``call_index`` counts calls of that name within one step (a module run twice
    in one forward gets 0 and 1, never an overwrite); ``step`` is the forward/token index;
    ``position`` is the tensor's path inside the call's inputs or outputs (``"0"``,
    ``"1.0"``, ``"last_hidden_state"``). ``rank`` tells the processes of a multi-rank run
    apart when their dumps are read as one run (0 in a single-process run);
    :data:`ALL_RANKS` marks a tensor gathered from every rank's shard.
    """

    name: str
    io: str = IO_OUTPUT
    position: str = "0"
    step: int = 0
    call_index: int = 0
    moment: str = MOMENT_AFTER
    rank: int = 0

    def label(self) -> str:
        """Return a short human label, e.g. ``model.layers.3.mlp[1] step 0 output.0 rank 1``."""
        call = f"[{self.call_index}]" if self.call_index else ""
        moment = " (before)" if self.moment == MOMENT_BEFORE else ""
        rank = "" if self.rank == 0 else " all ranks" if self.rank == ALL_RANKS else f" rank {self.rank}"
        return f"{self.name}{call} step {self.step} {self.io}.{self.position}{moment}{rank}"


class _HeldOrRow:
    """What a noun held two ways -- its values itself, or a row of columns -- shares: frozen, and
    compared, hashed, shown and pickled by its values, whichever way holds them.

    The noun -- the class deriving from this one directly -- names its fields (``_FIELDS``);
    it is then its kinds' ``_NOUN``, and its fields are read in one call (``_VALUES``). A kind
    that reads them faster another way (a row of columns) gives its own :meth:`values`. Pickled,
    either kind comes back holding its values (a row's columns stay behind).
    """

    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]]
    _NOUN: ClassVar[type]
    _VALUES: ClassVar[Callable[[Any], tuple[Any, ...]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _HeldOrRow in cls.__bases__:  # the noun itself, not one of its kinds
            cls._NOUN = cls
            cls._VALUES = operator.attrgetter(*cls._FIELDS)

    def values(self) -> tuple[Any, ...]:
        """Return the values, in the noun's field order."""
        return type(self)._VALUES(self)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, self._NOUN):
            return NotImplemented
        mine, theirs = self.values(), cast("_HeldOrRow", other).values()
        return mine == theirs

    def __hash__(self) -> int:
        return hash(self.values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value in zip(self._FIELDS, self.values()))
        return f"{self._NOUN.__name__}({shown})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return self._NOUN, self.values()


#: The fields of :class:`TensorStats`, in order: a statistics object is made from them by position.
STATS_FIELDS = ("min", "max", "mean", "l2norm", "nan_count", "inf_count")


class TensorStats(_HeldOrRow):
    """Cheap statistics of a tensor, computed at capture time or read from the dump.

    Values are ``None`` when undefined (an empty tensor) or not recorded by the source.
    ``min``/``max``/``mean``/``l2norm`` are over the finite elements.

    ``TensorStats(min=..., ...)`` holds its six values itself (:class:`HeldStats`). The
    statistics of the records read from llmcheck's own index are rows of columns instead
    (:class:`~llmcheck.core.dumps.record_rows.StatsRow`, made when asked for): a
    statistics-only dump is a record and its statistics a line, and the six values as objects
    of their own were 176 bytes a record, two fifths of what a loaded record costs. Both kinds
    read alike, compare equal when their values are equal, hash alike and are frozen.
    """

    __slots__ = ()
    _FIELDS = STATS_FIELDS

    def __new__(
        cls,
        min: float | None = None,
        max: float | None = None,
        mean: float | None = None,
        l2norm: float | None = None,
        nan_count: int | None = None,
        inf_count: int | None = None,
    ) -> TensorStats:
        if cls is TensorStats or cls is HeldStats:  # the statistics a plugin or the measure makes hold their values
            return build_stats(min, max, mean, l2norm, nan_count, inf_count)
        return super().__new__(cls)

    def __init__(self, *values: Any, **named: Any) -> None:
        """The values were set by ``__new__``."""

    if TYPE_CHECKING:  # the values, as the kinds below give them
        min: float | None  # the smallest finite element
        max: float | None  # the largest finite element
        mean: float | None  # the mean of the finite elements
        l2norm: float | None  # the L2 norm of the finite elements
        nan_count: int | None  # how many elements are NaN
        inf_count: int | None  # how many elements are infinite

    def as_json(self) -> dict[str, float | int | str | None]:
        """Return a JSON-safe dict (NaN and infinities become strings JSON can carry)."""
        return {name: _json_number(value) for name, value in zip(STATS_FIELDS, self.values())}

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> TensorStats:
        """Build statistics from :meth:`as_json` output (unknown keys ignored)."""
        return build_stats(*(number_from_json(values.get(name)) for name in STATS_FIELDS))


@dataclass(frozen=True, slots=True, init=False, repr=False, eq=False)
class HeldStats(TensorStats):
    """Statistics that hold their six values: what ``TensorStats(...)`` makes."""

    min: float | None = None
    max: float | None = None
    mean: float | None = None
    l2norm: float | None = None
    nan_count: int | None = None
    inf_count: int | None = None


def _json_number(value: float | int | None) -> float | int | str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan', 'inf', '-inf'
    return value


def number_from_json(value: Any) -> float | int | None:
    """Return a statistic as :meth:`TensorStats.as_json` wrote it, read back: ``'nan'``/``'inf'``/``'-inf'`` as floats."""
    if isinstance(value, str):
        return float(value)
    number: float | int | None = value  # JSON numbers or null, as as_json wrote them
    return number


class TensorLoader(Protocol):
    """Returns a record's tensor in its exact dtype; used when the bytes are not a plain range."""

    def __call__(self) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class TensorData:
    """A lazy handle to a record's data: a byte range in a file, or a loader function.

    Most dump formats keep a tensor as plain little-endian bytes somewhere in a file
    (safetensors, ATB ``.bin``, ``.npy``, GE dump payloads), so a byte range lets the core
    memory-map and stream any of them in chunks. Formats that need decoding (FRACTAL_NZ
    layout, pickled ``.pt``) give a ``loader`` instead.
    """

    dtype: str
    shape: tuple[int, ...]
    path: Path | None = None
    offset: int = 0
    nbytes: int = 0
    loader: TensorLoader | None = None

    def __post_init__(self) -> None:
        if self.loader is None and self.path is None:
            raise ValueError("TensorData needs a path (byte range) or a loader")

    @property
    def numel(self) -> int:
        """Return the number of elements the shape holds."""
        return math.prod(self.shape)

    def identity(self) -> tuple[Any, ...]:
        """Return what identifies the bytes this handle reads: its byte range, or the handle itself for a loader.

        Records of one run that share their data (one tensor seen by several records) are
        read and measured once.
        """
        if self.loader is not None:
            return ("loader", id(self))
        return (str(self.path), self.offset, self.nbytes, self.dtype)

    def load(self) -> torch.Tensor:
        """Return the tensor in its exact dtype and shape (memory-mapped for byte ranges)."""
        if self.loader is not None:
            return self.loader()
        from llmcheck.core.dumps.tensor_io import tensor_from_byte_range

        return tensor_from_byte_range(self.path, self.offset, self.nbytes, self.dtype, self.shape)


#: ``attrs`` not given: each held record gets a dict of its own, as a dataclass's ``default_factory`` gives.
_FRESH_ATTRS: Any = MISSING

#: The fields of :class:`TensorRecord`, in order: a record is made from them by position.
RECORD_FIELDS = (
    "key",
    "dtype",
    "shape",
    "order",
    "device",
    "rank",
    "op_type",
    "parent",
    "stats",
    "data",
    "source_path",
    "attrs",
    "digest",
)


class TensorRecord(_HeldOrRow):
    """One tensor seen in one run: its key, its description, its statistics and lazy data.

    ``order`` is the execution order within the run (records are compared and the first
    divergence named in this order). ``parent`` is the enclosing module path or op id in
    the topology, ``op_type`` the module class, ATen overload or accelerator op type.
    ``source_path`` is where a user finds the tensor on disk (shown in reports).
    ``attrs`` carries source-specific facts (op parameters, recorded call arguments).
    ``digest`` is a checksum of the tensor's bytes that the source recorded instead of (or
    besides) the data (msprobe's md5 mode); two records whose sources recorded digests the
    same way are bit-identical exactly when their digests are equal.

    ``TensorRecord(key=..., ...)`` holds its fields itself (:class:`HeldRecord`). The records
    read from llmcheck's own index are rows of columns instead
    (:class:`~llmcheck.core.dumps.record_rows.RecordRow`): a decode dump holds 10**6 records or
    more, and a record as an object of its own and its ``order`` were 164 bytes. Both kinds
    read alike, compare equal when their fields are equal and are frozen;
    :meth:`with_changes` makes a held record of either.
    """

    __slots__ = ()
    _FIELDS = RECORD_FIELDS

    if TYPE_CHECKING:  # the fields, as the kinds below give them
        key: RecordKey
        dtype: str
        shape: tuple[int, ...]
        order: int
        device: str
        rank: int
        op_type: str | None
        parent: str | None
        stats: TensorStats | None
        data: TensorData | None
        source_path: str
        attrs: Mapping[str, Any]
        digest: str | None

    def __new__(
        cls,
        key: RecordKey,
        dtype: str,
        shape: tuple[int, ...],
        order: int,
        device: str = "cpu",
        rank: int = 0,
        op_type: str | None = None,
        parent: str | None = None,
        stats: TensorStats | None = None,
        data: TensorData | None = None,
        source_path: str = "",
        attrs: Mapping[str, Any] = _FRESH_ATTRS,
        digest: str | None = None,
    ) -> TensorRecord:
        if cls is TensorRecord or cls is HeldRecord:  # the records a plugin makes hold their fields
            return build_record(
                key, dtype, shape, order, device, rank, op_type, parent, stats, data, source_path, attrs, digest
            )
        return super().__new__(cls)

    def __init__(self, *values: Any, **named: Any) -> None:
        """The fields were set by ``__new__``."""

    @property
    def numel(self) -> int:
        """Return the number of elements of the tensor."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Return the tensor's size in bytes in its own dtype."""
        return self.numel * DTYPE_ITEMSIZE.get(self.dtype, 0)

    def with_changes(self, **changes: Any) -> TensorRecord:
        """Return a copy with the given fields replaced (a :class:`HeldRecord`, whichever kind this is)."""
        unknown = changes.keys() - _RECORD_POSITION.keys()
        if unknown:
            raise TypeError(f"TensorRecord has no field {sorted(unknown)[0]!r}")
        values = list(self.values())
        for name, value in changes.items():
            values[_RECORD_POSITION[name]] = value
        return build_record(*values)


_RECORD_POSITION = {name: position for position, name in enumerate(RECORD_FIELDS)}


@dataclass(frozen=True, slots=True, init=False, repr=False, eq=False)
class HeldRecord(TensorRecord):
    """A record that holds its fields: what ``TensorRecord(...)`` makes."""

    key: RecordKey
    dtype: str
    shape: tuple[int, ...]
    order: int
    device: str = "cpu"
    rank: int = 0
    op_type: str | None = None
    parent: str | None = None
    stats: TensorStats | None = None
    data: TensorData | None = None
    source_path: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    digest: str | None = None


@dataclass(frozen=True, slots=True)
class TopologyNode:
    """One node of a run's module or operator tree: name, type, children, tensors it reads and writes."""

    name: str
    op_type: str
    children: tuple[TopologyNode, ...] = ()
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def walk(self) -> Iterator[TopologyNode]:
        """Yield this node and its descendants depth first, in child order."""
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """Which request and token position each row of one step's flattened batch holds.

    Serving engines (vLLM, SGLang) run every scheduled request of an engine step as one
    ``[tokens, hidden]`` batch: prefill chunks and decode tokens of several requests side by
    side. A golden run of one request (transformers, ``[batch, seq, hidden]``) pairs with
    such a step only through this bookkeeping: request ``request_ids[i]`` holds rows
    ``query_start_loc[i]`` to ``query_start_loc[i + 1]`` (exclusive), and row ``r`` is the
    token at ``positions[r]`` of its request. Capture writes it per step; loaders of engine
    dumps put it in :attr:`Dump.batches`; pairing plugins cut requests out of a step with it.
    """

    step: int
    request_ids: tuple[str, ...]
    query_start_loc: tuple[int, ...]
    positions: tuple[int, ...]
    rank: int = 0

    def rows_of(self, request_id: str) -> range | None:
        """Return the rows request ``request_id`` holds in this step, or ``None`` when it did not run."""
        try:
            index = self.request_ids.index(request_id)
        except ValueError:
            return None
        return range(self.query_start_loc[index], self.query_start_loc[index + 1])

    def as_json(self) -> dict[str, Any]:
        """Return the layout as the JSON object a dump's ``batches.jsonl`` holds, one line per step."""
        return {
            "step": self.step,
            "rank": self.rank,
            "request_ids": list(self.request_ids),
            "query_start_loc": list(self.query_start_loc),
            "positions": list(self.positions),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchLayout:
        """Return the layout a ``batches.jsonl`` line holds; a missing or mistyped field raises ``KeyError``/``TypeError``/``ValueError``."""
        request_ids = tuple(str(item) for item in data["request_ids"])
        query_start_loc = tuple(int(item) for item in data["query_start_loc"])
        positions = tuple(int(item) for item in data["positions"])
        if len(query_start_loc) != len(request_ids) + 1:
            raise ValueError(f"{len(request_ids)} requests need {len(request_ids) + 1} query start offsets")
        if query_start_loc and (query_start_loc[0] != 0 or list(query_start_loc) != sorted(query_start_loc)):
            raise ValueError("query start offsets must start at 0 and never decrease")
        if query_start_loc and query_start_loc[-1] > len(positions):
            raise ValueError(f"query start offsets reach row {query_start_loc[-1]} of {len(positions)} positions")
        return cls(int(data["step"]), request_ids, query_start_loc, positions, int(data.get("rank", 0)))


#: ``Dump.manifest["layout"]`` of a dump read from tensor files given directly (one ``.bin``,
#: ``.npy`` or ``.pt`` file, a checkpoint's shards) rather than from a captured run's folder.
LAYOUT_TENSOR_FILES = "file"


@dataclass(slots=True)
class Dump:
    """A loaded run: which source read it, its root, its records in execution order, its topology.

    ``cut`` is set when the dump ends early (a writer killed mid-run): it says what was lost.
    """

    source: str
    root: Path
    records: list[TensorRecord]
    topology: TopologyNode | None = None
    manifest: Mapping[str, Any] = field(default_factory=dict)
    cut: str | None = None
    #: A serving engine's per-step batch bookkeeping, keyed by ``(rank, step)`` (see :class:`BatchLayout`).
    batches: Mapping[tuple[int, int], BatchLayout] = field(default_factory=dict)

    @property
    def is_tensor_files(self) -> bool:
        """Return whether the dump was read from tensor files given directly (see :data:`LAYOUT_TENSOR_FILES`)."""
        return self.manifest.get("layout") == LAYOUT_TENSOR_FILES

    def by_key(self) -> dict[RecordKey, TensorRecord]:
        """Return the records indexed by key (the last record wins on a duplicate key)."""
        return {record.key: record for record in self.records}

    @property
    def ranks(self) -> tuple[int, ...]:
        """Return the ranks whose records this dump holds, ascending (``(0,)`` for one process)."""
        return tuple(sorted({record.key.rank for record in self.records})) or (0,)


def merge_rank_dumps(dumps: Sequence[Dump], ranks: Sequence[int], root: Path) -> Dump:
    """Return the dumps of the ranks of one multi-rank run as one run, each record keyed by its rank.

    Records keep their own execution order within a rank; the ranks ran side by side, so the
    merged order interleaves them (the n-th record of every rank, then the (n+1)-th).
    """
    by_rank = sorted(zip(ranks, dumps), key=lambda item: item[0])
    ranks, dumps = [rank for rank, _ in by_rank], [dump for _, dump in by_rank]
    merged: list[tuple[int, int, TensorRecord]] = []
    for dump, rank in zip(dumps, ranks):
        for position, record in enumerate(dump.records):
            merged.append((position, rank, record.with_changes(key=replace(record.key, rank=rank), rank=rank)))
    merged.sort(key=lambda item: (item[0], item[1]))
    records = [record.with_changes(order=order) for order, (_, _, record) in enumerate(merged)]
    cuts = [f"rank {rank}: {dump.cut}" for dump, rank in zip(dumps, ranks) if dump.cut]
    return Dump(
        source=dumps[0].source,
        root=root,
        records=records,
        topology=dumps[0].topology,
        manifest={**dumps[0].manifest, "ranks": list(ranks)},
        cut="; ".join(cuts) or None,
        batches={
            (rank, step): replace(layout, rank=rank)
            for dump, rank in zip(dumps, ranks)
            for (_, step), layout in dump.batches.items()
        },
    )


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """A kind of dump a plugin can read, named for ``--golden-source`` / ``--my-source``."""

    name: str
    description: str


class PairPriority(IntEnum):
    """How strongly a pairing rule's proposal holds: the core keeps each record's highest-priority pair.

    A plugin picks the level that says why its rule is trustworthy; ties between plugins
    at the same level are resolved by the order records were proposed.
    """

    #: aligning two record sequences where nothing better matched
    SEQUENCE = 0
    #: equal record keys in both runs
    EXACT_KEY = 20
    #: the same place found by walking both trees, ids moved (ATB ops re-numbered)
    STRUCTURAL = 45
    #: a source-specific rule that knows both formats (ATB <-> torch, GE <-> FX, tensor-parallel shards)
    SOURCE_RULE = 50
    #: a ``--mapping`` entry naming which module kind answers to which op kind
    USER_KIND = 60
    #: the user named the pair itself (manual mapping, an edited ``pairs.json``)
    USER_MAPPING = 100


@dataclass(frozen=True, slots=True)
class Pair:
    """A golden record matched to a my record, with the rule that matched them.

    Either side may be ``None`` for a record the pairing left unmatched; ``note`` says why
    (for example ``"Cast op inserted by the graph compiler, no FX counterpart"``), and
    ``expected`` declares that the rule legitimately leaves it unmatched (a compiler-inserted
    op, a non-tensor argument): such records are counted apart and never fail a compare,
    while any other unmatched golden record does (exit 3 unless ``--allow-unmatched``).
    ``priority`` orders competing proposals: the core keeps the highest-priority pair for
    each record (see :class:`PairPriority`). ``golden`` and ``my`` must be the very record
    objects of the loaded dumps, not copies: the core matches proposals to records by
    identity.
    """

    golden: TensorRecord | None
    my: TensorRecord | None
    rule: str
    priority: int = PairPriority.EXACT_KEY
    note: str = ""
    expected: bool = False


@dataclass(frozen=True, slots=True)
class UserMapping:
    """The user's ``--mapping`` file: golden name patterns to my name patterns, in file order.

    ``key_pairs`` holds exact record-key pairs, read from an edited ``pairs.json`` fed back
    with ``--mapping`` (the user audited the pairing and fixed or added pairs). ``rules``
    holds ``(golden name pattern, rule text)`` entries, in file order: how the records a
    pattern matches are to be paired (``tp_unshard(sum)``); the pairing plugin that owns
    the rule reads them, the others ignore them.
    """

    path: Path
    entries: tuple[tuple[str, str], ...]
    key_pairs: tuple[tuple[RecordKey, RecordKey], ...] = ()
    rules: tuple[tuple[str, str], ...] = ()


VERDICT_PASS = "pass"
VERDICT_WARN = "warn"
VERDICT_FAIL = "fail"
VERDICT_ERROR = "error"  # no metric could be computed: shape mismatch, unreadable data


class MetricAccumulator(Protocol):
    """Streams one pair through a metric chunk by chunk, so no full float64 copy is ever made.

    An accumulator that also defines ``update_chunk`` is a :class:`ChunkMetricAccumulator`:
    the core then calls ``update_chunk`` instead of ``update``.
    """

    def update(self, golden: np.ndarray, my: np.ndarray) -> None:
        """Fold in one chunk of both tensors, flattened, as float64 arrays of equal length."""

    def result(self) -> float:
        """Return the metric's value over every chunk seen."""


class ChunkMetricAccumulator(MetricAccumulator, Protocol):
    """A metric accumulator that reads the values several metrics share from one :class:`PairChunk`."""

    def update_chunk(self, chunk: PairChunk) -> None:
        """Fold in one chunk: ``chunk`` holds both sides and, computed once for every metric, their
        difference, absolute difference and dot products (see ``llmcheck.core.measuring.pair_chunk``)."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A named measure of one pair, its direction and its default thresholds per dtype class.

    ``thresholds`` maps a dtype class (see :func:`dtype_class`; ``"default"`` as fallback)
    to ``(warn, fail)``: a value worse than ``warn`` is a warning, worse than ``fail`` a
    failure; "worse" means lower when ``higher_is_better``. A metric without thresholds
    is reported but never decides a verdict.

    ``error_measure`` marks the scale-free error measure (0 = equal, relative to the golden
    magnitude) that attribution compares between a row and its feeders, that growth factors
    and repeated-structure baselines are computed on, and that a statistics-only pair's
    relative L2-norm difference bounds from below. One registered metric holds this role
    (the built-in ``relative_euclidean_distance``); the core names no metric itself.
    """

    name: str
    description: str
    higher_is_better: bool
    make_accumulator: Callable[[], MetricAccumulator]
    thresholds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    error_measure: bool = False

    def thresholds_for(self, dtype: str) -> tuple[float, float] | None:
        """Return ``(warn, fail)`` for a dtype name, or ``None`` if this metric never judges it."""
        return self.thresholds.get(dtype_class(dtype), self.thresholds.get("default"))


def error_measure(specs: Sequence[MetricSpec]) -> MetricSpec | None:
    """Return the metric holding the error-measure role among ``specs`` (:attr:`MetricSpec.error_measure`), or None."""
    return next((spec for spec in specs if spec.error_measure), None)


def error_growth(error: float | None, feeder_error: float | None) -> float | None:
    """Return a row's ``growth``: its error over its feeders', 1.0 where both are 0, inf where only the feeders' is; None where either is unknown.

    One definition for judging, which sets it, and the row tables, which make it again from
    the two errors rather than hold it.
    """
    if error is None or feeder_error is None:
        return None
    return error / feeder_error if feeder_error > 0 else (1.0 if error == 0 else math.inf)


@dataclass(frozen=True, slots=True)
class MetricResult:
    """One metric's value for one pair, with the thresholds it was judged against and its direction."""

    name: str
    value: float
    verdict: str = VERDICT_PASS
    warn_threshold: float | None = None
    fail_threshold: float | None = None
    higher_is_better: bool = False

    def beyond(self, limit: float) -> bool:
        """Return whether the value is worse than ``limit`` in this metric's direction."""
        return self.value < limit if self.higher_is_better else self.value > limit

    @property
    def comparison(self) -> str:
        """Return the sign a failure reason prints between value and threshold (``<`` when higher is better)."""
        return "<" if self.higher_is_better else ">"


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One measured pair as every report shows it: both records, the rule, each metric, the verdict and why.

    ``index`` is the row's place in the report (the seed's ``data_id``). ``deciding_metric``
    names the metric that gave the verdict (``"nonfinite_mismatch"`` when one side holds a
    NaN or Inf the other does not; ``None`` for an ``error`` row). ``reason`` is the seed's
    ``cmp_fail_reason``: why no metric could be computed, or what was noticed on the way
    (a dtype difference, NaN counts). ``golden_stats`` / ``my_stats`` are the statistics of
    the data as measured (NaN and Inf counts included). ``attribution`` says whether a
    failing row's error was introduced here or inherited from the records that fed it
    (``fed_by``, their labels). ``judged_as`` is the dtype class whose thresholds applied.

    What the verdict learnt about precision noise (``docs/metrics.md``, "Verdicts in reduced
    precision"): ``error`` is the row's value of the error measure (the metric whose
    :attr:`MetricSpec.error_measure` is set; for a statistics-only pair its L2-norm lower
    bound), ``feeder_error`` the largest error among its feeders and ``growth`` their ratio
    (how much error this place adds). ``structure`` is the record name with the repeated
    block's index abstracted (``model.layers.{i}.mlp.down_proj``) and ``layer_index`` that
    index; ``sibling_growth`` is the (lowest, highest) growth the same place shows in the
    ``sibling_count`` other repeats. ``noise_error`` is the error of the same tensor in the
    noise twin (``compare --noise-path``), and ``expected_error`` the error this place
    should carry at this precision (the twin's, else the feeders' grown by the siblings'
    median growth); ``None`` where unknown. ``evidence`` says in words why a row was judged
    introduced or failing beyond the dtype table.
    """

    index: int
    golden: TensorRecord
    my: TensorRecord
    rule: str
    metrics: Mapping[str, MetricResult]
    verdict: str
    deciding_metric: str | None = None
    reason: str = ""
    golden_stats: TensorStats | None = None
    my_stats: TensorStats | None = None
    nonfinite_mismatch: int = 0
    attribution: str = ""
    fed_by: tuple[str, ...] = ()
    judged_as: str = ""
    error: float | None = None
    feeder_error: float | None = None
    growth: float | None = None
    structure: str = ""
    layer_index: int | None = None
    sibling_growth: tuple[float, float] | None = None
    sibling_count: int = 0
    noise_error: float | None = None
    expected_error: float | None = None
    evidence: str = ""

    def with_changes(self, **changes: Any) -> ComparisonRow:
        """Return a copy with the given fields replaced.

        Asked for every row of a compare (10**5 in a decode dump): the fields are read in one
        call and passed positionally, cheaper than :func:`dataclasses.replace`.
        """
        values = list(_ROW_VALUES(self))
        for name, value in changes.items():
            position = _ROW_POSITION.get(name)
            if position is None:
                raise TypeError(f"ComparisonRow has no field {name!r}")
            values[position] = value
        return _build_row(*values)


_ROW_POSITION = {row_field.name: position for position, row_field in enumerate(fields(ComparisonRow))}
_ROW_VALUES = operator.attrgetter(*_ROW_POSITION)


def slot_builder(cls: type[_Built], *, skip_post_init: bool = False) -> Callable[..., _Built]:
    """Return a function taking a frozen slots dataclass's fields as its ``__init__`` does, building the same object faster.

    Why: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    looked up by name field by field. The loader, the judge and the reports build several
    objects per pair -- 10**6 for a 10**5-record decode dump -- and that was the larger part
    of loading a dump and of judging it. The function made here (generated once, as
    ``dataclasses`` makes ``__init__``) sets the slots through their descriptors: the object
    equals what the class gives, field for field, defaults included. A class whose
    ``__post_init__`` checks its fields is refused unless ``skip_post_init`` says the
    caller's values pass that check by construction.
    """
    if cls.__dict__.get("__post_init__") is not None and not skip_post_init:
        raise TypeError(f"{cls.__name__} checks its fields in __post_init__, which the builder would skip")
    names = [built_field.name for built_field in fields(cls)]  # type: ignore[arg-type]
    if tuple(names) != tuple(cls.__dict__.get("__slots__", ())):
        raise TypeError(f"{cls.__name__} is not a slots dataclass whose slots are its fields")
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_unset": MISSING}
    parameters, setting = [], ""
    for built_field in fields(cls):  # type: ignore[arg-type]
        name = built_field.name
        namespace[f"_set_{name}"] = getattr(cls, name).__set__
        if built_field.default is not MISSING:
            namespace[f"_default_{name}"] = built_field.default
            parameters.append(f"{name}=_default_{name}")
        elif built_field.default_factory is not MISSING:  # a fresh default per object, as the class makes it
            namespace[f"_factory_{name}"] = built_field.default_factory
            parameters.append(f"{name}=_unset")
            setting += f"    if {name} is _unset:\n        {name} = _factory_{name}()\n"
        else:
            parameters.append(name)
    setting += "".join(f"    _set_{name}(built, {name})\n" for name in names)
    exec(f"def build({', '.join(parameters)}):\n    built = _new(_cls)\n{setting}    return built\n", namespace)
    build: Callable[..., _Built] = namespace["build"]
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build


#: ``ComparisonRow(...)``, built faster (:func:`slot_builder`): the judge builds one per pair.
build_row = _build_row = slot_builder(ComparisonRow)
#: ``MetricResult(...)``, built faster: the judge builds one per metric per pair.
build_metric_result = slot_builder(MetricResult)
#: ``TensorStats(...)``, built faster: two per measured pair, one per record of a statistics dump.
build_stats = slot_builder(HeldStats)
#: ``TensorRecord(...)``, built faster: what a loader makes for each record.
build_record = slot_builder(HeldRecord)


class MetricLayout:
    """The metrics some rows hold, in order, with the thresholds they were judged against: one, shared by those rows.

    The rows of one compare judged in one dtype class (and, with threshold overrides, under
    one record name) hold the same metrics with the same thresholds; only the values and
    verdicts differ (:class:`JudgedMetrics`).
    """

    __slots__ = ("fail", "higher_is_better", "names", "positions", "warn")

    def __init__(
        self,
        names: Sequence[str],
        warn: Sequence[float | None],
        fail: Sequence[float | None],
        higher_is_better: Sequence[bool],
    ) -> None:
        self.names = tuple(names)
        self.positions = {name: position for position, name in enumerate(self.names)}
        self.warn, self.fail, self.higher_is_better = tuple(warn), tuple(fail), tuple(higher_is_better)


class JudgedMetrics(Mapping[str, MetricResult]):
    """A row's metric results as a read-only mapping, held as a value and a verdict per metric of a :class:`MetricLayout`.

    Why: held as a dict of :class:`MetricResult`, the nine metrics of a row cost 1.3 KB --
    64 MB for a 50 000-pair decode dump, the largest part of its rows, and a fifth of the
    compare's peak memory. Held here they cost the values and a tuple. Asked for a metric, it
    makes the :class:`MetricResult` a dict would hold (equal field for field); it keeps none.
    A reader that wants only values asks :func:`metric_value`, which makes nothing. The
    mapping equals a dict holding the same results.
    """

    __slots__ = ("_layout", "_values", "_verdicts")

    def __init__(self, layout: MetricLayout, values: Sequence[float], verdicts: tuple[str, ...]) -> None:
        self._layout, self._values, self._verdicts = layout, values, verdicts

    def _result(self, position: int) -> MetricResult:
        layout = self._layout
        return build_metric_result(
            layout.names[position],
            self._values[position],
            self._verdicts[position],
            layout.warn[position],
            layout.fail[position],
            layout.higher_is_better[position],
        )

    def __getitem__(self, name: str) -> MetricResult:
        return self._result(self._layout.positions[name])

    def get(self, name: str, default: Any = None) -> Any:
        position = self._layout.positions.get(name)
        return default if position is None else self._result(position)

    def __contains__(self, name: object) -> bool:
        return name in self._layout.positions

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout.names)

    def __len__(self) -> int:
        return len(self._values)

    def value(self, name: str) -> float | None:
        """Return the named metric's value, None where the row holds no such metric."""
        position = self._layout.positions.get(name)
        return None if position is None else self._values[position]

    @property
    def verdicts(self) -> tuple[str, ...]:
        """Return each metric's verdict, in order."""
        return self._verdicts

    def alike(self, values: Sequence[float]) -> JudgedMetrics:
        """Return the results of a row judged alike -- the same metrics, limits and verdicts -- whose values are ``values``."""
        return JudgedMetrics(self._layout, values, self._verdicts)

    def __repr__(self) -> str:
        return f"JudgedMetrics({dict(self)!r})"


_FLOAT = float


def held_values(values: list[Any]) -> Sequence[float]:
    """Return a row's metric values for a :class:`JudgedMetrics` to hold: as C doubles when every one is a float.

    Why: as a tuple, nine values cost the tuple and nine float objects (330 bytes a row);
    as an ``array('d')``, 140 -- and each reads back as the float it was, bit for bit. Values
    of any other type (an int statistic, a numpy scalar) are held as they are, in a tuple,
    so that a report prints them as before.
    """
    if all(type(value) is _FLOAT for value in values):
        return array("d", values)
    return tuple(values)


def metric_value(metrics: Mapping[str, MetricResult], name: str) -> float | None:
    """Return a metric's value in a row's ``metrics``, None where it is not there, without making a result."""
    if type(metrics) is JudgedMetrics:
        return metrics.value(name)
    result = metrics.get(name)
    return None if result is None else result.value


def _alike_layouts(rows_metrics: Sequence[Mapping[str, MetricResult]]) -> set[MetricLayout] | None:
    """Return the layouts of the rows' metrics when all are :class:`JudgedMetrics` over layouts naming the same metrics in the same order.

    The usual case for a block of rows: one layout per dtype class, all of one compare's metrics.
    """
    if not rows_metrics or any(type(metrics) is not JudgedMetrics for metrics in rows_metrics):
        return None
    layouts = {metrics._layout for metrics in cast("Sequence[JudgedMetrics]", rows_metrics)}
    names = next(iter(layouts)).names
    return layouts if all(layout.names == names for layout in layouts) else None


#: One metric across rows (:func:`metric_columns`): values, verdicts, warn and fail thresholds, directions.
MetricColumns = tuple[list[float | None], list[str | None], list[float | None], list[float | None], list[bool | None]]


def metric_columns(rows_metrics: Sequence[Mapping[str, MetricResult]], names: Sequence[str]) -> list[MetricColumns]:
    """Return each named metric's fields across the rows' ``metrics`` (None where a row lacks it), making no results.

    A report reads every metric of every row: 10**6 :class:`MetricResult` made only to be read.
    """
    layouts = _alike_layouts(rows_metrics)
    if layouts is None:
        return [_mixed_metric_columns(rows_metrics, name) for name in names]
    # the usual case: each metric has the same place in every row
    judged = cast("Sequence[JudgedMetrics]", rows_metrics)
    count = len(judged)
    row_layouts = [next(iter(layouts))] * count if len(layouts) == 1 else [metrics._layout for metrics in judged]
    columns: list[MetricColumns] = []
    for name in names:
        position = row_layouts[0].positions.get(name)
        if position is None:
            columns.append(([None] * count, [None] * count, [None] * count, [None] * count, [None] * count))
            continue
        values: list[float | None] = [metrics._values[position] for metrics in judged]
        verdicts: list[str | None] = [metrics._verdicts[position] for metrics in judged]
        if len(layouts) == 1:
            layout = row_layouts[0]
            warn: list[float | None] = [layout.warn[position]] * count
            fail: list[float | None] = [layout.fail[position]] * count
            higher: list[bool | None] = [layout.higher_is_better[position]] * count
        else:
            warn = [layout.warn[position] for layout in row_layouts]
            fail = [layout.fail[position] for layout in row_layouts]
            higher = [layout.higher_is_better[position] for layout in row_layouts]
        columns.append((values, verdicts, warn, fail, higher))
    return columns


def metric_values(rows_metrics: Sequence[Mapping[str, MetricResult]], names: Sequence[str]) -> list[list[float | None]]:
    """Return each named metric's values across the rows' ``metrics`` (None where a row lacks it): :func:`metric_columns`' first field, alone."""
    layouts = _alike_layouts(rows_metrics)
    if layouts is None:
        return [[metric_value(metrics, name) for metrics in rows_metrics] for name in names]
    judged = cast("Sequence[JudgedMetrics]", rows_metrics)
    positions = next(iter(layouts)).positions
    return [
        [None] * len(judged)
        if (position := positions.get(name)) is None
        else [metrics._values[position] for metrics in judged]
        for name in names
    ]


def _mixed_metric_columns(rows_metrics: Sequence[Mapping[str, MetricResult]], name: str) -> MetricColumns:
    """Return :func:`metric_columns` of one metric for rows not all alike (plain dicts among them)."""
    absent = (None, None, None, None, None)
    fields_per_row: list[tuple[Any, ...]] = []
    for metrics in rows_metrics:
        result = metrics.get(name)
        fields_per_row.append(
            absent
            if result is None
            else (result.value, result.verdict, result.warn_threshold, result.fail_threshold, result.higher_is_better)
        )
    if not fields_per_row:
        return [], [], [], [], []
    columns = [list(column) for column in zip(*fields_per_row)]
    return columns[0], columns[1], columns[2], columns[3], columns[4]


@dataclass(frozen=True, slots=True)
class OpReference:
    """A reference implementation of one operator type, registered for ``llmcheck opcheck``.

    ``compute(inputs, params)`` gets the op's dumped input tensors keyed by their record
    position (``"0"``, ``"1"``; ``"1.0"`` for a tensor inside a list argument), in their
    dumped dtypes on the reference device -- a position the dump lacks is absent -- and
    ``params``: the op's parameters as the source recorded them (ATB's ``op_param.json``,
    the recorded call arguments of a torch op). It returns the op's outputs in output
    position order (``"0"``, ``"1"``, ...), computed in higher precision (float64 where the
    op allows), or a mapping from output position to tensor; opcheck measures each dumped
    output against the one at its position. It
    raises :class:`~llmcheck.core.errors.UnsupportedOpError` for a variant it cannot
    compute (the report lists the op with that reason).

    ``inplace_inputs`` names, for ops that write into their inputs (ATB's KvCache,
    ReshapeAndCache), the input positions whose after-state is the op's result, in output
    order: opcheck uses them when the dump holds no output tensors for the op.

    ``compute_as_recorded``, when given, takes the same arguments as ``compute`` but computes
    the op at the recorded run's precision -- its inputs in their dumped dtypes, nothing
    widened -- on the CPU. Its distance from ``compute``'s float64 result is the rounding a
    correct kernel of that precision makes (an accumulation that cancels loses far more than
    the dtype's relative tolerance); opcheck allows each dumped output that much
    (``opcheck/criteria.py``). ``None``: only the fixed tolerance of the dtype applies.

    ``pointwise`` says the op maps each element on its own (PyTorch tags such ATen ops
    ``pointwise``): given a tensor of its input's recorded min and max, ``compute`` gives what
    those two elements become, so a compare can replay a statistics-only call on its
    recorded extremes (:mod:`llmcheck.core.judging.op_replay`).
    """

    op_type: str
    compute: Callable[
        [Mapping[str, torch.Tensor], Mapping[str, Any]], Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
    ]
    description: str
    inplace_inputs: tuple[int, ...] = ()
    compute_as_recorded: (
        Callable[[Mapping[str, torch.Tensor], Mapping[str, Any]], Sequence[torch.Tensor] | Mapping[str, torch.Tensor]]
        | None
    ) = None
    pointwise: bool = False

    @property
    def name(self) -> str:
        """Return the op type, the name the registry keys this reference by."""
        return self.op_type


@dataclass(frozen=True, slots=True)
class CaptureRequest:
    """What ``llmcheck dump`` asks a capture backend to do.

    ``command`` is the user's program as an argv list (never a shell string).
    ``options`` holds the value of every option the backend declared
    (``llmcheck_register_backend_options``) by its name, already parsed -- for a backend
    that declares the seed flags: ``type``, ``only_save_desc``, ``save_operation_ids``,
    ``execute_range``, ``save_operation_child``, ``save_time``, ``operation_name``,
    ``save_tensor_part``, ``device_id``, ``seed``; a backend rejects, with a
    :class:`UsageError`, a combination it cannot honour.
    """

    backend: str
    command: Sequence[str]
    output_dir: Path
    options: Mapping[str, Any] = field(default_factory=dict)
    log_level: str = "info"


class CaptureBackend(Protocol):
    """A way of recording a run, named for ``llmcheck dump --backend NAME``.

    A backend that can also record a model object inside the calling process offers
    ``capture_model(model, request)``, returning a context manager whose ``path`` is the
    dump folder once it is closed (the ``torch`` backend does; ``llmcheck demo`` uses it).
    A backend with a true ``is_default`` attribute is the one ``llmcheck dump`` uses without
    ``--backend`` (at most one may claim it).
    """

    name: str
    description: str

    def run(self, request: CaptureRequest) -> int:
        """Run the user's command with capture on and return its exit code."""
