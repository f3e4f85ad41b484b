"""Tensor-parallel runs (torch.distributed, gloo, 2 and 4 CPU ranks) compared against a single-process golden.

The runs are real: tests/tp_dump_run.py shards a Megatron-style attention and MLP block
over the ranks and each rank dumps itself with llmcheck's capture; the ranks' dumps are
read as one run and gathered against the golden by the tensor-parallel pairing rules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llmcheck.core.cli import main
from llmcheck.core.compare import compare_dumps
from llmcheck.core.errors import EXIT_FAILURES_FOUND, DumpNotFoundError
from llmcheck.core.judging.result import CompareResult
from llmcheck.core.pairing.merge import load_user_mapping
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.tensor_parallel.shard_layout import CONCAT, REPLICATED, SUM, RuleError, ShardLayout, parse_rule

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tp_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Return a function that runs (once per argument set) the TP model on N gloo ranks and returns the dumps' folder."""
    root = tmp_path_factory.mktemp("tp")
    written: dict[tuple[str, ...], Path] = {}

    def run(*args: str) -> Path:
        if args not in written:
            out = root / f"run{len(written)}"
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
            finished = subprocess.run(
                [sys.executable, str(HERE / "tp_dump_run.py"), str(out), *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
            )
            assert finished.returncode == 0, finished.stderr[-3000:]
            written[args] = out
        return written[args]

    return run


def _compare(golden: Path, my: Path, mapping: Path | None = None) -> CompareResult:
    plugins = get_plugins()
    return compare_dumps(
        plugins.load_tensors(golden),
        plugins.load_tensors(my),
        workers=1,
        user_mapping=load_user_mapping(mapping, get_plugins().mapping_rules()) if mapping else None,
    )


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_a_clean_tensor_parallel_run_matches_the_single_process_golden(tp_run: Callable[..., Path], world: int) -> None:
    result = _compare(tp_run("--world", "1"), tp_run("--world", str(world)))
    counts = result.counts()
    assert counts["failures"] == counts["errors"] == counts["warnings"] == 0
    assert counts["unmatched_golden"] == 0
    ranks = f"ranks=0..{world - 1}"
    rules = {row.golden.key.name: row.rule for row in result.rows if row.my.key.rank == -1}
    # column-parallel outputs and the attention heads are joined along the last dim ...
    assert rules["layers.0.mlp.up_proj"] == rules["layers.1.attn.core"] == f"tp_unshard(dim=-1, {ranks})"
    # ... row-parallel partial sums are summed, as the all-reduce does
    assert rules["layers.0.mlp.down_proj.local"] == f"tp_unshard(sum, {ranks})"
    replicated = [
        row for row in result.rows if row.golden.key.name == "layers.0.input_norm" and row.golden.key.io == "output"
    ]
    assert sorted(row.my.key.rank for row in replicated) == list(range(world))
    assert replicated[1].rule == f"tp_replicated(rank=1, {ranks})"
    # partial sums alone have no golden counterpart: listed with where they were compared
    partial = [item for item in result.pairing.unmatched_my if item.record.key.name == "layers.0.mlp.down_proj.local"]
    assert len(partial) == world and partial[0].note.startswith("a partial sum, compared summed as")


@pytest.mark.slow
@pytest.mark.parametrize("world, module", [(2, "layers.0.mlp.up_proj"), (4, "layers.1.attn.q_proj")])
def test_a_defect_in_rank_1s_shard_is_named_with_its_rank(tp_run: Callable[..., Path], world: int, module: str) -> None:
    result = _compare(
        tp_run("--world", "1"), tp_run("--world", str(world), "--defect-rank", "1", "--defect-module", module)
    )
    introduced = result.first_introduced
    assert (introduced.golden.key.name, introduced.golden.key.io) == (module, "output")
    assert introduced.my.key.rank == 1 and introduced.my.key.label().endswith("output.0 rank 1")
    assert introduced.rule == f"tp_shard(dim=-1, rank=1, ranks=0..{world - 1})"
    assert introduced.metrics["relative_euclidean_distance"].value == pytest.approx(0.05, rel=1e-3)
    same_module = {
        row.my.key.rank: row.verdict
        for row in result.rows
        if row.golden.key.name == module and row.golden.key.io == "output"
    }
    assert same_module[0] == "pass" and same_module[1] == "fail" and same_module[-1] == "fail"


@pytest.mark.slow
def test_llmcheck_compare_prints_the_culprit_rank_and_writes_the_rule_to_pairs_json(
    tp_run: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = next(tp_run("--world", "1").glob("llmcheck_dump_*"))
    code = main(
        [
            "compare",
            "-gp",
            str(golden),
            "-mp",
            str(tp_run("--world", "2", "--defect-rank", "1", "--defect-module", "layers.0.mlp.up_proj")),
            "-o",
            str(tmp_path / "out"),
            "-j",
            "1",
        ]
    )
    assert code == EXIT_FAILURES_FOUND
    assert "first introduced divergence: layers.0.mlp.up_proj step 0 output.0 rank 1" in capsys.readouterr().out
    pairs = json.loads((tmp_path / "out" / "pairs.json").read_text())["pairs"]
    gathered = next(
        pair
        for pair in pairs
        if pair["golden"]["name"] == "layers.0.mlp.up_proj"
        and pair["golden"]["io"] == "output"
        and pair["my"].get("rank") == -1
    )
    assert gathered["rule"] == "tp_unshard(dim=-1, ranks=0..1)" and gathered["derived"] is True
    # fed back as the mapping, the pairs come out the same: derived pairs are rebuilt by their rule
    first = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (
        main(
            [
                "compare",
                "-gp",
                str(golden),
                "-mp",
                first["my"]["path"],
                "--mapping",
                str(tmp_path / "out" / "pairs.json"),
                "-o",
                str(tmp_path / "again"),
                "-j",
                "1",
            ]
        )
        == code
    )
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["counts"] == first["counts"] and again["first_introduced"] == first["first_introduced"]


@pytest.mark.slow
def test_a_rule_in_the_mapping_file_overrides_the_inferred_layout(tp_run: Callable[..., Path], tmp_path: Path) -> None:
    mapping = tmp_path / "tp_rules.json"
    # down_proj's output is all-reduced (whole on every rank); stating partial sums doubles it
    mapping.write_text(json.dumps([{"golden": "layers.0.mlp.down_proj:output.*", "rule": "tp_unshard(sum)"}]))
    result = _compare(tp_run("--world", "1"), tp_run("--world", "2"), mapping)
    stated = [
        row for row in result.rows if row.golden.key.name == "layers.0.mlp.down_proj" and row.golden.key.io == "output"
    ]
    assert [(row.rule, row.verdict) for row in stated] == [("tp_unshard(sum, ranks=0..1)", "fail")]
    assert stated[0].metrics["relative_euclidean_distance"].value == pytest.approx(1.0, rel=1e-4)


@pytest.mark.slow
def test_a_stated_rule_that_cannot_rebuild_the_golden_is_one_line_naming_the_mapping_file(
    tp_run: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mapping = tmp_path / "tp_rules.json"
    mapping.write_text(json.dumps([{"golden": "*.mlp.up_proj", "rule": "tp_unshard(dim=0)"}]))
    code = main(
        [
            "compare",
            "-gp",
            str(tp_run("--world", "1")),
            "-mp",
            str(tp_run("--world", "2")),
            "--mapping",
            str(mapping),
            "-o",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(
        f"llmcheck: error: {mapping}: rule 'tp_unshard(dim=0)' for '*.mlp.up_proj' cannot rebuild "
        "layers.0.mlp.up_proj step 0 input.0 (before) [1, 6, 32] from shards"
    )


@pytest.mark.slow
def test_the_ranks_of_one_run_load_as_one_run_and_two_runs_of_one_rank_are_refused(
    tp_run: Callable[..., Path], tmp_path: Path
) -> None:
    folder = tp_run("--world", "4")
    dump = get_plugins().load_tensors(folder)
    assert dump.ranks == (0, 1, 2, 3) and dump.manifest["ranks"] == [0, 1, 2, 3]
    per_rank = [sum(1 for record in dump.records if record.key.rank == rank) for rank in dump.ranks]
    assert len(set(per_rank)) == 1 and len(dump.by_key()) == len(dump.records)
    assert all(record.rank == record.key.rank for record in dump.records)
    two_runs = tmp_path / "two_runs"
    two_runs.mkdir()
    for run in (tp_run("--world", "1"), tp_run("--world", "1", "--defect-rank", "0", "--defect-module", "embed")):
        (dump_folder,) = run.glob("llmcheck_dump_*")
        shutil.copytree(dump_folder, two_runs / dump_folder.name)  # a link would never be entered
    with pytest.raises(DumpNotFoundError, match="holds 2 dumps"):
        get_plugins().load_tensors(two_runs)


@pytest.mark.parametrize(
    "text, layout",
    [
        ("tp_unshard(dim=-1, ranks=0..3)", ShardLayout(CONCAT, -1, (0, 1, 2, 3))),
        ("tp_unshard(sum)", ShardLayout(SUM, None, None)),
        ("tp_unshard(dim=1, ranks=0,2)", ShardLayout(CONCAT, 1, (0, 2))),
        ("tp_replicated", ShardLayout(REPLICATED, None, None)),
    ],
)
def test_rules_read_back_as_the_layout_they_state(text: str, layout: ShardLayout) -> None:
    assert parse_rule(text) == layout
    if layout.ranks:
        assert parse_rule(layout.rule()) == layout


@pytest.mark.parametrize("text", ["tp_unshard()", "tp_unshard(dim=x)", "tp_unshard(dim=-1, ranks=a..b)", "gather"])
def test_unreadable_rules_say_what_to_write(text: str) -> None:
    with pytest.raises(RuleError):
        parse_rule(text)
