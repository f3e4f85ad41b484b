"""What a torch capture records: :class:`DumpConfig`, the seed's API with the options users expect.

The seed tool's ``DumpConfig(dump_path, token_range, module_list, tensor_part)`` keeps its
meaning; the other fields add what the original lacked (name globs, op level, statistics
only, save moments, a memory cap, CPU profiling). The config travels to a child process as
JSON (``llmcheck dump --backend torch``), so every field has a JSON form. This module does
not import torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import DEPTH_BLOCKS, UsageError

LEVEL_MODULE = "module"
LEVEL_OP = "op"
LEVELS = (LEVEL_MODULE, LEVEL_OP)

#: ``save_time`` values, the seed's ``-time`` numbers: which moments of a call are saved.
SAVE_BEFORE = 0  # inputs as they were before the call
SAVE_AFTER = 1  # inputs and outputs after the call
SAVE_BOTH = 2  # inputs before and after, outputs after
SAVE_IN_BEFORE_OUT_AFTER = 3  # inputs before, outputs after (the default)
SAVE_TIMES = (SAVE_BEFORE, SAVE_AFTER, SAVE_BOTH, SAVE_IN_BEFORE_OUT_AFTER)
SAVE_TIME_NAMES = {
    "before": SAVE_BEFORE,
    "after": SAVE_AFTER,
    "both": SAVE_BOTH,
    "in_before_out_after": SAVE_IN_BEFORE_OUT_AFTER,
}

TENSOR_PART_INPUTS = 0
TENSOR_PART_OUTPUTS = 1
TENSOR_PART_BOTH = 2

DEFAULT_MAX_PENDING_BYTES = 512 * 1024 * 1024

#: ``on_capture_error`` values: what a failure inside capture (a full disk, a bug) does to the program.
ON_ERROR_STOP = "stop"  # capture stops, the dump is closed as cut, the program runs on untouched
ON_ERROR_RAISE = "raise"  # the same, then the error is raised into the program's forward
ON_CAPTURE_ERROR = (ON_ERROR_STOP, ON_ERROR_RAISE)

#: Environment variable that carries the config (JSON) to a child started by ``llmcheck dump``.
CONFIG_ENV = "LLMCHECK_TORCH_CAPTURE"
#: Environment variable naming the file a child appends the device of each capture that ``device_ids``
#: leaves out to (one line each), so ``llmcheck dump`` can say why no dump was written.
LEFT_OUT_ENV = "LLMCHECK_LEFT_OUT_DEVICES"
#: Environment variable naming the file a child appends why its capture could not start to (one line
#: each: a full disk refused the new dump), so ``llmcheck dump`` blames the disk, not the program.
NOT_STARTED_ENV = "LLMCHECK_CAPTURE_NOT_STARTED"
#: Environment variable naming the file a child appends each dump it could not close to (one line each:
#: the dump folder, a tab, why its closing manifest could not be written), so ``llmcheck dump`` says
#: that, not that the program was killed.
UNCLOSED_ENV = "LLMCHECK_DUMP_UNCLOSED"
#: Environment variable naming the file a child appends the folder of each dump it starts to (one line
#: each), so ``llmcheck dump`` reports its own run's dumps -- not another run's writing into the same -o.
STARTED_ENV = "LLMCHECK_DUMPS_STARTED"
#: Environment variable naming the file a child writes to when its capture ended the program after the
#: last step of ``token_range`` (``exit_after_range``): the step, so ``llmcheck dump`` reports that
#: end as the one asked for, whatever exit code the program's other processes then gave.
ENDED_ENV = "LLMCHECK_PROGRAM_ENDED"

#: ``DumpConfig.engine`` of a capture inside vLLM (``llmcheck dump --backend vllm``).
ENGINE_VLLM = "vllm"
ENGINES = (ENGINE_VLLM,)

#: ``as_dtype`` spellings -- the short names compare prints (``bf16``) and torch's own
#: (``bfloat16``, ``half``, ``torch.float16``) -- and the torch dtype each stands for.
AS_DTYPE_NAMES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
    "fp64": "float64",
    "float64": "float64",
    "double": "float64",
}


def as_dtype_name(value: Any, where: str) -> str | None:
    """Return the torch dtype name ``as_dtype`` stands for (``"bf16"`` -> ``"bfloat16"``), ``None`` for no cast.

    A ``torch.dtype`` is accepted by its name; anything else is a usage error naming ``where``.
    """
    if value is None or value == "":
        return None
    text = str(value).strip().lower().removeprefix("torch.")
    if text not in AS_DTYPE_NAMES:
        raise UsageError(
            f"unknown floating dtype {str(value)!r}",
            where=where,
            hint="give bf16, fp16, fp32 or fp64, or torch's name: bfloat16, float16, float32, float64",
        )
    return AS_DTYPE_NAMES[text]


def check_depth(depth: int | str | None, where: str) -> int | str | None:
    """Return a module depth as given (levels >= 0, ``"blocks"`` or ``None``); anything else is a usage error."""
    if (
        depth is None
        or depth == DEPTH_BLOCKS
        or (isinstance(depth, int) and not isinstance(depth, bool) and depth >= 0)
    ):
        return depth
    raise UsageError(
        f"a depth is a number of levels >= 0 or {DEPTH_BLOCKS!r}, got {depth!r}",
        where=where,
        hint="0 records the model's own inputs and outputs only",
    )


def step_runs(steps: Sequence[int]) -> list[tuple[int, int]]:
    """Return step numbers as sorted closed runs: ``[0, 1, 2, 5]`` -> ``[(0, 2), (5, 5)]``."""
    runs: list[list[int]] = []
    for step in sorted(set(steps)):
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return [(low, high) for low, high in runs]


@dataclass
class DumpConfig:
    """The settings of one capture; ``register_hook(model, DumpConfig(...))`` applies them.

    Seed fields: ``dump_path`` (folder the dump folder is created in), ``token_range``
    (steps to dump: each forward of the top-level model is one step, with HF ``generate``
    step 0 is the prefill; ``None`` dumps every step), ``module_list`` (module classes, or
    class names, to capture; empty = all), ``tensor_part`` (0 inputs, 1 outputs, 2 both).

    Added: ``include`` / ``exclude`` (globs on module paths such as ``model.layers.3.*``;
    a pattern matching a module also selects its submodules), ``mode`` (capture levels:
    ``"module"``, ``"op"`` for every ATen operator, both, or none for the module tree
    only), ``statistics_only`` (statistics and descriptions, no tensor data),
    ``save_time`` (0 before, 1 after, 2 both, 3 inputs before and outputs after, or the
    names ``"before"``, ``"after"``, ``"both"``, ``"in_before_out_after"``),
    ``max_pending_bytes`` (host memory the pending tensor copies may hold before they are
    handed to the writer), ``module_ids`` / ``include_children`` (the seed's ``-ids`` /
    ``-child`` on module ids such as ``0_1_3``, listed in ``topology.json``),
    ``type_prefixes`` (the seed's ``-opname``: module class or ATen op names starting with
    these, case-insensitive), ``device_ids`` (capture only on these devices), ``rank``
    (default: torch.distributed, else ``RANK``/``LOCAL_RANK``), ``profile_cpu``
    (per-step operator host times as CSV), ``export_onnx`` (module graph as ONNX at close),
    ``on_capture_error`` (``"stop"``: a failure inside capture -- a full disk, any
    exception in a hook -- stops capture with one warning and closes the dump as cut, and
    the program runs on as if uncaptured; ``"raise"``: the same, then the error reaches
    the program's forward), ``weight_digests`` (module level: the first record of each
    module call carries digests of the module's own parameters, so compare finds weights
    that differ from the golden's beyond rounding without storing them; see
    :mod:`.parameter_digests`), ``as_dtype`` (``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp64"`` or
    torch's names: cast the model's floating parameters and buffers to this dtype when the
    capture starts, and the floating tensors its forward is given at every call, so the
    unchanged program runs at that precision -- the noise twin of ``compare --noise-path``;
    floating results go back in the model's dtype when it holds them exactly; see :mod:`.dtype_cast`),
    ``engine`` (``None``: capture the first module the program calls; ``"vllm"``: the model vLLM's
    model runner loads, one step per engine step; see :mod:`.vllm_engine`), ``max_depth`` (record
    only modules at most this many levels below the model: 0 is the model's own inputs and
    outputs, 3 a Llama's decoder layers ``model.layers.N``; a coarse dump of every step costs a few
    records per step; ``"blocks"``: down to the model's repeated blocks, the shallowest levels of its
    module tree holding 8 modules), ``step_depths`` (``{step: depth}``: at these steps record down
    to this depth instead of ``max_depth``, module level: every step's logits and the prefill's
    decoder layers in one run), ``exit_after_range`` (end the program once the last step of ``token_range``
    is dumped and the dump closed: a dump of step 0 of a long generation then costs the load and
    the prefill only; exit code 0).
    Seed aliases accepted: ``layer_name`` (a glob, added to ``include``),
    ``dump_statistics_mode`` (1 = statistics only).
    """

    dump_path: str | Path = "./"
    token_range: Sequence[int] | None = (0,)
    module_list: Sequence[Any] = ()
    tensor_part: int = TENSOR_PART_BOTH
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    mode: str | Sequence[str] = (LEVEL_MODULE,)
    statistics_only: bool = False
    save_time: int | str = SAVE_IN_BEFORE_OUT_AFTER
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    module_ids: Sequence[str] = ()
    include_children: bool = True
    type_prefixes: Sequence[str] = ()
    device_ids: Sequence[str] = ()
    rank: int | None = None
    profile_cpu: bool = False
    export_onnx: bool = False
    on_capture_error: str = ON_ERROR_STOP
    weight_digests: bool = True
    as_dtype: str | None = None
    engine: str | None = None
    max_depth: int | str | None = None
    step_depths: Mapping[int, int | str] = field(default_factory=dict)
    exit_after_range: bool = False
    layer_name: str | None = None
    dump_statistics_mode: int = 0
    command_line: Sequence[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.dump_path = Path(self.dump_path)
        if self.token_range is not None:
            if isinstance(self.token_range, int):
                self.token_range = (self.token_range,)
            if any(not isinstance(step, int) or step < 0 for step in self.token_range):
                raise UsageError(
                    f"token_range must list step numbers >= 0, got {list(self.token_range)!r}",
                    where="DumpConfig.token_range",
                    hint="e.g. token_range=[0, 1], or None for every step",
                )
            self.token_range = tuple(sorted(set(self.token_range)))
        if self.tensor_part not in (TENSOR_PART_INPUTS, TENSOR_PART_OUTPUTS, TENSOR_PART_BOTH):
            raise UsageError(
                f"tensor_part must be 0, 1 or 2, got {self.tensor_part!r}",
                where="DumpConfig.tensor_part",
                hint="0 inputs, 1 outputs, 2 both",
            )
        levels = (self.mode,) if isinstance(self.mode, str) else tuple(self.mode)
        for level in levels:
            if level not in LEVELS:
                hint = "use 'op' to record every ATen operator" if level == "api" else "use 'module' and/or 'op'"
                raise UsageError(f"unknown capture level {level!r}", where="DumpConfig.mode", hint=hint)
        self.mode = tuple(dict.fromkeys(levels))
        if isinstance(self.save_time, str):
            if self.save_time not in SAVE_TIME_NAMES:
                raise UsageError(
                    f"unknown save_time {self.save_time!r}",
                    where="DumpConfig.save_time",
                    hint=f"use one of {', '.join(SAVE_TIME_NAMES)} or 0-3",
                )
            self.save_time = SAVE_TIME_NAMES[self.save_time]
        if self.save_time not in SAVE_TIMES:
            raise UsageError(
                f"save_time must be 0-3, got {self.save_time!r}",
                where="DumpConfig.save_time",
                hint="0 before, 1 after, 2 both, 3 inputs before and outputs after",
            )
        if not isinstance(self.max_pending_bytes, int) or self.max_pending_bytes <= 0:
            raise UsageError(
                f"max_pending_bytes must be a positive number of bytes, got {self.max_pending_bytes!r}",
                where="DumpConfig.max_pending_bytes",
            )
        if self.on_capture_error not in ON_CAPTURE_ERROR:
            raise UsageError(
                f"on_capture_error must be 'stop' or 'raise', got {self.on_capture_error!r}",
                where="DumpConfig.on_capture_error",
                hint="'stop' keeps the program running, 'raise' hands it the error",
            )
        self.as_dtype = as_dtype_name(self.as_dtype, "DumpConfig.as_dtype")
        if self.engine is not None and self.engine not in ENGINES:
            raise UsageError(
                f"unknown engine {self.engine!r}", where="DumpConfig.engine", hint=f"use one of {', '.join(ENGINES)}"
            )
        check_depth(self.max_depth, "DumpConfig.max_depth")
        depths: dict[int, int | str] = {}
        for step, depth in dict(self.step_depths).items():
            checked = check_depth(depth, "DumpConfig.step_depths")
            if not str(step).isdigit() or checked is None:
                raise UsageError(
                    f"step_depths maps step numbers >= 0 to depths, got {step!r}: {depth!r}",
                    where="DumpConfig.step_depths",
                )
            depths[int(step)] = checked
        self.step_depths = depths
        if self.exit_after_range and self.token_range is None:
            raise UsageError(
                "exit_after_range needs a last step to end after, and token_range is every step",
                where="DumpConfig.exit_after_range",
                hint="give token_range (-er 0,0), or leave exit_after_range off",
            )
        if self.dump_statistics_mode not in (0, 1, 2):
            raise UsageError(
                f"dump_statistics_mode must be 0, 1 or 2, got {self.dump_statistics_mode!r}",
                where="DumpConfig.dump_statistics_mode",
                hint="1 = statistics only",
            )
        if self.dump_statistics_mode == 1:
            self.statistics_only = True
        if self.layer_name:
            self.include = (*self.include, self.layer_name)
            self.layer_name = None
        for name in ("include", "exclude", "module_ids", "device_ids"):
            value = getattr(self, name)
            setattr(self, name, (value,) if isinstance(value, str) else tuple(str(v) for v in value))
        self.type_prefixes = tuple(
            p.lower() for p in ((self.type_prefixes,) if isinstance(self.type_prefixes, str) else self.type_prefixes)
        )
        self.module_list = tuple(self.module_list)

    @property
    def levels(self) -> tuple[str, ...]:
        """Return the capture levels asked for (``()`` = the module tree only)."""
        return tuple(self.mode)

    @property
    def saves_inputs(self) -> bool:
        """Return whether call inputs are recorded (``tensor_part`` 0 or 2)."""
        return self.tensor_part in (TENSOR_PART_INPUTS, TENSOR_PART_BOTH)

    @property
    def saves_outputs(self) -> bool:
        """Return whether call outputs are recorded (``tensor_part`` 1 or 2; never with save_time 0)."""
        return self.tensor_part in (TENSOR_PART_OUTPUTS, TENSOR_PART_BOTH) and self.save_time != SAVE_BEFORE

    @property
    def saves_inputs_before(self) -> bool:
        """Return whether inputs are saved as they were before the call."""
        return self.saves_inputs and self.save_time in (SAVE_BEFORE, SAVE_BOTH, SAVE_IN_BEFORE_OUT_AFTER)

    @property
    def saves_inputs_after(self) -> bool:
        """Return whether inputs are saved as they are after the call (changed by in-place ops)."""
        return self.saves_inputs and self.save_time in (SAVE_AFTER, SAVE_BOTH)

    def dumps_step(self, step: int) -> bool:
        """Return whether step ``step`` (the n-th forward of the top-level model) is dumped."""
        return self.token_range is None or step in self.token_range

    def ends_program_after(self, step: int) -> bool:
        """Return whether the program is ended after step ``step``: the last one dumped, with ``exit_after_range``."""
        return self.exit_after_range and self.token_range is not None and step >= self.token_range[-1]

    def as_json(self) -> dict[str, Any]:
        """Return the config as JSON-safe values (module classes by name), for manifests and child processes."""
        values = asdict(self)
        values["dump_path"] = str(self.dump_path)
        values["token_range"] = None if self.token_range is None else list(self.token_range)
        values["module_list"] = [entry if isinstance(entry, str) else entry.__name__ for entry in self.module_list]
        for name in ("include", "exclude", "mode", "module_ids", "type_prefixes", "device_ids"):
            values[name] = list(values[name])
        values["command_line"] = None if self.command_line is None else list(self.command_line)
        values["step_depths"] = {str(step): depth for step, depth in self.step_depths.items()}
        del values["layer_name"]
        return values

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> DumpConfig:
        """Build a config from :meth:`as_json` output; an unknown key is a usage error naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise UsageError(f"unknown DumpConfig field(s): {', '.join(unknown)}", where=CONFIG_ENV)
        return cls(**values)

    @classmethod
    def from_env(cls, text: str) -> DumpConfig:
        """Build a config from the JSON text of the ``LLMCHECK_TORCH_CAPTURE`` variable."""
        try:
            values = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"is not JSON: {exc}", where=CONFIG_ENV) from exc
        if not isinstance(values, dict):
            raise UsageError("must hold a JSON object", where=CONFIG_ENV)
        return cls.from_json(values)
