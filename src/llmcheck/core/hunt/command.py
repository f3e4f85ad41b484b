"""``llmcheck hunt``: from two programs to the culprit operator, coarse to fine, without dumping the whole model.

Each phase runs ``llmcheck dump`` / ``compare`` / ``opcheck`` as child processes (the exact
command lines a user can repeat), keeps its dumps and reports under ``OUT/<phase>/`` and
writes ``phase.json`` last: a phase whose folder holds it is done, and a later hunt with the
same programs reuses it instead of running it again (``--fresh`` redoes every phase).

1. ``1_steps``: both programs (and the golden's noise twin when the precisions differ), statistics
   of the model's own inputs and outputs at every step, and of the prefill's blocks (a Llama's
   decoder layers): the first step whose logits diverge beyond noise -- and at the prefill, the
   block where the error is introduced.
2. ``2_blocks``, for a later step only: statistics of that step down to the blocks: the block.
3. ``3_module``: full tensors of that step, that block's subtree and the producers of its inputs:
   the module inside it.
4. ``4_operator``: the operators inside that module, at that step: the culprit operator.
5. ``5_opcheck``: the my-run's operators recomputed in float64 from its dumped inputs.

Every phase after the first ends each program once its step is dumped (``--exit-after-range``),
so a late phase costs a program's start and its steps up to the culprit's, not a whole run. Each
program runs in several phases: the records two of its runs both hold must agree bit for bit,
else the program is not deterministic and the hunt stops, naming the first record that moved.
"""

from __future__ import annotations

import csv
import functools
import json
import logging
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmcheck.core.dumps.atomic_files import atomic_write_text
from llmcheck.core.dumps.store import MODEL_DTYPES_FIELD, find_dumps, read_dump
from llmcheck.core.errors import EXIT_FAILURE, LlmcheckError, UsageError
from llmcheck.core.records import DEPTH_BLOCKS, ROOT_MODULE, Dump, TensorRecord, block_depth, module_depth

log = logging.getLogger("llmcheck.hunt")

#: The file a phase writes last: its folder holds a finished phase.
PHASE_MARKER = "phase.json"
REPORT_NAME = "hunt.json"
PHASES = ("1_steps", "2_blocks", "3_module", "4_operator", "5_opcheck")

#: The capture backends a hunt drives, and how deep the step search records in each: the torch
#: backend's model returns its logits (depth 0); vLLM's returns hidden states, and its logits come
#: from a module the runner calls after the forward (``logits_processor``, one level down).
STEP_SEARCH_DEPTH = {"torch": 0, "vllm": 1}
BACKENDS = tuple(STEP_SEARCH_DEPTH)
#: Backends whose ``dump`` records a noise twin (``--as-dtype``).
TWIN_BACKENDS = ("torch",)

#: Exit codes of ``llmcheck hunt`` (docs/commands/hunt.md).
EXIT_NO_DIVERGENCE = 0
EXIT_CULPRIT_NAMED = 3
EXIT_NOT_DETERMINISTIC = 4
EXIT_OTHER_TOKENS = 5

#: Exit codes of a child that mean it did its job: a dump's program succeeded; compare and opcheck
#: give 3 when something fails, and opcheck 1 when it could check nothing (said in the verdict).
DUMP_DONE_CODES = (0,)
COMPARE_DONE_CODES = (0, 3)
OPCHECK_DONE_CODES = (0, 1, 3)

#: The short dtype names ``dump --as-dtype`` takes, for the floating dtypes a record may hold.
SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


class HuntStopped(LlmcheckError):
    """The hunt cannot go on (a program that moves, runs fed other tokens): one line, its own exit code."""

    def __init__(self, what: str, exit_code: int) -> None:
        super().__init__(what)
        self.exit_code = exit_code


@dataclass
class ChildRun:
    """One command a phase ran: its argv, as the user would type it, its exit code and time."""

    argv: list[str]
    exit_code: int
    elapsed_s: float

    def as_json(self) -> dict[str, Any]:
        return {
            "command": display_command(self.argv),
            "exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 2),
        }


