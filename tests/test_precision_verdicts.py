"""Verdicts in reduced precision: a defect the dtype table passes is named, clean low-precision runs never fail.

Real seeded transformers models, captured with llmcheck's own torch capture and compared
in-process, as a user's script would.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from compare_runs import capture_generate
from llmcheck import DumpConfig, register_hook
from llmcheck.core.compare import compare_dumps
from llmcheck.core.plugins import get_plugins

torch.set_num_threads(1)

DEFECTIVE = "model.layers.2.mlp.down_proj"


def _llama(attention: str = "sdpa") -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=128,
        attn_implementation=attention,
    )
    model = LlamaForCausalLM(config).eval()
    for parameter in model.parameters():  # trained-model scale: an O(1) residual stream
        if parameter.dim() == 2:
            torch.nn.init.normal_(parameter, std=1 / math.sqrt(parameter.shape[1]))
    return model


IDS = torch.randint(0, 512, (1, 32), generator=torch.Generator().manual_seed(0))


def _dump(model: torch.nn.Module, folder: Path, **options):
    with register_hook(model, DumpConfig(dump_path=str(folder), token_range=[0], tensor_part=2, **options)) as handle:
        with torch.no_grad():
            model(IDS)
    return get_plugins().load_tensors(Path(handle.path))


def _load(folder: Path):
    return get_plugins().load_tensors(folder)


def _scaled(model: torch.nn.Module, factor: float = 1.05) -> torch.nn.Module:
    defective = copy.deepcopy(model)
    with torch.no_grad():
        dict(defective.named_modules())[DEFECTIVE].weight.mul_(factor)
    return defective


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return _llama()


@pytest.fixture(scope="module")
def fp32_golden(llama, tmp_path_factory):
    return _dump(llama, tmp_path_factory.mktemp("golden"))


def _introduced(result) -> list[str]:
    return [row.golden.key.label() for row in result.rows if row.attribution == "introduced"]


def test_bf16_weight_five_percent_off_is_named_although_the_bf16_table_passes_it(llama, fp32_golden, tmp_path):
    # without the weight digests: the activations alone must tell (a defect in code, not in weights, looks the same)
    my = _dump(_scaled(llama).to(torch.bfloat16), tmp_path, weight_digests=False)
    result = compare_dumps(fp32_golden, my, workers=1)
    culprit = result.first_introduced
    assert culprit is not None and culprit.golden.key.name == DEFECTIVE and culprit.golden.key.io == "output"
    # the table alone would pass it: bf16 fails at 0.1, the row is at about 0.05
    assert culprit.metrics["relative_euclidean_distance"].verdict != "fail"
    assert culprit.deciding_metric == "error_vs_expected" and culprit.verdict == "fail"
    assert culprit.growth > 2 * culprit.sibling_growth[1] and culprit.sibling_count == 5
    assert "error grows" in culprit.evidence and "in the other 5 repeats" in culprit.evidence
    assert culprit.structure == "model.layers.{i}.mlp.down_proj" and culprit.layer_index == 2
    # one defect, one introduced row; its mlp only encloses it
    assert _introduced(result) == [culprit.golden.key.label()]
    mlp = next(
        row for row in result.rows if row.golden.key.name == "model.layers.2.mlp" and row.golden.key.io == "output"
    )
    assert mlp.attribution in ("encloses", "")
    described = result.summary()["first_introduced"]
    assert described["growth"] == pytest.approx(culprit.growth, rel=1e-5) and described["evidence"] == culprit.evidence


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_clean_low_precision_run_never_fails_and_names_no_culprit(llama, fp32_golden, tmp_path, dtype):
    result = compare_dumps(fp32_golden, _dump(copy.deepcopy(llama).to(dtype), tmp_path), workers=1)
    assert result.counts()["failures"] == 0 and result.first_introduced is None
    assert result.counts()["warnings"] > 0 or dtype == torch.float16  # the noise is there, and judged as noise


def test_weight_digests_name_a_weight_that_is_not_the_golden_rounded_to_bf16(llama, fp32_golden, tmp_path):
    defective = copy.deepcopy(llama)
    with torch.no_grad():  # a 0.4 % calibration error: far under bf16's activation noise, never an honest rounding
        dict(defective.named_modules())[DEFECTIVE].weight.mul_(1.004)
    result = compare_dumps(fp32_golden, _dump(defective.to(torch.bfloat16), tmp_path), workers=1)
    culprit = result.first_introduced
    assert culprit is not None and (culprit.golden.key.name, culprit.golden.key.io) == (DEFECTIVE, "output")
    assert culprit.deciding_metric == "weights_beyond_rounding" and culprit.verdict == "fail"
    assert culprit.evidence == (
        f"weights differ from golden beyond bfloat16 rounding: {DEFECTIVE}.weight (the digests of their values differ)"
    )
    assert _introduced(result) == [culprit.golden.key.label()]


def test_weight_digests_are_taken_at_every_dtype_the_other_run_may_use(fp32_golden, llama, tmp_path):
    first_norm = next(
        r for r in fp32_golden.records if r.key.name == "model.layers.0.input_layernorm" and r.key.io == "output"
    )
    golden_entry = first_norm.attrs["parameter_digests"]["weight"]
    assert golden_entry["dtype"] == "float32" and set(golden_entry["rounded"]) == {"float32", "float16", "bfloat16"}
    my = _dump(copy.deepcopy(llama).to(torch.bfloat16), tmp_path)
    my_norm = next(r for r in my.records if r.key.name == "model.layers.0.input_layernorm" and r.key.io == "output")
    my_entry = my_norm.attrs["parameter_digests"]["weight"]
    assert my_entry["dtype"] == "bfloat16" and my_entry["rounded"] == {"bfloat16": golden_entry["rounded"]["bfloat16"]}
    # only the first output record of a module's first call carries them, and modules without own parameters none
    assert (
        sum(
            "parameter_digests" in r.attrs
            for r in fp32_golden.records
            if r.key.name == "model.layers.0.input_layernorm"
        )
        == 1
    )
    assert not any("parameter_digests" in r.attrs for r in fp32_golden.records if r.key.name == "model.layers.0.mlp")


def test_bf16_against_bf16_golden_names_the_first_row_that_differs_behind_bit_exact_inputs(llama, tmp_path):
    bf16 = copy.deepcopy(llama).to(torch.bfloat16)
    golden = _dump(bf16, tmp_path / "golden")
    result = compare_dumps(golden, _dump(_scaled(bf16), tmp_path / "my", weight_digests=False), workers=1)
    culprit = result.first_introduced
    assert culprit is not None and culprit.golden.key.name == DEFECTIVE
    assert culprit.feeder_error == 0.0 and culprit.deciding_metric == "error_with_exact_inputs"
    assert all(row.error in (0.0, None) for row in result.rows if row.golden.order < culprit.golden.order)


def test_statistics_only_capture_names_the_defect_in_bf16(llama, tmp_path):
    golden = _dump(llama, tmp_path / "golden", statistics_only=True)
    my = _dump(_scaled(llama).to(torch.bfloat16), tmp_path / "my", statistics_only=True)
    result = compare_dumps(golden, my, workers=1)
    assert result.first_introduced is not None and result.first_introduced.golden.key.name == DEFECTIVE
    clean = compare_dumps(
        golden, _dump(copy.deepcopy(llama).to(torch.bfloat16), tmp_path / "clean", statistics_only=True), workers=1
    )
    assert clean.counts()["failures"] == 0


def test_noise_twin_finds_a_defect_smaller_than_the_rounding_noise(llama, fp32_golden, tmp_path):
    bf16 = copy.deepcopy(llama).to(torch.bfloat16)
    twin = _dump(bf16, tmp_path / "twin")
    norm = dict(bf16.named_modules())["model.layers.3.post_attention_layernorm"]
    norm.variance_epsilon = 1e-2  # the demo's defect: a hard-coded epsilon
    my = _dump(bf16, tmp_path / "my")
    without = compare_dumps(fp32_golden, my, workers=1)
    with_twin = compare_dumps(fp32_golden, my, workers=1, noise=twin)
    culprit = with_twin.first_introduced
    assert culprit is not None and culprit.golden.key.name == "model.layers.3.post_attention_layernorm"
    assert culprit.deciding_metric == "differs_from_noise_twin" and culprit.noise_error is not None
    assert "noise twin" in culprit.evidence
    assert with_twin.summary()["noise"]["records"] == len(twin.records)
    # without the twin the same row sits inside the bf16 noise
    same_row = next(row for row in without.rows if row.golden.key == culprit.golden.key)
    assert same_row.verdict != "fail"


def test_attention_kernel_swap_sdpa_to_eager_gives_no_failure_at_op_level(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    def tiny(attention: str) -> torch.nn.Module:
        torch.manual_seed(0)
        config = LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
            attn_implementation=attention,
        )
        return LlamaForCausalLM(config).eval()

    ids = IDS[:, :16] % 256

    def dump(model: torch.nn.Module, folder: Path):
        with register_hook(model, DumpConfig(dump_path=str(folder), token_range=[0], mode="op")) as handle:
            with torch.no_grad():
                model(ids)
        return get_plugins().load_tensors(Path(handle.path))

    result = compare_dumps(dump(tiny("sdpa"), tmp_path / "g"), dump(tiny("eager"), tmp_path / "m"), workers=1)
    counts = result.counts()
    assert counts["failures"] == 0 and counts["errors"] == 0 and counts["pairs"] > 300
    # the flash-attention op has no eager counterpart: it stays unmatched, never paired across layers
    assert any("_scaled_dot_product" in item.record.key.name for item in result.pairing.unmatched_golden)
    assert all(pair.golden.key.name.split("/")[0] == pair.my.key.name.split("/")[0] for pair in result.pairing.pairs)


def test_additive_mask_sentinels_agree_across_dtypes_and_a_lost_mask_does_not(tmp_path):
    from llmcheck.core.measuring.pair_chunk import Workspace
    from llmcheck.core.measuring.pair_measure import PairJob, measure_pair
    from llmcheck.core.records import TensorData
    from llmcheck.plugins.metrics import builtin_metric_specs

    def data(tensor: torch.Tensor, name: str) -> TensorData:
        path = tmp_path / name
        raw = (
            tensor.contiguous().view(torch.uint8).numpy().tobytes()
            if tensor.dtype == torch.bfloat16
            else tensor.numpy().tobytes()
        )
        path.write_bytes(raw)
        return TensorData(
            dtype=str(tensor.dtype).removeprefix("torch."), shape=tuple(tensor.shape), path=path, nbytes=len(raw)
        )

    scores = torch.tensor([[0.5, -1.0, 2.0, 0.25]])
    golden = torch.where(torch.tensor([[True, True, False, False]]), scores, torch.finfo(torch.float32).min)
    for dtype in (torch.float16, torch.bfloat16):
        mask = torch.where(torch.tensor([[True, True, False, False]]), scores.to(dtype), torch.finfo(dtype).min)
        measured = measure_pair(
            PairJob(0, data(golden, "g"), data(mask, f"m{dtype}")), builtin_metric_specs(), Workspace(64)
        )
        assert measured.masked == 2 and measured.nonfinite_mismatch == 0
        assert measured.values["relative_euclidean_distance"] == 0.0
    lost = measure_pair(
        PairJob(0, data(golden, "g"), data(torch.full((1, 4), -10.0, dtype=torch.float16), "lost")),
        builtin_metric_specs(),
        Workspace(64),
    )
    assert lost.values["max_absolute_error"] > 1e30  # an fp32 mask value against -10 is measured as the number it is
    overflow = measure_pair(
        PairJob(0, data(torch.tensor([70000.0]), "big"), data(torch.tensor([math.inf], dtype=torch.float16), "inf")),
        builtin_metric_specs(),
        Workspace(64),
    )
    assert overflow.nonfinite_mismatch == 1  # an fp16 overflow is never mistaken for a mask
    assert np.isfinite(overflow.golden_stats.max)


def _run_of(dtype: torch.dtype, squares: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """A run whose tensors are mostly ``dtype``, with an RMSNorm's squares and a mask upcast to float32."""
    hidden = torch.linspace(-2.0, 2.0, 64)
    return {
        "hidden": hidden.to(dtype),
        "mlp": (hidden * 3).to(dtype),
        "norm/pow": squares.to(torch.float32),
        "softmax_input": mask.to(torch.float32),
        "out": (hidden / 2).to(dtype),
    }


