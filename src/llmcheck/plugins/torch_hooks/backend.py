"""``llmcheck dump --backend torch``: run an unmodified PyTorch program with capture on.

The program runs as a child process (its argv as given, no shell) whose ``PYTHONPATH``
starts with a bootstrap folder holding a ``sitecustomize.py``. Python imports that file at
start-up; it waits until the program imports torch, then captures the first module whose
forward is called -- the outermost model. The configuration travels as JSON in
``LLMCHECK_TORCH_CAPTURE``; every Python process the program starts (a launcher script,
torchrun workers) inherits it and writes its own dump, named by rank and device.

This module does not import torch: the parent only builds the environment and waits.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import (
    BATCHES_NAME,
    UNFINISHED_SHARDS,
    CaptureRequest,
    DumpNotFoundError,
    LlmcheckError,
    ProgramRun,
    UsageError,
    atomic_write_text,
    close_from_outside,
    closing_state,
    find_dumps,
    mark_cut,
    read_dump,
    run_program,
)
from llmcheck.plugins.torch_hooks.config import (
    CONFIG_ENV,
    ENDED_ENV,
    ENGINE_VLLM,
    LEFT_OUT_ENV,
    LEVEL_MODULE,
    LEVEL_OP,
    NOT_STARTED_ENV,
    ON_ERROR_STOP,
    STARTED_ENV,
    UNCLOSED_ENV,
    DumpConfig,
)

log = logging.getLogger("llmcheck.torch")

BACKEND_NAME = "torch"
VLLM_BACKEND_NAME = "vllm"

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
#: Where the child finds the llmcheck package if its Python does not have it installed.
PACKAGE_PARENT_ENV = "LLMCHECK_PACKAGE_PARENT"
LOG_LEVEL_ENV = "LLMCHECK_LOG_LEVEL"
SEED_ENV = "LLMCHECK_SEED"
#: ``-device`` ids: an index (``0``, any device type), ``cpu``, or a type and an index (``cuda1``, ``npu:3``).
DEVICE_ID = re.compile(r"\d+|cpu|[a-z_]+:?\d+")
DEVICE_FLAG = "-device/--device-id"
#: ``--type`` values the torch backend honours; the others are ATB's.
TORCH_DUMP_TYPES = frozenset({"tensor", "model", "op", "stats", "cpu_profiling", "onnx"})
#: An ``-er`` range longer than this is refused: ``-er all`` says "every step" without a list.
MAX_LISTED_STEPS = 1_000_000


def config_from_options(options: Mapping[str, Any], output_dir: Path, command: list[str]) -> DumpConfig:
    """Return the capture config the seed flags of ``llmcheck dump`` ask for, or raise a usage error naming the flag."""
    dump_types = list(options.get("type") or ["tensor"])
    refused = [name for name in dump_types if name not in TORCH_DUMP_TYPES]
    if refused:
        raise UsageError(
            f"the torch backend cannot dump {', '.join(map(repr, refused))}",
            where="--type",
            hint="'layer' and 'kernel' are ATB graphs; torch offers tensor, model, op, stats, cpu_profiling, onnx",
        )
    if options.get("save_tiling"):
        raise UsageError(
            "tiling data exists only for ATB kernels",
            where="-tiling/--save-tiling",
            hint="drop -tiling with --backend torch",
        )
    levels = []
    if {"tensor", "stats"} & set(dump_types):
        levels.append(LEVEL_MODULE)
    if "op" in dump_types:
        levels.append(LEVEL_OP)
    statistics_only = bool(options.get("only_save_desc")) or ("stats" in dump_types and "tensor" not in dump_types)
    ranges = options.get("execute_range", [(0, 0)])
    token_range = None
    if ranges is not None:
        if sum(high - low + 1 for low, high in ranges) > MAX_LISTED_STEPS:
            raise UsageError(
                "the step ranges list more than a million steps",
                where="-er/--execute-range",
                hint="use -er all to dump every step",
            )
        token_range = sorted({step for low, high in ranges for step in range(low, high + 1)})
    device_ids = parse_device_ids(options.get("device_id"))
    return DumpConfig(
        dump_path=Path(output_dir).resolve(),
        token_range=token_range,
        tensor_part=options.get("save_tensor_part", 2),
        mode=levels,
        statistics_only=statistics_only,
        save_time=options.get("save_time", 3),
        module_ids=list(options.get("save_operation_ids") or []),
        include_children=bool(options.get("save_operation_child", True)),
        type_prefixes=list(options.get("operation_name") or []),
        device_ids=device_ids,
        profile_cpu="cpu_profiling" in dump_types,
        export_onnx="onnx" in dump_types,
        command_line=command,
        on_capture_error=options.get("on_capture_error", ON_ERROR_STOP),
        weight_digests=not options.get("no_weight_digests", False),
        as_dtype=options.get("as_dtype"),
        max_depth=options.get("max_depth"),
        step_depths=options.get("max_depth_at") or {},
        exit_after_range=_exit_after_range(options, token_range),
    )


def _exit_after_range(options: Mapping[str, Any], token_range: Sequence[int] | None) -> bool:
    """Return ``--exit-after-range``, refused with ``-er all``: there is no last step to end after."""
    wanted = bool(options.get("exit_after_range"))
    if wanted and token_range is None:
        raise UsageError(
            "-er all dumps every step: there is no last step to end the program after",
            where="--exit-after-range",
            hint="give -er LOW,HIGH, or leave --exit-after-range out",
        )
    return wanted


def parse_device_ids(text: Any) -> list[str]:
    """Return the device ids of ``-device`` (``0,cuda:1,cpu``), lower-cased; an id no device can have is a usage error."""
    if text is None:
        return []
    parts = [part.strip().lower() for part in str(text).split(",")]
    for part in parts:
        if not DEVICE_ID.fullmatch(part):
            raise UsageError(
                f"invalid device id {part!r}" if part else f"an empty device id in {str(text)!r}",
                where=DEVICE_FLAG,
                hint="give a device index (0), a type and an index (cuda:1, npu3), or cpu; a comma list is allowed",
            )
    return parts


def child_environment(
    config: DumpConfig, log_level: str, seed: int | None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Return the environment of the child: the bootstrap first on ``PYTHONPATH`` and the config as JSON."""
    env = dict(os.environ if base is None else base)
    existing = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR) + (os.pathsep + existing if existing else "")
    env[CONFIG_ENV] = json.dumps(config.as_json())
    env[PACKAGE_PARENT_ENV] = str(Path(__file__).resolve().parents[3])
    env[LOG_LEVEL_ENV] = log_level
    if seed is not None:
        env[SEED_ENV] = str(seed)
        env["PYTHONHASHSEED"] = str(seed)
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS needs it
    return env


