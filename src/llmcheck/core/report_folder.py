"""Where a command's reports go: a new folder, or one holding a previous report -- never a dump.

Why: ``-o`` pointed at a dump by mistake (the golden run's folder, an ATB tensor tree, a
torchair FX or GE dump, a manual ``metadata.json`` folder) would mix report files into the
evidence, or replace files of the same name. Every source plugin already knows its dumps,
so the test is theirs: a folder some plugin reads as a dump (or inside one) is refused. A
folder holding the previous run's report is fine; its files are replaced, and said so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from llmcheck.core.errors import DumpNotFoundError, LlmcheckError, UsageError
from llmcheck.core.store import check_output_folder

log = logging.getLogger("llmcheck.report")


def prepare_report_folder(output: Path, report_names: Sequence[str], what: str = "reports") -> None:
    """Raise a usage error when ``output`` cannot take reports; say so when a previous report will be replaced."""
    output = Path(output)
    check_output_folder(output, what)
    if not output.is_dir() or next(output.iterdir(), None) is None:
        return
    claimed_by = dump_holding(output)
    if claimed_by is not None:
        raise UsageError(
            f"is {claimed_by}; {what} are never written into a dump", where=output, hint="pass another folder with -o"
        )
    previous = [name for name in report_names if (output / name).is_file()]
    if previous:
        log.warning("%s: replacing the previous report (%s)", output, ", ".join(previous))


def dump_holding(folder: Path) -> str | None:
    """Return what kind of dump ``folder`` is or lies in (``"a ge dump"``), or ``None`` when no plugin reads it as one."""
    from llmcheck.core.plugins import get_plugins

    try:
        dump = get_plugins().load_tensors(folder, tensor_folder=False)  # a folder of loose files may take reports
    except DumpNotFoundError:
        return None
    except LlmcheckError as exc:  # a plugin claimed it and found it broken: a dump all the same
        return f"a damaged dump ({exc.one_line()})"
    root = Path(dump.root).resolve()
    resolved = folder.resolve()
    if resolved == root or root in resolved.parents:
        return f"a {dump.source} dump" if resolved == root else f"inside the {dump.source} dump {root}"
    return None
