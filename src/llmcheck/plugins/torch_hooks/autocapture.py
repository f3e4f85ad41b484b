"""Capture with no code change: inside the child of ``llmcheck dump --backend torch``.

``bootstrap/sitecustomize.py`` calls :func:`arm` at interpreter start-up. Nothing happens
until the program imports torch; then the first module whose forward is called -- the
outermost model, as nothing else is running yet -- gets a :class:`CaptureSession` built
from the ``LLMCHECK_TORCH_CAPTURE`` config, closed when the process exits.

Why the first call is caught by wrapping ``torch.nn.Module.__call__`` once, rather than by
a global forward pre-hook: global pre-hooks do not see keyword arguments, and HF
``generate`` passes every input of the model by keyword. The wrapper removes itself at
that first call, so the rest of the run pays nothing for it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from llmcheck.plugins.torch_hooks.config import CONFIG_ENV, ENGINE_VLLM

log = logging.getLogger("llmcheck.torch")

#: Sessions started in this process (kept alive until exit, when each closes its dump).
sessions: list[Any] = []


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; lets ``import NAME`` proceed, then calls ``then(module)`` once the module is ready."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            self.then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def arm() -> None:
    """Turn capture on for this process: now if torch is imported, else right after it is.

    Inside a serving engine (``DumpConfig.engine``) the model is not the first module called:
    the engine's own hook (:mod:`.vllm_engine`) finds it where its model runner loads it.
    """
    _configure_logging(os.environ.get("LLMCHECK_LOG_LEVEL", "info"))
    engine = _engine_asked()
    if engine == ENGINE_VLLM:
        from llmcheck.plugins.torch_hooks import vllm_engine

        vllm_engine.arm()
    if "torch" in sys.modules:
        _install(first_module=engine is None)
    else:
        sys.meta_path.insert(0, AfterImport("torch", lambda _torch: _install(first_module=engine is None)))


def _engine_asked() -> str | None:
    """Return the engine the config names (``None``: capture the first module called); the config is checked later."""
    try:
        values = json.loads(os.environ.get(CONFIG_ENV, "{}"))
    except ValueError:
        return None  # reported in one line where the config is read
    engine = values.get("engine") if isinstance(values, dict) else None
    return engine if isinstance(engine, str) else None


def _configure_logging(level_name: str) -> None:
    level = {"warn": logging.WARNING, "fatal": logging.CRITICAL}.get(
        level_name.lower(), getattr(logging, level_name.upper(), logging.INFO)
    )
    logger = logging.getLogger("llmcheck")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("llmcheck: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)


def _install(*, first_module: bool = True) -> None:
    import torch

    _seed_if_asked(torch)
    if not first_module:
        return
    original_call = torch.nn.Module.__call__
    started = False

    def first_module_call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        # Code may hold this function as a bound method from before the first call (HF
        # generate keeps ``model_forward = self.__call__``), so it stays a plain pass-through.
        nonlocal started
        if not started:
            started = True
            torch.nn.Module.__call__ = original_call  # type: ignore[method-assign]
            _start_capture(module)
        return original_call(module, *args, **kwargs)

    torch.nn.Module.__call__ = first_module_call  # type: ignore[method-assign]


def _start_capture(module: Any) -> None:
    from llmcheck.plugin_api import LlmcheckError
    from llmcheck.plugins.torch_hooks.capture import register_hook
    from llmcheck.plugins.torch_hooks.config import DumpConfig

    try:
        config = DumpConfig.from_env(os.environ[CONFIG_ENV])
        sessions.append(register_hook(module, config))
    except LlmcheckError as exc:  # the program runs on, without capture
        sys.stderr.write(f"llmcheck: error: {exc.one_line()}\n")


def _seed_if_asked(torch: Any) -> None:
    """Seed every generator in this process (``llmcheck dump -seed N``), where the run happens."""
    seed_text = os.environ.get("LLMCHECK_SEED")
    if not seed_text:
        return
    import random

    seed = int(seed_text)
    random.seed(seed)
    torch.manual_seed(seed)
    import numpy  # a dependency of llmcheck, so always there

    numpy.random.seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
