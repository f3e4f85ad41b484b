"""The ``llmcheck`` command line: thin click commands over the core and the plugin hooks.

Start-up stays light: this module imports neither torch nor any plugin; each command
imports what it needs when it runs. Every error reaches the user as one line
``llmcheck: error: ...`` (exit 2 for usage errors, 1 for failures); ``-l debug`` adds the
traceback.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import click

from llmcheck import __version__
from llmcheck.core.capture.backend_options import BackendOption
from llmcheck.core.capture.seed_flags import LOG_LEVELS, expand_multi_value_options, parse_names, parse_operation_ids
from llmcheck.core.errors import LlmcheckError, UsageError

#: Options that take space-separated lists in the seed tool (``-metric kl abs``); ``dump``'s come from its backend.
MULTI_VALUE_OPTIONS = ("-metric", "--metric", "--precision-metric")

log_level_option = click.option(
    "-l",
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="Log level; 'debug' also shows tracebacks.",
)


def _configure_logging(level: str) -> None:
    numeric = {"warn": logging.WARNING, "fatal": logging.CRITICAL}.get(level.lower(), getattr(logging, level.upper()))
    logging.basicConfig(level=numeric, format="llmcheck: %(levelname)s: %(message)s", stream=sys.stderr)
    logging.getLogger("llmcheck").setLevel(numeric)


#: ``llmcheck --help``'s closing lines: an example per command and the exit codes (``\b`` keeps the layout).
OVERVIEW_EPILOG = """\b
Examples:
  llmcheck demo                       the whole job on the bundled SmolLM2-135M
  llmcheck dump --backend torch -o golden --exec "python infer.py"
  llmcheck compare -gp golden -mp my -o report
  llmcheck opcheck -i DUMP/tensors -o checks
  llmcheck export onnx DUMP/layer/model.json --level 1
  llmcheck plugins --json

\b
Exit codes:
  0  done, nothing failed
  1  llmcheck could not do the job (bad input, a broken dump)
  2  usage error (a wrong flag or value)
  3  done, and compare or opcheck found failing tensors or ops
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=OVERVIEW_EPILOG)
@click.version_option(__version__, prog_name="llmcheck")
def cli() -> None:
    """Find where an LLM's numbers go wrong: dump two runs, pair and compare every tensor, name the first divergence."""


# --- dump ------------------------------------------------------------------------------


class BackendOptionsCommand(click.Command):
    """``llmcheck dump``: its own options, then the ones the chosen ``--backend`` declares.

    The backend is read from the arguments before they are parsed, so ``--help`` and the
    parser both see exactly that backend's flags (``llmcheck_register_backend_options``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.own_params = list(self.params)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Add the chosen backend's options, then parse; a flag of another backend is one error naming it."""
        from llmcheck.core.plugins import get_plugins

        plugins = get_plugins()
        chosen = plugins.capture_backend(_backend_named(args, None))  # None: the backend declared default
        backend = chosen.name
        declared = plugins.backend_options(backend)
        self.params = [*self.own_params, *(_click_option(option) for option in declared)]
        others = sorted(name for name in plugins.capture_backends() if name != backend)
        self.epilog = (
            f"Backend {backend} ({chosen.description}): the options after -l/--log-level are its own. "
            f"Other backends: {', '.join(others) or 'none'}; 'llmcheck dump --backend NAME --help' "
            "shows theirs."
        )
        args = expand_multi_value_options(
            args, [flag for option in declared if option.multiple for flag in option.flags]
        )
        try:
            return super().parse_args(ctx, list(args))  # click consumes the list it parses
        except click.NoSuchOption:
            _raise_if_another_backends_option(args, backend, plugins.backend_options())
            raise


def _raise_if_another_backends_option(args: Sequence[str], backend: str, every_option: Sequence[BackendOption]) -> None:
    """Raise a usage error naming the backends that own the first flag in ``args`` that ``backend`` lacks."""
    own = {flag for option in every_option if option.backend == backend for flag in option.flags}
    for token in args:
        if token == "--":
            return
        flag = token.split("=", 1)[0]
        owners = sorted({option.backend for option in every_option if flag in option.flags})
        if owners and flag not in own:
            raise UsageError(
                f"is an option of backend {', '.join(owners)}, not {backend}",
                where=flag,
                hint=f"'llmcheck dump --backend {backend} --help' lists {backend}'s options",
            )


