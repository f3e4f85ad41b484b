"""``llmcheck dump --backend torch``: an unmodified script captured with no code change, flags, exit codes."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from llmcheck import read_dump
from llmcheck.bundled_model import random_llama
from llmcheck.core.dumps.store import find_dumps

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    from llmcheck.bundled_model import random_llama

    torch.set_num_threads(1)
    seed_at_start = torch.initial_seed()
    model = random_llama(seed=0)
    with torch.no_grad():
        tokens = model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=3, do_sample=False)
    with open(sys.argv[1], "w") as result:
        json.dump({"argv": sys.argv[2:], "tokens": tokens.tolist(), "user_site": os.environ.get("USER_SITE_RAN"),
                   "seed": seed_at_start}, result)
    sys.exit(int(sys.argv[2]))
""")


def _llmcheck(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmcheck.core.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "infer.py"
    path.write_text(SCRIPT)
    return path


def _expected_tokens() -> list[list[int]]:
    with torch.no_grad():
        return random_llama(seed=0).generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=3, do_sample=False).tolist()


def test_dump_exec_captures_an_unmodified_script_and_returns_its_exit_code(tmp_path: Path, script: Path) -> None:
    user_site = tmp_path / "user_site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    other_python = tmp_path / "bin" / "python"  # first on PATH, as an unactivated environment's python would be
    other_python.parent.mkdir()
    other_python.write_text("#!/bin/sh\necho 'the python on PATH ran' >&2\nexit 99\n")
    other_python.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(user_site), "PATH": f"{other_python.parent}{os.pathsep}{os.environ['PATH']}"}
    command = f"python {script} result.json 3 'two words' \"it's\""  # a bare python runs as llmcheck's own
    completed = _llmcheck(
        "dump", "--backend", "torch", "-o", "out", "-er", "0,1", "-seed", "7", "--exec", command, cwd=tmp_path, env=env
    )
    assert completed.returncode == 3, completed.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["argv"] == ["3", "two words", "it's"]  # quotes work, no shell
    assert result["tokens"] == _expected_tokens()  # capture did not change the run
    assert result["user_site"] == "yes"  # the environment's own sitecustomize still ran
    assert result["seed"] == 7  # -seed seeds the program's own process, not only the launcher
    (dump_path,) = find_dumps(tmp_path / "out")
    assert dump_path.name.endswith("_rank0_cpu")
    assert f"torch capture wrote {dump_path}" in completed.stderr
    dump = read_dump(dump_path)
    assert dump.cut is None and dump.manifest["command_line"][-3:] == ["3", "two words", "it's"]
    outputs = {(r.key.name, r.key.step) for r in dump.records if r.key.io == "output"}
    assert {(f"model.layers.{i}", step) for i in range(2) for step in (0, 1)} <= outputs
    assert {r.key.step for r in dump.records} == {0, 1}
    assert dump.topology.op_type == "LlamaForCausalLM"
    digested = {r.key.name for r in dump.records if "parameter_digests" in r.attrs}
    assert {"model.layers.0.mlp.down_proj", "model.norm"} <= digested  # weights checked against the golden's