@pytest.mark.parametrize("statistics_only", [False, True], ids=["tensors", "statistics"])
def test_squares_beyond_fp16_range_in_an_upcast_tensor_are_numbers_not_mask_sentinels(
    make_llmcheck_dump, tmp_path, statistics_only
):
    # SmolLM2's massive activations (653 in layer 3) squared in an RMSNorm upcast to fp32 reach
    # 426 409 inside the fp16 run: past fp16's range, so no fp16 mask value. Taken for the run's
    # "plus infinity", the fp16 run's norm was named where the error is introduced (a NaN/Inf
    # mismatch, with no NaN or Inf anywhere), and two fp16 runs' norms were never judged.
    from llmcheck.core.measuring.sentinels import sentinel_range_in_run

    upcast = sentinel_range_in_run("float32", "float16")
    assert [upcast.holds(abs(value)) for value in (-65504.0, -65504.0 - 300, 426409.0, -3.4e38, math.inf)] == [
        True,
        True,
        False,
        True,
        True,
    ]
    squares = torch.cat([torch.tensor([426347.78125]), torch.linspace(0.0, 40.0, 63)])
    mask = torch.tensor([0.0, -1.5] + [torch.finfo(torch.float16).min] * 62)
    recorded = {"norm/pow", "softmax_input"} if statistics_only else set()

    def dump(name: str, dtype: torch.dtype, squared: torch.Tensor) -> Path:
        return make_llmcheck_dump(tmp_path / name, _run_of(dtype, squared, mask), statistics_only=recorded)

    golden_mask = mask.clone()
    golden_mask[2:] = torch.finfo(torch.float32).min
    golden = make_llmcheck_dump(
        tmp_path / "golden", _run_of(torch.float32, squares, golden_mask), statistics_only=recorded
    )
    fp16_squares = squares.clone()
    fp16_squares[0] = 426409.0  # the fp16 run's rounding of the activation, squared
    clean = compare_dumps(*map(_load, (golden, dump("clean", torch.float16, fp16_squares))), workers=1)
    assert clean.first_introduced is None and clean.counts()["failures"] == 0
    rows = {row.golden.key.name: row for row in clean.rows}
    assert rows["norm/pow"].nonfinite_mismatch == 0 and rows["norm/pow"].verdict == "pass"
    assert "sentinel" in rows["softmax_input"].reason  # the mask still agrees across dtypes
    # two fp16 runs: a defect in the squares past fp16's range is measured, not masked
    fp16_golden = dump("fp16_golden", torch.float16, fp16_squares)
    defective = fp16_squares.clone()
    defective[0] = 600000.0
    result = compare_dumps(*map(_load, (fp16_golden, dump("defective", torch.float16, defective))), workers=1)
    assert result.first_introduced is not None and result.first_introduced.golden.key.name == "norm/pow"
    assert result.first_introduced.nonfinite_mismatch == 0


