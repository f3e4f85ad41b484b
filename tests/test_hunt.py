"""``llmcheck hunt``: from two programs to the culprit module and operator, phase by phase, resumable."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from llmcheck.core.cli import main
from llmcheck.core.store import read_dump

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
    if "--dropout" in sys.argv:  # left in train mode: attention dropout moves every run
        model.train()
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # random_llama seeded torch
        for layer in model.model.layers:
            layer.self_attn.attention_dropout = 0.5
    with torch.no_grad():
        print(model.generate(torch.tensor([[1, 7, 42, 9]]), max_new_tokens=2, do_sample=False))
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
    assert list(phases) == ["1_determinism", "2_statistics", "3_module", "4_operator", "5_opcheck"]
    assert phases["3_module"]["confirmed"] is True
    assert all(phase["bytes_written"] > 0 for phase in phases.values())
    assert phases["1_determinism"]["runs"][0]["command"].startswith("llmcheck dump --backend torch -sd -er all")
    # full tensors of the culprit's step only, and of its subtree and its inputs' producers only
    records = read_dump(Path(phases["3_module"]["my_dump"])).records
    assert {record.key.step for record in records} == {0}
    kept = {record.key.name for record in records}
    assert "model.layers.1.post_attention_layernorm" in kept
    assert not any(name.startswith(("model.layers.0", "model.layers.2", "lm_head")) for name in kept)


def test_hunt_resumes_after_the_determinism_phase_and_fresh_redoes_it(
    workdir: Path, finished_hunt: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = workdir / "hunt_out"
    marker = out / "1_determinism" / "phase.json"
    written_at = marker.stat().st_mtime_ns
    for later in ("2_statistics", "3_module", "4_operator", "5_opcheck"):
        shutil.rmtree(out / later)
    assert _hunt(workdir, "hunt_out", "python infer.py --defect", monkeypatch=monkeypatch) == 3
    resumed = json.loads((out / "hunt.json").read_text())
    assert marker.stat().st_mtime_ns == written_at
    assert resumed["phases"]["1_determinism"]["reused"] is True
    assert resumed["phases"]["2_statistics"]["reused"] is False
    assert resumed["path"] == finished_hunt["path"]

    assert _hunt(workdir, "hunt_out", "python infer.py --defect", "--fresh", monkeypatch=monkeypatch) == 3
    assert marker.stat().st_mtime_ns != written_at
    assert json.loads((out / "hunt.json").read_text())["phases"]["1_determinism"]["reused"] is False


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
    assert "the golden program is not deterministic: two runs of it differ first at model.layers.0" in stopped[0]
    assert not (workdir / "moving" / "1_determinism" / "phase.json").exists()
    assert not (workdir / "moving" / "2_statistics").exists()


def test_hunt_bad_input_is_one_error_line(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(workdir)
    (workdir / "a_file").write_text("")
    assert main(["hunt", "--golden", "python infer.py", "--my", "python infer.py", "-o", "a_file"]) == 2
    assert capsys.readouterr().err.strip() == (
        "llmcheck: error: a_file: is a file, not a folder (give -o a folder for the hunt's phases)"
    )
    assert (
        main(["hunt", "--golden", "python no_such.py", "--my", "python infer.py", "-o", "broken", "-l", "warning"]) == 1
    )
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert error[0].startswith("llmcheck: error: broken/1_determinism/golden.log: 'llmcheck dump --backend torch")
    assert "failed with exit code 2" in error[0]


def _token_dump(folder: Path, tokens_by_step: list[list[int]]) -> Path:
    import torch

    from llmcheck.core.records import RecordKey, TensorRecord
    from llmcheck.core.statistics import tensor_stats
    from llmcheck.core.store import DumpWriter

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
    from llmcheck.core.hunt import first_moved_record, first_token_divergence

    golden = _token_dump(tmp_path / "golden", [[1, 7, 42, 9], [34], [63]])
    same = _token_dump(tmp_path / "same", [[1, 7, 42, 9], [34], [63]])
    other = _token_dump(tmp_path / "other", [[1, 7, 42, 9], [34], [151]])
    assert first_token_divergence(golden, same) is None
    assert first_token_divergence(golden, other) == 2
    assert first_moved_record(golden, same) is None
    assert first_moved_record(golden, other) == (
        "root step 2 input.input_ids (before): l2norm 63.0, mean 63.0 vs l2norm 151.0, mean 151.0"
    )
