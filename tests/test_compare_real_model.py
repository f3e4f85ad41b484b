"""Compare on the real SmolLM2-135M: defects named at exactly their module, bf16 within its thresholds."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from compare_runs import capture_run, linears_in_float64, scaled_weight, wrong_rmsnorm_epsilon
from llmcheck.core.compare import compare_dumps
from llmcheck.core.plugins import get_plugins

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def prompt_ids(smollm2) -> torch.Tensor:
    _, tokenizer = smollm2
    return tokenizer(PROMPT, return_tensors="pt").input_ids


@pytest.fixture(scope="module")
def golden_smollm2_dump(smollm2, prompt_ids, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, _ = smollm2
    return capture_run(model, prompt_ids, tmp_path_factory.mktemp("golden"))


def _compare(golden: Path, my: Path):
    plugins = get_plugins()
    return compare_dumps(plugins.load_tensors(golden), plugins.load_tensors(my))


@pytest.mark.parametrize(
    ("defect", "module_name"),
    [
        (
            lambda model: wrong_rmsnorm_epsilon(model, "model.layers.3.post_attention_layernorm", 1e-2),
            "model.layers.3.post_attention_layernorm",
        ),
        (lambda model: scaled_weight(model, "model.layers.17.mlp.down_proj", 0.97), "model.layers.17.mlp.down_proj"),
    ],
    ids=["wrong-epsilon", "weight-3-percent-off"],
)
def test_defect_in_a_named_module_is_the_first_introduced_divergence(
    smollm2, prompt_ids, golden_smollm2_dump: Path, tmp_path: Path, defect, module_name: str
) -> None:
    model, _ = smollm2
    with defect(model):
        my_dump = capture_run(model, prompt_ids, tmp_path / "my")
    result = _compare(golden_smollm2_dump, my_dump)
    introduced = result.first_introduced
    assert introduced is not None
    assert (introduced.golden.key.name, introduced.golden.key.io) == (module_name, "output")
    assert introduced.verdict == "fail" and introduced.attribution == "introduced"
    # Everything before the defect agrees exactly; its parent's output is judged later (the
    # residual stream may dilute the error to a warning), and the logits inherit it.
    assert all(
        row.metrics["max_absolute_error"].value == 0.0
        for row in result.rows
        if row.golden.order < introduced.golden.order
    )
    parent = module_name.rsplit(".", 1)[0]
    parent_output = next(row for row in result.rows if row.golden.key.name == parent and row.golden.key.io == "output")
    assert parent_output.verdict != "pass" and parent_output.golden.order > introduced.golden.order
    logits = next(row for row in result.rows if row.golden.key.name == "lm_head" and row.golden.key.io == "output")
    assert logits.verdict != "pass" and logits.attribution in ("", "inherited", "amplified")


def test_another_fp32_program_names_no_culprit_yet_finds_a_defect_it_carries(
    smollm2, prompt_ids, golden_smollm2_dump: Path, tmp_path: Path
) -> None:
    # Another program in fp32 (its GEMMs accumulate in float64): each product differs by its
    # summation order alone, and the model's output, fed the bit-exact token ids, adds up 30
    # layers of that (above 1e-6): it holds the error its children made, none of its own.
    model, _ = smollm2
    with linears_in_float64(model):
        clean = capture_run(model, prompt_ids, tmp_path / "clean")
        with scaled_weight(model, "model.layers.17.mlp.down_proj", 0.97):
            defective = capture_run(model, prompt_ids, tmp_path / "defective")
    result = _compare(golden_smollm2_dump, clean)
    counts = result.counts()
    assert counts["failures"] == 0 and counts["errors"] == 0 and result.first_introduced is None
    behind_exact_inputs = [row for row in result.rows if row.feeder_error == 0 and row.error]
    assert max(row.error for row in behind_exact_inputs) > 1e-6  # the composites the exact-input rule once named
    introduced = _compare(golden_smollm2_dump, defective).first_introduced
    assert introduced is not None and introduced.golden.key.name == "model.layers.17.mlp.down_proj"


def test_bf16_against_fp32_warns_within_bf16_thresholds_and_never_fails(
    smollm2, prompt_ids, golden_smollm2_dump: Path, tmp_path: Path
) -> None:
    model, _ = smollm2
    bf16_model = copy.deepcopy(model).to(torch.bfloat16)
    my_dump = capture_run(bf16_model, prompt_ids, tmp_path / "my")
    del bf16_model
    result = _compare(golden_smollm2_dump, my_dump)
    counts = result.counts()
    assert counts["failures"] == 0 and counts["errors"] == 0 and counts["unmatched"] == 0
    assert counts["warnings"] > 0
    float_rows = [row for row in result.rows if row.golden.dtype == "float32"]
    assert float_rows and all(row.my.dtype == "bfloat16" for row in float_rows)
    warned = [row for row in result.rows if row.verdict == "warn"]
    assert all(row.metrics[row.deciding_metric].warn_threshold in (0.9999, 1.6e-2) for row in warned)
    worst = max(row.metrics["relative_euclidean_distance"].value for row in float_rows)
    assert 1.6e-2 < worst < 0.1  # bf16 error through 30 layers: a warning, well short of the fail line


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_trained_model_at_low_precision_names_no_culprit_with_statistics_only(
    smollm2, prompt_ids, tmp_path: Path, dtype: torch.dtype
) -> None:
    # A trained model has layers that differ from their siblings (SmolLM2's layer 28 grows bf16
    # noise 3x, where the others grow it 0.4-1.6x): the repeated-structure baseline must not
    # mistake that for a defect, neither on full tensors nor on statistics alone.
    model, _ = smollm2
    golden = capture_run(model, prompt_ids, tmp_path / "golden", statistics_only=True)
    low = copy.deepcopy(model).to(dtype)
    my = capture_run(low, prompt_ids, tmp_path / "my", statistics_only=True)
    del low
    result = _compare(golden, my)
    assert result.counts()["failures"] == 0 and result.first_introduced is None


@pytest.mark.parametrize("made", ["cast", "loaded"], ids=["cast-to-bf16", "loaded-in-bf16"])
def test_trained_model_in_bf16_names_no_culprit_on_op_level_statistics(smollm2, tmp_path: Path, made: str) -> None:
    # Op level, a norm's ops run upcast in float32 inside the bf16 run: their records' dtypes
    # agree with the golden's, yet they carry the bf16 run's rounding. Judged on statistics
    # alone, the L2 norm of x**2 (massive activations to the fourth power) grows that error
    # 6.9x (the model cast to bf16) or 7.2x (loaded in bf16) in layer 10 where its repeats grow
    # it 1.8-3.9x (0.2-5.1x): it was blamed as introduced. A bound on the norms that far out is
    # within bf16's noise (cast: under the statistics' floor), or a suspect naming the noise twin.
    from llmcheck.bundled_model import load_smollm2

    model, tokenizer = smollm2
    prompt_ids = tokenizer("The quick brown fox jumps over the lazy dog because", return_tensors="pt").input_ids
    options = {"statistics_only": True, "mode": ("module", "op")}
    golden = capture_run(model, prompt_ids, tmp_path / "golden", **options)
    low = copy.deepcopy(model).to(torch.bfloat16) if made == "cast" else load_smollm2(dtype=torch.bfloat16)[0]
    my = capture_run(low, prompt_ids, tmp_path / "my", **options)
    del low
    result = _compare(golden, my)
    assert result.first_introduced is None, result.first_introduced
    assert result.counts()["failures"] == 0
    pow_output = next(
        row
        for row in result.rows
        if row.golden.key.name == "model.layers.10.input_layernorm/aten.pow.Tensor_Scalar"
        and row.golden.key.io == "output"
    )
    assert (pow_output.golden.dtype, pow_output.my.dtype, pow_output.judged_as) == ("float32", "float32", "bf16")
    assert pow_output.verdict == "warn" and pow_output.growth > 6
    if made == "loaded":
        assert pow_output.attribution == "suspect" and "noise twin" in pow_output.evidence


def test_trained_model_in_fp16_names_no_culprit_on_op_level_statistics(smollm2, tmp_path: Path) -> None:
    # Layer 3's massive activation (653) squared in its upcast input_layernorm is 426 409 in
    # the fp16 run: past fp16's range, no mask value, yet it was taken for the run's "plus
    # infinity" and blamed as introduced (nonfinite_mismatch 1, with no NaN or Inf anywhere).
    # And the forward's 180 empty records (lift_fresh of [], cat of an empty cache) were errors.
    from llmcheck.bundled_model import load_smollm2

    model, tokenizer = smollm2
    prompt_ids = tokenizer("The quick brown fox jumps over the lazy dog because", return_tensors="pt").input_ids
    options = {"statistics_only": True, "mode": ("module", "op")}
    golden = capture_run(model, prompt_ids, tmp_path / "golden", **options)
    low = load_smollm2(dtype=torch.float16)[0]
    my = capture_run(low, prompt_ids, tmp_path / "my", **options)
    del low
    result = _compare(golden, my)
    counts = result.counts()
    assert result.first_introduced is None, result.first_introduced
    assert counts["failures"] == 0 and counts["errors"] == 0
    squares = next(
        row
        for row in result.rows
        if row.golden.key.name == "model.layers.3.input_layernorm/aten.pow.Tensor_Scalar"
        and row.golden.key.io == "output"
    )
    assert squares.my.dtype == "float32" and squares.my.stats.max > 65504
    assert squares.verdict == "pass" and squares.nonfinite_mismatch == 0
    empty = [row for row in result.rows if row.reason.startswith("both tensors are empty")]
    assert len(empty) > 100 and all(row.verdict == "pass" for row in empty)


def test_op_level_statistics_replay_the_final_norms_squares_on_their_extremes(smollm2, tmp_path: Path) -> None:
    # On the chat prompt, SmolLM2's final norm receives 4704 in bf16 where the golden has 4427
    # (6 %; the input's L2 norm differs by 2 %): squared, the L2 norm of x**2 differs by 11.5 %,
    # past bf16's 10 %, and the pow was blamed. Its recorded output max is what pow gives from
    # its recorded input extremes: it computes what it is given. A recorded max that is not
    # (here 1 % off, as a kernel wrong at that element would give) is not cleared.
    import json

    from llmcheck.bundled_model import load_smollm2

    model, tokenizer = smollm2
    chat = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Give me three tips for writing clear documentation."},
    ]
    prompt_ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
        "input_ids"
    ]
    options = {"statistics_only": True, "mode": "op"}
    golden = capture_run(model, prompt_ids, tmp_path / "golden", **options)
    low = load_smollm2(dtype=torch.bfloat16)[0]
    my = capture_run(low, prompt_ids, tmp_path / "my", **options)
    del low
    squares = "model.norm/aten.pow.Tensor_Scalar"
    result = _compare(golden, my)
    assert result.first_introduced is None and result.counts()["failures"] == 0
    row = next(row for row in result.rows if row.golden.key.name == squares and row.golden.key.io == "output")
    assert row.verdict == "warn" and row.metrics["l2norm_stat_relative_error"].value > 0.1
    assert row.evidence.startswith("replayed on its recorded extremes, aten.pow.Tensor_Scalar")
    index = my / "index.jsonl"
    lines = index.read_text().splitlines()
    for number, line in enumerate(lines):
        record = json.loads(line)
        if record.get("name") == squares and record.get("io") == "output":
            record["stats"]["max"] *= 1.01
            lines[number] = json.dumps(record)
    index.write_text("\n".join(lines) + "\n")
    tampered = _compare(golden, my).first_introduced
    assert tampered is not None and (tampered.golden.key.name, tampered.golden.key.io) == (squares, "output")


def test_op_level_statistics_blame_no_mean_for_the_squares_it_was_handed(smollm2, tmp_path: Path) -> None:
    # Layer 14's o_proj rounded to int8 is below bf16's noise on statistics alone. Its slightly
    # larger error reaches the final norm, where the squares (cleared by their replay on their
    # extremes) hand 10 % to the mean of each token's squares: that mean, no pointwise op and
    # so not replayed, grew it 1.0x and was named where the error is introduced (0.111).
    from llmcheck.bundled_model import load_smollm2

    model, tokenizer = smollm2
    prompt_ids = tokenizer(
        "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987,", return_tensors="pt"
    ).input_ids
    options = {"statistics_only": True, "mode": "op"}
    golden = capture_run(model, prompt_ids, tmp_path / "golden", **options)
    low = load_smollm2(dtype=torch.bfloat16)[0]
    weight = dict(low.named_modules())["model.layers.14.self_attn.o_proj"].weight
    with torch.no_grad():
        wide = weight.float()
        step = wide.abs().max() / 127  # per-tensor symmetric int8, dequantised
        weight.copy_(torch.round(wide / step) * step)
    my = capture_run(low, prompt_ids, tmp_path / "my", **options)
    del low
    result = _compare(golden, my)
    means = [
        row
        for row in result.rows
        if row.golden.key.name == "model.norm/aten.mean.dim" and row.golden.key.io == "output"
    ]
    assert means and means[0].verdict == "warn" and means[0].evidence.startswith("on statistics alone no replay")
    assert result.first_introduced is None or result.first_introduced.golden.key.name.startswith("model.layers.14")


def _generate_statistics(
    model: torch.nn.Module, prompt_ids: torch.Tensor, folder: Path, tokens: int, statistics_only: bool = True
) -> Path:
    from llmcheck import DumpConfig, register_hook

    config = DumpConfig(dump_path=str(folder), token_range=list(range(tokens)), statistics_only=statistics_only)
    with register_hook(model, config) as handle, torch.no_grad():
        model.generate(prompt_ids, max_new_tokens=tokens, do_sample=False)
    assert handle.path is not None
    return Path(handle.path)


def test_a_clean_bf16_generate_that_picks_another_token_names_no_culprit_after_it(smollm2, tmp_path: Path) -> None:
    # Greedy decode of this prompt: fp32 picks 14795 at step 8, bf16 6478. From there the runs
    # compute on other tokens; on statistics alone a norm brings the other token's L2 norm back
    # in line, so a later row failed while its inputs agreed and was named where the error is
    # introduced: layer 0's act_fn at step 8, in a clean run. A defect is still named where it
    # enters, before any token differs.
    from llmcheck.bundled_model import load_smollm2

    model, tokenizer = smollm2
    prompt_ids = tokenizer("The quick brown fox jumps over the lazy dog because", return_tensors="pt").input_ids
    golden = _generate_statistics(model, prompt_ids, tmp_path / "golden", 9)
    low = load_smollm2(dtype=torch.bfloat16)[0]
    clean = _compare(golden, _generate_statistics(low, prompt_ids, tmp_path / "clean", 9))
    first = clean.first_divergence
    assert first is not None and (first.golden.key.name, first.golden.key.step) == ("root", 8)
    assert clean.first_introduced is None and clean.summary()["culprit"] is None
    carried = [row for row in clean.rows if row.evidence.startswith("the runs were given other values at root step 8")]
    assert carried and all(row.attribution == "inherited" and row.golden.key.step >= 8 for row in carried)
    with scaled_weight(low, "model.layers.14.mlp.down_proj", 1.05):
        defective = _compare(golden, _generate_statistics(low, prompt_ids, tmp_path / "defective", 9))
    named = defective.first_introduced
    assert named is not None and named.golden.key.step == 0
    assert named.golden.key.name.startswith("model.layers.14.mlp.down_proj")


def test_a_clean_bf16_generate_names_no_decode_step_for_a_layer_whose_noise_always_stands_out(
    smollm2, tmp_path: Path
) -> None:
    # Full tensors, module level. SmolLM2's layer-8 attention core grows bf16 noise more than
    # its 29 repeats at every step: 1.7x their line in the prefill, 1.9-3.0x at the decode steps
    # after. At step 6, 3.0x stood 2x beyond the farthest sibling, and a clean generate named
    # layer 8's self_attn where the error is introduced. It stood out as much before: a
    # suspect. A defect of the decode alone (layer 14's MLP output x1.1 from step 3 on) is
    # still named at its step.
    from llmcheck.bundled_model import load_smollm2

    model, tokenizer = smollm2
    prompt_ids = tokenizer("The quick brown fox jumps over the lazy dog because", return_tensors="pt").input_ids
    golden = _generate_statistics(model, prompt_ids, tmp_path / "golden", 8, statistics_only=False)
    low = load_smollm2(dtype=torch.bfloat16)[0]
    clean = _compare(golden, _generate_statistics(low, prompt_ids, tmp_path / "clean", 8, statistics_only=False))
    assert clean.first_introduced is None and clean.summary()["culprit"] is None
    attention = [
        row
        for row in clean.rows
        if row.golden.key.name == "model.layers.8.self_attn.o_proj" and row.golden.key.io == "input"
    ]
    assert any(row.attribution == "suspect" and row.golden.key.step > 0 for row in attention)
    mlp = dict(low.named_modules())["model.layers.14.mlp"]
    plain_forward, calls = mlp.forward, []

    def decode_defect(hidden: torch.Tensor) -> torch.Tensor:
        calls.append(hidden.shape[1])
        out = plain_forward(hidden)
        return out * 1.1 if len(calls) > 3 else out  # the fourth call on: decode step 3

    mlp.forward = decode_defect
    defective = _compare(
        golden, _generate_statistics(low, prompt_ids, tmp_path / "defective", 8, statistics_only=False)
    )
    named = defective.first_introduced
    assert named is not None and named.golden.key.step == 3 and named.golden.key.name == "model.layers.14.mlp"


def test_a_clean_fp16_generate_names_no_row_where_accumulated_noise_crosses_the_line(smollm2, tmp_path: Path) -> None:
    # A greedy decode's single tokens carry no massive activation to dilute the rounding noise:
    # at step 6 the fp16 run's error reaches fp16's line (0.012) in layer 12's down_proj, which
    # received 0.0117 and grew it 1.08x, as its repeats predict. It was named where the error is
    # introduced. It adds nothing a defect would: it warns, saying so.
    from llmcheck.bundled_model import load_smollm2

    model, tokenizer = smollm2
    prompt_ids = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    golden = _generate_statistics(model, prompt_ids, tmp_path / "golden", 8, statistics_only=False)
    low = load_smollm2(dtype=torch.float16)[0]
    result = _compare(golden, _generate_statistics(low, prompt_ids, tmp_path / "my", 8, statistics_only=False))
    assert result.first_introduced is None and result.counts()["failures"] == 0
    crossed = [row for row in result.rows if row.evidence.startswith("past the fp16 line, but it grows the error")]
    assert crossed and all(row.verdict == "warn" and row.golden.key.step > 0 for row in crossed)


#: Prompts on which clean low-precision runs of SmolLM2 were once blamed: a decoder layer whose
#: residual stream and MLP output nearly cancel a massive activation (layer 28 in bf16, layer 9
#: in fp16), and an attention core that amplifies fp16 noise more than its repeats do (layer 10).
CLEAN_CASES = {
    "bf16-question": (torch.bfloat16, "Why is the sky blue during the day but red at sunset? Explain it simply."),
    "bf16-numbers": (torch.bfloat16, "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987,"),
    "fp16-prose": (torch.float16, "The capital of France is Paris. The capital of Germany is"),
    "fp16-story": (
        torch.float16,
        "Once upon a time, a curious robot named Pip lived in a lighthouse. Every night it counted "
        "the ships that passed, and every morning it wrote their names in a big blue book. One day",
    ),
}


@pytest.mark.parametrize("case", list(CLEAN_CASES))
def test_clean_low_precision_run_of_the_trained_model_names_no_culprit_on_full_tensors(
    smollm2, smollm2_path: Path, tmp_path: Path, case: str
) -> None:
    from llmcheck.bundled_model import load_smollm2

    dtype, prompt = CLEAN_CASES[case]
    model, tokenizer = smollm2
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    golden = capture_run(model, ids, tmp_path / "golden")
    low, _ = load_smollm2(dtype=dtype)  # as a user loads it: the rotary frequencies stay fp32
    my = capture_run(low, ids, tmp_path / "my")
    del low
    result = _compare(golden, my)
    assert result.counts()["failures"] == 0 and result.culprit is None
    assert result.counts()["warnings"] > 0  # the rounding noise is there, and judged as noise
    # whatever the siblings cannot tell from noise is a suspect: a warning that says how to settle it
    suspects = result.summary()["noise_suspects"]
    assert all(row["verdict"] == "warn" and "noise twin" in row["evidence"] for row in suspects)