def test_a_statistics_only_empty_tensor_passes_as_a_measured_one_does(make_llmcheck_dump, tmp_path):
    # An op-level statistics-only forward of SmolLM2 holds 180 empty records (lift_fresh of [], cat
    # of an empty cache): each was an error, "golden has no tensor data", in a clean run.
    tensors = {"empty": torch.empty(0), "cache": torch.empty(1, 0, 8), "x": torch.ones(4)}
    verdicts = []
    for recorded in (set(), {"empty", "cache", "x"}):
        golden = make_llmcheck_dump(tmp_path / f"g{len(recorded)}", tensors, statistics_only=recorded)
        my = make_llmcheck_dump(tmp_path / f"m{len(recorded)}", tensors, statistics_only=recorded)
        verdicts.append([row.verdict for row in compare_dumps(_load(golden), _load(my), workers=1).rows])
        assert verdicts[-1] == ["pass", "pass", "pass"]
    rows = compare_dumps(_load(golden), _load(my), workers=1).rows
    assert [row.reason for row in rows[:2]] == [
        "both tensors are empty (shape [0]): nothing to compare",
        "both tensors are empty (shape [1, 0, 8]): nothing to compare",
    ]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("capture", ["module", "op", "statistics"])
def test_eager_attention_with_finfo_min_mask_gives_no_false_culprit(tmp_path, dtype, capture):
    model = _llama("eager")
    options = {"statistics_only": True} if capture == "statistics" else {"mode": "op"} if capture == "op" else {}
    golden = _dump(model, tmp_path / "golden", **options)
    result = compare_dumps(golden, _dump(copy.deepcopy(model).to(dtype), tmp_path / "my", **options), workers=1)
    assert result.counts()["failures"] == 0, [row.golden.key.label() for row in result.rows if row.verdict == "fail"][
        :5
    ]
    assert result.first_introduced is None


