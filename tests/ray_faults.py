"""Test helper, imported by Ray workers: tensor loaders that kill the worker process measuring them.

A worker that dies mid-task is what an out-of-memory kill or a lost node looks like to Ray.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from llmcheck.core.records import TensorData


def dies_once(marker: Path, data: TensorData) -> torch.Tensor:
    """Kill the worker the first time (leaving ``marker``), load the tensor on the retry."""
    if not marker.exists():
        marker.touch()
        os._exit(1)
    return data.load()


def always_dies(data: TensorData) -> torch.Tensor:
    """Kill every worker that tries to load the tensor."""
    os._exit(1)
