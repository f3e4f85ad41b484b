"""Where captured tensors go: copied off the run, measured, batched, handed to the dump writer.

Shared by the captures that write llmcheck's own dump format (the torch module/op capture,
the FX backend's fast path); plugins reach it through ``llmcheck.plugin_api``.

Why it is shaped like this:

* The run must not change and later in-place ops must not change what was saved, so every
  tensor is copied at the moment it is seen -- never read later from the live tensor.
* The forward only copies: one ``clone`` per distinct tensor, no statistics, no host
  read, no wait. At the end of a step (or when ``max_pending_bytes`` of copies are held)
  the batch goes to the dump writer's thread (:meth:`DumpWriter.add_prepared`), which
  measures the copies and writes them while the program runs on: small copies and every
  accelerator copy together by :func:`segmented_stats_vectors` (a dozen calls per
  distinct size, where :func:`stats_vector` costs about twenty per tensor -- a kernel
  launch each on an accelerator), a large CPU copy alone in cache-sized chunks. From an
  accelerator the statistics and data go to pinned host memory by asynchronous copies
  that the writer thread waits for on an event (:func:`wait_for_copies`); torch's
  pinned-memory cache hands the buffers of a written batch to the next one (the ring).
* The writer's queue holds one batch besides the one being written: the forward waits
  only when the writer is that far behind -- back-pressure, never loss.
* A tensor seen several times in one step (a module's output is the next module's input;
  q, k and v projections share their input) is copied and measured once: the same Python
  object, alive and with an unchanged version counter, is the same data. The writer
  stores one copy for all its records. An operator's output seen inside the dispatch
  mode does not have its final version counter yet (autograd bumps it after an in-place
  op and gives a view its base's counter once the mode returns), so it is never reused
  there and its version is read at the next capture, when it is final.
* Pending copies are bounded by ``max_pending_bytes``: past it, the batch is handed over
  mid-step so memory never grows with the model (at most three batches exist: the one
  filling, the one queued and the one being written).
"""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from llmcheck.core.capture.dump_progress import DumpProgress
from llmcheck.core.capture.statistics import segmented_stats_vectors, stats_json_from_rows, stats_vector
from llmcheck.core.dtypes import DTYPE_ITEMSIZE
from llmcheck.core.dumps.store import DumpWriter, KeyFields, index_line
from llmcheck.core.dumps.tensor_io import dtype_name
from llmcheck.core.records import TopologyNode

#: CPU tensors up to this many elements are measured with their batch, larger ones one by one.
SMALL_TENSOR_ELEMENTS = 1 << 16

_NO_ATTRS: Mapping[str, Any] = {}


@dataclass(slots=True)
class _Slot:
    """One distinct tensor of a batch: the copy taken when it was seen, and the copy the dump gets."""

    copy: torch.Tensor | None  # measured by the writer thread (then dropped)
    host: torch.Tensor | None  # the CPU copy written to the dump (None for statistics only; set there from a device)


#: A record waiting for the writer thread to measure its copy and write its index line, as a tuple (the
#: forward makes one per recorded tensor): key fields, dtype, shape, order, device, op_type, parent, attrs,
#: and the index of its copy in the batch's slots (None: not captured -- sparse, meta, unknown dtype).
_PendingRecord = tuple[
    KeyFields, str, tuple[int, ...], int, str, "str | None", "str | None", Mapping[str, Any], "int | None"
]


@dataclass(slots=True)
class _SeenTensor:
    """What was saved for a live tensor object this batch, valid while it is alive and unchanged."""

    ref: weakref.ref[torch.Tensor]
    version: int | None  # None until settled (an operator output seen inside the dispatch mode)
    shape: torch.Size
    slot: int
    identity: int


@dataclass
class _Batch:
    """What waits for the next hand-over: records, the distinct tensors they point at, what was seen."""

    records: list[_PendingRecord] = field(default_factory=list)
    slots: list[_Slot] = field(default_factory=list)
    seen: dict[int, _SeenTensor] = field(default_factory=dict)
    #: data named by the caller (a model weight) -> (version, slot, identity): stored once however it is viewed
    same_data: dict[Any, tuple[int | None, int, int]] = field(default_factory=dict)
    unsettled: list[int] = field(default_factory=list)  # ids of operator outputs awaiting their version
    pending_bytes: int = 0
    #: CUDA devices of the copies -> the stream they were made on (set at hand-over)
    streams: dict[torch.device, Any] = field(default_factory=dict)
    cuda_devices: set[torch.device] = field(default_factory=set)


