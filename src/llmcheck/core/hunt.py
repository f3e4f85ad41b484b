"""``llmcheck hunt``: from two programs to the culprit operator, coarse to fine, without dumping the whole model.

Each phase runs ``llmcheck dump`` / ``compare`` / ``opcheck`` as child processes (the exact
command lines a user can repeat), keeps its dumps and reports under ``OUT/<phase>/`` and
writes ``phase.json`` last: a phase whose folder holds it is done, and a later hunt with the
same programs reuses it instead of running it again (``--fresh`` redoes every phase).

1. ``1_determinism``: the golden twice, statistics only, every step; any record that moves stops the hunt.
2. ``2_statistics``: the my-run statistics only (and the golden's noise twin when the precisions
   differ); compare with the first golden run: the step and the module where the error is introduced.
3. ``3_module``: full tensors of that step, that module's subtree and the producers of its inputs.
4. ``4_operator``: the operators inside that module, at that step: the culprit operator.
5. ``5_opcheck``: the my-run's operators recomputed in float64 from its dumped inputs.
"""

from __future__ import annotations

import csv
import json
import logging
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmcheck.core.atomic_files import atomic_write_text
from llmcheck.core.errors import LlmcheckError, UsageError
from llmcheck.core.records import TensorRecord
from llmcheck.core.store import find_dumps, read_dump

log = logging.getLogger("llmcheck.hunt")

#: The file a phase writes last: its folder holds a finished phase.
PHASE_MARKER = "phase.json"
REPORT_NAME = "hunt.json"
PHASES = ("1_determinism", "2_statistics", "3_module", "4_operator", "5_opcheck")

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
    """The hunt cannot go on (a golden that moves, runs fed other tokens): one line, its own exit code."""

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
class Hunt:
    """The inputs of one hunt and what its phases ran."""

    golden_program: str
    my_program: str
    output_dir: Path
    log_level: str = "warning"

    def llmcheck(self, args: Sequence[str], log_file: Path, done_codes: Sequence[int]) -> ChildRun:
        """Return the run of ``llmcheck ARGS`` as a child (its output in ``log_file``); a failure is one error line."""
        argv = [sys.executable, "-m", "llmcheck.core.cli", *args]
        log.info("running %s", display_command(argv))
        started = time.perf_counter()
        with log_file.open("w", encoding="utf-8") as output:
            completed = subprocess.run(argv, stdout=output, stderr=subprocess.STDOUT, check=False)
        run = ChildRun(argv, completed.returncode, time.perf_counter() - started)
        if completed.returncode not in done_codes:
            lines = [line for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines() if line]
            raise LlmcheckError(
                f"'{display_command(argv)}' failed with exit code {completed.returncode}: "
                f"{lines[-1] if lines else 'no output'}",
                where=log_file,
                hint="run that command to see the whole output",
            )
        return run

    def dump(self, program: str, folder: Path, flags: Sequence[str]) -> tuple[ChildRun, Path]:
        """Return the run of ``llmcheck dump`` of ``program`` into ``folder`` and the dump it wrote."""
        folder.mkdir(parents=True, exist_ok=True)
        args = ["dump", "--backend", "torch", *flags, "-o", str(folder), "-l", self.log_level, "--exec", program]
        run = self.llmcheck(args, folder.with_suffix(".log"), DUMP_DONE_CODES)
        dumps = find_dumps(folder)
        if not dumps:
            raise LlmcheckError(
                "the program ran but wrote no dump", where=folder, hint=f"see {folder.with_suffix('.log')}"
            )
        return run, dumps[-1]

    def compare(self, golden: Path, my: Path, report: Path, noise: Path | None) -> tuple[ChildRun, dict[str, Any]]:
        """Return the run of ``llmcheck compare`` and the ``summary.json`` it wrote."""
        # The -o folders of the dumps (each holds one dump): the commands read as a user writes them.
        args = ["compare", "-gp", str(golden.parent), "-mp", str(my.parent), "-o", str(report), "-l", self.log_level]
        if noise is not None:
            args += ["--noise-path", str(noise.parent)]
        report.mkdir(parents=True, exist_ok=True)
        run = self.llmcheck(args, report.with_suffix(".log"), COMPARE_DONE_CODES)
        summary: dict[str, Any] = json.loads((report / "summary.json").read_text(encoding="utf-8"))
        return run, summary


