"""Every hook is documented with its exact signature and a working example, and has a test (datasette-style).

The reference page docs/hooks.md is generated from the hook specifications; these tests keep
the committed page in step with them and run the examples the page shows.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from llmcheck.core import hookspecs
from llmcheck.core.records import CaptureRequest

ROOT = Path(__file__).resolve().parent.parent
HOOKS = {
    name: function
    for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
    if name.startswith("llmcheck_")
}


def _generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gen_hook_reference", ROOT / "docs" / "gen_hook_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _example(hook_name: str) -> str:
    """Return the code of a hook's ``Example::`` block."""
    doc = inspect.getdoc(HOOKS[hook_name]) or ""
    _, found, code = doc.partition("Example::\n")
    assert found, f"{hook_name} has no Example:: block in its docstring"
    return inspect.cleandoc("\n".join(line for line in code.split("\n")))


def _example_plugin(name: str, *hook_names: str) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name in hook_names:
        exec(compile(_example(hook_name), f"<example of {hook_name}>", "exec"), module.__dict__)
    return module


def test_there_are_hooks_of_every_family() -> None:
    assert {
        "llmcheck_register_capture_backends",
        "llmcheck_load_tensors",
        "llmcheck_map_pairs",
        "llmcheck_register_metrics",
    } <= set(HOOKS)


def test_the_committed_hook_reference_is_the_generated_one() -> None:
    committed = (ROOT / "docs" / "hooks.md").read_text()
    assert committed == _generator().render(), "docs/hooks.md is stale: run `python docs/gen_hook_reference.py`"


def test_the_hand_written_plugin_guide_links_the_reference_and_does_not_repeat_it() -> None:
    guide = (ROOT / "docs" / "plugins.md").read_text()
    assert "(hooks.md)" in guide
    signature = _generator().signature
    assert not [name for name, hook in HOOKS.items() if f"#### {name}" in guide or signature(hook) in guide]


@pytest.mark.parametrize("hook_name", sorted(HOOKS))
def test_plugin_hooks_are_documented_with_their_exact_signature(hook_name: str) -> None:
    docs = (ROOT / "docs" / "hooks.md").read_text()
    assert f"#### {hook_name}" in docs
    assert _generator().signature(HOOKS[hook_name]) in docs


@pytest.mark.parametrize("hook_name", sorted(HOOKS))
def test_plugin_hooks_have_docstrings_with_an_example(hook_name: str) -> None:
    assert len(inspect.getdoc(HOOKS[hook_name]) or "") > 80
    assert f"def {hook_name}(" in _example(hook_name)


@pytest.mark.parametrize("hook_name", sorted(HOOKS))
def test_plugin_hooks_have_tests(hook_name: str) -> None:
    test_sources = "\n".join(path.read_text() for path in (ROOT / "tests").rglob("test_*.py"))
    assert re.search(rf"def test_hook_{hook_name}\b", test_sources), f"no test named test_hook_{hook_name}"


def test_the_npyfolder_examples_load_pair_and_measure_two_folders(llmcheck_plugins, tmp_path: Path) -> None:
    plugin = _example_plugin(
        "npyfolder_example",
        "llmcheck_register_sources",
        "llmcheck_load_tensors",
        "llmcheck_map_pairs",
        "llmcheck_register_metrics",
    )
    facade = llmcheck_plugins(plugin)
    for side, name, offset in (("golden", "Embed", 0.0), ("my", "embed", 0.5)):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / f"{name}.npy", np.arange(4, dtype=np.float32) + offset)
    golden, my = facade.load_tensors(tmp_path / "golden"), facade.load_tensors(tmp_path / "my")
    assert (golden.source, [r.key.name for r in golden.records], golden.records[0].shape) == (
        "npyfolder",
        ["Embed"],
        (4,),
    )
    assert my.records[0].data.load().tolist() == [0.5, 1.5, 2.5, 3.5]
    pairs = [pair for pair in facade.map_pairs(golden, my, None) if pair.rule.startswith("npyfolder")]
    assert [(pair.golden, pair.my) for pair in pairs] == [(golden.records[0], my.records[0])]
    accumulator = facade.metrics()["max_abs_diff"].make_accumulator()
    accumulator.update(golden.records[0].data.load().double().numpy(), my.records[0].data.load().double().numpy())
    assert accumulator.result() == 0.5


def test_the_op_reference_examples_compute_in_float64() -> None:
    registered = []
    _example_plugin("gelu_example", "llmcheck_register_op_references").llmcheck_register_op_references(
        registered.append
    )
    (gelu,) = registered
    assert gelu.op_type == "MyGeluOperation"
    assert gelu.compute({"0": torch.zeros(2, dtype=torch.float16)}, {})[0].dtype == torch.float64
    resolve = _example_plugin("unary_example", "llmcheck_resolve_op_reference").llmcheck_resolve_op_reference
    assert resolve("LinearOperation") is None
    exp = resolve("MyUnaryOperation")
    assert exp.compute({"0": torch.zeros(3)}, {"kind": "exp"})[0].tolist() == [1.0, 1.0, 1.0]


def test_the_capture_backend_example_runs_the_command(tmp_path: Path) -> None:
    backends = []
    _example_plugin("plain_example", "llmcheck_register_capture_backends").llmcheck_register_capture_backends(
        backends.append
    )
    marker = tmp_path / "ran"
    request = CaptureRequest(backend="plain", command=["touch", str(marker)], output_dir=tmp_path)
    assert backends[0].run(request) == 0 and marker.exists()


def test_the_export_example_writes_an_onnx_graph(tmp_path: Path) -> None:
    import onnx

    topology = tmp_path / "model.mytopo.json"
    topology.write_text(
        json.dumps({"name": "tiny", "ops": [{"type": "Relu", "name": "act", "inputs": ["x"], "outputs": ["y"]}]})
    )
    export = _example_plugin("export_example", "llmcheck_export_onnx").llmcheck_export_onnx
    assert export(tmp_path / "other.json", -1, None) is None
    written = export(topology, -1, None)
    assert [node.op_type for node in onnx.load(str(written)).graph.node] == ["Relu"]


def test_the_noise_twin_example_answers_for_its_own_capture_only(tmp_path: Path) -> None:
    from llmcheck.core.records import Dump

    command = _example_plugin("twin_example", "llmcheck_noise_twin_command").llmcheck_noise_twin_command
    plain = Dump(
        source="llmcheck", root=tmp_path, records=[], manifest={"backend": "plain", "command_line": ["run.sh"]}
    )
    assert command(plain, "bf16", tmp_path / "golden_twin") == (
        f"env DTYPE=bf16 llmcheck dump --backend plain -o {tmp_path / 'golden_twin'} -- run.sh"
    )
    assert (
        command(Dump(source="llmcheck", root=tmp_path, records=[], manifest={"backend": "torch"}), "bf16", tmp_path)
        is None
    )