#: The errno names (as failed writes spell them) that mean the disk, or the user's share of it, is full.
DISK_FULL_ERRNO_NAMES = ("(ENOSPC)", "(EDQUOT)", "(EFBIG)")

#: Program names run with llmcheck's own interpreter (a path such as ``/usr/bin/python3`` is kept as given).
BARE_PYTHON_NAMES = ("python", "python3")


class TorchCaptureBackend:
    """The ``torch`` dump backend: capture any PyTorch program's modules or ATen operators."""

    name = BACKEND_NAME
    description = "PyTorch module and ATen-op capture of an unmodified program (CPU, CUDA, NPU)"
    #: ``llmcheck dump`` without ``--backend`` uses this backend
    is_default = True
    #: Whether a dump its program closed holds only whole steps, even when llmcheck was signalled: a
    #: program's forward may be cut mid-step by Ctrl-C (torch), an engine finishes its step first (vllm).
    steps_are_whole = False

    def run(self, request: CaptureRequest) -> int:
        """Run the request's command with capture on; return its exit code (128+N when killed by signal N)."""
        command = list(request.command)
        if not command:
            raise UsageError("no command to run", where="--exec")
        if command[0] in BARE_PYTHON_NAMES:
            # A bare "python" is whichever comes first on PATH, often one without torch (an
            # unactivated environment); llmcheck's own interpreter has torch and llmcheck.
            log.debug("running %r as %s", command[0], sys.executable)
            command[0] = sys.executable
        config = self.config_for(request, command)
        env = child_environment(config, request.log_level, request.options.get("seed"))
        output_dir = Path(config.dump_path)
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create the output folder: {exc.strerror}", where=output_dir) from exc
        with tempfile.TemporaryDirectory(prefix="llmcheck_dump_") as notes:
            left_out_file = Path(notes) / "left_out_devices"
            not_started_file = Path(notes) / "captures_not_started"
            unclosed_file = Path(notes) / "dumps_not_closed"
            started_file = Path(notes) / "dumps_started"
            ended_file = Path(notes) / "program_ended"
            env[ENDED_ENV] = str(ended_file)
            env[LEFT_OUT_ENV] = str(left_out_file)
            env[STARTED_ENV] = str(started_file)
            env[NOT_STARTED_ENV] = str(not_started_file)
            env[UNCLOSED_ENV] = str(unclosed_file)
            program_run = run_program(command, env)
            ended_after = _noted_lines(ended_file)
            left_out = _noted_lines(left_out_file, split=True)
            not_started = _noted_lines(not_started_file)
            unclosed = dict(line.partition("\t")[::2] for line in _noted_lines(unclosed_file))
            # The run's own dumps, as its captures named them: another run writing into the same -o
            # at the same time is not this run's to report (or to mark cut).
            written = sorted(Path(line) for line in _noted_lines(started_file) if find_dumps(Path(line)))
        if ended_after:  # the capture ended the program as asked; its other processes may have failed at that
            program_run = program_run.ended_by_capture(int(ended_after[0]))
        cut_reason = program_run.cut_reason
        written_cut = written
        if self.steps_are_whole:  # stopped by a signal, or its engine's processes killed as the program ended
            for path in written:
                self.close_whole_steps(path, program_run)
            written_cut = [path for path in written if closing_state(path)[1] is not None]
        if cut_reason is not None:
            for path in written_cut:
                try:
                    mark_cut(path, cut_reason)
                except LlmcheckError as exc:
                    log.warning("%s; read it as a cut dump", exc.one_line())
        report_outcome(
            written,
            program_run,
            output_dir,
            left_out=left_out,
            device_ids=config.device_ids,
            not_started=not_started,
            unclosed=unclosed,
            backend=self.name,
        )
        return program_run.exit_code

    def close_whole_steps(self, path: Path, program_run: ProgramRun) -> None:
        """Close a stopped program's dump that holds whole steps only, as its killed writer would have.

        A server stopped by SIGINT or SIGTERM finishes its engine step, and its dump is whole
        whether the capturing process closed it or was killed at shutdown after writing it (vLLM
        force-kills its model worker). Each step's batch layout is written after its records
        are handed to the writer, and every step records the same modules: so the dump is
        whole when its last step has a layout and as many records as the step before. A dump
        that is not is left to be marked cut.

        A writer killed while it wrote a shard leaves ``shard_*.safetensors.tmp``: the writer
        renames a shard before it writes the index lines pointing into it, so such a file holds
        only tensors of records the index never named -- of a step whose records were lost
        (a writer behind a busy machine's engine). It is removed as the dump is closed, and the
        note says so; the step counts alone tell whether the steps kept are whole.
        """
        if program_run.interrupted_by is None:
            stopped = "the program ended"
        else:
            stopped = f"the program was stopped by {program_run.interrupted_by}"
        state = closing_state(path)[1]
        if state is None:
            if program_run.interrupted_by is not None:
                log.info("%s: %s and closed its dump: every engine step it holds is whole", path, stopped)
            return
        if not state.startswith("the capture did not close it"):
            return  # cut for a reason of its own (a full disk): it says so itself
        try:
            dump = read_dump(path)
        except LlmcheckError:
            return
        per_step = Counter(record.key.step for record in dump.records)
        steps = sorted(per_step)
        if not steps or dump.cut is None or "holds" in dump.cut:
            return
        unfinished = sorted(path.glob(UNFINISHED_SHARDS))
        last = steps[-1]
        rank = int(dump.manifest.get("rank") or 0)
        whole = (rank, last) in dump.batches and (len(steps) == 1 or per_step[last] == per_step[steps[-2]])
        if not whole:
            return
        note = f"llmcheck dump: {stopped}, and its capturing process ended without closing it; steps 0-{last} are whole"
        lost = sorted(step for layout_rank, step in dump.batches if layout_rank == rank and step not in per_step)
        if lost:  # the kill came while a step's records were still on their way to the disk: that step is lost
            note += f"; step {', '.join(map(str, lost))} was lost (its records were not written)"
        if unfinished:  # tensors of records no index line names: nothing a reader could reach
            try:
                for shard in unfinished:
                    shard.unlink()
            except OSError as exc:
                log.warning("%s: cannot remove an unfinished shard (%s); read it as a cut dump", path, exc.strerror)
                return
            names = ", ".join(shard.name for shard in unfinished)
            removed = "shard {} was removed" if len(unfinished) == 1 else "shards {} were removed"
            note += "; the unfinished " + removed.format(names)
        try:
            if lost:
                kept = [layout.as_json() for (_, step), layout in sorted(dump.batches.items()) if step in per_step]
                atomic_write_text(path / BATCHES_NAME, "".join(json.dumps(line) + "\n" for line in kept))
            close_from_outside(path, len(dump.records), note)
        except LlmcheckError as exc:
            log.warning("%s; read it as a cut dump", exc.one_line())
            return
        log.info(
            "%s: %s; its capturing process was ended before it closed the dump, which holds "
            "%d whole engine steps: llmcheck closed it",
            path,
            stopped,
            len(steps),
        )

    def config_for(self, request: CaptureRequest, command: list[str]) -> DumpConfig:
        """Return the capture config of the request's flags, for the program ``command``."""
        return config_from_options(request.options, request.output_dir, command)

    def capture_model(self, model: Any, request: CaptureRequest) -> Any:
        """Return a running capture of ``model`` in this process, configured by the request's seed flags.

        Use it as a context manager; its ``path`` is the dump folder once it is closed.
        The manifest's command line is this process's (``sys.argv``), and its config records
        no program: the model runs inside this process, there is no program to run again
        (``compare`` suggests rerunning the config's ``command_line`` for a noise twin).
        """
        from llmcheck.plugins.torch_hooks.capture import register_hook

        config = config_from_options(request.options, request.output_dir, list(request.command))
        return register_hook(model, dataclasses.replace(config, command_line=None))


