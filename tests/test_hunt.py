"""``llmcheck hunt``: from two programs to the culprit module and operator, phase by phase, resumable."""

from __future__ import annotations

import importlib.util
import json
import shutil
import textwrap
from pathlib import Path

import pytest

from llmcheck.core.cli import main
from llmcheck.core.dumps.store import read_dump

INFER = textwrap.dedent(
    """
    import os
    import sys
    import torch
    from llmcheck.bundled_model import random_llama

    torch.set_num_threads(1)
    model = random_llama(seed=0)
    if "--defect" in sys.argv:  # a fused norm's hard-coded epsilon, in a middle layer
        model.model.layers[1].post_attention_layernorm.variance_epsilon = 1e-1
    if "--decode-defect" in sys.argv:  # the epsilon wrong only where one token is decoded, not at the prefill
        norm = model.model.layers[1].post_attention_layernorm

        def decode_only(module, args):
            module.variance_epsilon = 1e-1 if args[0].shape[1] == 1 else 1e-6

        norm.register_forward_pre_hook(decode_only)
    if "--sampled" in sys.argv:  # the same model, but its tokens drawn, not the most likely: other tokens
        torch.manual_seed(7)
    if "--dropout" in sys.argv:  # left in train mode: attention dropout moves every run
        model.train()
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # random_llama seeded torch
        for layer in model.model.layers:
            layer.self_attn.attention_dropout = 0.5
    with torch.no_grad():
        drawn = {"do_sample": True, "top_k": 0} if "--sampled" in sys.argv else {"do_sample": False}
        print(model.generate(torch.tensor([[1, 7, 42, 9]]), max_new_tokens=2, **drawn))
    """
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hunt")
    (folder / "infer.py").write_text(INFER)
    return folder


def _hunt(workdir: Path, out: str, my: str, *extra: str, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.chdir(workdir)
    return main(["hunt", "--golden", "python infer.py", "--my", my, "-o", out, "-l", "warning", *extra])


@pytest.fixture(scope="module")
def finished_hunt(workdir: Path) -> dict:
    with pytest.MonkeyPatch.context() as patch:
        code = _hunt(workdir, "hunt_out", "python infer.py --defect", monkeypatch=patch)
    assert code == 3
    return json.loads((workdir / "hunt_out" / "hunt.json").read_text())


def test_hunt_names_the_module_a_full_module_dump_compare_names_and_goes_on_to_the_operator(
    workdir: Path, finished_hunt: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)
    for name, program in (("full_golden", "infer.py"), ("full_my", "infer.py --defect")):
        assert (
            main(
                ["dump", "--backend", "torch", "-o", name, "-er", "all", "-l", "warning", "--exec", f"python {program}"]
            )
            == 0
        )
    assert main(["compare", "-gp", "full_golden", "-mp", "full_my", "-o", "full_report", "-l", "warning"]) == 3
    full_culprit = json.loads((workdir / "full_report" / "summary.json").read_text())["first_introduced"]

    path = finished_hunt["path"]
    assert path["module"] == full_culprit["name"] == "model.layers.1.post_attention_layernorm"
    assert path["step"] == full_culprit["step"] == 0
    # the epsilon is added inside the norm: the add is where the error starts, and it computes what it is given
    assert path["operator"] == "model.layers.1.post_attention_layernorm/aten.add.Tensor"
    assert path["opcheck"].startswith("PASS")
    phases = finished_hunt["phases"]
    # the prefill's decoder layers were recorded by the step search: no block phase of its own
    assert list(phases) == ["1_steps", "3_module", "4_operator", "5_opcheck"]
    assert path["block"] == "model.layers.1"
    assert phases["3_module"]["confirmed"] is True
    assert all(phase["bytes_written"] > 0 for phase in phases.values())
    # the step search: the model's own inputs and outputs at every step, its blocks at the prefill
    assert phases["1_steps"]["runs"][0]["command"].startswith(
        "llmcheck dump --backend torch -sd -er all --max-depth 0 --max-depth-at 0:blocks"
    )
    steps = read_dump(Path(phases["1_steps"]["dumps"]["my"])).records
    assert {record.key.name for record in steps if record.key.step == 1} == {"root"}
    assert {record.key.step for record in steps} == {0, 1}
    prefill = {record.key.name for record in steps if record.key.step == 0}
    assert "model.layers.1" in prefill and max(name.count(".") for name in prefill) == 2
    # later phases end the program after the prefill
    assert "tensor([[" in (workdir / "hunt_out" / "1_steps" / "my.log").read_text()
    assert "tensor([[" not in (workdir / "hunt_out" / "3_module" / "my.log").read_text()
    # full tensors of the culprit's step only, and of its subtree and its inputs' producers only
    records = read_dump(Path(phases["3_module"]["dumps"]["my"])).records
    assert {record.key.step for record in records} == {0}
    kept = {record.key.name for record in records}
    assert "model.layers.1.post_attention_layernorm" in kept
    assert "model.layers.0" in kept  # the producer of the block's input: its own records, not its children's
    assert not any(name.startswith(("model.layers.0.", "model.layers.2", "lm_head")) for name in kept)


def test_a_defect_first_seen_in_decoding_gets_a_block_phase_at_that_step(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _hunt(workdir, "decode", "python infer.py --decode-defect", monkeypatch=monkeypatch) == 3
    report = json.loads((workdir / "decode" / "hunt.json").read_text())
    assert list(report["phases"]) == ["1_steps", "2_blocks", "3_module", "4_operator", "5_opcheck"]
    path = report["path"]
    assert (path["step"], path["block"], path["module"]) == (
        1,
        "model.layers.1",
        "model.layers.1.post_attention_layernorm",
    )
    assert path["operator"] == "model.layers.1.post_attention_layernorm/aten.add.Tensor"
    blocks = report["phases"]["2_blocks"]
    assert blocks["runs"][0]["command"].startswith("llmcheck dump --backend torch -sd -er 1,1 --exit-after-range")
    assert {record.key.step for record in read_dump(Path(blocks["dumps"]["my"])).records} == {1}


def test_hunt_resumes_after_the_step_search_and_fresh_redoes_it(
    workdir: Path, finished_hunt: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = workdir / "hunt_out"
    marker = out / "1_steps" / "phase.json"
    written_at = marker.stat().st_mtime_ns
    for later in ("3_module", "4_operator", "5_opcheck"):
        shutil.rmtree(out / later)
    assert _hunt(workdir, "hunt_out", "python infer.py --defect", monkeypatch=monkeypatch) == 3
    resumed = json.loads((out / "hunt.json").read_text())
    assert marker.stat().st_mtime_ns == written_at
    assert resumed["phases"]["1_steps"]["reused"] is True
    assert resumed["phases"]["3_module"]["reused"] is False
    assert resumed["path"] == finished_hunt["path"]

    assert _hunt(workdir, "hunt_out", "python infer.py --defect", "--fresh", monkeypatch=monkeypatch) == 3
    assert marker.stat().st_mtime_ns != written_at
    assert json.loads((out / "hunt.json").read_text())["phases"]["1_steps"]["reused"] is False


def test_hunt_of_a_nondeterministic_golden_stops_with_one_line(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(workdir)
    code = main(
        ["hunt", "--golden", "python infer.py --dropout", "--my", "python infer.py", "-o", "moving", "-l", "warning"]
    )
    assert code == 4
    stopped = capsys.readouterr().out.splitlines()
    assert len(stopped) == 1
    assert stopped[0].startswith("stopped: ")
    assert stopped[0].endswith("; wrote moving/hunt.json")
    # the step search's run and the module phase's: the first decoder layer is the first record that moved
    assert "the golden program is not deterministic: two runs of it differ first at model.layers.0" in stopped[0]
    assert "see moving/1_steps/golden and moving/3_module/golden" in stopped[0]
    assert not (workdir / "moving" / "3_module" / "phase.json").exists()
    assert not (workdir / "moving" / "4_operator").exists()


def test_hunt_of_two_runs_that_agree_says_so_after_the_step_search(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _hunt(workdir, "agree", "python infer.py", monkeypatch=monkeypatch) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2] == "no divergence: the my-run agrees with the golden within noise at every step"
    report = json.loads((workdir / "agree" / "hunt.json").read_text())
    assert list(report["phases"]) == ["1_steps"] and report["path"]["step"] is None


def test_hunt_of_runs_fed_other_tokens_stops_at_the_step_before_with_one_line(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the same model: its logits agree at step 0, then the my-run draws another token than the golden's best
    code = _hunt(workdir, "sampled", "python infer.py --sampled", monkeypatch=monkeypatch)
    assert code == 5
    stopped = capsys.readouterr().out.splitlines()
    assert stopped == [
        "stopped: the runs generated other tokens from step 1 and no record of steps 0 to 0 diverges beyond noise: "
        "the step search stops at step 0 (teacher forcing, feeding the my-run the golden's tokens, is out of scope); "
        "wrote sampled/hunt.json"
    ]
    assert json.loads((workdir / "sampled" / "hunt.json").read_text())["path"]["step"] is None


def test_hunt_bad_input_is_one_error_line(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(workdir)
    (workdir / "a_file").write_text("")
    assert main(["hunt", "--golden", "python infer.py", "--my", "python infer.py", "-o", "a_file"]) == 2
    assert capsys.readouterr().err.strip() == (
        "llmcheck: error: a_file: is a file, not a folder (give -o a folder for the hunt's phases)"
    )
    assert main(["hunt", "--golden", "python infer.py", "--my", "python infer.py", "-o", "x", "--backend", "atb"]) == 2
    refused = capsys.readouterr().err.strip()
    assert refused.startswith("llmcheck: error: --backend atb: hunt drives the torch and vllm backends only")
    assert len(refused.splitlines()) == 1 and not (workdir / "x").exists()
    assert (
        main(["hunt", "--golden", "python no_such.py", "--my", "python infer.py", "-o", "broken", "-l", "warning"]) == 1
    )
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert error[0].startswith("llmcheck: error: broken/1_steps/golden.log: 'llmcheck dump --backend torch")
    assert "failed with exit code 2" in error[0]


def _token_dump(folder: Path, tokens_by_step: list[list[int]]) -> Path:
    import torch

    from llmcheck.core.capture.statistics import tensor_stats
    from llmcheck.core.dumps.store import DumpWriter
    from llmcheck.core.records import RecordKey, TensorRecord

    with DumpWriter(folder, "test") as writer:
        for step, tokens in enumerate(tokens_by_step):
            tensor = torch.tensor([tokens])
            key = RecordKey(name="root", io="input", position="input_ids", step=step, moment="before")
            record = TensorRecord(
                key=key, dtype="int64", shape=tuple(tensor.shape), order=step, stats=tensor_stats(tensor)
            )
            writer.add(record, None)
    return writer.path


def test_other_tokens_are_found_at_the_first_decode_step_fed_another_token(tmp_path: Path) -> None:
    from llmcheck.core.hunt.command import first_moved_record, first_token_divergence

    golden = _token_dump(tmp_path / "golden", [[1, 7, 42, 9], [34], [63]])
    same = _token_dump(tmp_path / "same", [[1, 7, 42, 9], [34], [63]])
    other = _token_dump(tmp_path / "other", [[1, 7, 42, 9], [34], [151]])
    assert first_token_divergence(golden, same) is None
    assert first_token_divergence(golden, other) == 2
    assert first_moved_record(golden, same) is None
    assert first_moved_record(golden, other) == (
        "root step 2 input.input_ids (before): l2norm 63.0, mean 63.0 vs l2norm 151.0, mean 151.0"
    )


def test_the_block_level_is_the_first_depth_that_splits_the_model_and_a_block_opens_whole() -> None:
    from llmcheck.core.hunt.command import block_depth, module_depth, selection_ids

    names = ["root", "model", "lm_head", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb"]
    layers = [f"model.layers.{index}" for index in range(30)]
    assert module_depth("root") == 0 and module_depth("model.layers.3") == 3
    assert block_depth(names + layers + [f"{layer}.mlp" for layer in layers]) == 3
    assert block_depth(["root", "model"]) == 1
    ids = {
        "root": "",
        "model": "0",
        "model.layers.1": "0_1_1",
        "model.layers.1.mlp": "0_1_1_3",
        "model.layers.0": "0_1_0",
    }
    assert selection_ids(ids, "model.layers.1", ["model.layers.0"], subtree=True) == ["0_1_1", "0_1_1_3", "0_1_0"]
    assert selection_ids(ids, "model", ["root"], subtree=False) == ["0"]


def _hunt_cost_program(new_tokens: int) -> str:
    """Return benchmarks/hunt_cost.py's program (SmolLM2, fp32 golden, bf16 with a layer-15 epsilon defect)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "hunt_cost.py"
    spec = importlib.util.spec_from_file_location("hunt_cost", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.PROGRAM.format(threads=1, tokens=new_tokens))


@pytest.mark.slow
def test_on_smollm2_hunt_names_what_a_full_dump_with_its_twin_names_and_goes_on_to_the_operator(
    tmp_path: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "infer.py").write_text(_hunt_cost_program(new_tokens=4))
    monkeypatch.chdir(tmp_path)
    golden, my = "python infer.py", "python infer.py --bf16"
    assert main(["hunt", "--golden", golden, "--my", my, "-o", "hunt", "-l", "warning"]) == 3
    path = json.loads((tmp_path / "hunt" / "hunt.json").read_text())["path"]

    for name, program, extra in (
        ("full_golden", golden, []),
        ("full_my", my, []),
        ("full_twin", golden, ["--as-dtype", "bf16"]),
    ):
        dump = ["dump", "--backend", "torch", "-o", name, "-er", "all", "-l", "warning", *extra, "--exec", program]
        assert main(dump) == 0
    compare = ["compare", "-gp", "full_golden", "-mp", "full_my", "--noise-path", "full_twin", "-o", "full_report"]
    assert main([*compare, "-l", "warning"]) == 3
    full = json.loads((tmp_path / "full_report" / "summary.json").read_text())["culprit"]
    assert (path["step"], path["module"]) == (full["step"], full["name"])
    assert path["module"] == "model.layers.15.post_attention_layernorm" and path["block"] == "model.layers.15"
    assert path["operator"] == "model.layers.15.post_attention_layernorm/aten.add.Tensor"
    assert path["opcheck"].startswith("PASS")


def test_a_hunt_stopped_by_sigterm_stops_its_child_and_the_program_in_it(workdir: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    argv = [sys.executable, "-m", "llmcheck.core.cli", "hunt", "--golden", "python infer.py", "--my", "python infer.py"]
    hunt = subprocess.Popen(
        [*argv, "-o", "stopped", "-l", "warning"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = workdir / "stopped" / "1_steps" / "golden"
    while hunt.poll() is None and not any(started.glob("llmcheck_dump_*")):  # the program is capturing
        time.sleep(0.05)
    hunt.send_signal(signal.SIGTERM)
    _, err = hunt.communicate(timeout=120)
    assert hunt.returncode == 128 + signal.SIGTERM, err
    assert (
        err.strip().splitlines()[-1]
        == "llmcheck: error: terminated (SIGTERM); the processes it started were stopped first"
    )
    (dump,) = started.glob("llmcheck_dump_*")
    assert read_dump(dump).cut is not None  # dump passed the signal on to the program and marked its dump cut
    assert not (workdir / "stopped" / "1_steps" / "phase.json").exists()


def _named_dump(folder: Path, names: list[str], size: int) -> Path:
    import torch

    from llmcheck.core.capture.statistics import tensor_stats
    from llmcheck.core.dumps.store import DumpWriter
    from llmcheck.core.records import RecordKey, TensorRecord

    with DumpWriter(folder, "test") as writer:
        for order, name in enumerate(names):
            tensor = torch.full((size,), float(order + 1))
            record = TensorRecord(
                key=RecordKey(name=name), dtype="float32", shape=(size,), order=order, stats=tensor_stats(tensor)
            )
            writer.add(record, tensor)
    return writer.path


def test_a_phase_whose_compare_pairs_nothing_says_what_each_dump_held(tmp_path: Path) -> None:
    from llmcheck.core.errors import LlmcheckError
    from llmcheck.core.hunt.command import Hunt

    # two programs that recorded other tensors (another model, another selection): compare has no pair to judge
    golden = _named_dump(tmp_path / "golden", ["model.layers.0", "model.layers.1", "lm_head"], 4)
    my = _named_dump(tmp_path / "my", ["decoder.block.0", "decoder.block.1"], 6)
    hunt = Hunt("python golden.py", "python my.py", tmp_path / "hunt")
    with pytest.raises(LlmcheckError) as raised:
        hunt.compare(golden, my, tmp_path / "hunt" / "report", None, page=False)
    line = raised.value.one_line()
    assert line.startswith(f"{tmp_path / 'hunt' / 'report.log'}: the compare paired none of the 3 golden records ")
    assert f"with the 2 my records of {golden.parent} and {my.parent}" in line
    # compare's own account stays in its log, and its reports were written
    assert "no pairs: no pairing rule matched" in (tmp_path / "hunt" / "report.log").read_text()
    assert (tmp_path / "hunt" / "report" / "summary.json").is_file()