def display_command(argv: Sequence[str]) -> str:
    """Return a child's argv as a user repeats it: ``llmcheck ...`` for llmcheck's own CLI."""
    if list(argv[1:3]) == ["-m", "llmcheck.core.cli"]:
        argv = ["llmcheck", *argv[3:]]
    return shlex.join(argv)


def folder_bytes(folder: Path) -> int:
    """Return the bytes of the files under ``folder``."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


# --- phases ------------------------------------------------------------------------------


def record_label(record: TensorRecord) -> str:
    """Return a record as compare names it: ``model.layers.1 step 0 output.0``."""
    key = record.key
    moment = f" ({key.moment})" if key.io == "input" else ""
    return f"{key.name} step {key.step} {key.io}.{key.position}{moment}"


def _fingerprint(record: TensorRecord) -> tuple[Any, ...]:
    stats = record.stats
    values = (stats.min, stats.max, stats.mean, stats.l2norm, stats.nan_count, stats.inf_count) if stats else ()
    return (record.dtype, tuple(record.shape), values)


def first_moved_record(first: Path, second: Path) -> str | None:
    """Return the first record (execution order) whose statistics differ between two dumps, ``None`` when bit-identical."""
    first_records = sorted(read_dump(first).records, key=lambda record: record.order)
    second_by_key = {record.key: record for record in read_dump(second).records}
    for record in first_records:
        other = second_by_key.get(record.key)
        if other is None:
            return f"{record_label(record)} (only in the first run)"
        if _fingerprint(record) != _fingerprint(other):
            return f"{record_label(record)}: {_stats_text(record)} vs {_stats_text(other)}"
    if len(second_by_key) != len(first_records):
        return f"the second run has {len(second_by_key)} records, the first {len(first_records)}"
    return None


def _stats_text(record: TensorRecord) -> str:
    stats = record.stats
    if stats is None:
        return f"{record.dtype} {list(record.shape)}"
    return f"l2norm {stats.l2norm!r}, mean {stats.mean!r}"


def dominant_float_dtype(dump: Path) -> str | None:
    """Return the floating dtype most of a dump's records hold (``torch.bfloat16``), ``None`` when none is floating."""
    dtypes = (record.dtype.removeprefix("torch.") for record in read_dump(dump).records)
    counts = Counter(dtype for dtype in dtypes if dtype in SHORT_DTYPES)
    return counts.most_common(1)[0][0] if counts else None


def first_token_divergence(golden: Path, my: Path) -> int | None:
    """Return the first step after the prefill whose integer inputs of the model differ (other tokens), or ``None``."""
    my_by_key = {record.key: record for record in read_dump(my).records}
    steps = []
    for record in read_dump(golden).records:
        if record.key.name == "root" and record.key.io == "input" and record.key.step > 0 and "int" in record.dtype:
            other = my_by_key.get(record.key)
            if other is None or _fingerprint(other) != _fingerprint(record):
                steps.append(record.key.step)
    return min(steps) if steps else None


def determinism_phase(hunt: Hunt, folder: Path) -> dict[str, Any]:
    """Run the golden twice, statistics only; return the phase's result, or stop the hunt when a record moved."""
    flags = ["-sd", "-er", "all"]
    first_run, first = hunt.dump(hunt.golden_program, folder / "golden", flags)
    second_run, second = hunt.dump(hunt.golden_program, folder / "golden_again", flags)
    moved = first_moved_record(first, second)
    if moved is not None:
        # the compare's report shows how far the runs moved; of two identical runs it would say nothing
        hunt.compare(first, second, folder / "report", None)
        raise HuntStopped(
            f"the golden program is not deterministic: two runs of it differ first at {moved} "
            f"(make it deterministic -- eval mode, no dropout or sampling, fixed seeds -- before hunting; "
            f"see {folder / 'report'})",
            EXIT_NOT_DETERMINISTIC,
        )
    records = len(read_dump(first).records)
    return {
        "runs": [first_run.as_json(), second_run.as_json()],
        "golden_dump": str(first),
        "evidence": f"two golden runs are bit-identical ({records} records, statistics of every step)",
    }