class VllmCaptureBackend(TorchCaptureBackend):
    """The ``vllm`` dump backend: capture the model inside vLLM's engine, one step per engine step.

    The program runs exactly as under the torch backend; only where capture attaches differs
    (:mod:`.vllm_engine`): the model vLLM's model runner loads, in whichever process runs it.
    """

    name = VLLM_BACKEND_NAME
    description = "PyTorch module and ATen-op capture inside vLLM (offline LLM or vllm serve), eager mode"
    is_default = False
    #: ``vllm serve`` stopped by SIGINT or SIGTERM finishes its engine step and exits: its dump is whole.
    steps_are_whole = True

    def config_for(self, request: CaptureRequest, command: list[str]) -> DumpConfig:
        """Return the torch backend's config for these flags, capturing inside vLLM."""
        config = super().config_for(request, command)
        if config.export_onnx or config.profile_cpu:
            raise UsageError(
                "the vllm backend records tensors and statistics only",
                where="--type",
                hint="use --type tensor, stats or op with --backend vllm",
            )
        return dataclasses.replace(config, engine=ENGINE_VLLM)

    def capture_model(self, model: Any, request: CaptureRequest) -> Any:
        """Refuse: vLLM's model lives inside its engine; capture it with ``llmcheck dump --backend vllm``."""
        raise UsageError(
            "the vllm backend captures a program that runs vLLM, not a model object",
            where="--backend vllm",
            hint='run llmcheck dump --backend vllm -o OUT --exec "python offline.py"',
        )