def _backend_named(args: Sequence[str], default: str | None) -> str | None:
    """Return the last ``--backend`` value before any ``--`` in ``args`` (the user's program follows ``--``)."""
    backend = default
    for index, token in enumerate(args):
        if token == "--":
            break
        if token == "--backend" and index + 1 < len(args):
            backend = args[index + 1]
        elif token.startswith("--backend="):
            backend = token.split("=", 1)[1]
    return backend


def _click_option(option: BackendOption) -> click.Option:
    """Return the click flag of a declared backend option."""
    shown_default = option.default not in (None, False, "", ())
    if option.type is bool:
        return click.Option([*option.flags, option.name], is_flag=True, default=bool(option.default), help=option.help)
    kind: Any = click.Choice(option.choices) if option.choices else option.type
    return click.Option(
        [*option.flags, option.name],
        type=kind,
        multiple=option.multiple,
        default=option.default,
        show_default=shown_default,
        help=option.help,
    )


@cli.command(cls=BackendOptionsCommand, short_help="Run a program with capture on and write a dump.")
@click.option(
    "--backend",
    default=None,
    help="Dump backend (see 'llmcheck plugins'; default: the one declared default, torch when built in).",
)
@click.option("--exec", "exec_text", help='Command to run, e.g. --exec "python infer.py --x 1" (no shell).')
@click.option(
    "-o",
    "--output",
    default="./",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder the dump is written under (a new dump folder per run).",
)
@log_level_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def dump(
    backend: str | None,
    exec_text: str | None,
    output: Path,
    log_level: str,
    command: Sequence[str],
    **backend_options: Any,
) -> None:
    """Run a program with capture on: llmcheck dump --backend torch -o OUT --exec "python infer.py"."""
    from llmcheck.core.capture.dump_command import dump_command

    _configure_logging(log_level)
    raise SystemExit(
        dump_command(
            backend=backend,
            exec_text=exec_text,
            trailing_command=command,
            output_dir=output,
            given_options=backend_options,
            log_level=log_level,
        )
    )


# --- compare ---------------------------------------------------------------------------


@cli.command(short_help="Pair two runs, measure every pair, name where the error starts.")
@click.option(
    "-gp",
    "--golden-path",
    required=True,
    type=click.Path(path_type=Path),
    help="Trusted run: a dump, a folder holding exactly one dump, or one tensor file.",
)
@click.option(
    "-mp",
    "--my-path",
    required=True,
    type=click.Path(path_type=Path),
    help="Run under suspicion, same kinds as --golden-path.",
)
@click.option("--golden-source", default=None, help="Force the source plugin reading --golden-path (e.g. fx).")
@click.option("--my-source", default=None, help="Force the source plugin reading --my-path (e.g. ge).")
@click.option(
    "-o",
    "--output",
    default="./llmcheck_compare",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for cmp_report.csv, summary.json, pairs.json, report.html (and any --report).",
)
@click.option("--metric", "metrics", multiple=True, help="Metrics to compute (default: all registered).")
@click.option(
    "--mapping",
    "-mf",
    "--op-mapping-file",
    "mapping",
    default=None,
    type=click.Path(path_type=Path),
    help="User mapping (JSON or YAML: golden name pattern -> my name pattern), or an edited pairs.json.",
)
@click.option(
    "-j", "--jobs", default=None, type=int, help="Processes measuring pairs, this one included (default: CPU count)."
)
@click.option(
    "--thresholds",
    "thresholds",
    default=None,
    type=click.Path(path_type=Path),
    help="Threshold overrides (JSON or YAML list of {pattern, metric, warn, fail[, dtype]}).",
)
@click.option(
    "--noise-path",
    "noise_path",
    default=None,
    type=click.Path(path_type=Path),
    help="Noise twin: the golden program run at the my-run's precision (same capture). Rows are judged "
    "against its error instead of the dtype table.",
)
@click.option("--noise-source", default=None, help="Force the source plugin reading --noise-path.")
@click.option(
    "--allow-unmatched",
    is_flag=True,
    help="Do not fail (exit 3) on golden records that no pairing rule expects to be unmatched.",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where pairs are measured: this machine's worker processes, or Ray tasks near the data "
    "(pip install 'llmcheck[ray]'; docs/scale-out.md).",
)
@click.option(
    "--ray-address",
    default=None,
    help="The Ray cluster for --executor ray (default: the running one, else a local one; 'auto', 'ray://HEAD:10001').",
)
@click.option(
    "--report",
    "report_names",
    multiple=True,
    help="Also write this report format (repeatable), e.g. --report junit for junit.xml; "
    "'llmcheck plugins' lists the formats.",
)
@click.option(
    "--skip-report",
    "skipped_reports",
    multiple=True,
    help="Leave out this default report (repeatable), e.g. --skip-report html where only the files' rows are read.",
)
@log_level_option
def compare(
    golden_path: Path,
    my_path: Path,
    golden_source: str | None,
    my_source: str | None,
    output: Path,
    metrics: Sequence[str],
    mapping: Path | None,
    jobs: int | None,
    thresholds: Path | None,
    noise_path: Path | None,
    noise_source: str | None,
    allow_unmatched: bool,
    executor: str,
    ray_address: str | None,
    report_names: Sequence[str],
    skipped_reports: Sequence[str],
    log_level: str,
) -> None:
    """Pair two runs, measure every pair, and name the first divergence.

    Example: llmcheck compare -gp golden -mp my -o report
    """
    _configure_logging(log_level)
    from llmcheck.core.compare import compare_command

    raise SystemExit(
        compare_command(
            golden_path=golden_path,
            my_path=my_path,
            golden_source=golden_source,
            my_source=my_source,
            output_dir=output,
            metric_names=list(metrics),
            mapping_path=mapping,
            jobs=jobs,
            thresholds_path=thresholds,
            noise_path=noise_path,
            noise_source=noise_source,
            allow_unmatched=allow_unmatched,
            executor=executor,
            ray_address=ray_address,
            report_names=list(report_names),
            skipped_reports=list(skipped_reports),
        )
    )