@dataclass
class DumpRun:
    """One program a phase dumps: which program, into which folder, with which flags."""

    program: str
    folder: Path
    flags: list[str]


@dataclass
class Hunt:
    """The inputs of one hunt and how it runs its children."""

    golden_program: str
    my_program: str
    output_dir: Path
    log_level: str = "warning"
    backend: str = "torch"
    #: programs dumped at once within a phase (their runs are independent)
    jobs: int = 1

    def llmcheck(self, args: Sequence[str], log_file: Path, done_codes: Sequence[int]) -> ChildRun:
        """Return the run of ``llmcheck ARGS`` as a child (its output in ``log_file``); a failure is one error line."""
        argv = [sys.executable, "-m", "llmcheck.core.cli", *args]
        log.info("running %s", display_command(argv))
        started = time.perf_counter()
        with log_file.open("w", encoding="utf-8") as output:
            returncode = _run_child(argv, output)
        run = ChildRun(argv, returncode, time.perf_counter() - started)
        if returncode not in done_codes:
            raise child_failure(run, log_file)
        return run

    def dump(self, program: str, folder: Path, flags: Sequence[str]) -> tuple[ChildRun, Path]:
        """Return the run of ``llmcheck dump`` of ``program`` into ``folder`` and the dump it wrote."""
        folder.mkdir(parents=True, exist_ok=True)
        args = ["dump", "--backend", self.backend, *flags, "-o", str(folder), "-l", self.log_level, "--exec", program]
        run = self.llmcheck(args, folder.with_suffix(".log"), DUMP_DONE_CODES)
        dumps = find_dumps(folder)
        if not dumps:
            raise LlmcheckError(
                "the program ran but wrote no dump", where=folder, hint=f"see {folder.with_suffix('.log')}"
            )
        return run, dumps[-1]

    def dump_all(self, runs: Sequence[DumpRun]) -> list[tuple[ChildRun, Path]]:
        """Return the runs and dumps of several programs, ``jobs`` at a time, in the order given."""
        if self.jobs <= 1 or len(runs) <= 1:
            return [self.dump(run.program, run.folder, run.flags) for run in runs]
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = [pool.submit(self.dump, run.program, run.folder, run.flags) for run in runs]
            return [future.result() for future in futures]

    def compare(
        self, golden: Path, my: Path, report: Path, noise: Path | None, *, page: bool = True
    ) -> tuple[ChildRun, dict[str, Any]]:
        """Return the run of ``llmcheck compare`` and the ``summary.json`` it wrote.

        ``page``: also write ``report.html``. The coarse phases leave it out: their evidence is a
        row of their CSV and ``hunt.json``, and a page of every step's logits or every layer
        would be most of what the hunt writes.
        """
        # The -o folders of the dumps (each holds one dump): the commands read as a user writes them.
        args = ["compare", "-gp", str(golden.parent), "-mp", str(my.parent), "-o", str(report), "-l", self.log_level]
        if noise is not None:
            args += ["--noise-path", str(noise.parent)]
        if not page:
            args += ["--skip-report", "html"]
        report.mkdir(parents=True, exist_ok=True)
        run = self.llmcheck(args, report.with_suffix(".log"), (*COMPARE_DONE_CODES, EXIT_FAILURE))
        summary_path = report / "summary.json"
        summary: dict[str, Any] = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
        counts = summary.get("counts", {})
        if run.exit_code == EXIT_FAILURE and summary and not counts.get("pairs"):
            # compare's own words ("no pairs: ...") sit above the list of files it wrote: say what the dumps held
            raise LlmcheckError(
                f"the compare paired none of the {counts.get('unmatched_golden', '?')} golden records with the "
                f"{counts.get('unmatched_my', '?')} my records of {golden.parent} and {my.parent}",
                where=report.with_suffix(".log"),
                hint="the phase's two programs recorded different tensors; see their logs beside the dumps",
            )
        if run.exit_code not in COMPARE_DONE_CODES:
            raise child_failure(run, report.with_suffix(".log"))
        return run, summary


