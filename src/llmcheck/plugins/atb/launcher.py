"""``llmcheck dump --backend atb``: run the user's program with ATB's probe preloaded and the dump flags set.

The seed flags become the probe's environment contract (the ``ATB_*`` variables ``msit
llm dump`` sets, see ``docs/sources/atb.md``); the probe library is found for
``libatb.so``'s C++ ABI and put first in ``LD_PRELOAD``; the program runs as an argv list
(no shell), its exit code is returned; afterwards the topology JSON is converted to ONNX
(``--type onnx``) and the cpu profiling text to CSV (``--type cpu_profiling``). Without an
Ascend toolkit the command stops before running anything, saying what is missing.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import CaptureRequest, DumpNotFoundError, LlmcheckError, UsageError, run_program
from llmcheck.plugins.atb.probe_library import choose_probe

log = logging.getLogger("llmcheck.atb")

BACKEND_NAME = "atb"
DUMP_ROOT_PREFIX = "msit_dump_"
#: The probe refuses to write with less free space than this.
MIN_FREE_BYTES = 2 * 1024**3
#: What to check when the probe wrote nothing.
NO_DUMP_HINT = (
    "check that the program uses ATB, that the probe matches its ABI, and that no stale ATB_SAVE_* variable "
    "filters every op"
)
LOG_LEVEL_CODES = {"debug": 0, "info": 1, "warning": 2, "warn": 2, "error": 3, "fatal": 4, "critical": 5}
#: What ``-seed`` sets for the child: deterministic collectives and matmuls (the seed tool's list).
DETERMINISM_ENV = {
    "LCCL_DETERMINISTIC": "1",
    "HCCL_DETERMINISTIC": "true",
    "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
    "ATB_LLM_LCOC_ENABLE": "0",
}
#: Where a dump keeps its layer/model topology JSON (msit layout, then msprobe's).
TOPOLOGY_PATTERNS = ("layer/*/*.json", "model/*/*.json", "info/layer/*/*.json", "info/model/*/*.json")
#: Variables the contract sets only under some flags; cleared otherwise so a stale shell value filters nothing.
OPTIONAL_VARIABLES = (
    "ATB_SAVE_TENSOR_IDS",
    "ATB_SAVE_TENSOR_RUNNER",
    "ATB_SAVE_TENSOR_STATISTICS",
    "ATB_DUMP_SUB_PROC_INFO_SAVE_PATH",
    "ATB_DEVICE_ID",
)


def dump_types(requested: list[str]) -> list[str]:
    """Return the dump types the probe is told: ``onnx`` needs the model topology and the op CSV."""
    types = list(dict.fromkeys(requested))
    if "onnx" in types:
        types += [extra for extra in ("model", "op") if extra not in types]
    return types


def execute_range_text(ranges: list[tuple[int, int]] | None) -> str:
    """Return ``-er`` as the probe reads it: ``"3,5,7,7"``, or ``"all"``."""
    if ranges is None:
        return "all"
    return ",".join(f"{low},{high}" for low, high in ranges)


def probe_environment(
    options: Mapping[str, Any], *, output_dir: Path, log_level: str, timestamp: str, launcher_pid: int
) -> dict[str, str | None]:
    """Return the environment changes the seed flags make (``None`` = unset the variable)."""
    types = dump_types(list(options.get("type") or ["tensor"]))
    save_time = int(options.get("save_time", 3))
    changes: dict[str, str | None] = {name: None for name in OPTIONAL_VARIABLES}
    changes.update(
        {
            "ATB_SAVE_TENSOR": "2" if options.get("only_save_desc") else "1",
            "ATB_SAVE_TENSOR_IN_BEFORE_OUT_AFTER": "1" if save_time == 3 else "0",
            "ATB_SAVE_TENSOR_TIME": "1" if save_time == 3 else str(save_time),
            "ATB_OUTPUT_DIR": str(output_dir.absolute()).rstrip("/") + "/",
            "ATB_DUMP_TYPE": "|".join(types),
            "ATB_SAVE_CHILD": "1" if options.get("save_operation_child", True) else "0",
            "ATB_SAVE_TENSOR_RANGE": execute_range_text(options.get("execute_range", [(0, 0)])),
            "ATB_SAVE_TILING": "1" if options.get("save_tiling") else "0",
            "ATB_SAVE_TENSOR_PART": str(int(options.get("save_tensor_part", 2))),
            "ATB_SAVE_CPU_PROFILING": "1" if "cpu_profiling" in types else "0",
            "ATB_CUR_PID": str(launcher_pid),
            "ATB_TIMESTAMP": timestamp,
            "ATB_AIT_LOG_LEVEL": str(LOG_LEVEL_CODES.get(log_level.lower(), 1)),
        }
    )
    if options.get("save_operation_ids"):
        changes["ATB_SAVE_TENSOR_IDS"] = ",".join(options["save_operation_ids"])
    if options.get("operation_name"):
        changes["ATB_SAVE_TENSOR_RUNNER"] = ",".join(name.lower() for name in options["operation_name"])
    if "stats" in types and "tensor" in types:
        changes["ATB_SAVE_TENSOR_STATISTICS"] = "1"
    if "onnx" in types:
        changes["ATB_DUMP_SUB_PROC_INFO_SAVE_PATH"] = str(subprocess_info_dir(output_dir, launcher_pid))
    if options.get("device_id") is not None:
        changes["ATB_DEVICE_ID"] = str(options["device_id"])
    if options.get("seed") is not None:
        changes.update(DETERMINISM_ENV)
        changes["PYTHONHASHSEED"] = str(int(options["seed"]))
    return changes


def subprocess_info_dir(output_dir: Path, launcher_pid: int) -> Path:
    """Return the folder where the probe lists the topology files it wrote (``subprocess_info.txt``)."""
    return output_dir.absolute() / str(launcher_pid)


def free_timestamp(output_dir: Path, now: float | None = None) -> str:
    """Return a ``%Y%m%d_%H%M%S`` stamp whose ``msit_dump_{stamp}`` folder does not exist yet (never reuse a dump)."""
    moment = time.time() if now is None else now
    for step_s in range(3600):
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(moment + step_s))
        if not (output_dir / f"{DUMP_ROOT_PREFIX}{stamp}").exists():
            return stamp
    raise LlmcheckError("no free msit_dump_{timestamp} folder name in the next hour", where=output_dir)


class AtbCaptureBackend:
    """The ``atb`` capture backend: ATB's probe, preloaded into the user's program."""

    name = BACKEND_NAME
    description = "Ascend ATB (加速库) dump through CANN's probe library (LD_PRELOAD); writes msit_dump_{TS}/"

    def run(self, request: CaptureRequest) -> int:
        """Run the user's command with the probe preloaded; return its exit code."""
        options = dict(request.options)
        if not request.command:
            raise UsageError("no command to run", where="--exec")
        probe = choose_probe(os.environ)  # before anything runs or is created: no toolkit, no run
        output_dir = Path(request.output_dir)
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LlmcheckError(f"cannot create the output folder: {exc.strerror}", where=output_dir) from exc
        if shutil.disk_usage(output_dir).free <= MIN_FREE_BYTES:
            log.warning("%s has 2 GiB or less free; the ATB probe writes nothing below that", output_dir)
        timestamp = free_timestamp(output_dir)
        launcher_pid = os.getpid()
        environment = dict(os.environ)
        for name, value in probe_environment(
            options, output_dir=output_dir, log_level=request.log_level, timestamp=timestamp, launcher_pid=launcher_pid
        ).items():
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = value
        previous_preload = environment.get("LD_PRELOAD", "")
        environment["LD_PRELOAD"] = str(probe.path) + (":" + previous_preload if previous_preload else "")
        types = dump_types(list(options.get("type") or ["tensor"]))
        info_dir = subprocess_info_dir(output_dir, launcher_pid)
        if "onnx" in types:
            info_dir.mkdir(parents=True, exist_ok=True)
        log.info(
            "preloading %s (%s); dump goes to %s",
            probe.path,
            probe.reason,
            output_dir / f"{DUMP_ROOT_PREFIX}{timestamp}",
        )
        program_run = run_program(request.command, environment)
        dump_root = self._dump_root(output_dir, timestamp)
        try:
            if dump_root is None:
                what, hint = "no ATB dump was written", NO_DUMP_HINT
                if program_run.returncode == 0:  # a program that succeeded without a dump must not pass a CI step
                    raise DumpNotFoundError(what, where=output_dir, hint=hint)
                log.warning("%s: %s (%s); %s", output_dir, what, hint, program_run.ended)
            else:
                self._post_steps(dump_root, types, info_dir)
                print(f"llmcheck: ATB dump written to {dump_root}", file=sys.stderr)
        finally:
            if "onnx" in types and info_dir.is_dir():
                shutil.rmtree(info_dir, ignore_errors=True)
        if program_run.interrupted_by is not None:
            log.warning("%s; the ATB dump holds what the probe wrote until then: read it as cut", program_run.ended)
        return program_run.exit_code

    @staticmethod
    def _dump_root(output_dir: Path, timestamp: str) -> Path | None:
        """Return the dump the probe wrote for this run (msit layout, or msprobe's ``atb_dump_data``)."""
        for candidate in (output_dir / f"{DUMP_ROOT_PREFIX}{timestamp}", output_dir / "atb_dump_data"):
            if candidate.is_dir():
                return candidate
        return None

    @staticmethod
    def _post_steps(dump_root: Path, types: list[str], info_dir: Path) -> None:
        """Convert the topology to ONNX (``--type onnx``) and the cpu profiling text to CSV (``--type cpu_profiling``)."""
        if "onnx" in types:
            from llmcheck.plugins.atb.onnx_export import atb_json_to_onnx

            listed: list[Path] = []
            info_file = info_dir / "subprocess_info.txt"
            if info_file.is_file():
                for line in info_file.read_text(encoding="utf-8", errors="replace").splitlines():
                    listed_path = Path(line.strip())
                    if (
                        line.strip()
                        and listed_path.is_file()
                        and listed_path.resolve().is_relative_to(dump_root.resolve())
                    ):
                        listed.append(listed_path)
            found = sorted(path for pattern in TOPOLOGY_PATTERNS for path in dump_root.glob(pattern))
            for topology_path in dict.fromkeys(path.resolve() for path in [*listed, *found]):
                written = atb_json_to_onnx(topology_path)
                log.info("wrote %s", written)
        if "cpu_profiling" in types:
            from llmcheck.plugins.atb.cpu_profiling import convert_cpu_profiling

            profiling_dir = dump_root / "cpu_profiling"
            if profiling_dir.is_dir():
                for written in convert_cpu_profiling(profiling_dir):
                    log.info("wrote %s", written)
