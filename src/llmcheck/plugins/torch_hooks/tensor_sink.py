"""Where captured tensors go: copied off the run, measured, batched, handed to the dump writer.

Why it is shaped like this:

* The run must not change and later in-place ops must not change what was saved, so every
  tensor is copied at the moment it is seen -- never read later from the live tensor.
* Measuring costs about twenty small torch calls per tensor, which a large tensor pays
  for and a small one does not (a decode step's activations, any tensor on an
  accelerator, where each call is a kernel launch). So a large CPU tensor is cloned and
  measured at once (:func:`stats_vector`, in cache-sized chunks), while a small CPU
  tensor or any accelerator tensor is only cloned (one call, no sync) and the batch's
  clones are measured together at the end of the step by
  :func:`segmented_stats_vectors` -- a dozen calls per distinct size -- and, on an
  accelerator, moved to pinned host memory in one asynchronous transfer, then one sync.
* A tensor seen several times in one step (a module's output is the next module's input;
  q, k and v projections share their input) is copied and measured once: the same Python
  object, alive and with an unchanged version counter, is the same data. The writer
  stores one copy for all its records. An operator's output seen inside the dispatch
  mode does not have its final version counter yet (autograd bumps it after an in-place
  op and gives a view its base's counter once the mode returns), so it is never reused
  there and its version is read at the next capture, when it is final.
* Pending copies are bounded by ``max_pending_bytes``: past it, the batch is handed over
  mid-step (one extra sync on an accelerator) so memory never grows with the model.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch

from llmcheck.plugin_api import (
    DTYPE_ITEMSIZE,
    DumpWriter,
    RecordKey,
    TensorRecord,
    dtype_name,
    segmented_stats_vectors,
    stats_from_vectors,
    stats_vector,
)
from llmcheck.plugins.torch_hooks.dump_progress import DumpProgress

#: CPU tensors up to this many elements are measured with their batch, not one by one.
SMALL_TENSOR_ELEMENTS = 1 << 16


@dataclass(slots=True)
class _Slot:
    """One distinct tensor of a batch: how it is measured and the copy the dump gets."""

    vector: torch.Tensor | None  # its statistics, when measured as soon as it was seen
    deferred: torch.Tensor | None  # a clone measured with the batch at hand-over (moved there from a device)
    host: torch.Tensor | None  # the CPU copy written to the dump (None for statistics only)


@dataclass(slots=True)
class _PendingRecord:
    """A record waiting for its statistics (fetched once per batch)."""

    key: RecordKey
    dtype: str
    shape: tuple[int, ...]
    order: int
    device: str
    op_type: str | None
    parent: str | None
    attrs: Mapping[str, Any]
    slot: int | None  # None: not captured (sparse, meta, unknown dtype)


@dataclass(slots=True)
class _SeenTensor:
    """What was saved for a live tensor object this batch, valid while it is alive and unchanged."""

    ref: "weakref.ref[torch.Tensor]"
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
    unsettled: list[int] = field(default_factory=list)  # ids of operator outputs awaiting their version
    pending_bytes: int = 0


def _version(tensor: torch.Tensor) -> int | None:
    """Return the tensor's in-place version counter, or ``None`` for inference tensors (they have none)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _capturable(tensor: torch.Tensor) -> bool:
    """Return whether the tensor's data can be copied and stored (dense, real storage, a known dtype)."""
    return tensor.layout == torch.strided and not tensor.is_meta and dtype_name(tensor.dtype) in DTYPE_ITEMSIZE


def _slot_for(tensor: torch.Tensor, statistics_only: bool) -> tuple[_Slot, int]:
    """Return the copy (and, for a large CPU tensor, the statistics) of a tensor as it is now, and the bytes held."""
    contiguous = torch.contiguous_format
    on_cpu = tensor.device.type == "cpu"
    if not on_cpu or tensor.numel() <= SMALL_TENSOR_ELEMENTS:
        deferred = tensor.clone(memory_format=contiguous)
        host = deferred if on_cpu and not statistics_only else None
        return _Slot(None, deferred, host), deferred.numel() * deferred.element_size()
    if statistics_only:
        # a strided view (a transposed weight) is measured several times slower than a contiguous copy
        source = tensor if tensor.is_contiguous() else tensor.contiguous()
        return _Slot(stats_vector(source), None, None), 0
    host = tensor.clone(memory_format=contiguous)
    return _Slot(stats_vector(host), None, host), host.numel() * host.element_size()


def copies_to_host(device_copies: list[torch.Tensor]) -> list[torch.Tensor]:
    """Return CPU tensors receiving the device tensors' values by one asynchronous pinned transfer.

    The values are there only after the device is synchronised. The tensors are views of
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
        hosts[i] = pinned[offset:offset + nbytes].view(copy.dtype).reshape(copy.shape)
        offset += nbytes
    return hosts


def synchronize(devices: Iterable[torch.device]) -> None:
    """Wait until every queued kernel and copy on these accelerator devices is done."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        else:
            accelerator = getattr(torch, "accelerator", None)
            if accelerator is not None and hasattr(accelerator, "synchronize"):
                accelerator.synchronize(device)
            else:  # torch_npu and other backends register a torch.<type> module
                getattr(torch, device.type).synchronize(device)


