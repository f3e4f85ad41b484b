"""The ``llmcheck dump`` command that records a torch golden run's noise twin: its program again, ``--as-dtype``.

``compare`` asks for it (hook ``llmcheck_noise_twin_command``) when the runs differ in
precision and no twin was given. The golden dump's config says how it was captured; the
twin is captured the same way (steps, level, statistics only, selection), so its records
pair with the golden's. A dump written by ``llmcheck dump --exec`` holds its program in the
config's ``command_line``; one written in-process (``register_hook``, ``llmcheck demo``)
holds none, and the command shows a placeholder for it. This module does not import torch.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import Dump
from llmcheck.plugins.torch_hooks.backend import BACKEND_NAME
from llmcheck.plugins.torch_hooks.config import (
    AS_DTYPE_NAMES,
    LEVEL_MODULE,
    LEVEL_OP,
    SAVE_IN_BEFORE_OUT_AFTER,
    TENSOR_PART_BOTH,
    step_runs,
)

#: Stands for the program in a command made for a dump that recorded none.
PROGRAM_PLACEHOLDER = "python <your golden program>"
#: Characters a double-quoted shell word would expand or end on.
_UNSAFE_IN_DOUBLE_QUOTES = frozenset('"$`\\!')


def noise_twin_command(golden: Dump, precision: str, output_dir: Path) -> str | None:
    """Return the ``llmcheck dump --as-dtype`` command that records ``golden``'s twin, or None for another capture's dump."""
    manifest = golden.manifest
    if manifest.get("backend") != BACKEND_NAME or precision not in AS_DTYPE_NAMES:
        return None
    config = manifest.get("config")
    config = config if isinstance(config, Mapping) else {}
    program = config.get("command_line")
    words = [
        "llmcheck",
        "dump",
        "--backend",
        BACKEND_NAME,
        "--as-dtype",
        precision,
        *capture_flags(config),
        "-o",
        str(output_dir),
    ]
    command = f"{shlex.join(words)} --exec {_shell_word(shlex.join(program) if program else PROGRAM_PLACEHOLDER)}"
    if program:
        return command
    return (
        f"{command}   # the golden dump was written in-process and names no program: put yours in; "
        f'in Python, DumpConfig(as_dtype="{precision}") does the same'
    )


def capture_flags(config: Mapping[str, Any]) -> list[str]:
    """Return the ``llmcheck dump`` flags that capture what a dump's config (its manifest's) captured; defaults left out."""
    flags: list[str] = []
    steps = config.get("token_range", [0])
    if steps is None:
        flags += ["-er", "all"]
    elif list(steps) != [0]:
        flags += ["-er", ",".join(f"{low},{high}" for low, high in step_runs(steps))]
    levels = list(config.get("mode") or [])
    dump_types = [name for level, name in ((LEVEL_MODULE, "tensor"), (LEVEL_OP, "op")) if level in levels]
    if dump_types != ["tensor"]:
        flags += ["--type", *(dump_types or ["model"])]
    if config.get("statistics_only"):
        flags.append("-sd")
    flags += _unless_default(config, "tensor_part", "-stp", TENSOR_PART_BOTH)
    flags += _unless_default(config, "save_time", "-time", SAVE_IN_BEFORE_OUT_AFTER)
    flags += _listed(config.get("module_ids"), "-ids")
    if config.get("module_ids") and config.get("include_children") is False:
        flags += ["-child", "False"]
    flags += _listed(config.get("type_prefixes"), "-opname")
    flags += _listed(config.get("device_ids"), "-device")
    return flags


def _unless_default(config: Mapping[str, Any], key: str, flag: str, default: int) -> list[str]:
    value = config.get(key, default)
    return [] if value == default else [flag, str(value)]


def _listed(values: Sequence[str] | None, flag: str) -> list[str]:
    return [flag, ",".join(values)] if values else []


def _shell_word(text: str) -> str:
    """Return ``text`` as one shell word: in double quotes when nothing in it would expand, else single-quoted."""
    if _UNSAFE_IN_DOUBLE_QUOTES.isdisjoint(text):
        return f'"{text}"'
    return shlex.quote(text)
