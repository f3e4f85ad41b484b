"""The hunt's one report: ``OUT/hunt.json`` and the short terminal summary of the path it took."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from llmcheck.core.dumps.atomic_files import atomic_write_text

REPORT_FORMAT = "llmcheck-hunt"


def hunt_path(phases: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Return what the hunt found, level by level: step, module, operator, opcheck verdict (``None`` where it stopped)."""
    steps = phases.get("1_steps", {})
    blocks = phases.get("2_blocks", {})
    module = phases.get("3_module", {})
    operator = phases.get("4_operator", {})
    opcheck = phases.get("5_opcheck", {})
    return {
        "step": steps.get("step"),
        "block": blocks.get("module", steps.get("module")),
        "module": module.get("module", blocks.get("module", steps.get("module"))),
        "operator": operator.get("operator"),
        "op_type": operator.get("op_type"),
        "opcheck": opcheck.get("verdict"),
    }


def write_report(
    path: Path, inputs: Mapping[str, str], phases: Mapping[str, Mapping[str, Any]], stopped: str | None
) -> dict[str, Any]:
    """Write ``hunt.json`` (the path, each phase's evidence, commands and bytes) and return it."""
    report = {
        "format": REPORT_FORMAT,
        "format_version": 1,
        "golden": inputs["golden"],
        "my": inputs["my"],
        "path": hunt_path(phases),
        "stopped": stopped,
        "phases": {name: dict(result) for name, result in phases.items()},
        "bytes_written": sum(int(result.get("bytes_written", 0)) for result in phases.values()),
    }
    atomic_write_text(path, json.dumps(report, indent=2) + "\n")
    report["report_path"] = str(path)
    return report


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.2f} MB"


def print_summary(report: Mapping[str, Any]) -> None:
    """Print the path taken, the evidence at each level, the commands run and the bytes each phase wrote."""
    found = report["path"]
    if report["stopped"]:
        # one line: where the hunt could not go on, and the report that keeps what it found so far
        click.echo(f"stopped: {report['stopped']}; wrote {report['report_path']}")
        return
    for name, result in report["phases"].items():
        state = "reused" if result.get("reused") else f"{result.get('elapsed_s', 0):.1f} s"
        click.echo(f"{name}: {_megabytes(int(result.get('bytes_written', 0)))} written ({state})")
        evidence = result.get("evidence")
        if evidence:
            click.echo(f"  evidence: {evidence}")
        if name == "1_steps" and result.get("twin_dtype"):
            click.echo(
                f"  precision: {result['golden_dtype']} golden, {result['my_dtype']} my: "
                f"noise twin recorded at {result['twin_dtype']}"
            )
        if name == "5_opcheck":
            click.echo(f"  verdict: {result['verdict']}")
        for run in result.get("runs", []):
            click.echo(f"  $ {run['command']}")
    if found["step"] is None:
        click.echo("no divergence: the my-run agrees with the golden within noise at every step")
    else:
        steps = [f"step {found['step']}"]
        if found["block"] and found["block"] != found["module"]:
            steps.append(f"block {found['block']}")
        if found["module"]:
            steps.append(f"module {found['module']}")
        if found["operator"]:
            steps.append(f"operator {found['operator']}")
        if found["opcheck"]:
            steps.append(f"opcheck {found['opcheck'].split(':')[0]}")
        click.echo("path: " + " -> ".join(steps))
    click.echo(f"wrote {report['report_path']} ({_megabytes(int(report['bytes_written']))} in all)")