# --- opcheck ---------------------------------------------------------------------------


@cli.command(short_help="Recompute single ops from their dumped inputs, check outputs.")
@click.option(
    "-i",
    "--input",
    "tensor_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Tensor folder of a dump (ATB or torch op level).",
)
@click.option(
    "-c", "--csv-path", default=None, type=click.Path(path_type=Path), help="Op CSV of the dump (older ATB dumps)."
)
@click.option(
    "-o",
    "--output",
    default="./",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for opcheck_result.csv.",
)
@click.option("-ids", "--operation-ids", default="", help="Check only these op ids, e.g. 24_1,2_3_5.")
@click.option(
    "-opname", "--operation-name", default=None, help="Check only ops whose name contains these: self,linear."
)
@click.option(
    "-metric",
    "--precision-metric",
    "precision_metrics",
    multiple=True,
    type=click.Choice(["abs", "cos_sim", "kl"]),
    help="Extra columns: abs, cos_sim, kl.",
)
@click.option("-device", "--device-id", default=None, help="Device the reference runs on (default CPU).")
@click.option("-j", "--jobs", default=None, type=int, help="Worker processes (default: CPU count).")
@log_level_option
def opcheck(
    tensor_dir: Path,
    csv_path: Path | None,
    output: Path,
    operation_ids: str,
    operation_name: str | None,
    precision_metrics: Sequence[str],
    device_id: str | None,
    jobs: int | None,
    log_level: str,
) -> None:
    """Check single operators offline: recompute each op from its dumped inputs and compare.

    Example: llmcheck opcheck -i DUMP/tensors -o checks
    """
    _configure_logging(log_level)
    ids = parse_operation_ids(operation_ids, "-ids/--operation-ids")
    names = parse_names(operation_name) if operation_name else []
    from llmcheck.core.opcheck.command import opcheck_command

    raise SystemExit(
        opcheck_command(
            tensor_dir=tensor_dir,
            csv_path=csv_path,
            output_dir=output,
            operation_ids=ids,
            operation_names=names,
            precision_metrics=list(precision_metrics),
            device_id=device_id,
            jobs=jobs,
        )
    )


# --- hunt ------------------------------------------------------------------------------


