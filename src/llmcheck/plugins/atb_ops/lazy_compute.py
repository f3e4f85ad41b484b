"""A reference's compute function named by module and attribute, imported on first call.

Registering references must not import torch (``llmcheck plugins`` lists them without
paying for it), and a worker process receives the name, not the function, when opcheck
checks ops in parallel.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LazyCompute:
    """Calls ``module.attribute(inputs, params)``, importing the module the first time."""

    module: str
    attribute: str

    def __call__(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> Sequence[Any]:
        return getattr(importlib.import_module(self.module), self.attribute)(inputs, params)
