"""The ``llmcheck opcheck`` command: recompute every operator of a dump from its dumped inputs and judge its dumped outputs.

The dump is read through the *load tensors* hook (an ATB tensor tree, a torch op-level
dump, any source whose records carry an ``op_type``), grouped into op calls, and each call
is recomputed by the reference its op type resolves to (:meth:`Plugins.op_reference`) on
the CPU -- or a CUDA device with ``-device`` -- in float64 where the op allows. Each
dumped output is judged by the criterion of its dtype (:mod:`llmcheck.core.opcheck.criteria`).
Calls are checked in parallel worker processes; the report lists every output, and every
op that could not be checked with the reason.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from llmcheck.core.errors import EXIT_FAILURES_FOUND, EXIT_OK, DumpNotFoundError, LlmcheckError, UsageError
from llmcheck.core.op_calls import OpCall, group_op_calls, position_order
from llmcheck.core.opcheck.case_check import FAILED, OpcheckRow, check_case
from llmcheck.core.opcheck.selection import select_op_calls
from llmcheck.core.records import OpReference, TensorRecord

log = logging.getLogger("llmcheck.opcheck")

PRECISION_METRICS = ("abs", "cos_sim", "kl")
#: By default, a worker is started per this many op calls: below it, starting a worker
#: process (a few seconds: it imports torch) costs more than the calls take.
MIN_CASES_PER_WORKER = 400
MAX_DEFAULT_WORKERS = 8
#: Op calls handed to a worker at once.
CASES_PER_TASK = 8


def reference_device(device_id: str | None) -> str:
    """Return where references run: ``cpu``, or ``cuda:N`` for ``-device N`` when that CUDA device exists."""
    if device_id is None or not str(device_id).strip():
        return "cpu"
    first = str(device_id).split(",")[0].strip()
    if not first.isdigit():
        raise UsageError(
            f"invalid device id {device_id!r}", where="-device/--device-id", hint="give a number, e.g. -device 0"
        )
    import torch

    if torch.cuda.is_available() and int(first) < torch.cuda.device_count():
        return f"cuda:{first}"
    log.warning("-device %s: no such CUDA device here; the references run on the CPU", first)
    return "cpu"


def _op_calls(records: Sequence[TensorRecord]) -> list[OpCall]:
    """Return the op calls of the records that belong to an op (records without an ``op_type`` belong to none)."""
    return group_op_calls([record for record in records if record.op_type is not None])


def _with_csv_params(cases: list[OpCall], csv_path: Path) -> list[OpCall]:
    """Return the cases with op parameters taken from an op CSV where the dump gave none."""
    from dataclasses import replace

    from llmcheck.core.plugins import get_plugins

    if not Path(csv_path).is_file():
        raise DumpNotFoundError(
            "no such op CSV file", where=csv_path, hint="give the operation_tensors_N.csv of the dump, or omit -c"
        )
    try:
        csv_dump = get_plugins().load_tensors(Path(csv_path))
    except DumpNotFoundError as exc:
        raise UsageError(
            "not an op CSV any installed source reads",
            where=csv_path,
            hint="give the dump's operation_tensors_N.csv, or omit -c",
        ) from exc
    by_op = {(case.name, case.step): case.params for case in _op_calls(csv_dump.records)}

    def recorded_op_param(case: OpCall) -> bool:
        return any("op_param" in record.attrs for record in (*case.inputs.values(), *case.outputs.values()))

    return [
        replace(case, params=by_op[(case.name, case.step)])
        if not recorded_op_param(case) and (case.name, case.step) in by_op
        else case
        for case in cases
    ]


def _worker_start() -> None:
    import torch

    torch.set_num_threads(1)  # one thread per worker: the workers are the parallelism


def _check_batch(
    batch: Sequence[tuple[OpCall, OpReference | None]], device: str, precision_metrics: Sequence[str]
) -> list[OpcheckRow]:
    rows: list[OpcheckRow] = []
    for case, reference in batch:
        rows.extend(check_case(case, reference, device=device, precision_metrics=precision_metrics))
    return rows


def _picklable(item: object) -> bool:
    try:
        pickle.dumps(item)
        return True
    except Exception:  # any object a worker cannot receive is checked in this process instead
        return False


def check_cases(
    cases: Sequence[OpCall],
    references: dict[str, OpReference | None],
    *,
    device: str,
    precision_metrics: Sequence[str],
    jobs: int | None,
) -> list[OpcheckRow]:
    """Return the rows of every case, checked in worker processes.

    ``jobs`` workers when given; by default one per CPU (at most 8) but none for a small
    dump, where starting workers (each imports torch) costs more than it saves. A case
    a worker cannot receive (an unpicklable reference from a plugin) is checked here.
    """
    work = [(case, references.get(case.op_type)) for case in cases]
    if jobs is None:
        workers = min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS, len(work) // MIN_CASES_PER_WORKER)
    else:
        workers = min(jobs, len(work))
    if workers <= 1 or device != "cpu":
        return _check_batch(work, device, precision_metrics)
    sendable = [_picklable(item) for item in work]
    remote = [item for item, ok in zip(work, sendable) if ok]
    local = [item for item, ok in zip(work, sendable) if not ok]
    rows: list[OpcheckRow] = []
    context = get_context("spawn")  # no fork: torch's thread pools do not survive it
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_start) as pool:
        futures = [
            pool.submit(_check_batch, remote[start : start + CASES_PER_TASK], device, precision_metrics)
            for start in range(0, len(remote), CASES_PER_TASK)
        ]
        rows.extend(_check_batch(local, device, precision_metrics))
        for future in futures:
            rows.extend(future.result())
    return rows


def opcheck_command(
    *,
    tensor_dir: Path,
    csv_path: Path | None,
    output_dir: Path,
    operation_ids: Sequence[str],
    operation_names: Sequence[str],
    precision_metrics: Sequence[str],
    device_id: str | None,
    jobs: int | None,
) -> int:
    """Run opcheck on a dump and write its report; return 3 when an output failed its criterion, else 0."""
    from llmcheck.core.dumps.atomic_files import reports_written_into
    from llmcheck.core.opcheck.report import CSV_NAME, XLSX_NAME, print_summary, write_reports
    from llmcheck.core.plugins import get_plugins
    from llmcheck.core.reporting.report_folder import prepare_report_folder, replace_previous_report

    started = time.perf_counter()
    unknown = [name for name in precision_metrics if name not in PRECISION_METRICS]
    if unknown:
        raise UsageError(
            f"unknown precision metric {unknown[0]!r}",
            where="-metric",
            hint=f"choose from {', '.join(PRECISION_METRICS)}",
        )
    if jobs is not None and jobs < 1:
        raise UsageError(f"invalid number of workers {jobs}", where="-j/--jobs", hint="give 1 or more")
    device = reference_device(device_id)
    plugins = get_plugins()
    prepare_report_folder(Path(output_dir), (CSV_NAME, XLSX_NAME), plugins.claimed_dump)
    dump = plugins.load_tensors(Path(tensor_dir))
    if dump.cut:
        log.warning("%s: the dump is cut short: %s", tensor_dir, dump.cut)
    all_cases = _op_calls(dump.records)
    if not all_cases:
        raise DumpNotFoundError(
            f"the {dump.source} dump holds no operator records",
            where=tensor_dir,
            hint="opcheck needs an ATB tensor dump or a torch dump captured at op level",
        )
    if csv_path is not None:
        all_cases = _with_csv_params(all_cases, Path(csv_path))
    cases = select_op_calls(all_cases, operation_ids, operation_names)
    if not cases:
        raise UsageError(
            f"none of the dump's {len(all_cases)} ops matches the filters",
            where="-ids/-opname",
            hint="check the op ids and type names in the dump",
        )
    references = {op_type: plugins.op_reference(op_type) for op_type in dict.fromkeys(case.op_type for case in cases)}
    rows = check_cases(cases, references, device=device, precision_metrics=list(precision_metrics), jobs=jobs)
    rows.sort(key=lambda row: (row.order, position_order(row.out_tensor_id)))
    with reports_written_into(output_dir):
        replace_previous_report(Path(output_dir), (CSV_NAME, XLSX_NAME), (CSV_NAME, XLSX_NAME))
        written = write_reports(rows, Path(output_dir), list(precision_metrics))
    print_summary(rows, written, time.perf_counter() - started)
    if all(row.rel_precision_rate is None for row in rows):
        # Zero checks is not a pass: a CI gate on opcheck must not go green on a dump it could not check.
        raise LlmcheckError(
            f"no output of the {len(cases)} ops could be checked",
            where=tensor_dir,
            hint=f"the reasons are in {written[0]}; opcheck needs ATB ops or a torch op-level dump",
        )
    return EXIT_FAILURES_FOUND if any(row.precision_result == FAILED for row in rows) else EXIT_OK
