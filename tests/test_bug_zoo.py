"""The bug zoo's fast subset: what must hold today and after any change to the verdicts.

``benchmarks/bug_zoo.py`` is the yardstick of llmcheck's localisation; these tests run its
``--quick`` subset through the script's own functions and check the invariants no change
may break: every fp32-against-fp32 module-level defect is named at an accepted module,
clean fp32 runs name nothing, and each printed line names what was blamed. Hit rates in
bf16 and fp16 are measured by the script, not asserted here (the method is being improved).
"""

from __future__ import annotations

import pytest
import torch

from faulty_kernels import load_bug_zoo

pytestmark = pytest.mark.slow

bug_zoo = load_bug_zoo()


@pytest.fixture(scope="module")
def quick_zoo(tmp_path_factory: pytest.TempPathFactory):
    """Run the --quick subset once; return (results, printed lines)."""
    lines: list[str] = []
    results = bug_zoo.run_zoo(
        bug_zoo.QUICK_SETTINGS,
        bug_zoo.QUICK_ARCHS,
        bug_zoo.QUICK_DEFECTS,
        workdir=tmp_path_factory.mktemp("zoo"),
        echo=lines.append,
    )
    return results, lines


def test_quick_subset_runs_every_setting_arch_defect_and_a_clean_control(quick_zoo) -> None:
    results, lines = quick_zoo
    expected = {
        (s, a, d)
        for s in bug_zoo.QUICK_SETTINGS
        for a in bug_zoo.QUICK_ARCHS
        for d in [*bug_zoo.QUICK_DEFECTS, bug_zoo.CLEAN]
    }
    assert {(r.setting, r.arch, r.defect) for r in results} == expected
    assert len(lines) == len(results)
    assert {"llama", "qwen2"} <= set(bug_zoo.QUICK_ARCHS)  # qwen2: eager attention with a finfo.min mask
    # the defect sits in different layers, not always the same one
    assert len({r.layer for r in results if not r.is_clean}) >= 3


def test_every_fp32_module_level_defect_is_named_at_an_accepted_module(quick_zoo) -> None:
    results, _ = quick_zoo
    fp32 = [r for r in results if r.setting == "fp32/fp32" and not r.is_clean]
    assert fp32 and all(r.hit for r in fp32), [r.line() for r in fp32 if not r.hit]
    for result in fp32:
        assert result.blamed_module.startswith(f"model.layers.{result.layer}.")  # never the whole decoder layer
        assert result.failures > 0 and result.introduced_rows >= 1


def test_clean_fp32_runs_name_no_culprit(quick_zoo) -> None:
    results, _ = quick_zoo
    clean = [r for r in results if r.is_clean and r.setting.startswith("fp32/fp32")]
    assert len(clean) == 2 * len(bug_zoo.QUICK_ARCHS)  # module level and statistics only
    assert all(not r.false_culprit and r.failures == 0 and r.blamed == "nothing" for r in clean)


def test_each_printed_line_names_the_blamed_module(quick_zoo) -> None:
    results, lines = quick_zoo
    for result, line in zip(results, lines):
        assert line.split()[0] == result.setting
        assert f"blamed {result.blamed};" in line
        if result.blamed_module is not None:
            assert result.blamed_module in line
        mark = (
            ("FALSE-CULPRIT" if result.false_culprit else "clean-ok")
            if result.is_clean
            else ("HIT" if result.hit else "miss")
        )
        assert f" {mark} " in line
    table = bug_zoo.format_table(bug_zoo.setting_table(results))
    fp32_row = next(row for row in table.splitlines() if row.startswith("| fp32/fp32 |"))
    cases = len(bug_zoo.QUICK_ARCHS) * len(bug_zoo.QUICK_DEFECTS)
    assert f"{cases}/{cases} (100 %)" in fp32_row and f"0 of {len(bug_zoo.QUICK_ARCHS)}" in fp32_row


def test_rows_that_fail_the_dtype_table_downstream_of_a_defect_are_inherited(tmp_path) -> None:
    # Phi-3 with one layer's key rows 5 % low, in fp16 against fp32: deeper down the carried
    # error crosses the fp16 table; those rows fail as inherited, and one row is introduced.
    results = bug_zoo.run_zoo(["fp16/fp32"], ["phi3"], ["k_proj_x0.95"], workdir=tmp_path, echo=lambda _: None)
    case = next(r for r in results if not r.is_clean)
    assert case.hit and case.introduced_rows == 1 and case.failures > 1, case.line()


def test_scoring_is_strict_about_the_enclosing_layer_and_fair_about_the_attention_function() -> None:
    scale = [
        bug_zoo.Accepted("model.layers.2.self_attn"),
        bug_zoo.Accepted("model.layers.2.self_attn.o_proj", ("input",)),
    ]
    assert bug_zoo.is_accepted("model.layers.2.self_attn.o_proj", "input", scale, "module")
    assert not bug_zoo.is_accepted("model.layers.2.self_attn.o_proj", "output", scale, "module")
    assert not bug_zoo.is_accepted("model.layers.2", "output", scale, "module")
    down_proj = [bug_zoo.Accepted("model.layers.2.mlp.down_proj")]
    assert not bug_zoo.is_accepted("model.layers.2.mlp", "output", down_proj, "module")
    assert bug_zoo.is_accepted("model.layers.2.mlp.down_proj/aten.mm.default", "input", down_proj, "op")
    assert not bug_zoo.is_accepted("model.layers.2/aten.add.Tensor", "input", down_proj, "op")


def test_every_defect_keeps_module_paths_and_changes_only_its_layer() -> None:
    torch.set_num_threads(1)
    for arch in bug_zoo.ARCHS.values():
        clean = bug_zoo.build_model(arch)
        ids = bug_zoo.input_ids(arch)
        names = [name for name, _ in clean.named_modules()]
        with torch.no_grad():
            clean_logits = clean(ids).logits
        for defect in bug_zoo.DEFECTS.values():
            model = bug_zoo.copy.deepcopy(clean)
            layer = bug_zoo.defect_layer(arch, defect.name)
            accepted = defect.inject(model, arch, arch.layer(layer))
            assert [name for name, _ in model.named_modules()] == names, (arch.name, defect.name)
            assert accepted and all(c.module.startswith(f"model.layers.{layer}.") for c in accepted)
            with torch.no_grad():
                assert not torch.equal(model(ids).logits, clean_logits), (arch.name, defect.name)


def test_msprobe_names_are_read_as_module_paths() -> None:
    assert bug_zoo.msprobe_module("Module.model.layers.1.mlp.down_proj.Linear.forward.0") == (
        "model.layers.1.mlp.down_proj",
        "",
    )
    assert bug_zoo.msprobe_module("Module.model.layers.0.mlp.LlamaMLP.forward.0.output.0") == (
        "model.layers.0.mlp",
        "output",
    )
    assert bug_zoo.msprobe_module("Module.model.layers.3.self_attn.q_proj.Linear.forward.0.parameters.weight") == (
        "model.layers.3.self_attn.q_proj",
        "output",
    )
