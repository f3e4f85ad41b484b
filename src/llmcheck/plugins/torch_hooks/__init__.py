"""Built-in plugin ``torch_hooks``: capture any PyTorch model's tensors, in code or with no code change.

* In code: ``from llmcheck import DumpConfig, register_hook`` (see :mod:`.capture`).
* No code change: ``llmcheck dump --backend torch --exec "python infer.py"`` (see :mod:`.backend`).

Both write llmcheck's own dump format, read back by the built-in ``native`` source. Importing
this plugin does not import torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from llmcheck.plugin_api import (
    TOPOLOGY_NAME,
    BackendOption,
    CaptureBackend,
    Dump,
    LlmcheckError,
    UsageError,
    find_dumps,
    hookimpl,
    seed_dump_options,
)
from llmcheck.plugins.torch_hooks.backend import (
    BACKEND_NAME,
    VLLM_BACKEND_NAME,
    TorchCaptureBackend,
    VllmCaptureBackend,
)
from llmcheck.plugins.torch_hooks.config import DEPTH_BLOCKS, ON_CAPTURE_ERROR, ON_ERROR_STOP, as_dtype_name
from llmcheck.plugins.torch_hooks.module_graph_onnx import ONNX_FILE
from llmcheck.plugins.torch_hooks.twin_command import noise_twin_command

#: Said under ``-er`` in ``llmcheck dump --help``: the Python API's ``token_range`` counts differently.
TOKEN_RANGE_NOTE = " (In Python, DumpConfig(token_range=[0, 4]) lists steps: 0 and 4.)"


@hookimpl
def llmcheck_register_capture_backends(register: Callable[[CaptureBackend], None]) -> None:
    register(TorchCaptureBackend())
    register(VllmCaptureBackend())


@hookimpl
def llmcheck_register_backend_options(register: Callable[[BackendOption], None]) -> None:
    for option in seed_dump_options(VLLM_BACKEND_NAME):  # steps are engine steps: -er 0-3 is the first four
        register(option)
    for backend in (BACKEND_NAME, VLLM_BACKEND_NAME):
        register(
            BackendOption(
                backend,
                "on_capture_error",
                "A failure inside capture (a full disk): 'stop' capture "
                "and let the program run on, or also 'raise' it into the program.",
                choices=ON_CAPTURE_ERROR,
                default=ON_ERROR_STOP,
            )
        )
        register(
            BackendOption(
                backend,
                "max_depth",
                "Record only modules at most this many levels below the model: 0 is the model's own inputs "
                "and outputs (its logits), 3 a Llama's decoder layers model.layers.N; 'blocks' is the depth of "
                "the model's repeated blocks.",
                parse=_depth,
            )
        )
        register(
            BackendOption(
                backend,
                "max_depth_at",
                "STEP:DEPTH: at this step record modules down to DEPTH instead of --max-depth (repeatable): "
                "--max-depth 0 --max-depth-at 0:blocks records every step's logits and the prefill's layers.",
                multiple=True,
                parse=_step_depths,
            )
        )
        register(
            BackendOption(
                backend,
                "exit_after_range",
                "End the program once the last step of -er is dumped (exit code 0): the steps after it "
                "would not be recorded anyway.",
                type=bool,
            )
        )
        register(
            BackendOption(
                backend,
                "no_weight_digests",
                "Do not record digests of each module's parameters (compare then cannot tell weights that "
                "differ from the golden's beyond rounding; saves one pass over the weights per dump).",
                type=bool,
            )
        )
    for option in seed_dump_options(BACKEND_NAME):
        register(
            dataclasses.replace(option, help=option.help + TOKEN_RANGE_NOTE)
            if option.name == "execute_range"
            else option
        )
    register(
        BackendOption(
            BACKEND_NAME,
            "as_dtype",
            "Run the program at this precision: bf16, fp16, fp32, fp64 (or bfloat16, float16, ...). The model's "
            "floating parameters, buffers and forward inputs are cast when its first forward starts, so the "
            "unchanged golden program records its own noise twin (compare --noise-path).",
            parse=as_dtype_name,
        )
    )


def _depth(value: str | None, flag: str) -> int | str | None:
    """Return a depth flag's value: levels (an integer >= 0), ``blocks``, or ``None`` when not given."""
    if value is None or value == DEPTH_BLOCKS:
        return value
    if not str(value).isdigit():
        raise UsageError(
            f"must be a number of levels >= 0 or '{DEPTH_BLOCKS}', got {value!r}",
            where=flag,
            hint="0 is the model itself",
        )
    return int(value)


def _step_depths(values: list[str] | None, flag: str) -> dict[int, int | str]:
    """Return ``--max-depth-at STEP:DEPTH`` values as ``{step: depth}``."""
    depths: dict[int, int | str] = {}
    for value in values or []:
        step, _, depth = str(value).partition(":")
        parsed = _depth(depth, flag) if depth else None
        if not step.isdigit() or parsed is None:
            raise UsageError(f"expects STEP:DEPTH, got {value!r}", where=flag, hint="e.g. --max-depth-at 0:blocks")
        depths[int(step)] = parsed
    return depths


@hookimpl
def llmcheck_noise_twin_command(golden: Dump, precision: str, output_dir: Path) -> str | None:
    return noise_twin_command(golden, precision, output_dir)


@hookimpl
def llmcheck_export_onnx(topology_path: Path, level: int, output_path: Path | None) -> Path | None:
    """Refuse an llmcheck dump's ``topology.json``, naming where its graph is or the flag that writes it.

    The module tree there has names and nesting but no dataflow, so there is nothing true to
    draw from it; the capture itself writes the graph it saw, as ``model.onnx`` in the dump.
    """
    dump = Path(topology_path).parent
    if Path(topology_path).name != TOPOLOGY_NAME or find_dumps(dump) != [dump]:
        return None
    what = "an llmcheck dump's module tree, which holds no dataflow to draw as ONNX"
    graph = dump / ONNX_FILE
    if graph.is_file():
        raise LlmcheckError(f"{what}; the capture wrote the dump's graph", where=topology_path, hint=f"open {graph}")
    raise LlmcheckError(
        f"{what}, and this dump has no graph",
        where=topology_path,
        hint=f"dump with --type onnx (DumpConfig(export_onnx=True)): the capture writes its graph as {ONNX_FILE} "
        "in the dump; export onnx converts ATB topologies",
    )
