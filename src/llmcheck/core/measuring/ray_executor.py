"""Measuring pairs on a Ray cluster (``llmcheck compare --executor ray``), near the data they read.

A dump of a large model over many tokens and ranks can be terabytes on the local disks of
several nodes. The local executor (:func:`llmcheck.core.measuring.metric_engine.measure_pairs`) brings
every byte to one machine; this one sends the measuring to where the bytes are:

* pairs are grouped by the files they read (one rank's shard, one tensor file), and the
  groups cut into chunks of about :data:`CHUNK_TARGET_BYTES`;
* before scheduling, one probe task per node says which of those files that node can open;
  each chunk then runs, with node affinity, on a node holding all its files (the least
  loaded of them), else on the node holding most of its bytes (soft affinity), else
  anywhere (shared storage);
* a task measures its chunk with the very function the local executor uses
  (:func:`~llmcheck.core.measuring.metric_engine.measure_jobs`: small pairs in groups, others streamed; same chunk size, same accumulators,
  single-threaded BLAS like the local worker processes) and returns only the measurements -- metric values and statistics, never tensors -- so
  the report is the same, bit for bit in the metric columns;
* a task whose worker dies is retried (:data:`TASK_RETRIES` times); a chunk that still
  fails is split and its pairs measured one by one, and a pair that fails alone becomes an
  ``error`` row with the reason, never a lost row.

Ray is an optional dependency (``pip install 'llmcheck[ray]'``), imported only here.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmcheck.core.errors import LlmcheckError, UsageError
from llmcheck.core.measuring.metric_engine import measure_jobs, split_by_bytes
from llmcheck.core.measuring.pair_chunk import Workspace
from llmcheck.core.measuring.pair_measure import DEFAULT_CHUNK_VALUES, PairJob, PairMeasurement
from llmcheck.core.records import MetricSpec, TensorData

log = logging.getLogger("llmcheck.ray")

#: A task measures about this many tensor bytes (enough to amortise scheduling, small enough to spread).
CHUNK_TARGET_BYTES = 256 * 1024 * 1024
#: How often Ray reruns a task whose worker process or node died.
TASK_RETRIES = 3
#: A task's BLAS runs on one thread, as in the local executor's worker processes: a dot product
#: split over threads sums in another order, and the last bits of a metric would differ.
SINGLE_THREADED_BLAS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def measure_chunk(jobs: list[PairJob], specs: list[MetricSpec], chunk_values: int) -> list[PairMeasurement]:
    """Return the measurements of a chunk of pairs, as the local executor measures them (runs in a Ray task)."""
    return measure_jobs(jobs, specs, Workspace(chunk_values), chunk_values)


def _local_files(paths: list[str]) -> list[str]:
    """Return the paths this node can read (runs in a probe task on each node)."""
    return [path for path in paths if os.access(path, os.R_OK)]


def _files(job: PairJob) -> tuple[str, ...]:
    """Return the files a job reads by byte range (data behind a loader may come from anywhere)."""
    return tuple(sorted({str(data.path) for data in (job.golden, job.my) if _by_path(data)}))


def _by_path(data: TensorData) -> bool:
    return data.loader is None and data.path is not None


def chunks_by_location(jobs: Sequence[PairJob], target_bytes: int = CHUNK_TARGET_BYTES) -> list[list[PairJob]]:
    """Return the jobs grouped by the files they read, each group cut into chunks of about ``target_bytes``."""
    groups: dict[tuple[str, ...], list[PairJob]] = defaultdict(list)
    for job in jobs:
        groups[_files(job)].append(job)
    return [chunk for group in groups.values() for chunk in split_by_bytes(group, target_bytes)]


@dataclass
class _Placement:
    """Which node holds which files, and how many bytes each node has been given so far."""

    files_on: dict[str, set[str]] = field(default_factory=dict)
    assigned_bytes: dict[str, int] = field(default_factory=dict)

    def node_for(self, chunk: list[PairJob]) -> tuple[str | None, bool]:
        """Return ``(node id, hard)`` for a chunk: a node holding all its files, else most of its bytes, else None."""
        needed: dict[str, int] = defaultdict(int)
        for job in chunk:
            for data in (job.golden, job.my):
                if _by_path(data):
                    needed[str(data.path)] += data.nbytes
        if not needed or not self.files_on:
            return None, False
        holding_all = [node for node, files in self.files_on.items() if needed.keys() <= files]
        hard = bool(holding_all)
        candidates = holding_all or list(self.files_on)
        present = {
            node: sum(size for path, size in needed.items() if path in self.files_on[node]) for node in candidates
        }
        if not hard and not any(present.values()):
            return None, False  # no node holds any of it: shared storage, or nothing to go by
        node = max(candidates, key=lambda node: (present[node], -self.assigned_bytes.get(node, 0)))
        self.assigned_bytes[node] = self.assigned_bytes.get(node, 0) + sum(needed.values())
        return node, hard


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise UsageError(
            "the ray executor needs Ray",
            where="--executor ray",
            hint="pip install 'llmcheck[ray]', or use --executor local",
        ) from exc
    return ray


class RayExecutor:
    """Measures pairs as Ray tasks on the cluster at ``address`` (None: the running one, else a local one)."""

    def __init__(
        self,
        address: str | None = None,
        chunk_values: int = DEFAULT_CHUNK_VALUES,
        chunk_bytes: int = CHUNK_TARGET_BYTES,
    ) -> None:
        self.address = address
        self.chunk_values = chunk_values
        self.chunk_bytes = chunk_bytes

    def __call__(
        self,
        jobs: Sequence[PairJob],
        specs: Sequence[MetricSpec],
        on_measured: Callable[[PairMeasurement], None] | None = None,
    ) -> tuple[dict[int, PairMeasurement], dict[int, str]]:
        """Return the measurement of every job that could be measured, and why each other one could not."""
        ray = _ray()
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise UsageError(
                    f"cannot reach the Ray cluster: {exc}",
                    where=f"--ray-address {self.address}",
                    hint="start it with `ray start --head`, or leave --ray-address out for a local one",
                ) from exc
            except Exception as exc:  # Ray raises a bare Exception when a node times out while it starts
                first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise LlmcheckError(
                    f"the Ray cluster did not start: {first_line}",
                    where="--executor ray" if self.address is None else f"--ray-address {self.address}",
                    hint="see `ray status` and Ray's logs under /tmp/ray, or use --executor local",
                ) from exc
        measure = ray.remote(max_retries=TASK_RETRIES, runtime_env={"env_vars": SINGLE_THREADED_BLAS})(measure_chunk)
        specs_ref = ray.put(list(specs))
        placement = self._placement(ray, jobs)
        results: dict[int, PairMeasurement] = {}
        failures: dict[int, str] = {}

        def submit(chunk: list[PairJob]) -> Any:
            node, hard = placement.node_for(chunk)
            options: dict[str, Any] = {}
            if node is not None:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=not hard)
            return measure.options(**options).remote(chunk, specs_ref, self.chunk_values)

        pending = {submit(chunk): chunk for chunk in chunks_by_location(jobs, self.chunk_bytes)}
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                chunk = pending.pop(ref)
                try:
                    measurements = ray.get(ref)
                except Exception as exc:  # a task error or a worker that died every retry
                    if len(chunk) > 1:  # find the pair at fault: the others are measured one by one
                        pending.update({submit([job]): [job] for job in chunk})
                    else:
                        failures[chunk[0].index] = f"measuring failed on the Ray cluster: {_first_line(exc)}"
                    continue
                for measurement in measurements:
                    results[measurement.index] = measurement
                    if on_measured is not None:
                        on_measured(measurement)
        return results, failures

    def _placement(self, ray: Any, jobs: Sequence[PairJob]) -> _Placement:
        """Return which alive node can read which of the jobs' files (one probe task per node)."""
        nodes = [node["NodeID"] for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU")]
        paths = sorted({path for job in jobs for path in _files(job)})
        if len(nodes) < 2 or not paths:
            return _Placement()  # one node: nothing to choose
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(num_cpus=0)(_local_files)
        probes = {
            node: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)).remote(
                paths
            )
            for node in nodes
        }
        return _Placement(files_on={node: set(ray.get(ref)) for node, ref in probes.items()})


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__