def version_counter(tensor: torch.Tensor) -> int | None:
    """Return the tensor's in-place version counter, or ``None`` for inference tensors (they have none).

    Asked first rather than caught: reading ``_version`` of an inference tensor raises a C++
    error whose translation costs about 20 us -- per recorded tensor, in a program that runs
    under ``torch.inference_mode()`` (vLLM), twice the rest of a record's cost.
    """
    return None if tensor.is_inference() else tensor._version


@dataclass(frozen=True, slots=True)
class _TensorKind:
    """What records of tensors of one (dtype, layout, device) share: whether they are copied, their texts."""

    capturable: bool  # dense, real storage, a known dtype
    dtype: str
    device: str
    on_cpu: bool
    on_cuda: bool
    item_bytes: int


def _kind_of(tensor: torch.Tensor) -> _TensorKind:
    dtype = dtype_name(tensor.dtype)
    capturable = tensor.layout == torch.strided and not tensor.is_meta and dtype in DTYPE_ITEMSIZE
    return _TensorKind(
        capturable,
        dtype,
        str(tensor.device),
        tensor.device.type == "cpu",
        tensor.device.type == "cuda",
        tensor.element_size() if capturable else 0,
    )


def copies_to_host(device_copies: list[torch.Tensor]) -> list[torch.Tensor]:
    """Return CPU tensors receiving the device tensors' values by one asynchronous pinned transfer.

    The values are there once the copy is done (:func:`wait_for_copies`). The tensors are views of
    one pinned buffer, placed largest item size first so each view is aligned.
    """
    order = sorted(range(len(device_copies)), key=lambda i: -device_copies[i].element_size())
    flat = torch.cat([device_copies[i].reshape(-1).view(torch.uint8) for i in order])
    pinned = torch.empty(flat.numel(), dtype=torch.uint8, pin_memory=True)
    pinned.copy_(flat, non_blocking=True)
    hosts: list[torch.Tensor] = [pinned] * len(device_copies)
    offset = 0
    for i in order:
        copy = device_copies[i]
        nbytes = copy.numel() * copy.element_size()
        hosts[i] = pinned[offset : offset + nbytes].view(copy.dtype).reshape(copy.shape)
        offset += nbytes
    return hosts


def wait_for_copies(devices: Iterable[torch.device], streams: Mapping[torch.device, Any]) -> None:
    """Wait until the work queued so far on these accelerator devices is done, without a synchronising call.

    On CUDA an event recorded now on the copies' stream (``streams``, else the current
    one) is polled: unlike ``synchronize()`` this never trips
    ``torch.cuda.set_sync_debug_mode`` and only the calling (writer) thread waits.
    """
    for device in devices:
        if device.type == "cuda":
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(streams.get(device) or torch.cuda.current_stream(device))
            while not event.query():  # type: ignore[no-untyped-call]
                time.sleep(_POLL_S)
        else:
            accelerator = getattr(torch, "accelerator", None)
            if accelerator is not None and hasattr(accelerator, "synchronize"):
                accelerator.synchronize(device)
            else:  # torch_npu and other backends register a torch.<type> module
                getattr(torch, device.type).synchronize(device)


#: How often the writer thread looks whether an accelerator's copies are done.
_POLL_S = 0.0002


def _prepare_lines(
    batch: _Batch, rank: int, statistics_only: bool
) -> tuple[list[dict[str, Any]], list[torch.Tensor | None]]:
    """Return a handed-over batch's index lines and CPU tensors (run by the writer thread)."""
    slots = batch.slots
    stats = _measure(slots, statistics_only, batch.streams)
    lines = []
    tensors: list[torch.Tensor | None] = []
    for key, dtype, shape, order, device, op_type, parent, attrs, index in batch.records:
        lines.append(
            index_line(
                key, dtype, shape, order, device, rank, op_type, parent, None if index is None else stats[index], attrs
            )
        )
        tensors.append(None if index is None else slots[index].host)
    return lines, tensors