def test_an_op_only_the_my_run_executes_is_named_as_the_suspect(tmp_path):
    model = _llama()
    golden = _dump(model, tmp_path / "golden", mode="op")
    my_model = copy.deepcopy(model)
    mlp = dict(my_model.named_modules())["model.layers.2.mlp"]
    plain_forward = mlp.forward
    mlp.forward = lambda hidden: plain_forward(hidden) * 0.9  # a stray scale in the ported MLP
    result = compare_dumps(golden, _dump(my_model, tmp_path / "my", mode="op"), workers=1)
    suspects = result.summary()["suspects"]
    assert [entry["name"] for entry in suspects["my_only"]][:1] == ["model.layers.2.mlp/aten.mul.Tensor"]
    assert (
        "the my-run executes 1 operation here that the golden run does not: model.layers.2.mlp/aten.mul.Tensor"
        in suspects["sentence"]
    )
    from llmcheck.core.reporting.reporters import write_reports

    html = write_reports(result, tmp_path / "report", get_plugins().reporters())["html"].read_text()
    assert "suspects: the my-run executes 1 operation here that the golden run does not" in html
    assert result.summary()["culprit"]["name"] == "model.layers.2.mlp/aten.mul.Tensor"
    fed_by_stray = [row for row in result.rows if row.attribution == "inherited_from_unmatched"]
    assert fed_by_stray and all("(my-run only)" in " ".join(row.fed_by) for row in fed_by_stray)
    assert result.first_introduced is None  # no pair introduces it: the stray op does, and it is the culprit


