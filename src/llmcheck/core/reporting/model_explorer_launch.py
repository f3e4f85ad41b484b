"""``export model-explorer --open``: start Google's Model Explorer on the graph with the overlay.

Model Explorer is an optional extra (``pip install 'llmcheck[explorer]'``): its server and
web app are large and most users only need the files. Its built-in adapters do not read
ONNX, so the extra also installs ``model-explorer-onnx``, the adapter extension it loads.
The server runs as ``python -m model_explorer`` (its own command line), so the test suite
starts exactly what ``--open`` starts.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from llmcheck.core.errors import BackendUnavailableError

ONNX_EXTENSION = "model_explorer_onnx"
INSTALL_HINT = "install it with: pip install 'llmcheck[explorer]'"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def model_explorer_missing() -> str | None:
    """Return which Model Explorer package is not installed, or ``None`` when both are."""
    for module, package in (("model_explorer", "ai-edge-model-explorer"), (ONNX_EXTENSION, "model-explorer-onnx")):
        if importlib.util.find_spec(module) is None:
            return package
    return None


def require_model_explorer() -> None:
    """Raise the one-line error that says how to install Model Explorer, unless it is installed."""
    missing = model_explorer_missing()
    if missing is not None:
        raise BackendUnavailableError(
            f"needs Model Explorer, and {missing} is not installed", where="--open", hint=INSTALL_HINT
        )


def server_command(
    graph: Path, node_data: Sequence[Path], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
) -> list[str]:
    """Return the argv that serves ``graph`` with the ``node_data`` files on ``host:port`` and opens a browser tab."""
    return [
        sys.executable,
        "-m",
        "model_explorer",
        str(graph.resolve()),
        f"--extensions={ONNX_EXTENSION}",
        "--node_data_paths=" + ",".join(str(path.resolve()) for path in node_data),
        f"--host={host}",
        f"--port={port}",
    ]


def open_in_model_explorer(
    graph: Path, node_data: Sequence[Path], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
) -> int:
    """Serve the graph and overlay until the user stops the server (Ctrl+C); return its exit status."""
    require_model_explorer()
    try:
        return subprocess.call(server_command(graph, node_data, host, port))
    except KeyboardInterrupt:
        return 0
