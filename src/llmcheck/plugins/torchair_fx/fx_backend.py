"""FX-graph capture on any machine: a torch.compile backend and a torch.export runner, in two layouts.

``torch.compile(model, backend=make_fx_dump_backend(path))`` lowers each captured graph to
ATen with AOTAutograd (as torchair's NPU backend does, so node names match torchair's) and
dumps every ATen call's positional arguments and results; :func:`dump_exported_program`
does the same for a ``torch.export`` program. Running the same model in fp32 and bf16, or
on CPU and CUDA, gives two dumps whose records pair exactly by node name. Two layouts:

* ``"llmcheck"`` (the default): the graph is rewritten once to record into llmcheck's own
  dump format, copies on the forward and statistics and writing on a writer thread
  (:mod:`.fx_recording`) -- a small fraction of the interpreter's cost;
* ``"torchair"``: :class:`FxDumpInterpreter` runs the graph node by node and saves each
  tensor as torchair's ``.npy`` file, for the original tool and scripts that read them.

torchair layout written: ``{dump_path}/worldsize{W}_global_rank{R}/
gm_{ts}_dump/{step}/{node}-{target}.{INPUT|OUTPUT}.{i}[.{j}].{ts}.npy``, steps counted from 0
per graph (one per call of the compiled graph). Like torchair, only positional arguments of
ATen calls are saved, and dtypes numpy lacks (bfloat16, float8) are saved as float32;
non-tensor arguments are saved as numbers where numpy can hold them, else as strings.
Unlike torchair, each step folder also gets ``llmcheck_saved_dtypes.json`` naming the true
dtype of every file saved as float32, so a bf16 run is judged against bf16 thresholds.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.fx

from llmcheck.plugin_api import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.plugins.torchair_fx.fx_recording import FxDump

log = logging.getLogger("llmcheck.fx")

DUMP_PATH_VARIABLE = "LLMCHECK_FX_DUMP_PATH"
LAYOUT_VARIABLE = "LLMCHECK_FX_DUMP_LAYOUT"
#: llmcheck's own dump format, written by the fast path (:mod:`.fx_recording`): the default
LAYOUT_LLMCHECK = "llmcheck"
#: torchair's ``.npy`` files, written by :class:`FxDumpInterpreter`: for the original tool
LAYOUT_TORCHAIR = "torchair"
LAYOUTS = (LAYOUT_LLMCHECK, LAYOUT_TORCHAIR)
#: ``tensor_part`` values, as in the torch capture's ``DumpConfig``: which side of each ATen call is recorded
TENSOR_PART_INPUTS = 0
TENSOR_PART_OUTPUTS = 1
TENSOR_PART_BOTH = 2
SAVED_DTYPES_FILE = "llmcheck_saved_dtypes.json"
DEFAULT_DUMP_PATH = "llmcheck_fx_dump"
TIMESTAMP_FORMAT = "%Y%m%d%H%M%S%f"
_NUMPY_LACKS = {
    torch.bfloat16,
    *(
        getattr(torch, n)
        for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
        if hasattr(torch, n)
    ),
}


class _Clock:
    """Gives strictly increasing microsecond timestamps, so file names order the calls exactly."""

    def __init__(self) -> None:
        self.last: datetime | None = None

    def stamp(self) -> str:
        now = datetime.now()
        if self.last is not None and now <= self.last:
            now = self.last + timedelta(microseconds=1)
        self.last = now
        return now.strftime(TIMESTAMP_FORMAT)


_clock = _Clock()


def as_saved_array(value: Any) -> np.ndarray:
    """Return what torchair's FX dumper saves for a value: the tensor as numpy, else ``np.array(value)`` or its text."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if tensor.dtype in _NUMPY_LACKS:
            tensor = tensor.float()
        elif tensor.dtype == torch.complex32:
            tensor = tensor.to(torch.complex64)
        try:
            return tensor.cpu().resolve_conj().resolve_neg().contiguous().numpy()
        except (TypeError, RuntimeError) as exc:  # sparse, quantised, ...: keep the run going, say what was lost
            log.warning(
                "FX dump: a %s %s tensor cannot be saved as .npy (%s); its description is saved instead",
                tensor.layout,
                tensor.dtype,
                exc,
            )
            return np.array(f"unsaved tensor: {tensor.dtype} {tensor.layout} {list(tensor.shape)}")
    try:
        array = np.array(value)
    except Exception:  # numpy refuses some objects outright (symbolic sizes, ...)
        return np.array(str(value))
    return np.array(str(value)) if array.dtype.hasobject else array


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Return this process's rank and the world size: those given, else torch.distributed's, else 0 and 1."""
    if rank is None or world_size is None:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        rank = rank if rank is not None else torch.distributed.get_rank() if distributed else 0
        world_size = world_size if world_size is not None else torch.distributed.get_world_size() if distributed else 1
    return rank, world_size


def rank_folder_name(rank: int | None = None, world_size: int | None = None) -> str:
    """Return ``worldsize{W}_global_rank{R}``, from torch.distributed when it is initialised."""
    rank, world_size = rank_and_world_size(rank, world_size)
    return f"worldsize{world_size}_global_rank{rank}"


class FxDumpInterpreter(torch.fx.Interpreter):
    """Runs a graph node by node, saving each ATen call's positional arguments and results as ``.npy``.

    One interpreter per graph; each :meth:`run` is one step, written to ``{graph_folder}/{step}/``.
    """

    def __init__(self, module: torch.fx.GraphModule, graph_folder: Path, first_step: int = 0) -> None:
        super().__init__(module)
        self.graph_folder = Path(graph_folder)
        self.step = first_step
        self._step_folder = self.graph_folder / str(first_step)
        self._saved_dtypes: dict[str, str] = {}  # file name -> true dtype of tensors saved as float32

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run the graph once (one step) and return its result."""
        self._step_folder = self.graph_folder / str(self.step)
        self._step_folder.mkdir(parents=True, exist_ok=False)
        self._saved_dtypes = {}
        try:
            with torch.no_grad():
                return super().run(*args, **kwargs)
        finally:
            if self._saved_dtypes:
                (self._step_folder / SAVED_DTYPES_FILE).write_text(json.dumps(self._saved_dtypes, indent=0) + "\n")
            self.step += 1

    def _save(self, stem: str, value: Any) -> None:
        file_name = f"{stem}.npy"
        np.save(self._step_folder / file_name, as_saved_array(value), allow_pickle=False)
        if isinstance(value, torch.Tensor) and value.dtype in _NUMPY_LACKS:
            self._saved_dtypes[file_name] = str(value.dtype).removeprefix("torch.")

    def run_node(self, node: torch.fx.Node) -> Any:
        """Run one node; for an ATen call, save its arguments before and its results after."""
        if node.op != "call_function" or not str(node.target).startswith("aten"):
            return super().run_node(node)
        with self._set_current_node(node):
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            stamp = _clock.stamp()
            prefix = f"{node.name}-{node.target}"
            for i, arg in enumerate(args):
                if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
                    for j, item in enumerate(arg):
                        self._save(f"{prefix}.INPUT.{i}.{j}.{stamp}", item)
                else:
                    self._save(f"{prefix}.INPUT.{i}.{stamp}", arg)
            result = self.call_function(node.target, args, kwargs)
            for i, item in enumerate(result if isinstance(result, (list, tuple)) else [result]):
                self._save(f"{prefix}.OUTPUT.{i}.{stamp}", item)
            return result


