"""Reporters: the files ``llmcheck compare`` writes, each one registered by a plugin.

Why: an output format -- JUnit XML for a CI server, a team's dashboard JSON -- is a plugin,
not an edit of the core (datasette's ``register_output_renderer``). A plugin registers a
:class:`Reporter` through :func:`~llmcheck.core.hookspecs.llmcheck_register_reporters`;
the ``default`` ones (``cmp_report.csv``, ``summary.json``, ``pairs.json``, ``report.html``)
run on every compare, the others when ``compare --report NAME`` asks for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmcheck.core.errors import LlmcheckError, PluginError, UsageError
from llmcheck.core.gc_pause import paused_cyclic_gc

if TYPE_CHECKING:  # pragma: no cover
    from llmcheck.core.judging.result import CompareResult

#: The flag that asks for a reporter, named in its errors.
REPORT_FLAG = "--report"
#: The flag that leaves a default reporter out.
SKIP_REPORT_FLAG = "--skip-report"


@dataclass(frozen=True, slots=True)
class Reporter:
    """One output format of ``llmcheck compare``, named for ``--report NAME``.

    ``write(result, path)`` writes the whole compare (:class:`~llmcheck.core.judging.result.CompareResult`:
    rows, pairing, both dumps, ``summary()``) into ``path``, which is ``file_name`` inside
    the output folder; write it atomically (``llmcheck.core.dumps.atomic_files``) so an
    interrupted compare leaves no half file. ``default`` reporters run on every compare.
    """

    name: str
    description: str
    file_name: str
    write: Callable[[CompareResult, Path], None]
    default: bool = False


def choose_reporters(
    registered: Mapping[str, Reporter], requested: Sequence[str] = (), skipped: Sequence[str] = ()
) -> list[Reporter]:
    """Return the default reporters but the ``skipped`` ones, and the ``requested`` ones, in registration order.

    An unknown name is a usage error, and so is skipping a report that is not written by default.
    """
    if not registered:
        raise PluginError(
            "no reporter is registered, so a compare would write no file",
            hint="reinstall llmcheck (pip install -e .) so its built-in 'reports' plugin is found, "
            "or check LLMCHECK_LOAD_PLUGINS / LLMCHECK_DISABLE_PLUGINS",
        )
    unknown = [name for name in requested if name not in registered]
    if unknown:
        raise UsageError(
            f"unknown report {unknown[0]!r}", where=REPORT_FLAG, hint=f"known reports: {', '.join(registered)}"
        )
    for name in skipped:
        reporter = registered.get(name)
        if reporter is None or not reporter.default:
            defaults = ", ".join(name for name, reporter in registered.items() if reporter.default)
            what = f"unknown report {name!r}" if reporter is None else f"report {name!r} is not written by default"
            raise UsageError(what, where=SKIP_REPORT_FLAG, hint=f"default reports: {defaults}")
    chosen = [
        reporter
        for reporter in registered.values()
        if (reporter.default and reporter.name not in skipped) or reporter.name in requested
    ]
    by_file: dict[str, str] = {}
    for reporter in chosen:
        if reporter.file_name in by_file:
            raise UsageError(
                f"reports {by_file[reporter.file_name]!r} and {reporter.name!r} both write {reporter.file_name}",
                where=REPORT_FLAG,
                hint="ask for one of them",
            )
        by_file[reporter.file_name] = reporter.name
    return chosen


@paused_cyclic_gc()  # the reports build ~10**5 short-lived rows beside the compare's as many live objects
def write_reports(
    result: CompareResult,
    output_dir: Path,
    registered: Mapping[str, Reporter],
    requested: Sequence[str] = (),
    skipped: Sequence[str] = (),
) -> dict[str, Path]:
    """Write the default reports but the ``skipped``, and the ``requested`` ones, into ``output_dir``; return their paths by name.

    A previous report in ``output_dir`` is replaced whole: its files this compare does not
    write are removed, and a warning names what was replaced and removed. ``registered`` are
    the reporters the loaded plugins register (``Plugins.reporters()``), by name.
    """
    from llmcheck.core.reporting.report_folder import replace_previous_report

    reporters = choose_reporters(registered, requested, skipped)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LlmcheckError(f"cannot create the output folder: {exc.strerror}", where=output_dir) from exc
    # the folder holds one report: the previous one's files this one does not write go too
    replace_previous_report(
        output_dir,
        [reporter.file_name for reporter in reporters],
        [reporter.file_name for reporter in registered.values()],
    )
    written: dict[str, Path] = {}
    for reporter in reporters:
        path = output_dir / reporter.file_name
        reporter.write(result, path)
        written[reporter.name] = path
    return written
