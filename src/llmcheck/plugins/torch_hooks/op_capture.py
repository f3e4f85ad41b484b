"""Op-level capture: every ATen operator call seen under a ``TorchDispatchMode``.

The mode sits below autograd, so it sees the operators that actually run (``aten.mm.default``,
``aten._scaled_dot_product_flash_attention_for_cpu.default``, ...), each with its exact
arguments. It only observes: it calls the operator exactly as asked and returns its result,
so the run takes the same code path as without capture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.plugins.torch_hooks.capture import CaptureSession


class OpCaptureMode(TorchDispatchMode):
    """Hands every operator call to its session, except the session's own work (copies, statistics)."""

    def __init__(self, session: "CaptureSession") -> None:
        super().__init__()
        self.session = session

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if self.session.busy:
            return func(*args, **(kwargs or {}))
        return self.session.capture_op(func, args, kwargs or {})
