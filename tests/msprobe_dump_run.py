"""Test helper, run as its own process: one forward pass of a seeded Llama, dumped by the real msprobe or by llmcheck.

msprobe wraps torch's APIs process-wide when it starts, so it never runs inside the test
process. ``--scale-weight MODULE FACTOR`` multiplies one module's weight (the injected defect).

    python msprobe_dump_run.py OUT --writer msprobe --task tensor --level L0 [--summary-mode md5]
    python msprobe_dump_run.py OUT --writer llmcheck
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

INPUT_IDS = [[1, 7, 42, 9, 3, 11]]


def _model(scale_weight: tuple[str, str] | None) -> torch.nn.Module:
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0, hidden_size=32, num_layers=2, vocab_size=64, num_heads=4)
    if scale_weight is not None:
        name, factor = scale_weight
        with torch.no_grad():
            dict(model.named_modules())[name].weight.mul_(float(factor))
    return model


def _dump_with_msprobe(model: torch.nn.Module, out: Path, task: str, level: str, summary_mode: str) -> None:
    from msprobe.pytorch import PrecisionDebugger

    task_config: dict[str, object] = {"scope": [], "list": [], "data_mode": ["all"]}
    if task == "statistics":
        task_config["summary_mode"] = summary_mode
    config = {
        "task": task,
        "dump_path": str(out),
        "rank": [],
        "step": [],
        "level": level,
        "async_dump": False,
        task: task_config,
    }
    config_path = out.parent / f"{out.name}_config.json"
    config_path.write_text(json.dumps(config))
    debugger = PrecisionDebugger(config_path=str(config_path))
    debugger.start(model)
    with torch.no_grad():
        model(torch.tensor(INPUT_IDS))
    debugger.stop()
    debugger.step()


def _dump_with_llmcheck(model: torch.nn.Module, out: Path) -> None:
    from llmcheck import DumpConfig, register_hook

    with register_hook(model, DumpConfig(dump_path=str(out), token_range=[0], tensor_part=2)), torch.no_grad():
        model(torch.tensor(INPUT_IDS))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--writer", choices=("msprobe", "llmcheck"), default="msprobe")
    parser.add_argument("--task", default="tensor")
    parser.add_argument("--level", default="L0")
    parser.add_argument("--summary-mode", default="statistics")
    parser.add_argument("--scale-weight", nargs=2, metavar=("MODULE", "FACTOR"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = _model(tuple(args.scale_weight) if args.scale_weight else None)
    if args.writer == "msprobe":
        _dump_with_msprobe(model, args.out, args.task, args.level, args.summary_mode)
    else:
        _dump_with_llmcheck(model, args.out)


if __name__ == "__main__":
    main()