def _measure(slots: list[_Slot], statistics_only: bool, streams: Mapping[torch.device, Any]) -> list[dict[str, Any]]:
    """Return the statistics of every slot: small copies measured together, one host copy per device.

    ``streams`` are the CUDA streams the forward made the copies on (its current ones).
    From an accelerator, the statistics and (unless statistics only) the data go to pinned
    host memory by asynchronous copies, and this thread waits on an event for them -- a
    wait that neither blocks the captured program nor counts as a synchronisation.
    """
    stats: list[dict[str, Any]] = [{}] * len(slots)
    measured: list[tuple[list[int], torch.Tensor]] = []
    batched: dict[torch.device, tuple[list[int], list[torch.Tensor]]] = {}
    alone: tuple[list[int], list[torch.Tensor]] = ([], [])  # large CPU copies: each measured in cache-sized chunks
    with torch.no_grad():
        for index, slot in enumerate(slots):
            copy, slot.copy = slot.copy, None
            if copy is None:
                continue
            if copy.device.type == "cpu" and copy.numel() > SMALL_TENSOR_ELEMENTS:
                alone[0].append(index)
                alone[1].append(stats_vector(copy))
            else:
                indices, copies = batched.setdefault(copy.device, ([], []))
                indices.append(index)
                copies.append(copy)
        other_accelerators = [device for device in batched if device.type not in ("cpu", "cuda")]
        wait_for_copies(other_accelerators, streams)  # their copies may be on a stream this thread cannot name
        for device, (indices, copies) in batched.items():
            # on the stream the copies were made on: ordered after them, and their memory stays with it
            stream = streams.get(device)
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                rows = segmented_stats_vectors(copies)
                if device.type != "cpu":
                    if not statistics_only:
                        for i, host in zip(indices, copies_to_host(copies)):
                            slots[i].host = host
                    rows = copies_to_host([rows])[0]
            measured.append((indices, rows))
        if alone[0]:
            measured.append((alone[0], torch.stack(alone[1])))
        wait_for_copies([device for device in batched if device.type != "cpu"], streams)
        for indices, rows in measured:
            for i, row_stats in zip(indices, stats_json_from_rows(rows)):
                stats[i] = row_stats
    return stats