def child_failure(run: ChildRun, log_file: Path) -> LlmcheckError:
    """Return the one-line error of a child that failed: its command, exit code and last line of output."""
    lines = [line for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines() if line]
    return LlmcheckError(
        f"'{display_command(run.argv)}' failed with exit code {run.exit_code}: {lines[-1] if lines else 'no output'}",
        where=log_file,
        hint="run that command to see the whole output",
    )


#: Seconds a child stopped with the hunt (SIGTERM, Ctrl-C) has to close its dump before it is killed.
CHILD_STOP_S = 60


def _run_child(argv: Sequence[str], output: Any) -> int:
    """Return the exit code of a child; a hunt that is stopped stops it with SIGTERM, as ``dump`` expects.

    ``dump`` passes SIGTERM on to the program and marks its dump cut; killing it instead would
    leave the program running, writing into a phase folder the next hunt removes.
    """
    child = subprocess.Popen(list(argv), stdout=output, stderr=subprocess.STDOUT)
    try:
        return child.wait()
    except BaseException:
        child.terminate()
        try:
            child.wait(timeout=CHILD_STOP_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise


def display_command(argv: Sequence[str]) -> str:
    """Return a child's argv as a user repeats it: ``llmcheck ...`` for llmcheck's own CLI."""
    if list(argv[1:3]) == ["-m", "llmcheck.core.cli"]:
        argv = ["llmcheck", *argv[3:]]
    return shlex.join(argv)


def folder_bytes(folder: Path) -> int:
    """Return the bytes of the files under ``folder``."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


# --- what two dumps say ------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _read(dump: Path) -> Dump:
    """Return a finished phase's dump, read once: the checks of a phase and of the next read it again."""
    return read_dump(dump)


def record_label(record: TensorRecord) -> str:
    """Return a record as compare names it: ``model.layers.1 step 0 output.0``."""
    key = record.key
    moment = f" ({key.moment})" if key.io == "input" else ""
    return f"{key.name} step {key.step} {key.io}.{key.position}{moment}"


def _fingerprint(record: TensorRecord) -> tuple[Any, ...]:
    stats = record.stats
    values = (stats.min, stats.max, stats.mean, stats.l2norm, stats.nan_count, stats.inf_count) if stats else ()
    return (record.dtype, tuple(record.shape), values)


def first_moved_record(first: Path, second: Path, *, common_only: bool = False) -> str | None:
    """Return the first record (execution order) whose statistics differ between two dumps, ``None`` when bit-identical.

    ``common_only``: compare only the records both dumps hold (two runs of one program with
    other selections); else a record only one holds is a difference too.
    """
    first_records = sorted(_read(first).records, key=lambda record: record.order)
    second_by_key = {record.key: record for record in _read(second).records}
    for record in first_records:
        other = second_by_key.get(record.key)
        if other is None:
            if common_only:
                continue
            return f"{record_label(record)} (only in the first run)"
        if _fingerprint(record) != _fingerprint(other):
            return f"{record_label(record)}: {_stats_text(record)} vs {_stats_text(other)}"
    if not common_only and len(second_by_key) != len(first_records):
        return f"the second run has {len(second_by_key)} records, the first {len(first_records)}"
    return None


def _stats_text(record: TensorRecord) -> str:
    stats = record.stats
    if stats is None:
        return f"{record.dtype} {list(record.shape)}"
    return f"l2norm {stats.l2norm!r}, mean {stats.mean!r}"


def run_dtype(dump: Path) -> str | None:
    """Return the floating dtype a run's model ran in (``bfloat16``), ``None`` when unknown.

    The capture's manifest says how many parameters ran in each dtype; a dump without it is
    judged by the floating dtype most of its records hold.
    """
    loaded = _read(dump)
    declared = loaded.manifest.get(MODEL_DTYPES_FIELD)
    if isinstance(declared, dict) and declared:
        return str(max(declared.items(), key=lambda item: item[1])[0]).removeprefix("torch.")
    dtypes = (record.dtype.removeprefix("torch.") for record in loaded.records)
    counts = Counter(dtype for dtype in dtypes if dtype in SHORT_DTYPES)
    return counts.most_common(1)[0][0] if counts else None


def first_token_divergence(golden: Path, my: Path) -> int | None:
    """Return the first step after the prefill whose integer inputs of the model differ (other tokens), or ``None``."""
    my_by_key = {record.key: record for record in _read(my).records}
    steps = []
    for record in _read(golden).records:
        if (
            record.key.name == ROOT_MODULE
            and record.key.io == "input"
            and record.key.step > 0
            and "int" in record.dtype
        ):
            other = my_by_key.get(record.key)
            if other is None or _fingerprint(other) != _fingerprint(record):
                steps.append(record.key.step)
    return min(steps) if steps else None


def module_tree(dump: Path) -> dict[str, str]:
    """Return ``module name -> id`` (``0_1_3``, ``""`` for the model) from a dump's module tree, in tree order."""
    topology = _read(dump).topology
    if topology is None:
        raise LlmcheckError("holds no topology.json: hunt selects modules by their ids there", where=dump)
    return {node.name: str(node.attrs.get("id", "")) for node in topology.walk()}


def input_producers(report: Path, module: str, step: int) -> list[str]:
    """Return the modules whose records fed ``module``'s inputs at ``step`` (compare's ``fed_by``), outside its subtree."""
    producers: list[str] = []
    with (report / "cmp_report.csv").open(encoding="utf-8", newline="") as rows:
        for row in csv.DictReader(rows):
            if row.get("name") != module or row.get("step") != str(step) or row.get("io") != "input":
                continue
            for fed in filter(None, (part.strip() for part in row.get("fed_by", "").split("|"))):
                name = fed.split(" step ")[0]
                inside = name == module or name.startswith(module + ".")
                if not inside and name not in producers:
                    producers.append(name)
    return producers


def selection_ids(ids: dict[str, str], module: str, producers: Sequence[str], *, subtree: bool) -> list[str]:
    """Return the ``-ids`` of a module (its subtree with ``subtree``) and of its inputs' producers (their own records only)."""
    chosen = [node_id for name, node_id in ids.items() if name == module or (subtree and name.startswith(module + "."))]
    return [node_id for node_id in chosen if node_id] + [
        ids[name] for name in producers if ids.get(name) and ids[name] not in chosen
    ]


def _evidence_text(introduced: dict[str, Any], culprit: dict[str, Any]) -> str:
    if introduced.get("name") != culprit["name"]:
        return f"named by compare as the culprit ({culprit.get('seen_at') or culprit['name']})"
    value = introduced.get("value")
    shown = f"{value:.6g}" if isinstance(value, float) else str(value)
    return (
        f"{introduced['name']} step {introduced['step']} {introduced['io']}.{introduced['position']}: "
        f"{introduced['metric']} {shown}, {introduced['attribution']}; {introduced.get('evidence') or ''}"
    ).rstrip("; ")


def _culprit(summary: dict[str, Any]) -> dict[str, Any] | None:
    """Return the compare's culprit (else the first record where an error is introduced), with its op type."""
    introduced = summary.get("first_introduced")
    culprit = summary.get("culprit") or introduced
    if culprit is not None and introduced is not None and introduced["name"] == culprit["name"]:
        culprit = {**culprit, "op_type": introduced.get("op_type")}
    return culprit


# --- determinism ---------------------------------------------------------------------------

#: How the stop line names each program of a phase.
PROGRAM_LABELS = {
    "golden": "the golden program",
    "my": "the my program",
    "twin": "the golden program at the my-run's precision (its noise twin)",
}


def check_same_program(hunt: Hunt, who: str, earlier: Path, later: Path, again: DumpRun | None) -> None:
    """Stop the hunt when two runs of one program disagree on a record both hold (bit for bit).

    ``again``: a run with the later run's selection, made only when they disagree, so the
    stop names the first record that moved among all the later run records (a module, not
    only the logits the earlier run held).
    """
    moved = first_moved_record(later, earlier, common_only=True)
    if moved is None:
        return
    where = f"{earlier.parent} and {later.parent}"
    if again is not None:
        _, repeated = hunt.dump(again.program, again.folder, again.flags)
        moved = first_moved_record(later, repeated) or moved
        where = f"{later.parent} and {repeated.parent}"
    raise HuntStopped(
        f"{PROGRAM_LABELS.get(who, who)} is not deterministic: two runs of it differ first at {moved} "
        f"(make it deterministic -- eval mode, no dropout or sampling, fixed seeds -- before hunting; "
        f"see {where})",
        EXIT_NOT_DETERMINISTIC,
    )


def check_programs(hunt: Hunt, found: dict[str, Any], dumps: dict[str, Path], again: dict[str, DumpRun]) -> None:
    """Check each program's dump of this phase against its dump of the phase before (``found``'s ``dumps``)."""
    for role, dump in dumps.items():
        earlier = found.get("dumps", {}).get(role)
        if earlier is not None:
            check_same_program(hunt, role, Path(earlier), dump, again.get(role))


# --- phases --------------------------------------------------------------------------------


def _phase_runs(
    hunt: Hunt, folder: Path, flags: list[str], twin_dtype: str | None, *, golden: bool = True
) -> tuple[dict[str, Path], list[dict[str, Any]], dict[str, DumpRun]]:
    """Dump the phase's programs (golden, my, the twin) with ``flags``; return their dumps, runs, and the runs as asked."""
    asked = {}
    if golden:
        asked["golden"] = DumpRun(hunt.golden_program, folder / "golden", flags)
    asked["my"] = DumpRun(hunt.my_program, folder / "my", flags)
    if twin_dtype is not None:
        asked["twin"] = DumpRun(hunt.golden_program, folder / "twin", [*flags, "--as-dtype", twin_dtype])
    done = hunt.dump_all(list(asked.values()))
    dumps = {role: dump for role, (_, dump) in zip(asked, done)}
    return dumps, [run.as_json() for run, _ in done], asked


def steps_phase(hunt: Hunt, folder: Path) -> dict[str, Any]:
    """Return the first step whose model outputs diverge beyond noise, from statistics of every step."""
    # the prefill's blocks too: most defects show at the prefill, where these records name the
    # block at once and spare the block phase's three runs; a later step needs that phase
    depth = str(STEP_SEARCH_DEPTH[hunt.backend])
    flags = ["-sd", "-er", "all", "--max-depth", depth, "--max-depth-at", f"0:{DEPTH_BLOCKS}"]
    dumps, runs, _ = _phase_runs(hunt, folder, flags, None)
    golden_dtype, my_dtype = run_dtype(dumps["golden"]), run_dtype(dumps["my"])
    differ = my_dtype is not None and golden_dtype != my_dtype
    twin_dtype = SHORT_DTYPES.get(my_dtype or "") if differ and hunt.backend in TWIN_BACKENDS else None
    if twin_dtype is not None:
        twin_run, dumps["twin"] = hunt.dump(hunt.golden_program, folder / "twin", [*flags, "--as-dtype", twin_dtype])
        runs.append(twin_run.as_json())
    elif differ:
        log.warning(
            "the runs differ in precision (%s golden, %s my), and the %s backend records no noise twin: "
            "verdicts use the default thresholds",
            golden_dtype,
            my_dtype,
            hunt.backend,
        )
    compare_run, summary = hunt.compare(dumps["golden"], dumps["my"], folder / "report", dumps.get("twin"), page=False)
    runs.append(compare_run.as_json())
    result: dict[str, Any] = {
        "runs": runs,
        "dumps": {role: str(dump) for role, dump in dumps.items()},
        "golden_dtype": golden_dtype,
        "my_dtype": my_dtype,
        "twin_dtype": twin_dtype,
        "counts": summary["counts"],
    }
    culprit = _culprit(summary)
    token_step = first_token_divergence(dumps["golden"], dumps["my"])
    if token_step is not None and (culprit is None or culprit["step"] >= token_step):
        result["stopped"] = (
            f"the runs generated other tokens from step {token_step} and no record of steps 0 to "
            f"{token_step - 1} diverges beyond noise: the step search stops at step {token_step - 1} "
            "(teacher forcing, feeding the my-run the golden's tokens, is out of scope)"
        )
        return result
    if culprit is None:
        return result
    introduced = summary.get("first_introduced") or {}
    result.update(step=culprit["step"], evidence=_evidence_text(introduced, culprit))
    names = list(module_tree(dumps["golden"]))
    result["depth"] = block_depth(names)
    if culprit["step"] == 0:  # the prefill's blocks were recorded: the block (or the model's own code) is named
        result["module"] = culprit["name"]
    return result


def blocks_phase(hunt: Hunt, folder: Path, found: dict[str, Any]) -> dict[str, Any]:
    """Return the block (a decoder layer) where the error is introduced at the step, from its statistics alone."""
    step, depth = found["step"], found["depth"]
    flags = ["-sd", "-er", f"{step},{step}", "--exit-after-range", "--max-depth", str(depth)]
    dumps, runs, asked = _phase_runs(hunt, folder, flags, found.get("twin_dtype"))
    again = {role: DumpRun(run.program, folder / f"{role}_again", run.flags) for role, run in asked.items()}
    check_programs(hunt, found, dumps, again)
    compare_run, summary = hunt.compare(dumps["golden"], dumps["my"], folder / "report", dumps.get("twin"), page=False)
    runs.append(compare_run.as_json())
    result: dict[str, Any] = {
        "runs": runs,
        "dumps": {role: str(dump) for role, dump in dumps.items()},
        "counts": summary["counts"],
    }
    culprit = _culprit(summary)
    if culprit is None or culprit["step"] != step:
        result["stopped"] = (
            f"the model's outputs diverge at step {step}, but no module down to depth {depth} is where an error "
            f"is introduced at that step (see {folder / 'report'})"
        )
        return result
    introduced = summary.get("first_introduced") or {}
    result.update(module=culprit["name"], evidence=_evidence_text(introduced, culprit))
    return result


def module_phase(hunt: Hunt, folder: Path, found: dict[str, Any]) -> dict[str, Any]:
    """Return the module confirmed on full tensors of one step: the block's subtree and its inputs' producers."""
    step, block = found["step"], found["module"]
    ids = module_tree(Path(found["dumps"]["golden"]))
    producers = input_producers(Path(found["report"]), block, step)
    # a block at the block level is opened whole; a shallower one was named for its own code, not its children's
    selected = selection_ids(ids, block, producers, subtree=module_depth(block) >= found["depth"])
    flags = ["-er", f"{step},{step}", "--exit-after-range", "-ids", ",".join(selected), "-child", "False"]
    dumps, runs, _ = _phase_runs(hunt, folder, flags, found.get("twin_dtype"))
    check_programs(hunt, found, dumps, {})
    compare_run, summary = hunt.compare(dumps["golden"], dumps["my"], folder / "report", dumps.get("twin"))
    runs.append(compare_run.as_json())
    culprit = _culprit(summary)
    confirmed: str = culprit["name"] if culprit is not None else ""
    # the full tensors may name a module inside the block: the finer one wins
    inside = confirmed == block or confirmed.startswith(block + ".")
    chosen = confirmed if inside else block
    introduced = summary.get("first_introduced")
    return {
        "runs": runs,
        "dumps": {role: str(dump) for role, dump in dumps.items()},
        "counts": summary["counts"],
        "evidence": _evidence_text(introduced, culprit) if culprit is not None and introduced else None,
        "producers": producers,
        "module": chosen,
        "confirmed": inside,
        "module_id": ids.get(chosen) or None,
    }


def operator_phase(hunt: Hunt, folder: Path, found: dict[str, Any]) -> dict[str, Any]:
    """Return the culprit operator: the ATen ops run inside the module, at the step, compared."""
    flags = ["--type", "op", "-er", f"{found['step']},{found['step']}", "--exit-after-range"]
    if found.get("module_id"):
        flags += ["-ids", found["module_id"]]
    # Between precisions the casts add operators only one run has (aten._to_copy), so fp32 golden
    # operators do not pair one to one with the my-run's: the twin -- the golden program at the
    # my-run's precision, same selection -- is the golden here, and its own noise reference, so
    # the first operator whose output departs from it on bit-exact inputs is named however small.
    twin_dtype = found.get("twin_dtype")
    dumps, runs, _ = _phase_runs(hunt, folder, flags, twin_dtype, golden=twin_dtype is None)
    reference = dumps.get("golden") or dumps["twin"]
    compare_run, summary = hunt.compare(reference, dumps["my"], folder / "report", dumps.get("twin"))
    runs.append(compare_run.as_json())
    culprit = _culprit(summary)
    introduced = summary.get("first_introduced")
    return {
        "runs": runs,
        "my_dump": str(dumps["my"]),
        "counts": summary["counts"],
        "evidence": _evidence_text(introduced, culprit) if culprit is not None and introduced else None,
        "operator": culprit["name"] if culprit is not None else None,
        "op_type": culprit.get("op_type") if culprit is not None else None,
    }


def opcheck_phase(hunt: Hunt, folder: Path, found: dict[str, Any]) -> dict[str, Any]:
    """Return opcheck's verdict on the culprit operator, recomputed in float64 from the my-run's dumped inputs."""
    report = folder / "report"
    report.mkdir(parents=True, exist_ok=True)
    args = ["opcheck", "-i", found["my_dump"], "-o", str(report)]
    run = hunt.llmcheck(args, folder / "opcheck.log", OPCHECK_DONE_CODES)
    verdicts = []
    result_file = report / "opcheck_result.csv"
    if result_file.is_file():
        with result_file.open(encoding="utf-8", newline="") as rows:
            verdicts = [row for row in csv.DictReader(rows) if row["op_id"] == found["operator"]]
    counts = Counter(row["precision_result"] for row in verdicts)
    if not verdicts:
        verdict = f"not checked (opcheck has no row for it; see {folder / 'opcheck.log'})"
    elif set(counts) == {"PASS"}:
        verdict = (
            "PASS: the operator computes what its inputs and arguments ask for; the error is in what "
            "it was given (an argument, a weight, a constant)"
        )
    else:
        reasons = "; ".join(sorted({row["fail_reason"] for row in verdicts if row["fail_reason"]}))
        verdict = f"FAIL: its own computation is wrong against float64 ({reasons or 'see the report'})"
    return {"runs": [run.as_json()], "verdict": verdict, "rows": len(verdicts)}


# --- the routine -------------------------------------------------------------------------


def run_phase(
    hunt: Hunt, name: str, fresh_inputs: dict[str, str], body: Callable[[Path], dict[str, Any]]
) -> dict[str, Any]:
    """Return a phase's result: read from its finished folder, or computed by ``body`` into a clean one."""
    folder = hunt.output_dir / name
    marker = folder / PHASE_MARKER
    if marker.is_file():
        done = json.loads(marker.read_text(encoding="utf-8"))
        if done.get("inputs") == fresh_inputs:
            log.info("%s: done already (%s), reused", name, marker)
            done["reused"] = True
            return dict(done)
        log.info("%s: done for other programs, run again", name)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    started = time.perf_counter()
    result = body(folder)
    result.update(inputs=fresh_inputs, elapsed_s=round(time.perf_counter() - started, 2), reused=False)
    result["bytes_written"] = folder_bytes(folder)
    atomic_write_text(marker, json.dumps(result, indent=2) + "\n")
    return result


def run_hunt(
    golden_program: str,
    my_program: str,
    output_dir: Path,
    *,
    fresh: bool,
    log_level: str,
    backend: str = "torch",
    jobs: int = 1,
) -> int:
    """Run the hunt, write ``OUT/hunt.json``, print its summary; return the exit code."""
    from llmcheck.core.hunt.report import print_summary, write_report

    _read.cache_clear()  # a dump path of an earlier hunt in this process may have been removed and made again
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise UsageError("is a file, not a folder", where=output_dir, hint="give -o a folder for the hunt's phases")
    for program, flag in ((golden_program, "--golden"), (my_program, "--my")):
        if not program.strip():
            raise UsageError("no program given", where=flag, hint='give the command line, e.g. "python infer.py"')
    if backend == "atb":
        raise UsageError(
            "hunt drives the torch and vllm backends only: it narrows by module depth and ends programs after a "
            "step, which an ATB graph dump cannot do, and no NPU was at hand to build the ATB flow on",
            where="--backend atb",
            hint="run the routine by hand: llmcheck dump --backend atb -sd -er all, then -er S,S with -ids of the "
            "layer that diverges, and llmcheck compare at each level (docs/commands/hunt.md)",
        )
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}", where="--backend", hint=f"use one of {', '.join(BACKENDS)}")
    if jobs < 1:
        raise UsageError(f"must be 1 or more, got {jobs}", where="-j/--jobs")
    if fresh:
        for name in (*PHASES, REPORT_NAME):
            path = output_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    output_dir.mkdir(parents=True, exist_ok=True)
    hunt = Hunt(golden_program, my_program, output_dir, log_level=log_level, backend=backend, jobs=jobs)
    inputs = {"golden": golden_program, "my": my_program, "backend": backend}
    phases: dict[str, dict[str, Any]] = {}
    stopped: tuple[str, int] | None = None
    try:
        steps = phases["1_steps"] = run_phase(hunt, "1_steps", inputs, lambda f: steps_phase(hunt, f))
        if "stopped" in steps:
            stopped = (steps["stopped"], EXIT_OTHER_TOKENS)
        elif "step" in steps:
            found = {**steps, "report": str(output_dir / "1_steps" / "report")}
            if "module" not in steps:  # the step is a later one: its blocks need a phase of their own
                blocks = run_phase(hunt, "2_blocks", inputs, lambda f: blocks_phase(hunt, f, steps))
                phases["2_blocks"] = blocks
                found = {**found, **blocks, "report": str(output_dir / "2_blocks" / "report")}
            if "stopped" in found:
                stopped = (found["stopped"], EXIT_CULPRIT_NAMED)
            elif found["module"] != ROOT_MODULE:  # an error of the model's own code has no module to open
                block = found
                module = phases["3_module"] = run_phase(
                    hunt, "3_module", inputs, lambda f: module_phase(hunt, f, block)
                )
                found = {**found, **module}
                operator = run_phase(hunt, "4_operator", inputs, lambda f: operator_phase(hunt, f, found))
                phases["4_operator"] = operator
                if operator.get("operator"):
                    checked = {**found, **operator}
                    phases["5_opcheck"] = run_phase(
                        hunt, "5_opcheck", inputs, lambda f: opcheck_phase(hunt, f, checked)
                    )
    except HuntStopped as stop:
        stopped = (stop.what, stop.exit_code)
    report = write_report(output_dir / REPORT_NAME, inputs, phases, stopped[0] if stopped else None)
    print_summary(report)
    if stopped is not None:
        return stopped[1]
    return EXIT_CULPRIT_NAMED if "step" in phases.get("1_steps", {}) else EXIT_NO_DIVERGENCE
