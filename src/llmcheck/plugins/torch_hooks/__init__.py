"""Built-in plugin ``torch_hooks``: capture any PyTorch model's tensors, in code or with no code change.

* In code: ``from llmcheck import DumpConfig, register_hook`` (see :mod:`.capture`).
* No code change: ``llmcheck dump --backend torch --exec "python infer.py"`` (see :mod:`.backend`).

Both write llmcheck's own dump format, read back by the built-in ``native`` source. Importing
this plugin does not import torch.
"""

from __future__ import annotations

from typing import Callable

from llmcheck.plugin_api import CaptureBackend, hookimpl
from llmcheck.plugins.torch_hooks.backend import TorchCaptureBackend


@hookimpl
def llmcheck_register_capture_backends(register: Callable[[CaptureBackend], None]) -> None:
    register(TorchCaptureBackend())