class TensorSink:
    """Collects captured tensors of one dump and hands them to the :class:`DumpWriter` in batches."""

    def __init__(
        self,
        writer: DumpWriter,
        *,
        rank: int,
        statistics_only: bool,
        max_pending_bytes: int,
        progress: DumpProgress | None = None,
        on_not_captured: Callable[[KeyFields, str], None] | None = None,
    ) -> None:
        self.writer = writer
        #: told the key and description of each tensor recorded without data (sparse, meta, unknown dtype)
        self.on_not_captured = on_not_captured
        #: told of every batch handed over (``None``: nobody is watching, see :mod:`.dump_progress`)
        self.progress = progress if progress is not None else DumpProgress.for_this_process()
        self.bytes_handed_over = 0
        self.rank = rank
        self.statistics_only = statistics_only
        self.max_pending_bytes = max_pending_bytes
        self.records_added = 0
        self._batch = _Batch()
        self._order = 0
        self._identities = 0
        self._kinds: dict[tuple[Any, Any, Any], _TensorKind] = {}

    def add(
        self,
        key: KeyFields,
        tensor: torch.Tensor,
        *,
        op_type: str | None,
        parent: str | None,
        attrs: Mapping[str, Any] | None = None,
        op_output: bool = False,
        same_data: Any = None,
    ) -> int:
        """Record ``tensor`` under ``key`` (a :class:`RecordKey`'s fields) as it is now: copied now, measured later.

        ``op_output`` marks the result of an operator still inside the dispatch mode (see
        the module docstring). ``same_data`` names the data when the caller knows it (a
        model weight, seen by op level as a new tensor object per operator): records with
        the same name and version counter share one copy. Returns the tensor's identity: equal for records of the same
        data seen in one batch (the torch capture's dataflow edges in its ONNX module graph). The path
        is a handful of Python operations and one ``clone`` -- no statistics, no host read.
        """
        batch = self._batch
        version = None if tensor.is_inference() else tensor._version  # an inference tensor has no counter
        seen = None if op_output else batch.seen.get(id(tensor))
        shape = tensor.shape
        known = batch.same_data.get(same_data) if same_data is not None else None
        kind_key = (tensor.dtype, tensor.layout, tensor.device)
        kind = self._kinds.get(kind_key) or self._kinds.setdefault(kind_key, _kind_of(tensor))
        if (
            seen is not None
            and seen.version == version
            and version is not None
            and seen.ref() is tensor
            and seen.shape == shape
        ):
            slot: int | None = seen.slot
            identity = seen.identity
        elif known is not None and known[0] == version and version is not None:
            _, slot, identity = known
        else:
            self._identities += 1
            identity = self._identities
            if not kind.capturable:
                slot = None
                description = f"{tensor.layout} {tensor.dtype} on {tensor.device}"
                attrs = {**(attrs or {}), "not_captured": description}
                if self.on_not_captured is not None:
                    self.on_not_captured(key, description)
            else:
                source = tensor.detach() if tensor.requires_grad else tensor
                copy = source.clone(memory_format=torch.contiguous_format)  # measured by the writer thread
                if kind.on_cuda:
                    batch.cuda_devices.add(copy.device)
                batch.slots.append(_Slot(copy, copy if kind.on_cpu and not self.statistics_only else None))
                batch.pending_bytes += copy.numel() * kind.item_bytes
                slot = len(batch.slots) - 1
                if version is not None:
                    batch.seen[id(tensor)] = _SeenTensor(
                        weakref.ref(tensor), None if op_output else version, shape, slot, identity
                    )
                    if op_output:
                        batch.unsettled.append(id(tensor))
                    if same_data is not None:
                        batch.same_data[same_data] = (version, slot, identity)
        batch.records.append(
            (key, kind.dtype, tuple(shape), self._order, kind.device, op_type, parent, attrs or _NO_ATTRS, slot)
        )
        self._order += 1
        if batch.pending_bytes >= self.max_pending_bytes:
            self.hand_over()
        return identity

    def settle_versions(self) -> None:
        """Read the now final version counters of operator outputs seen inside the dispatch mode."""
        batch = self._batch
        if not batch.unsettled:
            return
        for tensor_id in batch.unsettled:
            seen = batch.seen.get(tensor_id)
            tensor = seen.ref() if seen is not None else None
            if seen is not None and tensor is not None:
                seen.version = version_counter(tensor)
        batch.unsettled.clear()

    def hand_over(self, finished_step: int | None = None, build_tree: Callable[[], TopologyNode] | None = None) -> None:
        """Hand the batch to the writer thread, which measures, moves and writes it; the forward goes on.

        ``finished_step`` is the step this hand-over closes (``None`` mid-step or at close);
        ``build_tree`` builds the module tree to write after it (``None``: unchanged).
        The forward waits only while the writer is a whole batch behind (back-pressure).
        """
        batch, self._batch = self._batch, _Batch()
        if not batch.records:
            if build_tree is not None:
                self.writer.write_topology_later(build_tree)
            self._tell_progress(finished_step, step_done=True)
            return
        batch.streams = {device: torch.cuda.current_stream(device) for device in batch.cuda_devices}
        self.writer.add_prepared(functools.partial(_prepare_lines, batch, self.rank, self.statistics_only), build_tree)
        self.records_added += len(batch.records)
        self.bytes_handed_over += 0 if self.statistics_only else batch.pending_bytes
        self._tell_progress(
            batch.records[-1][0][3] if finished_step is None else finished_step, step_done=finished_step is not None
        )

    def _tell_progress(self, step: int | None, *, step_done: bool) -> None:
        if self.progress is not None and step is not None:
            self.progress.batch_written(
                step=step, records=self.records_added, tensor_bytes=self.bytes_handed_over, step_done=step_done
            )

    def close(self, build_tree: Callable[[], TopologyNode] | None) -> None:
        """Write every pending record and the module tree (``None``: unchanged since written), close the dump."""
        self.hand_over(build_tree=build_tree)
        self.writer.close()
        self.finish()

    def close_cut(self, reason: str) -> tuple[int, str | None]:
        """Close the dump after a failure at its last complete record.

        Return how many records it keeps, and why its closing manifest could not be written
        (``None``: the manifest marks it cut).
        """
        self._batch = _Batch()
        self.finish()  # the progress display ends with the capture
        unclosed = self.writer.close_cut(reason)
        return self.writer.records_written, unclosed

    def finish(self) -> None:
        """End the progress display (the dump is complete)."""
        if self.progress is not None:
            self.progress.close()


class NullSink:
    """The sink of a capture that writes no dump (``device_ids`` leave this process out): it keeps nothing."""

    records_added = 0

    def add(
        self,
        key: KeyFields,
        tensor: torch.Tensor,
        *,
        op_type: str | None,
        parent: str | None,
        attrs: Mapping[str, Any] | None = None,
        op_output: bool = False,
        same_data: Any = None,
    ) -> int:
        """Keep nothing; every record has identity 0."""
        return 0

    def settle_versions(self) -> None:
        """Nothing is pending."""

    def hand_over(self, finished_step: int | None = None, build_tree: Callable[[], TopologyNode] | None = None) -> None:
        """Nothing is pending, no dump to write the tree into."""

    def close(self, build_tree: Callable[[], TopologyNode] | None) -> None:
        """No dump to close."""

    def close_cut(self, reason: str) -> tuple[int, str | None]:
        """No dump to cut: it keeps no record, and there is no manifest to write."""
        return 0, None