def _noted_lines(notes: Path, *, split: bool = False) -> list[str]:
    """Return what the children noted in ``notes`` (devices left out, captures not started), each once, in order.

    ``split``: the notes are words (device names), not whole lines.
    """
    try:
        text = notes.read_text(encoding="utf-8")
    except OSError:  # nothing was noted (or the child could not say so)
        return []
    lines = text.split() if split else [line for line in text.splitlines() if line.strip()]
    return list(dict.fromkeys(lines))


def report_outcome(
    written: list[Path],
    program_run: ProgramRun,
    output_dir: Path,
    *,
    left_out: Sequence[str] = (),
    device_ids: Sequence[str] = (),
    not_started: Sequence[str] = (),
    unclosed: Mapping[str, str] | None = None,
    backend: str = BACKEND_NAME,
) -> None:
    """Log what the run left: each dump, complete or cut, and how the program ended (it may have failed).

    ``not_started`` are the reasons captures could not create their dump (a full disk), one per line;
    ``unclosed`` maps a dump folder to why its capture stopped but could not write its closing manifest.
    A program that succeeded but left no dump raises :class:`DumpNotFoundError` saying why, so that
    ``llmcheck dump`` exits 1 and a CI step does not pass without a dump; a program that failed keeps
    its own exit code, and why no dump was written is a warning.
    """
    ended = program_run.ended
    for path in written:
        records, cut = closing_state(path)
        if unclosed and str(path) in unclosed:  # not killed: the capture said why it left the dump open
            cut = f"capture stopped and could not write its closing manifest: {unclosed[str(path)]}"
        counted = f", {records} records" if records is not None else ""
        if cut is None:
            log.info("%s capture wrote %s (complete%s); %s", backend, path, counted, ended)
        else:
            log.warning("%s capture wrote %s (cut%s: %s); %s", backend, path, counted, cut, ended)
    if not_started:
        more = f" (and {len(not_started) - 1} more)" if len(not_started) > 1 else ""
        disk_full = any(name in not_started[0] for name in DISK_FULL_ERRNO_NAMES)
        what = f"capture could not start: {not_started[0]}{more}"
        hint = "free some space there or pass another folder with -o" if disk_full else "pass another folder with -o"
        if written:
            log.warning("%s: %d capture(s) wrote no dump: %s (%s); %s", output_dir, len(not_started), what, hint, ended)
            return
    elif written:
        return
    elif left_out:
        what = (
            f"the program's PyTorch forwards ran on {', '.join(left_out)}, and {DEVICE_FLAG} "
            f"{','.join(device_ids)} left them all out"
        )
        hint = f"give -device {left_out[0]}, or leave -device out"
    elif program_run.returncode == 0:
        what = "the program ran no PyTorch module forward under capture"
        hint = "is it a Python program that imports torch?"
    else:
        log.warning(
            "%s: no dump was written; %s before any PyTorch module forward ran under capture", output_dir, ended
        )
        return
    if program_run.returncode == 0:
        raise DumpNotFoundError(f"no dump was written: {what}", where=output_dir, hint=hint)
    log.warning("%s: no dump was written: %s (%s); %s", output_dir, what, hint, ended)