def test_op_level_weights_that_differ_beyond_bf16_rounding_are_introduced_where_they_enter(llama, tmp_path):
    golden = _dump(llama, tmp_path / "golden", mode="op")
    clean = compare_dumps(
        golden, _dump(copy.deepcopy(llama).to(torch.bfloat16), tmp_path / "clean", mode="op"), workers=1
    )
    assert clean.counts()["failures"] == 0  # weights rounded to bf16 are not a defect
    assert any(row.golden.attrs.get("parameter") == f"{DEFECTIVE}.weight" for row in clean.rows)
    result = compare_dumps(golden, _dump(_scaled(llama).to(torch.bfloat16), tmp_path / "my", mode="op"), workers=1)
    culprit = result.first_introduced
    assert culprit is not None and culprit.golden.attrs.get("parameter") == f"{DEFECTIVE}.weight"
    assert culprit.deciding_metric == "weights_beyond_rounding"
    assert culprit.evidence.startswith("weights differ from golden beyond bfloat16 rounding")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_eager_attention_with_finfo_min_mask_still_names_a_defect_elsewhere(tmp_path, dtype):
    model = _llama("eager")
    golden = _dump(model, tmp_path / "golden")
    result = compare_dumps(golden, _dump(_scaled(model).to(dtype), tmp_path / "my"), workers=1)
    assert result.first_introduced is not None and result.first_introduced.golden.key.name == DEFECTIVE
    masks = [row for row in result.rows if "attention_mask" in row.golden.key.position]
    assert masks and all(row.verdict == "pass" for row in masks)
    assert any("infinity sentinel" in row.reason for row in masks)


def test_a_compare_across_precisions_without_a_twin_says_how_to_see_below_the_noise(llama, fp32_golden, tmp_path):
    from rich.console import Console

    from llmcheck.core.reporting.report import print_summary

    my = _dump(copy.deepcopy(llama).to(torch.bfloat16), tmp_path / "my")
    console = Console(record=True, width=300)
    print_summary(
        compare_dumps(fp32_golden, my, workers=1), console, noise_twin_command=get_plugins().noise_twin_command
    )
    assert "hint: the runs differ in precision (fp32 golden, bf16 my)" in console.export_text()
    twin_console = Console(record=True, width=300)
    print_summary(
        compare_dumps(fp32_golden, my, workers=1, noise=my),
        twin_console,
        noise_twin_command=get_plugins().noise_twin_command,
    )
    assert "hint:" not in twin_console.export_text()


def test_a_golden_run_less_precise_than_the_my_run_asks_whether_the_paths_are_swapped(llama, fp32_golden, tmp_path):
    from rich.console import Console

    from llmcheck.core.reporting.report import print_summary

    bf16_run = _dump(copy.deepcopy(llama).to(torch.bfloat16), tmp_path / "bf16")
    console = Console(record=True, width=300)
    print_summary(
        compare_dumps(bf16_run, fp32_golden, workers=1), console, noise_twin_command=get_plugins().noise_twin_command
    )  # -gp bf16, -mp fp32
    shown = console.export_text()
    assert (
        "hint: the golden run is less precise than the my-run (bf16 golden, fp32 my): are -gp and -mp swapped? "
        "-gp takes the trusted run, -mp the one under suspicion (docs/commands/compare.md)"
    ) in shown
    assert "--noise-path" not in shown  # a noise twin of a bf16 golden is no answer to swapped paths


def test_opcheck_counts_a_mask_at_the_dumped_dtypes_minus_infinity_as_agreeing():
    from llmcheck.core.opcheck.criteria import criterion_for
    from llmcheck.core.opcheck.measures import measure_output

    criterion = criterion_for("float16")
    assert criterion is not None
    reference = torch.tensor([-65600.0, 1.0, 2.0], dtype=torch.float64)  # scores + an fp16 mask, in float64
    dumped = torch.tensor([-math.inf, 1.0, 2.0], dtype=torch.float16)  # the fp16 kernel rounds it to -inf
    measured = measure_output(reference, dumped, criterion)
    assert measured.nonfinite_mismatch == 0 and measured.max_abs_error == 0.0
    overflow = measure_output(
        torch.tensor([3.0], dtype=torch.float64), torch.tensor([math.inf], dtype=torch.float16), criterion
    )
    assert overflow.nonfinite_mismatch == 1  # an infinity where the reference is ordinary stays a mismatch


# --------------------------------------------------------------------------- a noise twin that says nothing about the noise

TWIN_DEFECT = "model.layers.1.post_attention_layernorm"
PROMPT = torch.tensor([[1, 7, 42, 9, 100, 3]])