def test_dump_warns_when_execute_range_selects_only_steps_the_program_never_reaches(
    tmp_path: Path, script: Path
) -> None:
    command = f"python {script} result.json 0"
    completed = _llmcheck("dump", "--backend", "torch", "-o", "out", "-er", "99,99", "--exec", command, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert json.loads((tmp_path / "result.json").read_text())["tokens"] == _expected_tokens()
    (dump_path,) = find_dumps(tmp_path / "out")
    assert read_dump(dump_path).records == []
    assert (  # max_new_tokens=3: the prefill and two decodes
        f"llmcheck: WARNING: token_range [99]: the program ran steps 0-2 only; nothing was dumped into {dump_path}\n"
    ) in completed.stderr
    assert f"torch capture wrote {dump_path} (complete, 0 records); the program exited with code 0" in completed.stderr


def test_max_depth_and_exit_after_range_dump_the_model_outputs_of_one_step_and_end_the_program(
    tmp_path: Path, script: Path
) -> None:
    command = f"python {script} result.json 0"
    flags = ["-sd", "-er", "1,1", "--exit-after-range", "--max-depth", "0"]
    completed = _llmcheck("dump", "--backend", "torch", "-o", "out", *flags, "--exec", command, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert not (tmp_path / "result.json").exists()  # ended after step 1: the rest of the program never ran
    (dump_path,) = find_dumps(tmp_path / "out")
    dump = read_dump(dump_path)
    assert {(record.key.name, record.key.step) for record in dump.records} == {("root", 1)}
    assert dump.manifest["model_dtypes"] == {"float32": len(list(random_llama(seed=0).parameters()))}
    assert (
        f"torch capture wrote {dump_path} (complete, {len(dump.records)} records); "
        "the capture ended the program after step 1, the last one asked for"
    ) in completed.stderr


def test_max_depth_at_records_the_prefill_down_to_the_blocks_and_every_other_step_at_the_top(
    tmp_path: Path, script: Path
) -> None:
    command = f"python {script} result.json 0"
    flags = ["-sd", "-er", "all", "--max-depth", "0", "--max-depth-at", "0:blocks"]
    completed = _llmcheck("dump", "--backend", "torch", "-o", "out", *flags, "--exec", command, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    (dump_path,) = find_dumps(tmp_path / "out")
    by_step: dict[int, set[str]] = {}
    for record in read_dump(dump_path).records:
        by_step.setdefault(record.key.step, set()).add(record.key.name)
    assert sorted(by_step) == [0, 1, 2] and by_step[1] == by_step[2] == {"root"}
    # the blocks of a 2-layer Llama: its decoder layers are 3 levels down, as in any Llama
    assert {"model.layers.0", "model.layers.1", "model.norm", "lm_head"} <= by_step[0]
    assert not any(name.count(".") > 2 for name in by_step[0])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["-er", "all", "--exit-after-range"],
            "llmcheck: error: --exit-after-range: -er all dumps every step: there is no last step to end the program "
            "after (give -er LOW,HIGH, or leave --exit-after-range out)",
        ),
        (["--max-depth", "-1"], "llmcheck: error: --max-depth: must be a number of levels >= 0 or 'blocks', got '-1'"),
        (["--max-depth-at", "x:1"], "llmcheck: error: --max-depth-at: expects STEP:DEPTH, got 'x:1'"),
    ],
)
def test_exit_after_range_and_max_depth_refuse_what_cannot_work(tmp_path: Path, flags: list[str], message: str) -> None:
    completed = _llmcheck("dump", "--backend", "torch", "-o", "out", *flags, "--exec", "python -c pass", cwd=tmp_path)
    assert completed.returncode == 2
    assert completed.stderr.strip().startswith(message)
    assert len(completed.stderr.strip().splitlines()) == 1


