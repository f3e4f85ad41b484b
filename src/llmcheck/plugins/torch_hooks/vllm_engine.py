"""Capture inside vLLM with no code change: hooks on the model its model runner loads, one step per engine step.

``llmcheck dump --backend vllm`` runs the program as the torch backend does (the bootstrap
``sitecustomize`` in every Python process it starts, the engine-core child and tensor-parallel
workers included); in such a process :func:`arm` waits for vLLM's model runner module and
wraps two methods of ``GPUModelRunner`` (which vLLM's CPU, XPU and NPU runners extend):

* ``__init__``: a runner that will compile the model or replay CUDA graphs is refused at
  once, before the minutes a compile takes: module hooks do not fire inside a compiled graph,
  so the dump would be empty or partial. The refusal is one line saying to pass
  ``--enforce-eager`` (``LLM(..., enforce_eager=True)``), noted for ``llmcheck dump``, and the
  process exits with :data:`REFUSED_EXIT_CODE`.
* ``execute_model``: the first call with tokens to run starts a
  :class:`~.capture.CaptureSession` on the runner's model (its forward hooks fire in vLLM's
  eager forward and in ``compute_logits``, which the runner calls after it); every such call
  is one step. Warm-up and profiling forwards run outside ``execute_model`` and are not steps.

Each dumped step's bookkeeping -- the request ids in batch order, their query start offsets
and every row's token position -- goes to the dump's ``batches.jsonl``
(:class:`~llmcheck.plugin_api.BatchLayout`), read from the runner after the step ran: the
rows of a flattened ``[tokens, hidden]`` batch mean nothing without it. The manifest's
``engine`` field records vLLM's version, the mode (``eager``), the model, its dtype and the
tensor-parallel size.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from llmcheck.plugins.torch_hooks.config import ENGINE_VLLM

log = logging.getLogger("llmcheck.torch")

#: The module defining ``GPUModelRunner``, the class every vLLM V1 model runner extends.
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
#: The manifest field describing the engine a dump was captured in.
ENGINE_FIELD = "engine"
#: Exit code of a process whose vLLM runner was refused (compiled mode).
REFUSED_EXIT_CODE = 3
#: The one line said when vLLM would compile the model.
COMPILED_REFUSAL = (
    "vLLM runs this model compiled ({mode}): module hooks do not fire inside a compiled graph or a "
    "replayed CUDA graph, so the dump would be empty or partial; run vLLM in eager mode: add "
    "--enforce-eager (vllm serve) or enforce_eager=True (LLM(...))"
)

_ATTRIBUTE = "_llmcheck_capture"


def arm() -> None:
    """Wrap vLLM's model runner now if its module is loaded, else as soon as it is."""
    module = sys.modules.get(RUNNER_MODULE)
    if module is not None:
        _wrap_runner(module.GPUModelRunner)
    else:
        from llmcheck.plugins.torch_hooks.autocapture import AfterImport

        sys.meta_path.insert(0, AfterImport(RUNNER_MODULE, lambda runner: _wrap_runner(runner.GPUModelRunner)))


def _wrap_runner(runner_class: type) -> None:
    if getattr(runner_class, "_llmcheck_wrapped", False):
        return
    original_init = runner_class.__init__  # type: ignore[misc]
    original_execute = runner_class.execute_model  # type: ignore[attr-defined]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        mode = compiled_mode(self.vllm_config)
        if mode is not None:
            _refuse(COMPILED_REFUSAL.format(mode=mode))

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(scheduler_output, "total_num_scheduled_tokens", 0):
            return original_execute(self, scheduler_output, *args, **kwargs)
        capture = _capture_of(self)
        if capture is None:
            return original_execute(self, scheduler_output, *args, **kwargs)
        capture.begin()
        try:
            return original_execute(self, scheduler_output, *args, **kwargs)
        finally:
            capture.end()

    runner_class.__init__ = __init__  # type: ignore[misc]
    runner_class.execute_model = execute_model  # type: ignore[attr-defined]
    runner_class._llmcheck_wrapped = True  # type: ignore[attr-defined]


def compiled_mode(vllm_config: Any) -> str | None:
    """Return how vLLM would compile the model (``"compilation mode VLLM_COMPILE"``), or ``None`` in eager mode."""
    if getattr(vllm_config.model_config, "enforce_eager", False):
        return None
    compilation = vllm_config.compilation_config
    parts = []
    mode = getattr(compilation, "mode", None)
    if mode is not None and getattr(mode, "name", str(mode)) != "NONE" and mode != 0:
        parts.append(f"compilation mode {getattr(mode, 'name', mode)}")
    graphs = getattr(compilation, "cudagraph_mode", None)
    if graphs is not None and getattr(graphs, "name", str(graphs)) != "NONE" and _graphs_replayed(vllm_config):
        parts.append(f"CUDA graphs {getattr(graphs, 'name', graphs)}")
    return ", ".join(parts) or None


def _graphs_replayed(vllm_config: Any) -> bool:
    device = str(getattr(vllm_config.device_config, "device_type", getattr(vllm_config.device_config, "device", "")))
    return device not in ("cpu", "")