def new_graph_folder(dump_path: Path, rank: int | None = None, world_size: int | None = None) -> Path:
    """Return a fresh ``{dump_path}/worldsize{W}_global_rank{R}/gm_{ts}_dump`` path (created on first run)."""
    return Path(dump_path) / rank_folder_name(rank, world_size) / f"gm_{_clock.stamp()}_dump"


def check_layout(layout: str, where: str = "layout") -> None:
    """Raise a usage error unless ``layout`` is ``"llmcheck"`` or ``"torchair"``."""
    if layout not in LAYOUTS:
        raise UsageError(
            f"unknown FX dump layout {layout!r}",
            where=where,
            hint=f"use {LAYOUT_LLMCHECK!r} (fast, llmcheck's dump format) or {LAYOUT_TORCHAIR!r} (torchair's .npy files)",
        )


def check_tensor_part(tensor_part: int) -> None:
    """Raise a usage error unless ``tensor_part`` is 0 (inputs), 1 (outputs) or 2 (both)."""
    if tensor_part not in (TENSOR_PART_INPUTS, TENSOR_PART_OUTPUTS, TENSOR_PART_BOTH):
        raise UsageError(
            f"tensor_part must be 0, 1 or 2, got {tensor_part!r}",
            where="tensor_part",
            hint="0 inputs, 1 outputs, 2 both",
        )


def _check_dump_options(layout: str, statistics_only: bool, tensor_part: int) -> None:
    check_layout(layout)
    check_tensor_part(tensor_part)
    if layout == LAYOUT_TORCHAIR and (statistics_only or tensor_part != TENSOR_PART_BOTH):
        raise UsageError(
            "statistics_only and tensor_part apply to the llmcheck layout only",
            where="layout",
            hint="torchair's layout saves every input and output in full; drop them or use layout='llmcheck'",
        )


def _check_dump_path(dump_path: Path) -> None:
    if dump_path.exists() and not dump_path.is_dir():
        raise UsageError("exists and is not a folder", where=dump_path, hint="pass a folder as dump_path")


