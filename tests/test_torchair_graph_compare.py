"""Graph-mode compare end to end: FX golden vs GE my, and unfused GE vs fused GE, on a real Llama graph.

The GE side is what torchair would dump for the exported graph of a seeded HF Llama
(``tests/ge_dump_from_fx.py``): one node's output perturbed on the "device" (the error
propagates downstream), ``silu`` and the ``mul`` it feeds fused into one
``AutomaticBufferFusionOp``, and a compiler-inserted ``Cast`` with no FX counterpart.
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from ge_dump_from_fx import GeScenario, ge_op_name_by_fx, write_ge_scenario
from llmcheck.core.cli import main
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.torchair_fx.fx_backend import FxDumpInterpreter, dump_exported_program, new_graph_folder

PERTURBED = "linear_10"  # a projection of the second decoder layer
FUSED = ("silu", "mul_11")  # the first layer's SiLU and the gate product it feeds


@pytest.fixture(scope="module")
def graph_runs(tmp_path_factory) -> dict[str, Path]:
    """Return the FX golden dump, the fused + perturbed GE dump and the unfused GE dump of one Llama graph."""
    from llmcheck.bundled_model import random_llama

    root = tmp_path_factory.mktemp("graph_runs")
    model = random_llama(seed=0)
    input_ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    program = torch.export.export(model, (input_ids,), {"use_cache": False}, strict=False)
    module = program.module()
    args = tuple(inspect.signature(module.forward).bind(input_ids, use_cache=False).arguments.values())
    assert {node.name for node in module.graph.nodes} >= {PERTURBED, *FUSED}
    FxDumpInterpreter(module, new_graph_folder(root / "fx")).run(*args)
    dump_exported_program(program, (input_ids,), {"use_cache": False}, dump_path=root / "fx_llmcheck")  # fast path
    write_ge_scenario(module, args, root / "ge_fused", GeScenario(perturb_node=PERTURBED, fuse=FUSED, add_cast=True))
    write_ge_scenario(module, args, root / "ge_unfused", GeScenario(framed=False))  # the old bare file form
    return {
        "fx": root / "fx",
        "fx_llmcheck": root / "fx_llmcheck",
        "ge_fused": root / "ge_fused",
        "ge_unfused": root / "ge_unfused",
        "root": root,
    }


def _compare(golden: Path, golden_source: str, my: Path, output: Path) -> dict:
    assert (
        main(
            [
                "compare",
                "--golden-path",
                str(golden),
                "--my-path",
                str(my),
                "--golden-source",
                golden_source,
                "--my-source",
                "ge",
                "-o",
                str(output),
                "-j",
                "1",
            ]
        )
        == 3
    )
    return json.loads((output / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("fx_run", "fx_source"), [("fx", "fx"), ("fx_llmcheck", "llmcheck")])
def test_fx_vs_ge_compare_names_the_perturbed_node_as_first_introduced(graph_runs, fx_run, fx_source):
    # the FX golden in torchair's .npy layout, and in llmcheck's format from the FX backend's fast path
    summary = _compare(graph_runs[fx_run], fx_source, graph_runs["ge_fused"], graph_runs["root"] / f"{fx_run}_vs_ge")

    introduced = summary["first_introduced"]
    assert (introduced["name"], introduced["my_name"], introduced["io"]) == (
        PERTURBED,
        ge_op_name_by_fx(PERTURBED),
        "output",
    )
    assert introduced["attribution"] == "introduced"
    assert summary["first_divergence"]["name"] == PERTURBED  # nothing before it fails: the fused op matches
    pairs = json.loads((graph_runs["root"] / f"{fx_run}_vs_ge" / "pairs.json").read_text())
    rules = Counter(pair["rule"] for pair in pairs["pairs"])
    assert rules["ge-fx:fused-last-outputs"] == 1 and rules["ge-fx:fused-inputs"] == 2
    cast_notes = {item["note"] for item in pairs["unmatched_my"] if item["name"] == "trans_Cast_inserted"}
    assert cast_notes == {"Cast op inserted by the graph compiler, no FX counterpart"}
    assert all(item.get("expected") for item in pairs["unmatched_my"] if item["name"] == "trans_Cast_inserted")
    counts = summary["counts"]  # what the pairing rule expects to stay unmatched is counted apart
    assert counts["unmatched_my_expected"] >= 2 and counts["unmatched_golden_unexpected"] == 0


@pytest.mark.slow
def test_fused_ge_vs_unfused_ge_compare_names_the_same_op(graph_runs):
    summary = _compare(graph_runs["ge_unfused"], "ge", graph_runs["ge_fused"], graph_runs["root"] / "ge_vs_ge")

    introduced = summary["first_introduced"]
    assert (introduced["name"], introduced["io"], introduced["attribution"]) == (
        ge_op_name_by_fx(PERTURBED),
        "output",
        "introduced",
    )
    pairs = json.loads((graph_runs["root"] / "ge_vs_ge" / "pairs.json").read_text())
    fused = [pair for pair in pairs["pairs"] if pair["rule"].startswith("ge-ge:fused")]
    assert {(p["golden"]["name"], p["my"]["name"], p["golden"]["io"]) for p in fused} == {
        ("Silu", "SiluMul_11", "input"),
        ("Mul_11", "SiluMul_11", "input"),
        ("Mul_11", "SiluMul_11", "output"),
    }
    inside = {item["note"] for item in pairs["unmatched_golden"]}
    assert inside == {"inside fused GE op SiluMul_11 of the my run"}  # silu's output and mul's input from it
    assert summary["counts"]["unmatched_golden_expected"] == len(pairs["unmatched_golden"]) > 0
    assert summary["counts"]["unmatched_golden_unexpected"] == 0


@pytest.mark.slow
def test_every_ge_output_with_an_fx_tensor_is_paired_with_that_tensor(graph_runs):
    plugins = get_plugins()
    fx, ge = plugins.load_tensors(graph_runs["fx"], "fx"), plugins.load_tensors(graph_runs["ge_fused"], "ge")
    pairs = [pair for pair in plugins.map_pairs(fx, ge, None) if pair.rule.startswith("ge-fx:")]

    outputs = {id(pair.my): pair for pair in pairs if pair.my is not None and pair.my.key.io == "output"}
    ge_outputs = [r for r in ge.records if r.key.io == "output" and r.attrs["ge_op_type"] != "Cast"]
    assert all(id(r) in outputs and outputs[id(r)].golden is not None for r in ge_outputs)
    for record in ge_outputs:  # each output pairs with the FX node its graph op names, position for position
        golden = outputs[id(record)].golden
        expected_node = (
            "mul_11" if record.key.name == "SiluMul_11" else record.key.name[:1].lower() + record.key.name[1:]
        )
        assert (golden.attrs["fx_node"], golden.key.position) == (expected_node, record.key.position)
    nz_inputs = [r for r in ge.records if r.attrs["format"] == "FRACTAL_NZ"]
    assert nz_inputs and all(r.shape == tuple(r.attrs["original_shape"]) for r in nz_inputs)
