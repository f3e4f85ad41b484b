"""Where a command's reports go: a new folder, or one holding a previous report -- never a dump.

Why: ``-o`` pointed at a dump by mistake (the golden run's folder, an ATB tensor tree, a
torchair FX or GE dump, a manual ``metadata.json`` folder) would mix report files into the
evidence, or replace files of the same name. Every source plugin already knows its dumps,
so the test is theirs: a folder some plugin reads as a dump (or inside one) is refused. A
folder holding the previous run's report is fine: once the new report is ready to be written,
the previous one's files are replaced, and the files it had that the new one does not write
(a ``--report junit`` file, an ``export model-explorer`` folder) are removed, so the folder
never mixes two reports; the warning names both. Only the report files llmcheck knows are
touched: anything else the user put in the folder stays.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from llmcheck.core.dumps.store import check_output_folder
from llmcheck.core.errors import DumpNotFoundError, LlmcheckError, UsageError
from llmcheck.core.records import Dump

log = logging.getLogger("llmcheck.report")

#: The folder ``llmcheck export model-explorer`` writes into a compare folder by default, and what it writes there.
MODEL_EXPLORER_DIR = "model_explorer"
MODEL_EXPLORER_FILES = ("node_data_*.json", "*.onnx")


def prepare_report_folder(
    output: Path, report_names: Sequence[str], read_dump: Callable[[Path], Dump], what: str = "reports"
) -> None:
    """Raise a usage error when ``output`` cannot take reports (it is, or lies in, a dump); write nothing.

    ``read_dump`` reads a folder as a dump the way the loaded plugins do (raising
    :class:`DumpNotFoundError` where none claims it): every source knows its own dumps.
    """
    output = Path(output)
    check_output_folder(output, what)
    if not output.is_dir() or next(output.iterdir(), None) is None:
        return
    claimed_by = dump_holding(output, read_dump)
    if claimed_by is not None:
        raise UsageError(
            f"is {claimed_by}; {what} are never written into a dump", where=output, hint="pass another folder with -o"
        )
    # A previous report is only replaced once the new one is ready to be written
    # (replace_previous_report): an input error found before then leaves it whole and unmentioned.


def dump_holding(folder: Path, read_dump: Callable[[Path], Dump]) -> str | None:
    """Return what kind of dump ``folder`` is or lies in (``"a ge dump"``), or ``None`` when no plugin reads it as one."""
    try:
        dump = read_dump(folder)
    except DumpNotFoundError:
        return None
    except LlmcheckError as exc:  # a plugin claimed it and found it broken: a dump all the same
        return f"a damaged dump ({exc.one_line()})"
    root = Path(dump.root).resolve()
    resolved = folder.resolve()
    if resolved == root or root in resolved.parents:
        return f"a {dump.source} dump" if resolved == root else f"inside the {dump.source} dump {root}"
    return None


def replace_previous_report(output: Path, writing: Sequence[str], known: Sequence[str]) -> None:
    """Remove what the previous report in ``output`` holds and this one will not write; warn naming both.

    ``writing`` are the file names the new report writes, ``known`` every report file name
    llmcheck can write there (all the registered reporters'). Nothing happens in a folder
    holding none of the ``known`` files: it holds no previous report.
    """
    output = Path(output)
    previous = [name for name in known if (output / name).is_file()]
    if not previous:
        return
    replaced = [name for name in writing if name in previous]
    removed: list[str] = []
    for name in previous:
        if name not in writing:
            _remove(output / name)
            removed.append(name)
    explorer = output / MODEL_EXPLORER_DIR
    kept_explorer = False
    if explorer.is_dir():
        if _holds_only_model_explorer_files(explorer):
            _remove(explorer)
            removed.append(MODEL_EXPLORER_DIR + "/")
        else:
            kept_explorer = True
    text = "replacing the previous report" + (f" ({', '.join(replaced)})" if replaced else "")
    if removed:
        text += f"; removed its {', '.join(removed)}, which this run does not write"
    if kept_explorer:
        text += (
            f"; {MODEL_EXPLORER_DIR}/ holds files llmcheck did not write, so it was kept: its views show the "
            "previous report (rerun llmcheck export model-explorer)"
        )
    log.warning("%s: %s", output, text)


def _holds_only_model_explorer_files(folder: Path) -> bool:
    """Return whether every entry of ``folder`` is a file ``llmcheck export model-explorer`` writes."""
    entries = list(folder.iterdir())
    return all(entry.is_file() and any(entry.match(pattern) for pattern in MODEL_EXPLORER_FILES) for entry in entries)


def _remove(path: Path) -> None:
    """Remove a file or a folder of the previous report; one that cannot be removed is an error naming it."""
    try:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError as exc:
        raise LlmcheckError(
            f"cannot remove {path.name} of the previous report: {exc.strerror}",
            where=path.parent,
            hint="remove it yourself, or pass another folder with -o",
        ) from exc
