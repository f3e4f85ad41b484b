"""``llmcheck dump --as-dtype``: the unchanged golden program records its own noise twin, and compare says how.

The golden program below is a real one (a seeded Llama, HF ``generate``, numpy on the
logits it gets back); the my-run is the same model cast by hand, as a port would.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from llmcheck import DumpConfig, read_dump, register_hook
from llmcheck.bundled_model import random_llama
from llmcheck.core.cli import main
from llmcheck.core.compare import compare_dumps
from llmcheck.core.dumps.store import find_dumps
from llmcheck.core.plugins import get_plugins
from llmcheck.core.reporting.report import twin_cast_line, twin_hint
from llmcheck.plugin_api import PARAMETER_DIGESTS_ATTR, hookimpl
from llmcheck.plugins.torch_hooks.twin_command import capture_flags

PROMPT = [[1, 7, 42, 9, 100, 3]]
GOLDEN_PROGRAM = textwrap.dedent(f"""
    import torch
    from llmcheck.bundled_model import random_llama

    torch.set_num_threads(1)
    model = random_llama(seed=0)
    with torch.no_grad():
        tokens = model.generate(torch.tensor({PROMPT}), max_new_tokens=2, do_sample=False)
        logits = model(tokens).logits
    print("logits", logits.dtype, int(logits[0, -1].numpy().argmax()))  # numpy: no bfloat16 there
    print("tokens", tokens.tolist())
""")


def _llmcheck(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmcheck.core.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _one_dump(folder: Path) -> Path:
    (dump,) = find_dumps(folder)
    return dump


def _generate(model: torch.nn.Module, dump_path: Path, **config: object) -> list[list[int]]:
    """Return the tokens the program's generate makes, captured at steps 0-1 into ``dump_path``."""
    with register_hook(model, DumpConfig(dump_path=dump_path, token_range=[0, 1], **config)), torch.no_grad():
        return model.generate(torch.tensor(PROMPT), max_new_tokens=2, do_sample=False).tolist()


def _loaded_at(dtype: torch.dtype, folder: Path) -> torch.nn.Module:
    """Return the golden model as a program written for ``dtype`` loads it: ``from_pretrained(dtype=...)``.

    The loader keeps what the model computes itself (a rotary embedding's ``inv_freq``) in
    fp32; the capture's cast does the same.
    """
    from transformers import AutoModelForCausalLM

    random_llama(seed=0).save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a folder holding the golden program's fp32 run (``golden``) and the port: it cast by hand to bf16 (``my``)."""
    folder = tmp_path_factory.mktemp("in_process")
    _generate(random_llama(seed=0), folder / "golden")
    tokens = _generate(_loaded_at(torch.bfloat16, folder / "checkpoint"), folder / "my")
    (folder / "my_tokens.json").write_text(json.dumps(tokens))
    return folder