def _tiny_run(folder: Path, *, epsilon: float | None = None, tokens: int = 6, include: str | None = None) -> Path:
    """Capture the bundled 2-layer Llama (fp32), with a wrong epsilon at ``TWIN_DEFECT`` when one is given."""
    from llmcheck.bundled_model import random_llama

    model = random_llama(seed=0)
    if epsilon is not None:
        dict(model.named_modules())[TWIN_DEFECT].variance_epsilon = epsilon
    options = {"include": [include]} if include is not None else {}
    with register_hook(model, DumpConfig(dump_path=str(folder), **options)) as handle, torch.no_grad():
        model(PROMPT[:, :tokens])
    return Path(handle.path)


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("twin_runs")
    return {"golden": _tiny_run(folder / "golden"), "my": _tiny_run(folder / "my", epsilon=0.5)}


def _compare_cli(tiny_runs: dict[str, Path], twin: Path, out: Path) -> int:
    from llmcheck.core.cli import main

    golden, my = str(tiny_runs["golden"]), str(tiny_runs["my"])
    return main(["compare", "-gp", golden, "-mp", my, "--noise-path", str(twin), "-o", str(out), "-j", "1"])


def _warnings(caplog) -> str:
    """Return the warnings compare printed (``llmcheck: WARNING: <message>`` on the terminal), one a line."""
    return "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def _csv_row(out: Path, name: str, io: str) -> dict[str, str]:
    import csv

    with open(out / "cmp_report.csv", newline="") as table:
        return next(row for row in csv.DictReader(table) if row["name"] == name and row["io"] == io)