class FxDumpBackend:
    """A torch.compile backend that dumps every graph it compiles under ``dump_path``.

    ``layout="llmcheck"`` rewrites each ATen graph once to record into one llmcheck dump
    (:mod:`.fx_recording`); ``close()`` -- or leaving a ``with`` block, or the process's exit --
    finishes it. ``layout="torchair"`` interprets each graph, writing torchair's ``.npy`` files
    as it goes (nothing to close). ``path`` is the dump folder (llmcheck) or ``dump_path``.
    """

    def __init__(
        self,
        dump_path: str | Path,
        *,
        layout: str = LAYOUT_LLMCHECK,
        statistics_only: bool = False,
        tensor_part: int = TENSOR_PART_BOTH,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        from torch._dynamo.backends.common import aot_autograd

        _check_dump_options(layout, statistics_only, tensor_part)
        _check_dump_path(Path(dump_path))
        self.layout = layout
        self.dump_path = Path(dump_path)
        self.rank, self.world_size = rank, world_size
        self.dump: FxDump | None = None
        if layout == LAYOUT_LLMCHECK:
            from llmcheck.plugins.torchair_fx.fx_recording import FxDump

            self.dump = FxDump(
                dump_path, statistics_only=statistics_only, tensor_part=tensor_part, rank=rank, world_size=world_size
            )
        self.path = self.dump.path if self.dump is not None else self.dump_path
        self._backend = aot_autograd(fw_compiler=self._compile_graph)

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """Compile one graph captured by dynamo (lowered to ATen by AOTAutograd, as torchair's backend does)."""
        return self._backend(graph_module, example_inputs)

    def _compile_graph(self, graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from torch._functorch.aot_autograd import make_boxed_func

        if self.dump is None:
            interpreter = FxDumpInterpreter(graph_module, new_graph_folder(self.dump_path, self.rank, self.world_size))
            return make_boxed_func(interpreter.run)
        recorder = self.dump.add_graph(graph_module, example_inputs)
        return make_boxed_func(functools.partial(recorder.run_step, graph_module))

    def close(self) -> None:
        """Finish the dump: write what is pending and close it (llmcheck layout; once)."""
        if self.dump is not None:
            self.dump.close()

    def __enter__(self) -> FxDumpBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def make_fx_dump_backend(
    dump_path: str | Path,
    *,
    layout: str = LAYOUT_LLMCHECK,
    statistics_only: bool = False,
    tensor_part: int = TENSOR_PART_BOTH,
    rank: int | None = None,
    world_size: int | None = None,
) -> FxDumpBackend:
    """Return a torch.compile backend that dumps every graph it compiles under ``dump_path``.

    ``layout``: ``"llmcheck"`` (default: fast, llmcheck's dump format, closed by the
    backend's ``close()``) or ``"torchair"`` (torchair's ``.npy`` files, read by the original
    tool). ``statistics_only`` and ``tensor_part`` (0 inputs, 1 outputs, 2 both) mean what
    they mean in the torch capture's ``DumpConfig``; llmcheck layout only.
    """
    return FxDumpBackend(
        dump_path,
        layout=layout,
        statistics_only=statistics_only,
        tensor_part=tensor_part,
        rank=rank,
        world_size=world_size,
    )


#: the backends :func:`fx_dump_backend` made, by (dump path, layout): every graph of a process goes to one dump
_ENVIRONMENT_BACKENDS: dict[tuple[str, str], FxDumpBackend] = {}


def fx_dump_backend(graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """A torch.compile backend dumping under ``$LLMCHECK_FX_DUMP_PATH`` (default ``./llmcheck_fx_dump``).

    The layout is ``$LLMCHECK_FX_DUMP_LAYOUT`` (``llmcheck``, the default, or ``torchair``);
    every graph of the process goes to one dump, closed when the process exits.
    """
    dump_path = os.environ.get(DUMP_PATH_VARIABLE, DEFAULT_DUMP_PATH)
    layout = os.environ.get(LAYOUT_VARIABLE, LAYOUT_LLMCHECK)
    check_layout(layout, where=LAYOUT_VARIABLE)
    backend = _ENVIRONMENT_BACKENDS.get((dump_path, layout))
    if backend is None:
        backend = _ENVIRONMENT_BACKENDS[(dump_path, layout)] = make_fx_dump_backend(dump_path, layout=layout)
    return backend(graph_module, example_inputs)


def dump_exported_program(
    program: torch.export.ExportedProgram,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    dump_path: str | Path,
    layout: str = LAYOUT_LLMCHECK,
    statistics_only: bool = False,
    tensor_part: int = TENSOR_PART_BOTH,
    rank: int | None = None,
    world_size: int | None = None,
) -> Any:
    """Run a ``torch.export`` program once with FX dumping and return its result.

    ``layout="llmcheck"`` (default) writes one new, closed llmcheck dump under ``dump_path``;
    ``"torchair"`` one new graph folder of ``.npy`` files. The other options are
    :func:`make_fx_dump_backend`'s.
    """
    _check_dump_options(layout, statistics_only, tensor_part)
    _check_dump_path(Path(dump_path))
    module = program.module()
    if layout == LAYOUT_TORCHAIR:
        bound = inspect.signature(module.forward).bind(*args, **(kwargs or {}))
        bound.apply_defaults()
        interpreter = FxDumpInterpreter(module, new_graph_folder(Path(dump_path), rank, world_size))
        return interpreter.run(*bound.arguments.values())
    from llmcheck.plugins.torchair_fx.fx_recording import FxDump

    with FxDump(
        dump_path, statistics_only=statistics_only, tensor_part=tensor_part, rank=rank, world_size=world_size
    ) as dump:
        recorder = dump.add_graph(module, [*args, *(kwargs or {}).values()])
        with torch.no_grad():
            return recorder.run_step(module, *args, **(kwargs or {}))