@pytest.fixture(scope="module")
def runs(in_process: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a folder holding golden.py and its fp32 dump by ``llmcheck dump --exec`` (``golden``), steps 0-1."""
    folder = tmp_path_factory.mktemp("as_dtype")
    (folder / "golden.py").write_text(GOLDEN_PROGRAM)
    golden = _llmcheck(
        "dump", "--backend", "torch", "-o", "golden", "-er", "0,1", "--exec", "python golden.py", cwd=folder
    )
    assert golden.returncode == 0, golden.stderr
    return folder


@pytest.mark.slow
def test_dump_as_dtype_bf16_records_the_golden_program_bit_for_bit_as_a_hand_cast_bf16_run(
    runs: Path, in_process: Path
) -> None:
    twin = _llmcheck(
        "dump", "--backend", "torch", "--as-dtype", "bf16", "-o", "twin", "-er", "0,1", "--exec", "python golden.py",
        cwd=runs,
    )  # fmt: skip
    assert twin.returncode == 0, twin.stderr
    # the program ran unchanged: it got float32 logits back (numpy took them) and chose the bf16 run's tokens
    assert "logits torch.float32" in twin.stdout
    assert f"tokens {json.loads((in_process / 'my_tokens.json').read_text())}" in twin.stdout
    twin_dump, hand_dump = read_dump(_one_dump(runs / "twin")), read_dump(_one_dump(in_process / "my"))
    assert [r.key for r in twin_dump.records] == [r.key for r in hand_dump.records]
    assert {r.dtype for r in twin_dump.records} == {"bfloat16", "int64"}
    for cast, hand in zip(twin_dump.records, hand_dump.records, strict=True):
        assert cast.dtype == hand.dtype, cast.key.label()
        assert torch.equal(cast.data.load(), hand.data.load()), cast.key.label()
        assert cast.attrs.get(PARAMETER_DIGESTS_ATTR) == hand.attrs.get(PARAMETER_DIGESTS_ATTR), cast.key.label()
    assert sum(PARAMETER_DIGESTS_ATTR in r.attrs for r in twin_dump.records) > 10  # the digests were compared
    assert twin_dump.manifest["as_dtype"] == {
        "to": "bfloat16",
        "from": {"float32": 21},  # 21 parameters; the rotary buffers the model computes itself stay fp32
        "outputs_returned_as": "float32",
    }


@pytest.mark.slow
def test_compare_of_fp32_golden_and_bf16_run_prints_the_twin_command_and_that_command_records_the_twin(
    runs: Path, in_process: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(runs)
    my = str(in_process / "my")
    main(["compare", "-gp", "golden", "-mp", my, "-o", "report", "-j", "1"])
    printed = capsys.readouterr().out
    recorded = read_dump(_one_dump(runs / "golden")).manifest["command_line"]
    program = shlex.join(recorded)
    command = f'llmcheck dump --backend torch --as-dtype bf16 -er 0,1 -o golden_twin --exec "{program}"'
    assert (
        "hint: the runs differ in precision (fp32 golden, bf16 my): a defect smaller than bf16 rounding noise "
        "passes unseen here; record the golden program at bf16, its noise twin, and add --noise-path golden_twin "
        f"to this compare:\n  {command}\n"
    ) in printed

    # the printed command runs as it is, and its twin covers every golden row
    ran = _llmcheck(*shlex.split(command)[1:], cwd=runs)
    assert ran.returncode == 0, ran.stderr
    main(["compare", "-gp", "golden", "-mp", my, "--noise-path", "golden_twin", "-o", "report", "-j", "1"])
    printed = capsys.readouterr().out
    assert "hint:" not in printed
    assert (
        f"noise twin golden_twin/{_one_dump(runs / 'golden_twin').name}: the golden program with its model cast to bfloat16 as it "
        "ran (21 float32 parameters and buffers)"
    ) in printed
    noise = json.loads((runs / "report" / "summary.json").read_text())["noise"]
    assert noise["rows_without_twin"] == 0
    assert noise["as_dtype"] == {"to": "bfloat16", "from": {"float32": 21}, "outputs_returned_as": "float32"}


def test_a_twin_cast_to_another_precision_than_the_my_run_is_named(in_process: Path, tmp_path: Path) -> None:
    _generate(random_llama(seed=0), tmp_path, as_dtype="fp16")
    golden, my, fp16_twin = (
        read_dump(_one_dump(folder)) for folder in (in_process / "golden", in_process / "my", tmp_path)
    )
    result = compare_dumps(golden, my, noise=fp16_twin, workers=1)
    assert twin_cast_line(result).endswith(
        "(21 float32 parameters and buffers); but the my-run is bf16: this twin shows fp16 noise (record it again at bf16)"
    )


class _DictModel(torch.nn.Module):
    """A model whose forward takes a dict and a keyword tensor and returns a tuple and a dict, as real ones do."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, batch: dict[str, torch.Tensor], *, scale: torch.Tensor) -> tuple[torch.Tensor, dict]:
        hidden = self.linear(batch["x"]) * scale
        return hidden, {"doubled": hidden * 2, "argmax": hidden.argmax(-1)}


def test_as_dtype_casts_the_arguments_and_hands_floating_results_back_without_changing_the_callers_objects(
    tmp_path: Path,
) -> None:
    model = _DictModel()
    batch = {"x": torch.randn(2, 8)}
    scale = torch.tensor(0.5, dtype=torch.float64)
    expected = _DictModel().to(torch.bfloat16)(
        {"x": batch["x"].to(torch.bfloat16)}, scale=scale.to(torch.bfloat16)
    )  # the same model and inputs cast by hand
    with register_hook(model, DumpConfig(dump_path=tmp_path, as_dtype="torch.bfloat16")) as capture:
        assert model.linear.weight.dtype == torch.bfloat16  # cast when the capture starts, before the first forward
        hidden, extra = model(batch, scale=scale)
    assert batch["x"].dtype == torch.float32 and scale.dtype == torch.float64  # the caller's objects are untouched
    assert (hidden.dtype, extra["doubled"].dtype, extra["argmax"].dtype) == (torch.float32, torch.float32, torch.int64)
    assert torch.equal(hidden, expected[0].float()) and torch.equal(extra["argmax"], expected[1]["argmax"])
    dump = read_dump(capture.path)
    recorded = {r.key.label(): r for r in dump.records if r.key.name == "root"}
    assert recorded["root step 0 input.0.x (before)"].dtype == "bfloat16"
    assert recorded["root step 0 input.scale (before)"].dtype == "bfloat16"
    assert recorded["root step 0 output.1.doubled"].dtype == "bfloat16"  # as the model computed it
    assert dump.manifest["as_dtype"] == {
        "to": "bfloat16",
        "from": {"float32": 2},
        "outputs_returned_as": "float32",
    }
    assert model.linear.weight.dtype == torch.bfloat16  # the cast is not undone: that would need a copy


def test_a_cast_up_leaves_the_results_in_the_cast_dtype_rather_than_round_them(tmp_path: Path) -> None:
    model = _DictModel()
    with register_hook(model, DumpConfig(dump_path=tmp_path, as_dtype="fp64")) as capture:
        hidden, _ = model({"x": torch.randn(2, 8)}, scale=torch.tensor(0.5))
    assert hidden.dtype == torch.float64  # rounding to float32 would change what a program feeds back in
    assert read_dump(capture.path).manifest["as_dtype"]["outputs_returned_as"] == "float64"


def test_as_dtype_at_op_level_records_the_ops_of_a_hand_cast_run_bit_for_bit(tmp_path: Path) -> None:
    """The casts of arguments and results happen outside the step: no ``aten._to_copy`` of llmcheck's own is recorded."""
    prompt = torch.tensor(PROMPT)
    dumps = []
    hand_cast = _loaded_at(torch.bfloat16, tmp_path / "checkpoint")
    for model, as_dtype in ((random_llama(seed=0), "bf16"), (hand_cast, None)):
        config = DumpConfig(dump_path=tmp_path / str(as_dtype), mode=["module", "op"], as_dtype=as_dtype)
        with register_hook(model, config) as capture, torch.no_grad():
            model(prompt)
        dumps.append(read_dump(capture.path))
    cast, hand = dumps
    assert [r.key for r in cast.records] == [r.key for r in hand.records] and len(cast.records) > 400
    assert all(torch.equal(a.data.load(), b.data.load()) for a, b in zip(cast.records, hand.records, strict=True))
    assert [r.attrs.get("parameter") for r in cast.records] == [r.attrs.get("parameter") for r in hand.records]


@pytest.mark.parametrize(
    ("given", "meant"),
    [("bf16", "bfloat16"), ("BF16", "bfloat16"), ("half", "float16"), (torch.float64, "float64"), ("fp32", "float32")],
)
def test_as_dtype_takes_the_short_names_and_torchs_own(given: object, meant: str) -> None:
    assert DumpConfig(as_dtype=given).as_dtype == meant


def test_as_dtype_flag_refuses_what_it_cannot_cast_to_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dump", "--backend", "torch", "--as-dtype", "int8", "-o", str(tmp_path), "--exec", "true"]) == 2
    assert capsys.readouterr().err == (
        "llmcheck: error: --as-dtype: unknown floating dtype 'int8' "
        "(give bf16, fp16, fp32 or fp64, or torch's name: bfloat16, float16, float32, float64)\n"
    )


def test_the_twin_command_captures_as_the_golden_was() -> None:
    config = DumpConfig(token_range=[0, 1, 2, 5], mode=["module", "op"], statistics_only=True, module_ids=["0_1"])
    assert capture_flags(config.as_json()) == ["-er", "0,2,5,5", "--type", "tensor", "op", "-sd", "-ids", "0_1"]
    assert capture_flags(DumpConfig(token_range=None, mode=[]).as_json()) == ["-er", "all", "--type", "model"]
    assert capture_flags(DumpConfig().as_json()) == []


class _OwnRunner:
    """A third-party plugin that records twins its own way, answering before the built-in torch one."""

    @hookimpl(tryfirst=True)
    def llmcheck_noise_twin_command(self, golden, precision, output_dir):  # type: ignore[no-untyped-def]
        return f"myrunner --precision {precision} -o {output_dir}" if golden.manifest.get("pid") else None


def test_hook_llmcheck_noise_twin_command(in_process: Path, llmcheck_plugins) -> None:  # type: ignore[no-untyped-def]
    # the golden was written in-process: it names no program to run again
    golden, my = (read_dump(_one_dump(in_process / side)) for side in ("golden", "my"))
    result = compare_dumps(golden, my, workers=1)
    assert twin_hint(result, get_plugins().noise_twin_command).endswith(
        f'-er 0,1 -o {in_process / "golden_twin"} --exec "python <your golden program>"   # the golden dump was '
        'written in-process and names no program: put yours in; in Python, DumpConfig(as_dtype="bf16") does the same'
    )
    llmcheck_plugins(_OwnRunner())
    assert twin_hint(result, get_plugins().noise_twin_command).endswith(
        f"to this compare:\n  myrunner --precision bf16 -o {in_process / 'golden_twin'}"
    )


SMOLLM2_PROGRAM = textwrap.dedent("""
    import torch
    from llmcheck.bundled_model import load_smollm2

    torch.set_num_threads(1)
    model, tokenizer = load_smollm2()
    ids = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    print("next", repr(tokenizer.decode([int(logits[0, -1].numpy().argmax())])))
""")


@pytest.mark.slow
@pytest.mark.parametrize(("flag", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_the_real_smollm2_program_under_as_dtype_records_what_a_hand_cast_run_records(
    smollm2, tmp_path: Path, flag: str, dtype: torch.dtype
) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "golden.py").write_text(SMOLLM2_PROGRAM)
    twin = _llmcheck(
        "dump", "--backend", "torch", "--as-dtype", flag, "-o", "twin", "--exec", "python golden.py", cwd=tmp_path
    )
    assert twin.returncode == 0, twin.stderr
    from llmcheck.bundled_model import load_smollm2

    _, tokenizer = smollm2
    hand_model, _ = load_smollm2(dtype=dtype)  # as a program written for that dtype loads it
    ids = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    with register_hook(hand_model, DumpConfig(dump_path=tmp_path / "hand")) as capture, torch.no_grad():
        hand_logits = hand_model(ids).logits
    assert f"next {tokenizer.decode([int(hand_logits[0, -1].float().argmax())])!r}" in twin.stdout
    cast, hand = read_dump(_one_dump(tmp_path / "twin")), read_dump(capture.path)
    assert [r.key for r in cast.records] == [r.key for r in hand.records] and len(cast.records) > 900
    for a, b in zip(cast.records, hand.records, strict=True):
        assert torch.equal(a.data.load(), b.data.load()), a.key.label()
        assert a.attrs.get(PARAMETER_DIGESTS_ATTR) == b.attrs.get(PARAMETER_DIGESTS_ATTR), a.key.label()
    # 272 parameters (lm_head tied); the 2 rotary inv_freq buffers the model computes itself stay fp32
    assert cast.manifest["as_dtype"]["from"] == {"float32": 272}
