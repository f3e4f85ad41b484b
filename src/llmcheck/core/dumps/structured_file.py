"""Reading the small JSON or YAML files users hand to llmcheck (``--mapping``, ``--thresholds``).

YAML is chosen by the ``.yaml`` / ``.yml`` suffix, JSON otherwise. A missing file, bad syntax
or a missing PyYAML is one clear error naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmcheck.core.errors import DumpFormatError, UsageError


def read_structured_file(path: Path) -> Any:
    """Return the parsed content of a JSON or YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise UsageError("no such file", where=path, hint="check the path") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the file: {exc}", where=path) from exc
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise UsageError(
                "reading YAML needs PyYAML", where=path, hint="pip install pyyaml, or write the file as JSON"
            ) from exc
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise DumpFormatError(f"not valid YAML{where}: {getattr(exc, 'problem', exc)}", where=path) from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise DumpFormatError(
            f"not valid JSON: {exc}", where=path, hint="YAML files need a .yaml or .yml suffix"
        ) from exc