class TensorSink:
    """Collects captured tensors of one dump and hands them to the :class:`DumpWriter` in batches."""

    def __init__(self, writer: DumpWriter, *, rank: int, statistics_only: bool, max_pending_bytes: int,
                 progress: DumpProgress | None = None) -> None:
        self.writer = writer
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
        self._names: dict[Any, str] = {}  # dtype or device -> its text in records

    def add(self, key: RecordKey, tensor: torch.Tensor, *, op_type: str | None, parent: str | None,
            attrs: Mapping[str, Any] | None = None, op_output: bool = False) -> int:
        """Record ``tensor`` under ``key`` as it is now (copied now, measured and written later).

        ``op_output`` marks the result of an operator still inside the dispatch mode (see
        the module docstring). Returns the tensor's identity: equal for records of the same
        data seen in one batch (the dataflow edges of :mod:`.module_graph_onnx`).
        """
        batch = self._batch
        seen = None if op_output else batch.seen.get(id(tensor))
        version = _version(tensor)
        slot: int | None
        if seen is not None and seen.version is not None and seen.version == version and seen.ref() is tensor \
                and seen.shape == tensor.shape:
            slot, identity = seen.slot, seen.identity
        elif not _capturable(tensor):
            slot, identity = None, self._new_identity()
            attrs = {**(attrs or {}), "not_captured": f"{tensor.layout} {tensor.dtype} on {tensor.device}"}
        else:
            with torch.no_grad():
                new_slot, nbytes = _slot_for(tensor.detach(), self.statistics_only)
            batch.slots.append(new_slot)
            batch.pending_bytes += nbytes
            slot, identity = len(batch.slots) - 1, self._new_identity()
            if version is not None:
                batch.seen[id(tensor)] = _SeenTensor(weakref.ref(tensor), None if op_output else version,
                                                     tensor.shape, slot, identity)
                if op_output:
                    batch.unsettled.append(id(tensor))
        dtype, device = tensor.dtype, tensor.device
        dtype_text = self._names.get(dtype) or self._names.setdefault(dtype, dtype_name(dtype))
        device_text = self._names.get(device) or self._names.setdefault(device, str(device))
        batch.records.append(_PendingRecord(
            key=key, dtype=dtype_text, shape=tuple(tensor.shape), order=self._order, device=device_text,
            op_type=op_type, parent=parent, attrs=attrs or {}, slot=slot,
        ))
        self._order += 1
        if batch.pending_bytes >= self.max_pending_bytes:
            self.hand_over()
        return identity

    def settle_versions(self) -> None:
        """Read the now final version counters of operator outputs seen inside the dispatch mode."""
        batch = self._batch
        for tensor_id in batch.unsettled:
            seen = batch.seen.get(tensor_id)
            tensor = seen.ref() if seen is not None else None
            if tensor is not None:
                seen.version = _version(tensor)  # type: ignore[union-attr]
        batch.unsettled.clear()

    def _new_identity(self) -> int:
        self._identities += 1
        return self._identities

    def hand_over(self, finished_step: int | None = None) -> None:
        """Measure the batch's deferred copies, move device ones to the host (one sync), write and flush.

        ``finished_step`` is the step this hand-over closes (``None`` mid-step or at close).
        """
        batch, self._batch = self._batch, _Batch()
        if not batch.records:
            self._tell_progress(finished_step, step_done=True)
            return
        slots = batch.slots
        vectors: list[torch.Tensor] = [slot.vector for slot in slots]  # type: ignore[misc]
        deferred: dict[torch.device, list[int]] = {}
        for index, slot in enumerate(slots):
            if slot.deferred is not None:
                deferred.setdefault(slot.deferred.device, []).append(index)
        with torch.no_grad():
            for device, indices in deferred.items():
                copies = [slots[i].deferred for i in indices]
                rows = segmented_stats_vectors(copies)  # type: ignore[arg-type]
                if device.type != "cpu" and not self.statistics_only:
                    for i, host in zip(indices, copies_to_host(copies)):  # type: ignore[arg-type]
                        slots[i].host = host
                for i, row in zip(indices, rows.unbind(0)):
                    vectors[i] = row
                    slots[i].deferred = None
            synchronize(device for device in deferred if device.type != "cpu")  # copies and statistics are done
            stats = stats_from_vectors(vectors) if vectors else []
        for pending in batch.records:
            has_slot = pending.slot is not None
            record = TensorRecord(
                key=pending.key, dtype=pending.dtype, shape=pending.shape, order=pending.order,
                device=pending.device, rank=self.rank, op_type=pending.op_type, parent=pending.parent,
                stats=stats[pending.slot] if has_slot else None, attrs=pending.attrs,  # type: ignore[index]
            )
            self.writer.add(record, slots[pending.slot].host if has_slot else None)  # type: ignore[index]
        self.records_added += len(batch.records)
        self.bytes_handed_over += sum(slot.host.numel() * slot.host.element_size() for slot in slots
                                      if slot.host is not None)
        self.writer.flush()
        self._tell_progress(batch.records[-1].key.step if finished_step is None else finished_step,
                            step_done=finished_step is not None)

    def _tell_progress(self, step: int | None, *, step_done: bool) -> None:
        if self.progress is not None and step is not None:
            self.progress.batch_written(step=step, records=self.records_added, tensor_bytes=self.bytes_handed_over,
                                        step_done=step_done)

    def finish(self) -> None:
        """End the progress display (the dump is complete)."""
        if self.progress is not None:
            self.progress.close()