def statistics_phase(hunt: Hunt, folder: Path, golden: Path) -> dict[str, Any]:
    """Return where the error is introduced: the step and the module, from statistics of every step."""
    flags = ["-sd", "-er", "all"]
    runs = []
    my_run, my = hunt.dump(hunt.my_program, folder / "my", flags)
    runs.append(my_run.as_json())
    golden_dtype, my_dtype = dominant_float_dtype(golden), dominant_float_dtype(my)
    twin_dtype = SHORT_DTYPES[my_dtype] if my_dtype is not None and golden_dtype != my_dtype else None
    twin = None
    if twin_dtype is not None:
        twin_run, twin = hunt.dump(hunt.golden_program, folder / "twin", [*flags, "--as-dtype", twin_dtype])
        runs.append(twin_run.as_json())
    compare_run, summary = hunt.compare(golden, my, folder / "report", twin)
    runs.append(compare_run.as_json())
    result: dict[str, Any] = {
        "runs": runs,
        "my_dump": str(my),
        "golden_dtype": golden_dtype,
        "my_dtype": my_dtype,
        "twin_dtype": twin_dtype,
        "counts": summary["counts"],
    }
    culprit = summary.get("culprit") or summary.get("first_introduced")
    token_step = first_token_divergence(golden, my)
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
    result.update(
        step=culprit["step"],
        module=culprit["name"],
        evidence=_evidence_text(introduced, culprit),
    )
    return result


def _evidence_text(introduced: dict[str, Any], culprit: dict[str, Any]) -> str:
    if introduced.get("name") != culprit["name"]:
        return f"named by compare as the culprit ({culprit.get('seen_at') or culprit['name']})"
    value = introduced.get("value")
    shown = f"{value:.6g}" if isinstance(value, float) else str(value)
    return (
        f"{introduced['name']} step {introduced['step']} {introduced['io']}.{introduced['position']}: "
        f"{introduced['metric']} {shown}, {introduced['attribution']}; {introduced.get('evidence') or ''}"
    ).rstrip("; ")


def module_ids(topology_file: Path) -> dict[str, str]:
    """Return ``module name -> id`` (``0_1_3``) from a dump's ``topology.json``."""
    ids: dict[str, str] = {}

    def visit(node: dict[str, Any]) -> None:
        node_id = node.get("attrs", {}).get("id")
        if node_id is not None:
            ids[node["name"]] = str(node_id)
        for child in node.get("children", []):
            visit(child)

    visit(json.loads(topology_file.read_text(encoding="utf-8")))
    return ids


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


def selection_ids(ids: dict[str, str], module: str, producers: Sequence[str]) -> list[str]:
    """Return the ``-ids`` of a module's subtree and of its inputs' producers (their own records only)."""
    subtree = [node_id for name, node_id in ids.items() if name == module or name.startswith(module + ".")]
    return subtree + [ids[name] for name in producers if name in ids and ids[name] not in subtree]


def module_phase(hunt: Hunt, folder: Path, golden: Path, found: dict[str, Any]) -> dict[str, Any]:
    """Return the module confirmed on full tensors of one step: its subtree and its inputs' producers."""
    step, module = found["step"], found["module"]
    ids = module_ids(golden / "topology.json")
    producers = input_producers(Path(found["report"]), module, step)
    selected = selection_ids(ids, module, producers)
    flags = ["-er", f"{step},{step}"]
    if selected:
        flags += ["-ids", ",".join(selected), "-child", "False"]
    result = _full_compare(hunt, folder, flags, found)
    culprit = result.pop("culprit")
    confirmed: str = culprit["name"] if culprit is not None else ""
    # the full tensors may name a module inside the one the statistics named: the finer one wins
    inside = confirmed == module or confirmed.startswith(module + ".")
    chosen = confirmed if inside else module
    result.update(producers=producers, module=chosen, confirmed=inside, module_id=ids.get(chosen))
    return result


def operator_phase(hunt: Hunt, folder: Path, found: dict[str, Any]) -> dict[str, Any]:
    """Return the culprit operator: the ATen ops run inside the module, at the step, compared."""
    flags = ["--type", "op", "-er", f"{found['step']},{found['step']}"]
    if found.get("module_id"):
        flags += ["-ids", found["module_id"]]
    # Between precisions the casts add operators only one run has (aten._to_copy), so fp32 golden
    # operators do not pair one to one with the my-run's: the twin -- the golden program at the
    # my-run's precision, same selection -- is the golden here, and its own noise reference, so
    # the first operator whose output departs from it on bit-exact inputs is named however small.
    result = _full_compare(hunt, folder, flags, found, twin_as_golden=bool(found.get("twin_dtype")))
    culprit = result.pop("culprit")
    result["operator"] = culprit["name"] if culprit is not None else None
    result["op_type"] = culprit.get("op_type") if culprit is not None else None
    return result


