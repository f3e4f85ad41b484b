"""Built-in plugin 'atb': Ascend ATB (加速库) dumps -- read, capture, pair, export (see docs/sources/atb.md).

* load tensors: ATB dump folders (``msit_dump_*``, ``ait_dump``, ``atb_temp``,
  ``atb_dump_data``) and single ``.bin`` tensor files, source name ``atb``;
* capture: ``llmcheck dump --backend atb --exec CMD`` preloads CANN's probe library;
* map pairs: ATB against a PyTorch module dump (layers, then op kinds), ATB against ATB;
* export: ``llmcheck export onnx TOPOLOGY.json`` and the seed API
  ``from llmcheck.plugins.atb import atb_json_to_onnx``.

Importing this package stays light (no torch, no onnx): each hook imports its module when called.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import (
    BackendOption,
    CaptureBackend,
    Dump,
    Pair,
    SourceInfo,
    UserMapping,
    hookimpl,
    read_dump_file,
    seed_dump_options,
)
from llmcheck.plugins.atb.onnx_export import atb_json_to_onnx

__all__ = ["atb_json_to_onnx"]

SOURCE_NAME = "atb"


@hookimpl
def llmcheck_register_sources(register: Callable[[SourceInfo], None]) -> None:
    register(SourceInfo(SOURCE_NAME, "Ascend ATB dump (msit_dump_*/ait_dump/atb_temp/atb_dump_data, .bin tensors)"))


@hookimpl
def llmcheck_load_tensors(path: Path, source: str | None) -> Dump | None:
    if source not in (None, SOURCE_NAME):
        return None
    from llmcheck.plugins.atb.dump_tree import load_atb_dump

    return load_atb_dump(path)


@hookimpl
def llmcheck_register_capture_backends(register: Callable[[CaptureBackend], None]) -> None:
    from llmcheck.plugins.atb.launcher import AtbCaptureBackend

    register(AtbCaptureBackend())


@hookimpl
def llmcheck_register_backend_options(register: Callable[[BackendOption], None]) -> None:
    from llmcheck.plugins.atb.launcher import BACKEND_NAME

    for option in seed_dump_options(BACKEND_NAME):
        register(option)
    register(
        BackendOption(
            BACKEND_NAME,
            "save_tiling",
            "Also save the kernels' tiling data.",
            type=bool,
            default=False,
            aliases=("-tiling",),
        )
    )


@hookimpl
def llmcheck_map_pairs(golden: Dump, my: Dump, user_mapping: UserMapping | None) -> list[Pair] | None:
    from llmcheck.plugins.atb.pairing import map_pairs

    return map_pairs(golden, my, user_mapping)


@hookimpl
def llmcheck_export_onnx(topology_path: Path, level: int, output_path: Path | None) -> Path | None:
    if Path(topology_path).suffix.lower() != ".json":
        return None
    from llmcheck.plugins.atb.topology import looks_like_topology

    try:  # a FIFO, a device, an oversized file: one error naming it (read_dump_file), never a hang
        document: Any = json.loads(read_dump_file(Path(topology_path), None))
    except (FileNotFoundError, ValueError, RecursionError):
        return None  # not JSON: another plugin's kind of topology (the core names what is wrong with it)
    if not looks_like_topology(document):
        return None
    return atb_json_to_onnx(topology_path, level, output_path)
