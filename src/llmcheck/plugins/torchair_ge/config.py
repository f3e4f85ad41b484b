"""torchair ``CompilerConfig`` for graph-mode dumps (GE data + graph text, FX ``.npy``) and the fusion switch file.

Usage on an Ascend machine (torch_npu with torchair installed)::

    from llmcheck.plugins.torchair_ge.config import get_ge_dump_config, write_fusion_switch_file
    config = get_ge_dump_config("./ge_dump")                       # my run: fused graph
    backend = torchair.get_npu_backend(compiler_config=config)
    model = torch.compile(model, backend=backend)

    switch = write_fusion_switch_file("./fusion_switch.json")    # golden run: fusion off
    config = get_ge_dump_config("./ge_dump_unfused", fusion_switch_file=switch)

Each call dumps into a fresh ``ge_dump_{YYYYmmdd_HHMMSS}`` folder under ``dump_path`` so two
runs never mix. Where torchair is absent the helpers raise
:class:`~llmcheck.core.errors.BackendUnavailableError`; :func:`ge_dump_settings` and
:func:`fx_dump_settings` give the same settings as plain data on any machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from llmcheck.plugin_api import BackendUnavailableError, LlmcheckError, UsageError

DUMP_MODES = ("input", "output", "all")
GE_DUMP_FOLDER_PREFIX = "ge_dump_"
FX_DUMP_FOLDER_PREFIX = "fx_dump_"


def _fresh_folder(parent: Path, prefix: str) -> Path:
    parent = Path(parent)
    stamp = time.strftime("%Y%m%d_%H%M%S")
    for attempt in range(1000):
        candidate = parent / (f"{prefix}{stamp}" if attempt == 0 else f"{prefix}{stamp}.{attempt}")
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            continue
        except OSError as exc:
            raise LlmcheckError(f"cannot create the dump folder: {exc.strerror}", where=candidate) from exc
    raise LlmcheckError("could not find a free dump folder name", where=parent)


def ge_dump_settings(
    dump_folder: Path,
    fusion_switch_file: Path | None = None,
    dump_mode: str = "all",
    dump_token: Iterable[int] | None = None,
    dump_layer: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Return the torchair ``CompilerConfig`` attributes a GE dump needs, by dotted attribute path.

    ``dump_token`` lists the steps to dump (torchair's ``dump_step``, ``"0|1"``);
    ``dump_layer`` the op names (``dump_layer``, space-separated).
    """
    if dump_mode not in DUMP_MODES:
        raise UsageError(f"dump_mode must be one of {', '.join(DUMP_MODES)}, not {dump_mode!r}", where="dump_mode")
    settings: dict[str, Any] = {
        "debug.graph_dump.type": "txt",
        "debug.graph_dump.path": str(dump_folder),
        "dump_config.enable_dump": True,
        "dump_config.dump_mode": dump_mode,
        "dump_config.dump_path": str(dump_folder),
    }
    if fusion_switch_file is not None:
        if not Path(fusion_switch_file).is_file():
            raise UsageError(
                "no such fusion switch file", where=fusion_switch_file, hint="write one with write_fusion_switch_file()"
            )
        settings["fusion_config.fusion_switch_file"] = str(fusion_switch_file)
    if dump_token is not None:
        tokens = [int(token) for token in dump_token]
        if any(token < 0 for token in tokens):
            raise UsageError("dump_token values must be non-negative step numbers", where="dump_token")
        settings["dump_config.dump_step"] = "|".join(str(token) for token in tokens)
    if dump_layer is not None:
        settings["dump_config.dump_layer"] = " ".join(str(name) for name in dump_layer)
    return settings


def fx_dump_settings(dump_folder: Path) -> dict[str, Any]:
    """Return the torchair ``CompilerConfig`` attributes an FX ``.npy`` dump needs."""
    return {"debug.data_dump.type": "npy", "debug.data_dump.path": str(dump_folder)}