def test_dump_without_weight_digests_records_none(tmp_path: Path, script: Path) -> None:
    completed = _llmcheck(
        "dump",
        "--backend",
        "torch",
        "-o",
        "out",
        "-sd",
        "--no-weight-digests",
        "--",
        sys.executable,
        str(script),
        "result.json",
        "0",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    (dump_path,) = find_dumps(tmp_path / "out")
    dump = read_dump(dump_path)
    assert dump.records and not any("parameter_digests" in r.attrs for r in dump.records)
    assert dump.manifest["config"]["weight_digests"] is False


def test_dump_after_double_dash_with_op_level_statistics_profile_and_onnx(tmp_path: Path, script: Path) -> None:
    completed = _llmcheck(
        "dump",
        "--backend",
        "torch",
        "-o",
        "out",
        "--type",
        "op",
        "cpu_profiling",
        "onnx",
        "-sd",
        "-opname",
        "mm",
        "-er",
        "all",
        "--",
        sys.executable,
        str(script),
        "result.json",
        "0",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    (dump_path,) = find_dumps(tmp_path / "out")
    dump = read_dump(dump_path)
    assert {r.op_type for r in dump.records} == {"aten.mm.default"}
    assert all(r.data is None and r.stats is not None for r in dump.records)
    assert {r.key.step for r in dump.records} == {0, 1, 2}
    tables = sorted((dump_path / "cpu_profiling").glob("operation_statistic_*.csv"))
    assert len(tables) == 3
    assert any(row["op_name"] == "aten::mm" for row in csv.DictReader(tables[0].open()))
    assert (dump_path / "model.onnx").stat().st_size > 0


def test_ranks_of_one_run_write_side_by_side(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text("import torch\nlayer = torch.nn.Linear(4, 4)\nlayer(torch.ones(2, 4))\n")
    launcher = tmp_path / "launch.py"  # what torchrun does: start one worker per rank with RANK set
    launcher.write_text(
        textwrap.dedent(f"""
        import os, subprocess, sys
        workers = [subprocess.Popen([sys.executable, {str(worker)!r}], env={{**os.environ, "RANK": str(rank)}})
                   for rank in (0, 1)]
        sys.exit(max(worker.wait() for worker in workers))
    """)
    )
    completed = _llmcheck(
        "dump", "--backend", "torch", "-o", "out", "--exec", f"{sys.executable} {launcher}", cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr
    dumps = find_dumps(tmp_path / "out")
    assert sorted(path.name.rsplit("_", 2)[-2] for path in dumps) == ["rank0", "rank1"]
    for path in dumps:
        rank = int(path.name.rsplit("_", 2)[-2].removeprefix("rank"))
        assert {record.rank for record in read_dump(path).records} == {rank}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--type", "layer"], "llmcheck: error: --type: the torch backend cannot dump 'layer'"),
        (["-tiling"], "llmcheck: error: -tiling: is an option of backend atb, not torch"),
        (
            ["--exec", "no-such-program-xyz --flag"],
            "llmcheck: error: --exec: cannot run 'no-such-program-xyz': no such program",
        ),
    ],
)
def test_wrong_use_is_one_line_usage_error(tmp_path: Path, flags: list[str], message: str) -> None:
    command = [] if "--exec" in flags else ["--exec", "python -c pass"]
    completed = _llmcheck("dump", "--backend", "torch", "-o", "out", *flags, *command, cwd=tmp_path)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [completed.stderr.strip().splitlines()[0]]
    assert completed.stderr.startswith(message)


LINEAR_SCRIPT = "import torch\nlayer = torch.nn.Linear(4, 4)\nlayer(torch.ones(2, 4))\n"


@pytest.mark.parametrize("device", ["abc", "cuda:x", "0,,1"])
def test_an_invalid_device_id_is_a_usage_error_before_the_program_runs(tmp_path: Path, device: str) -> None:
    (tmp_path / "infer.py").write_text(LINEAR_SCRIPT)
    completed = _llmcheck(
        "dump", "--backend", "torch", "-o", "out", "-device", device, "--", "python", "infer.py", cwd=tmp_path
    )
    assert completed.returncode == 2
    wrong = device if "," not in device else ""
    expected = f"invalid device id {wrong!r}" if wrong else f"an empty device id in {device!r}"
    assert completed.stderr == (
        f"llmcheck: error: -device/--device-id: {expected} (give a device index (0), a type and an index "
        "(cuda:1, npu3), or cpu; a comma list is allowed)\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_device_id_no_forward_ran_on_says_where_they_ran_and_that_device_left_them_out(tmp_path: Path) -> None:
    (tmp_path / "infer.py").write_text(LINEAR_SCRIPT)
    completed = _llmcheck(
        "dump", "--backend", "torch", "-o", "out", "-device", "3", "--", "python", "infer.py", cwd=tmp_path
    )
    assert completed.returncode == 1, completed.stderr  # the program succeeded, but there is no dump
    assert find_dumps(tmp_path / "out") == []
    assert completed.stderr.splitlines()[-1] == (
        f"llmcheck: error: {tmp_path / 'out'}: no dump was written: the program's PyTorch forwards ran on cpu, and "
        "-device/--device-id 3 left them all out (give -device cpu, or leave -device out)"
    )
    assert "imports torch" not in completed.stderr