@cli.command(short_help="From two programs to the culprit operator: statistics first, full tensors where it matters.")
@click.option(
    "--golden", "golden_program", required=True, help='The trusted program\'s command line: "python infer.py".'
)
@click.option("--my", "my_program", required=True, help="The command line of the program under suspicion.")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    help="Folder of the hunt: one sub-folder per phase, hunt.json.",
)
@click.option("--fresh", is_flag=True, help="Redo every phase, even those a previous hunt finished there.")
@click.option(
    "--backend",
    type=click.Choice(["torch", "vllm", "atb"]),
    default="torch",
    show_default=True,
    help="Capture backend of both programs: torch (any PyTorch program), vllm (programs serving with vLLM); "
    "atb is refused, saying how to run the routine by hand.",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Programs run at once within a phase; more than 1 only where the machine holds that many copies of the model.",
)
@log_level_option
def hunt(
    golden_program: str, my_program: str, output: Path, fresh: bool, backend: str, jobs: int, log_level: str
) -> None:
    """Find the step, module and operator where the my-run's error is introduced, then opcheck it.

    Example: llmcheck hunt --golden "python infer.py" --my "python infer.py --dtype bf16" -o hunt_out
    """
    _configure_logging(log_level)
    from llmcheck.core.hunt.command import run_hunt

    raise SystemExit(
        run_hunt(golden_program, my_program, output, fresh=fresh, log_level=log_level, backend=backend, jobs=jobs)
    )


# --- export ----------------------------------------------------------------------------


@cli.group(short_help="Export a dump's topology as ONNX, or a compare over the model graph (Netron, Model Explorer).")
def export() -> None:
    """Export a dump's topology, or a compare laid over the model graph, for viewing (Netron, Model Explorer)."""


@export.command("onnx")
@click.argument("topology", type=click.Path(path_type=Path))
@click.option(
    "--level", default=-1, show_default=True, type=int, help="Depth to flatten to; -1 = all leaves, 0 = the root alone."
)
@click.option(
    "-o",
    "--output",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="ONNX file (default: beside the topology, .onnx).",
)
@log_level_option
def export_onnx(topology: Path, level: int, output: Path | None, log_level: str) -> None:
    """Turn a topology file (ATB layer/model JSON, ...) into a viewable ONNX model."""
    _configure_logging(log_level)
    from llmcheck.core.plugins import get_plugins

    written = get_plugins().export_onnx(topology, level, output)
    click.echo(f"llmcheck: wrote {written}")


@export.command("model-explorer")
@click.argument("compare_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the node data and the annotated ONNX (default: COMPARE_DIR/model_explorer).",
)
@click.option(
    "--graph",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="ONNX graph to lay the compare over (default: the one in the golden dump).",
)
@click.option("--open", "open_server", is_flag=True, help="Start Model Explorer on the graph (extra [explorer]).")
@click.option("--port", default=8080, show_default=True, type=int, help="Port of the Model Explorer server (--open).")
@log_level_option
def export_model_explorer(
    compare_dir: Path, output: Path | None, graph: Path | None, open_server: bool, port: int, log_level: str
) -> None:
    """Lay a compare's per-node error, verdict and growth over the model graph (Model Explorer, Netron).

    Example: llmcheck export model-explorer CMP --open
    """
    _configure_logging(log_level)
    from llmcheck.core.reporting.graph_overlay import export_graph_overlay
    from llmcheck.core.reporting.model_explorer_launch import open_in_model_explorer, require_model_explorer

    if open_server:
        require_model_explorer()  # before writing anything: the user asked for the viewer
    overlay = export_graph_overlay(compare_dir, output, graph)
    not_passing = sum(1 for node in overlay.nodes.values() if node.verdict != "pass")
    click.echo(
        f"llmcheck: {len(overlay.nodes)} of {overlay.graph_nodes} graph nodes have pairs, {not_passing} not passing"
    )
    click.echo(
        f"llmcheck: wrote {overlay.annotated_onnx} (Netron), "
        + ", ".join(str(path) for path in overlay.node_data.values())
    )
    if open_server:
        raise SystemExit(open_in_model_explorer(overlay.annotated_onnx, list(overlay.node_data.values()), port=port))


# --- plugins ---------------------------------------------------------------------------