def _compiler_config_class() -> Any:
    try:
        from torchair.configs.compiler_config import CompilerConfig
    except ImportError as exc:
        raise BackendUnavailableError(
            f"torchair is not importable here ({exc})",
            where="torchair",
            hint="install torch_npu with torchair on an Ascend machine; on other machines capture FX "
            "dumps with llmcheck.plugins.torchair_fx.fx_dump_backend",
        ) from None
    return CompilerConfig


def apply_settings(config: Any, settings: Mapping[str, Any]) -> Any:
    """Set each dotted attribute of ``settings`` on ``config`` and return ``config``.

    torchair 8.0.RC1.b080 renamed ``graph_dump.path`` to ``graph_dump._path``; whichever the
    installed torchair has is set.
    """
    for dotted, value in settings.items():
        *parents, leaf = dotted.split(".")
        target = config
        for parent in parents:
            target = getattr(target, parent)
        if leaf == "path" and hasattr(target, "_path"):
            leaf = "_path"
        setattr(target, leaf, value)
    return config


def get_ge_dump_config(
    dump_path: str | Path,
    fusion_switch_file: str | Path | None = None,
    dump_mode: str = "all",
    dump_token: Iterable[int] | None = None,
    dump_layer: Iterable[str] | None = None,
    compiler_config: Any = None,
) -> Any:
    """Return a torchair ``CompilerConfig`` that dumps GE data and graph text into a fresh folder under ``dump_path``.

    ``compiler_config`` is an existing config to add the dump settings to (a new one otherwise).
    """
    config_class = _compiler_config_class()
    switch = Path(fusion_switch_file) if fusion_switch_file is not None else None
    settings_check = ge_dump_settings(Path(dump_path), switch, dump_mode, dump_token, dump_layer)  # validate first
    folder = _fresh_folder(Path(dump_path), GE_DUMP_FOLDER_PREFIX)
    settings = {**settings_check, "debug.graph_dump.path": str(folder), "dump_config.dump_path": str(folder)}
    return apply_settings(compiler_config if compiler_config is not None else config_class(), settings)


def get_fx_dump_config(dump_path: str | Path, compiler_config: Any = None) -> Any:
    """Return a torchair ``CompilerConfig`` that dumps FX ``.npy`` data into a fresh folder under ``dump_path``.

    torchair honours the path from torch_npu 7.0 on; older versions write under ``./data_dump``.
    """
    config_class = _compiler_config_class()
    folder = _fresh_folder(Path(dump_path), FX_DUMP_FOLDER_PREFIX)
    return apply_settings(compiler_config if compiler_config is not None else config_class(), fx_dump_settings(folder))


def fusion_switch(
    graph_fusion: str = "off", ub_fusion: str = "off", passes: Mapping[str, Mapping[str, str]] | None = None
) -> dict[str, Any]:
    """Return the fusion switch document: ``ALL`` of GraphFusion and UBFusion on or off, plus per-pass switches.

    ``passes`` maps ``"GraphFusion"``/``"UBFusion"`` to ``{pass name: "on"|"off"}``.
    """
    for value in (graph_fusion, ub_fusion, *(v for group in (passes or {}).values() for v in group.values())):
        if value not in ("on", "off"):
            raise UsageError(f"fusion switches are 'on' or 'off', not {value!r}", where="fusion switch")
    document: dict[str, Any] = {"Switch": {"GraphFusion": {"ALL": graph_fusion}, "UBFusion": {"ALL": ub_fusion}}}
    for group, switches in (passes or {}).items():
        if group not in ("GraphFusion", "UBFusion"):
            raise UsageError(f"fusion switch groups are GraphFusion and UBFusion, not {group!r}", where="fusion switch")
        document["Switch"][group].update(switches)
    return document


def write_fusion_switch_file(
    path: str | Path,
    graph_fusion: str = "off",
    ub_fusion: str = "off",
    passes: Mapping[str, Mapping[str, str]] | None = None,
) -> Path:
    """Write the fusion switch JSON (default: every GraphFusion and UBFusion pass off) and return its path."""
    path = Path(path)
    document = fusion_switch(graph_fusion, ub_fusion, passes)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=4) + "\n", encoding="utf-8")
    return path