def _full_compare(
    hunt: Hunt, folder: Path, flags: list[str], found: dict[str, Any], *, twin_as_golden: bool = False
) -> dict[str, Any]:
    runs = []
    golden: Path | None = None
    if not twin_as_golden:
        golden_run, golden = hunt.dump(hunt.golden_program, folder / "golden", flags)
        runs.append(golden_run.as_json())
    my_run, my = hunt.dump(hunt.my_program, folder / "my", flags)
    runs.append(my_run.as_json())
    twin = None
    if found.get("twin_dtype"):
        twin_run, twin = hunt.dump(hunt.golden_program, folder / "twin", [*flags, "--as-dtype", found["twin_dtype"]])
        runs.append(twin_run.as_json())
    reference = golden if golden is not None else twin
    assert reference is not None  # twin_as_golden is only asked for with a twin
    compare_run, summary = hunt.compare(reference, my, folder / "report", twin)
    runs.append(compare_run.as_json())
    introduced = summary.get("first_introduced")
    culprit = summary.get("culprit") or introduced
    if culprit is not None and introduced is not None and introduced["name"] == culprit["name"]:
        culprit = {**culprit, "op_type": introduced.get("op_type")}
    return {
        "runs": runs,
        "my_dump": str(my),
        "counts": summary["counts"],
        "culprit": culprit,
        "evidence": _evidence_text(introduced, culprit) if culprit is not None and introduced else None,
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


def run_hunt(golden_program: str, my_program: str, output_dir: Path, *, fresh: bool, log_level: str) -> int:
    """Run the hunt, write ``OUT/hunt.json``, print its summary; return the exit code."""
    from llmcheck.core.hunt_report import print_summary, write_report

    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise UsageError("is a file, not a folder", where=output_dir, hint="give -o a folder for the hunt's phases")
    for program, flag in ((golden_program, "--golden"), (my_program, "--my")):
        if not program.strip():
            raise UsageError("no program given", where=flag, hint='give the command line, e.g. "python infer.py"')
    if fresh:
        for name in (*PHASES, REPORT_NAME):
            path = output_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    output_dir.mkdir(parents=True, exist_ok=True)
    hunt = Hunt(golden_program, my_program, output_dir, log_level=log_level)
    inputs = {"golden": golden_program, "my": my_program}
    phases: dict[str, dict[str, Any]] = {}
    stopped: tuple[str, int] | None = None
    try:
        phases["1_determinism"] = run_phase(hunt, "1_determinism", inputs, lambda f: determinism_phase(hunt, f))
        golden = Path(phases["1_determinism"]["golden_dump"])
        statistics = run_phase(hunt, "2_statistics", inputs, lambda f: statistics_phase(hunt, f, golden))
        statistics["report"] = str(output_dir / "2_statistics" / "report")
        phases["2_statistics"] = statistics
        if "stopped" in statistics:
            stopped = (statistics["stopped"], EXIT_OTHER_TOKENS)
        elif "module" in statistics:
            module = run_phase(hunt, "3_module", inputs, lambda f: module_phase(hunt, f, golden, statistics))
            phases["3_module"] = module
            found = {**statistics, **module}
            operator = run_phase(hunt, "4_operator", inputs, lambda f: operator_phase(hunt, f, found))
            phases["4_operator"] = operator
            if operator.get("operator"):
                checked = {**found, **operator}
                phases["5_opcheck"] = run_phase(hunt, "5_opcheck", inputs, lambda f: opcheck_phase(hunt, f, checked))
    except HuntStopped as stop:
        stopped = (stop.what, stop.exit_code)
    report = write_report(output_dir / REPORT_NAME, inputs, phases, stopped[0] if stopped else None)
    print_summary(report)
    if stopped is not None:
        return stopped[1]
    return EXIT_CULPRIT_NAMED if "module" in phases.get("2_statistics", {}) else EXIT_NO_DIVERGENCE