@cli.command(short_help="List the installed plugins, backends, sources and metrics.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: name, distribution, version, hooks.")
def plugins(as_json: bool) -> None:
    """List the installed plugins and what they provide."""
    from llmcheck.core.plugins import get_plugins

    facade = get_plugins()
    infos = facade.infos()
    if as_json:
        click.echo(json.dumps([info.as_json() for info in infos], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="llmcheck plugins")
    for column in ("name", "distribution", "version", "hooks"):
        table.add_column(column)
    for info in infos:
        table.add_row(info.name, info.distribution or "-", info.version or "-", "\n".join(info.hooks))
    console = Console()
    console.print(table)
    console.print("backends: " + (", ".join(sorted(facade.capture_backends())) or "none"))
    console.print("sources:  " + (", ".join(sorted(facade.sources())) or "none"))
    console.print("metrics:  " + (", ".join(facade.metrics()) or "none"))
    console.print(
        "reports:  "
        + (
            ", ".join(
                f"{name}{'' if reporter.default else ' (--report)'}" for name, reporter in facade.reporters().items()
            )
            or "none"
        )
    )


# --- demo ------------------------------------------------------------------------------


@cli.command(short_help="Run the whole job on a bundled real model, with a report.")
@click.option(
    "-o",
    "--output",
    default="./llmcheck_demo",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for both dumps and the compare report.",
)
@click.option(
    "--dtype",
    "dtype",
    type=click.Choice(["fp32", "bf16", "fp16"]),
    default="fp32",
    show_default=True,
    help="Precision of the my-run. Below fp32 the demo also records a noise twin (the golden program at "
    "that precision, cast by the capture as 'llmcheck dump --as-dtype' does) and compares against it, as "
    "docs/commands/compare.md describes.",
)
@log_level_option
def demo(output: Path, dtype: str, log_level: str) -> None:
    """Run the whole job on a bundled real model: golden run, defective run, compare, report."""
    _configure_logging(log_level)
    from llmcheck.demo import run_demo

    raise SystemExit(run_demo(output, dtype=dtype))


# --- entry point -----------------------------------------------------------------------


def _wants_debug(args: Sequence[str]) -> bool:
    for i, token in enumerate(args):
        if token in ("-l", "--log-level") and i + 1 < len(args) and args[i + 1].lower() == "debug":
            return True
        if token in ("-l=debug", "--log-level=debug"):
            return True
        if token == "--":
            return False
    return False


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that ``with`` blocks close what they opened.

    Python's default for SIGTERM ends the process at once: a compare's worker processes and
    multiprocessing's resource tracker were left running, holding the caller's output pipe.
    """


TERMINATED_LINE = "llmcheck: error: terminated (SIGTERM); the processes it started were stopped first"


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While the CLI runs in the main thread: SIGTERM raises :class:`Terminated` (workers are shut down on the way out)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; errors become one ``llmcheck: error:`` line."""
    args = expand_multi_value_options(list(sys.argv[1:] if argv is None else argv), MULTI_VALUE_OPTIONS)
    debug = _wants_debug(args)
    try:
        with _sigterm_unwinds():
            cli.main(args=args, prog_name="llmcheck", standalone_mode=False)
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except click.exceptions.Abort as abort:  # click turns a KeyboardInterrupt (and so SIGTERM) into Abort
        if isinstance(abort.__cause__, Terminated):
            click.echo(TERMINATED_LINE, err=True)
            return 128 + signal.SIGTERM
        click.echo("llmcheck: error: aborted", err=True)
        return 130
    except click.ClickException as exc:
        command = exc.ctx.command_path if isinstance(exc, click.UsageError) and exc.ctx else "llmcheck"
        click.echo(f"llmcheck: error: {exc.format_message()} (see '{command} --help')", err=True)
        return 2 if isinstance(exc, click.UsageError) else 1
    except LlmcheckError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"llmcheck: error: {exc.one_line()}", err=True)
        return exc.exit_code
    except Terminated:
        click.echo(TERMINATED_LINE, err=True)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        click.echo("llmcheck: error: interrupted", err=True)
        return 130
    except Exception as exc:  # a bug in llmcheck: still one line unless debugging
        if debug:
            traceback.print_exc()
        click.echo(
            f"llmcheck: error: internal error: {type(exc).__name__}: {exc} "
            "(rerun with -l debug for the traceback and report it)",
            err=True,
        )
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