def _refuse(message: str) -> None:
    from llmcheck.plugins.torch_hooks.capture import _note_for_parent
    from llmcheck.plugins.torch_hooks.config import NOT_STARTED_ENV

    _note_for_parent(NOT_STARTED_ENV, message)
    sys.stderr.write(f"llmcheck: error: {message}\n")
    sys.stderr.flush()
    os._exit(REFUSED_EXIT_CODE)  # before vLLM compiles for minutes; nothing of the program is lost yet


class _EngineCapture:
    """A capture session on one runner's model, and the bookkeeping of the step running now."""

    def __init__(self, runner: Any, session: Any) -> None:
        self.runner = runner
        self.session = session
        self.positions: Any = None
        model = session.model

        def remember_inputs(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.positions = kwargs.get("positions", args[1] if len(args) > 1 else None)

        self._handle = model.register_forward_pre_hook(remember_inputs, with_kwargs=True)

    def begin(self) -> None:
        self.positions = None
        self.session.begin_outside_step()

    def end(self) -> None:
        layout = None
        try:
            layout = self._layout()
        except Exception as exc:  # vLLM's internals moved: the step's tensors are kept, its rows untraceable
            log.warning(
                "cannot read vLLM's batch bookkeeping (%s: %s); rows of step %d are not traceable",
                type(exc).__name__,
                exc,
                self.session.step,
            )
        self.session.end_outside_step(layout)

    def _layout(self) -> Any:
        from llmcheck.plugin_api import BatchLayout

        if self.positions is None:  # the model did not run in this step (nothing scheduled for it)
            return None
        runner = self.runner
        count = int(runner.input_batch.num_reqs)
        request_ids = tuple(str(request) for request in list(runner.input_batch.req_ids)[:count])
        starts = runner.query_start_loc.cpu[: count + 1].tolist()
        positions = self.positions[: starts[-1]].tolist() if starts else []
        return BatchLayout(self.session.step, request_ids, tuple(starts), tuple(positions), self.session.rank)


def _capture_of(runner: Any) -> _EngineCapture | None:
    """Return the runner's capture, starting it at its first step; ``None`` when capture could not start."""
    capture = runner.__dict__.get(_ATTRIBUTE, False)
    if capture is not False:
        return capture
    runner.__dict__[_ATTRIBUTE] = None
    from llmcheck.plugin_api import LlmcheckError
    from llmcheck.plugins.torch_hooks import autocapture
    from llmcheck.plugins.torch_hooks.capture import CaptureSession
    from llmcheck.plugins.torch_hooks.config import CONFIG_ENV, DumpConfig

    try:
        config = DumpConfig.from_env(os.environ[CONFIG_ENV])
        model = runner.get_model()
        session = CaptureSession(
            model, config, outside_steps=True, manifest_fields={ENGINE_FIELD: _engine_entry(runner)}
        )
    except LlmcheckError as exc:  # the program runs on, without capture
        sys.stderr.write(f"llmcheck: error: {exc.one_line()}\n")
        return None
    autocapture.sessions.append(session)
    _close_when_the_process_ends(session)
    capture = _EngineCapture(runner, session)
    runner.__dict__[_ATTRIBUTE] = capture
    return capture


def _close_when_the_process_ends(session: Any) -> None:
    """Close the dump when a multiprocessing child ends too: vLLM's engine core is one, and ends with ``os._exit``.

    A child of ``multiprocessing`` never runs ``atexit`` handlers; it runs the finalizers
    registered with ``multiprocessing.util`` as ``run()`` returns -- also when a stopped
    server's SIGTERM ends the engine's loop with ``SystemExit``. Without this the dump of a
    ``vllm serve`` stopped cleanly would read as killed. In the main process the same
    finalizers run at exit; closing twice is a no-op. A server's shutdown also signals its
    workers before it kills those that linger (vLLM on CPU force-kills its model worker):
    SIGTERM or SIGINT closes the dump first, then does what it did before.
    """
    import multiprocessing.util
    import signal
    import threading

    multiprocessing.util.Finalize(None, session.close_at_exit, exitpriority=100)
    if threading.current_thread() is not threading.main_thread():
        return  # Python runs signal handlers in the main thread only
    for number in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(number)

        def close_then_go_on(signum: int, frame: Any, previous: Any = previous) -> None:
            # a server stopping its workers: each engine step the dump holds is whole, close it now
            session.close_at_exit()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(number, close_then_go_on)


def _engine_entry(runner: Any) -> dict[str, Any]:
    """Return the manifest's ``engine`` field: what ran the model, so a reader knows the rows are a serving batch."""
    import vllm

    config = runner.vllm_config
    model_config = config.model_config
    return {
        "name": ENGINE_VLLM,
        "version": getattr(vllm, "__version__", None),
        "mode": "eager",
        "model": str(getattr(model_config, "model", "")),
        "dtype": str(getattr(model_config, "dtype", "")).replace("torch.", ""),
        "tensor_parallel_size": int(getattr(config.parallel_config, "tensor_parallel_size", 1)),
        "runner": type(runner).__name__,
    }