def test_a_twin_never_excuses_a_row_past_the_dtype_tables_fail_line(tiny_runs, tmp_path, caplog):
    # the my-run given as its own twin: its error is "the noise" everywhere, yet a 96 % error must fail
    out = tmp_path / "report"
    assert _compare_cli(tiny_runs, tiny_runs["my"], out) == 3
    row = _csv_row(out, TWIN_DEFECT, "output")
    assert float(row["relative_euclidean_distance"]) > 0.9 and float(row["noise_error"]) > 0.9
    assert row["verdict"] == "fail" and row["attribution"] == "introduced"
    assert row["deciding_metric"] == "cosine_similarity"  # the table's metric, not error_vs_noise_twin
    assert row["evidence"].startswith("fails the dtype table (cosine_similarity 0.99")
    assert "which the noise twin never excuses" in row["evidence"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_introduced"]["name"] == TWIN_DEFECT and summary["counts"]["failures"] > 0
    warned = _warnings(caplog)
    assert f"{tiny_runs['my']}: the noise twin is identical to the my-run (all 70 float tensors they share " in warned
    assert "agree exactly): every row under the dtype table's fail line passes against it" in warned


def test_a_row_the_twin_would_excuse_fails_on_the_table_and_keeps_the_twins_judgement_beside_it(tiny_runs):
    golden, my = (get_plugins().load_tensors(tiny_runs[run]) for run in ("golden", "my"))
    result = compare_dumps(golden, my, workers=1, noise=my)
    row = next(row for row in result.rows if row.golden.key.name == TWIN_DEFECT and row.golden.key.io == "output")
    assert row.verdict == "fail" and row.metrics["relative_euclidean_distance"].verdict == "fail"
    assert row.metrics["error_vs_noise_twin"].verdict == "pass" and row.metrics["error_vs_noise_twin"].value == 1.0
    assert result.summary()["noise"]["rows_with_twin"] == len(result.rows)


def test_a_twin_still_passes_the_rows_the_table_only_warns_on_when_they_are_its_noise(llama, fp32_golden, tmp_path):
    bf16 = copy.deepcopy(llama).to(torch.bfloat16)
    my, twin = _dump(bf16, tmp_path / "my"), _dump(bf16, tmp_path / "twin")
    warned = {row.golden.key for row in compare_dumps(fp32_golden, my, workers=1).rows if row.verdict == "warn"}
    assert warned  # bf16 against fp32: the table warns on its rounding noise
    result = compare_dumps(fp32_golden, my, workers=1, noise=twin)
    judged = [row for row in result.rows if row.golden.key in warned]
    assert all(row.verdict == "pass" and row.deciding_metric == "error_vs_noise_twin" for row in judged)
    assert result.counts()["failures"] == 0 and result.first_introduced is None


def test_a_twin_identical_to_the_golden_is_named_in_a_warning(tiny_runs, tmp_path, caplog):
    assert _compare_cli(tiny_runs, tiny_runs["golden"], tmp_path / "report") == 3
    warned = _warnings(caplog)
    assert f"{tiny_runs['golden']}: the noise twin is identical to the golden run (all 70 float tensors" in warned
    assert "it shows no rounding noise, so every row that differs by more than rounding fails against it" in warned
    assert "identical to the my-run" not in warned


def test_a_twin_on_another_prompt_pairs_with_nothing_and_is_an_error_naming_it(tiny_runs, tmp_path, capsys):
    twin = _tiny_run(tmp_path / "twin", tokens=3)  # every shape differs from the golden's
    assert _compare_cli(tiny_runs, twin, tmp_path / "report") == 1
    err = capsys.readouterr().err
    records = len(get_plugins().load_tensors(tiny_runs["golden"]).records)
    assert err.startswith(
        f"llmcheck: error: {twin}: no golden record has a twin record to measure the noise at: "
        f"{records} records pair by name but the shapes differ (golden root step 0 input.0 (before) [1, 6], twin [1, 3])"
    )
    assert "(give --noise-path the golden program run on the same input at the my-run's precision)" in err


def test_a_twin_whose_names_match_no_golden_record_is_an_error_naming_it(tiny_runs, tmp_path, capsys):
    from llmcheck.core.cli import main

    np.save(tmp_path / "a.npy", np.ones(4, np.float32))
    np.save(tmp_path / "b.npy", np.ones(4, np.float32) * 1.01)
    twin = tiny_runs["golden"]
    argv = ["compare", "-gp", str(tmp_path / "a.npy"), "-mp", str(tmp_path / "b.npy"), "--noise-path", str(twin)]
    assert main([*argv, "-o", str(tmp_path / "report")]) == 1
    err = capsys.readouterr().err
    records = len(get_plugins().load_tensors(twin).records)
    assert err.startswith(
        f"llmcheck: error: {twin}: no golden record has a twin record to measure the noise at: "
        f"none of its {records} records pairs with one of the golden's 1 (the names differ"
    )


def test_a_twin_of_part_of_the_run_is_named_with_the_count_and_the_summary_says_how_many_rows_had_one(
    tiny_runs, tmp_path, caplog
):
    twin = _tiny_run(tmp_path / "twin", include="model.layers.0.*")
    out = tmp_path / "report"
    assert _compare_cli(tiny_runs, twin, out) == 3
    summary = json.loads((out / "summary.json").read_text())
    with_twin, without_twin = summary["noise"]["rows_with_twin"], summary["noise"]["rows_without_twin"]
    assert with_twin == summary["noise"]["records"] == 27 and with_twin + without_twin == summary["counts"]["pairs"]
    assert (
        f"{twin}: {without_twin} of the {with_twin + without_twin} golden records have no twin "
        "record: root step 0 input.0 (before), model step 0 input.input_ids (before), "
        f"model.embed_tokens step 0 input.0 (before) and {without_twin - 3} more "
        "(their verdicts use the repeats and the dtype table instead)"
    ) in _warnings(caplog)
    # the rows without a twin are judged as without one: the defect in layer 1 is still where it was
    row = _csv_row(out, TWIN_DEFECT, "output")
    assert row["noise_error"] == "" and row["verdict"] == "fail" and row["attribution"] == "introduced"
    assert _csv_row(out, "model.layers.0.mlp", "output")["noise_error"] != ""


def test_a_defect_in_the_attention_core_is_named_as_the_attention_module_that_runs_it(llama, fp32_golden, tmp_path):
    # The softmax scale lives in self_attn's own code (no recorded submodule runs it): the first
    # wrong record is o_proj's input, and the culprit is the module a reader must open.
    defective = copy.deepcopy(llama)
    defective.model.layers[3].self_attn.scaling *= 1.1
    result = compare_dumps(fp32_golden, _dump(defective, tmp_path, weight_digests=False), workers=1)
    introduced = result.first_introduced
    assert introduced is not None
    assert (introduced.golden.key.name, introduced.golden.key.io) == ("model.layers.3.self_attn.o_proj", "input")
    assert result.culprit is not None and result.culprit.key.name == "model.layers.3.self_attn"
    assert result.culprit.key.io == "output"
    culprit = result.summary()["culprit"]
    assert culprit["name"] == "model.layers.3.self_attn"
    assert culprit["seen_at"] == "model.layers.3.self_attn.o_proj step 0 input.0 (before)"


def test_an_introduced_module_output_keeps_its_own_name_as_the_culprit(llama, fp32_golden, tmp_path):
    result = compare_dumps(fp32_golden, _dump(_scaled(llama), tmp_path, weight_digests=False), workers=1)
    assert result.culprit is not None and result.culprit.key.name == DEFECTIVE
    assert result.summary()["culprit"]["seen_at"] is None


def _activation_swapped(model: torch.nn.Module) -> torch.nn.Module:
    defective = copy.deepcopy(model)
    defective.model.layers[4].mlp.act_fn = torch.nn.GELU()
    return defective


def test_verdicts_before_a_defect_do_not_depend_on_which_defect_follows(llama, fp32_golden, tmp_path):
    # Layers 0-3 are bit for bit the same in both my-runs; only the defect in layer 4 differs.
    # Their rows' siblings include layers 4 and 5, which carry that defect's error: the rows
    # before the first introduced row must be judged by the siblings before it alone.
    def verdicts_before_layer_4(defective: torch.nn.Module, folder: Path) -> list[tuple[str, str, str]]:
        result = compare_dumps(
            fp32_golden, _dump(defective.to(torch.bfloat16), folder, weight_digests=False), workers=1
        )
        introduced = result.first_introduced
        assert introduced is not None and introduced.golden.key.name.startswith("model.layers.4.")
        return [
            (row.golden.key.label(), row.verdict, row.attribution)
            for row in sorted(result.rows, key=lambda row: row.golden.order)
            if row.golden.order < introduced.golden.order and "layers.4" not in row.golden.key.name
        ]

    weight_defect = verdicts_before_layer_4(_scaled_layer_4(llama), tmp_path / "a")
    code_defect = verdicts_before_layer_4(_activation_swapped(llama), tmp_path / "b")
    assert len(weight_defect) > 50 and weight_defect == code_defect


def _scaled_layer_4(model: torch.nn.Module) -> torch.nn.Module:
    defective = copy.deepcopy(model)
    with torch.no_grad():
        defective.model.layers[4].mlp.down_proj.weight.mul_(1.3)
    return defective


def _with_fp32_accumulating_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Return the model with every Linear computed by another kernel: fp32 products, rounded once to the model's dtype."""
    ported = copy.deepcopy(model)
    for module in ported.modules():
        if isinstance(module, torch.nn.Linear):

            def forward(x: torch.Tensor, linear: torch.nn.Linear = module) -> torch.Tensor:
                bias = linear.bias.float() if linear.bias is not None else None
                return torch.nn.functional.linear(x.float(), linear.weight.float(), bias).to(x.dtype)

            module.forward = forward  # type: ignore[method-assign]
    return ported


def test_a_twin_of_another_implementation_is_used_as_noise_and_the_report_says_so(llama, fp32_golden, tmp_path):
    # A port runs other kernels almost everywhere (here: every matmul accumulates in fp32): it differs
    # from the twin behind bit-exact inputs at q, k and v at once. Its bits then say nothing; the twin's
    # error is the noise to expect, and a clean port names no culprit.
    twin = _dump(copy.deepcopy(llama).to(torch.bfloat16), tmp_path / "twin")
    port = _dump(_with_fp32_accumulating_linears(copy.deepcopy(llama).to(torch.bfloat16)), tmp_path / "port")
    result = compare_dumps(fp32_golden, port, noise=twin, workers=1)
    assert result.summary()["noise"]["mode"] == "noise reference"
    assert result.counts()["failures"] == 0 and result.culprit is None
    # the golden program plus a defect is still judged by the twin's bits
    defective = _dump(_scaled(llama, 1.004).to(torch.bfloat16), tmp_path / "defect", weight_digests=False)
    judged = compare_dumps(fp32_golden, defective, noise=twin, workers=1)
    assert judged.summary()["noise"]["mode"] == "same program"
    assert judged.culprit is not None and judged.culprit.key.name == DEFECTIVE


def test_wrong_weights_are_introduced_again_in_every_decode_step_and_their_module_only_encloses_them(tmp_path):
    # Each decode step runs the wrong weights anew: in step 1 down_proj's input still passes, so it is
    # where that step's error is introduced, and its mlp only encloses it (not "inherited" from step 0).
    from llmcheck.bundled_model import random_llama

    def generate(model: torch.nn.Module, folder: Path):
        return get_plugins().load_tensors(capture_generate(model, folder, new_tokens=2))

    defective = random_llama(seed=0, num_layers=4)
    with torch.no_grad():
        defective.model.layers[2].mlp.down_proj.weight.mul_(1.05)
    result = compare_dumps(
        generate(random_llama(seed=0, num_layers=4), tmp_path / "g"), generate(defective, tmp_path / "m")
    )
    labels = {
        (row.golden.key.name, row.golden.key.step): row.attribution
        for row in result.rows
        if row.golden.key.io == "output" and row.golden.key.name.startswith("model.layers.2.mlp")
    }
    for step in (0, 1):
        assert labels[("model.layers.2.mlp.down_proj", step)] == "introduced"
        assert labels[("model.layers.2.mlp", step)] == "encloses"
