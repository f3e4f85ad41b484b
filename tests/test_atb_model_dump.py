"""A two-layer Llama dumped as ATB would dump it: compare names a perturbed op as the first introduced
divergence, and the ATB <-> torch pairing pairs the decoder layers and the main ops with the modules.

The ATB trees are format-exact (``msit_dump_*/tensors/{dev}_{pid}/{exec}/{id}_{Op}/...``, ``.bin``
files with the probe's header) and hold the real tensors of a real forward pass of the model, laid
out as an ATB graph: WordEmbedding, two Decoder_layer graphs (RmsNorm, Attention graph with q/k/v/o
LinearOperations and SelfAttention, residual Elewise add, RmsNorm, Mlp graph with gate/up Linear,
Activation, Elewise mul, down Linear, Elewise add), final RmsNorm, LM head Linear.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from llmcheck.core.cli import main
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.atb.bin_format import write_bin

pytestmark = pytest.mark.slow  # every test here builds a Llama (transformers import, ~10 s once)

PID = 4242
PERTURBED_MODULE = "model.layers.1.mlp.down_proj"
PERTURBED_OP = "2_4_4"  # layer 2 (the second decoder layer), Mlp graph 4, down LinearOperation 4


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    return kwargs["hidden_states"] if "hidden_states" in kwargs else kwargs["input_ids"]


def _run(
    model: torch.nn.Module, input_ids: torch.Tensor, perturb: str | None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Return ``{module name: (first input, first output)}`` of one forward pass, optionally perturbing one module."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = []
    generator = torch.Generator().manual_seed(3)

    def make_hook(name: str):
        def hook(module, args, kwargs, output):
            out = output[0] if isinstance(output, tuple) else output
            if not isinstance(out, torch.Tensor):
                return output  # model outputs (ModelOutput) are not ATB ops
            if name == perturb:
                out = out + 0.3 * out.std() * torch.randn(out.shape, generator=generator)
                output = (out, *output[1:]) if isinstance(output, tuple) else out
            seen[name] = (_hidden(args, kwargs).detach().clone(), out.detach().clone())
            return output

        return hook

    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_hook(make_hook(name), with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1, tensor.shape[-1]).contiguous() if tensor.dim() > 1 else tensor.contiguous()


def write_atb_dump(model: torch.nn.Module, input_ids: torch.Tensor, out: Path, perturb: str | None = None) -> Path:
    """Write the model's forward pass as an ATB dump tree (execute count 0) and return the dump root."""
    seen = _run(model, input_ids, perturb)
    root = out / "msit_dump_20240131_120000"
    step = root / "tensors" / f"0_{PID}" / "0"

    def op(chain: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], param: Any) -> None:
        folder = step / chain
        (folder / "before").mkdir(parents=True)
        (folder / "after").mkdir()
        for index, tensor in enumerate(inputs):
            write_bin(folder / "before" / f"intensor{index}.bin", tensor.contiguous())
        for index, tensor in enumerate(outputs):
            write_bin(folder / "after" / f"outtensor{index}.bin", tensor.contiguous())
        (folder / "op_param.json").write_text(json.dumps(param))

    def linear(chain: str, name: str) -> None:
        x, y = seen[name]
        op(
            chain,
            [_flat(x), model.get_submodule(name).weight.detach()],
            [_flat(y)],
            {"transposeA": False, "transposeB": True, "hasBias": False, "outDataType": -1},
        )

    def rms_norm(chain: str, name: str) -> None:
        x, y = seen[name]
        op(
            chain,
            [_flat(x), model.get_submodule(name).weight.detach()],
            [_flat(y)],
            {"layerType": 1, "normParam": {"epsilon": model.get_submodule(name).variance_epsilon}},
        )

    ids = input_ids.reshape(-1)
    embedded = _flat(seen["model.embed_tokens"][1])
    embedding_weight = model.get_submodule("model.embed_tokens").weight.detach()
    op("0_WordEmbedding", [embedding_weight, ids], [embedded], "")
    op("0_WordEmbedding/0_GatherOperation", [embedding_weight, ids], [embedded], {"axis": 0, "batchDims": 0})
    for number in range(model.config.num_hidden_layers):
        prefix, layer = f"model.layers.{number}", f"{number + 1}_Decoder_layer"
        layer_in, layer_out = (_flat(t) for t in seen[prefix])
        attention_out = _flat(seen[f"{prefix}.self_attn"][1])
        residual = layer_in + attention_out
        mlp_in, mlp_out = (_flat(t) for t in seen[f"{prefix}.mlp"])
        gate, act = _flat(seen[f"{prefix}.mlp.gate_proj"][1]), _flat(seen[f"{prefix}.mlp.act_fn"][1])
        up = _flat(seen[f"{prefix}.mlp.up_proj"][1])
        op(layer, [layer_in], [layer_out], "")
        rms_norm(f"{layer}/0_RmsNormOperation", f"{prefix}.input_layernorm")
        normed = _flat(seen[f"{prefix}.input_layernorm"][1])
        op(f"{layer}/1_Attention", [normed], [attention_out], "")
        for index, projection in enumerate(("q_proj", "k_proj", "v_proj")):
            linear(f"{layer}/1_Attention/{index}_LinearOperation", f"{prefix}.self_attn.{projection}")
        qkv = [_flat(seen[f"{prefix}.self_attn.{p}"][1]) for p in ("q_proj", "k_proj", "v_proj")]
        op(
            f"{layer}/1_Attention/3_SelfAttentionOperation",
            qkv,
            [_flat(seen[f"{prefix}.self_attn.o_proj"][0])],
            {
                "headNum": model.config.num_attention_heads,
                "kvHeadNum": model.config.num_key_value_heads,
                "qkScale": 1.0 / (model.config.head_dim**0.5),
                "calcType": 0,
                "maskType": 1,
            },
        )
        linear(f"{layer}/1_Attention/4_LinearOperation", f"{prefix}.self_attn.o_proj")
        op(f"{layer}/2_ElewiseOperation", [layer_in, attention_out], [residual], {"elewiseType": 8})
        rms_norm(f"{layer}/3_RmsNormOperation", f"{prefix}.post_attention_layernorm")
        op(f"{layer}/4_Mlp", [mlp_in], [mlp_out], "")
        linear(f"{layer}/4_Mlp/0_LinearOperation", f"{prefix}.mlp.gate_proj")
        linear(f"{layer}/4_Mlp/1_LinearOperation", f"{prefix}.mlp.up_proj")
        op(f"{layer}/4_Mlp/2_ActivationOperation", [gate], [act], {"activationType": 4, "scale": 1.0})
        op(
            f"{layer}/4_Mlp/3_ElewiseOperation",
            [act, up],
            [_flat(seen[f"{prefix}.mlp.down_proj"][0])],
            {"elewiseType": 9},
        )
        linear(f"{layer}/4_Mlp/4_LinearOperation", f"{prefix}.mlp.down_proj")
        op(f"{layer}/5_ElewiseOperation", [residual, mlp_out], [layer_out], {"elewiseType": 8})
    rms_norm("3_RmsNormOperation", "model.norm")
    linear("4_LinearOperation", "lm_head")
    return root


@pytest.fixture(scope="module")
def model_and_ids():
    from llmcheck.bundled_model import random_llama

    return random_llama(seed=0), torch.tensor([[5, 17, 99, 3, 42]])


@pytest.fixture(scope="module")
def torch_dump(model_and_ids, tmp_path_factory) -> Path:
    """A real llmcheck torch capture of the same forward pass (the golden side)."""
    from llmcheck import DumpConfig, register_hook

    model, input_ids = model_and_ids
    session = register_hook(model, DumpConfig(dump_path=tmp_path_factory.mktemp("torch")))
    with torch.no_grad():
        model(input_ids)
    session.close()
    return session.path


def _summary(golden: Path, my: Path, out: Path) -> dict[str, Any]:
    code = main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1"])
    assert code == 3  # the perturbed op fails
    return json.loads((out / "summary.json").read_text())


def test_compare_names_the_perturbed_atb_op_as_the_first_introduced_divergence(model_and_ids, tmp_path):
    model, input_ids = model_and_ids
    golden = write_atb_dump(model, input_ids, tmp_path / "golden")
    my = write_atb_dump(model, input_ids, tmp_path / "my", perturb=PERTURBED_MODULE)
    summary = _summary(golden, my, tmp_path / "report")
    introduced = summary["first_introduced"]
    assert (introduced["name"], introduced["op_type"], introduced["io"], introduced["step"]) == (
        PERTURBED_OP,
        "LinearOperation",
        "output",
        0,
    )
    assert introduced["attribution"] == "introduced"
    pairs = json.loads((tmp_path / "report" / "pairs.json").read_text())["pairs"]
    rules = {pair["rule"] for pair in pairs}
    assert rules == {"atb-atb: same op id, step, tensor and op type"}


def test_atb_torch_pairing_pairs_the_layers_and_main_ops(model_and_ids, torch_dump, tmp_path):
    model, input_ids = model_and_ids
    atb = write_atb_dump(model, input_ids, tmp_path / "atb")
    plugins = get_plugins()
    golden, my = plugins.load_tensors(torch_dump), plugins.load_tensors(atb)
    pairs = [pair for pair in plugins.map_pairs(golden, my, None) if pair.rule.startswith("atb-torch")]
    outputs = {pair.golden.key.name: pair.my.key.name for pair in pairs if pair.golden.key.io == "output"}
    expected = {"model.embed_tokens": "0", "model.norm": "3", "lm_head": "4"}
    for number in range(2):
        layer, op = f"model.layers.{number}", str(number + 1)
        expected.update(
            {
                layer: op,
                f"{layer}.input_layernorm": f"{op}_0",
                f"{layer}.self_attn": f"{op}_1",
                f"{layer}.self_attn.q_proj": f"{op}_1_0",
                f"{layer}.self_attn.k_proj": f"{op}_1_1",
                f"{layer}.self_attn.v_proj": f"{op}_1_2",
                f"{layer}.self_attn.o_proj": f"{op}_1_4",
                f"{layer}.post_attention_layernorm": f"{op}_3",
                f"{layer}.mlp": f"{op}_4",
                f"{layer}.mlp.gate_proj": f"{op}_4_0",
                f"{layer}.mlp.up_proj": f"{op}_4_1",
                f"{layer}.mlp.act_fn": f"{op}_4_2",
                f"{layer}.mlp.down_proj": f"{op}_4_4",
            }
        )
    assert outputs == expected
    layer_pair = next(pair for pair in pairs if pair.golden.key.name == "model.layers.1")
    assert layer_pair.rule == "atb-torch: decoder layer #1 (layers matched in order)" and layer_pair.priority == 50
    down = next(p for p in pairs if p.golden.key.name == "model.layers.1.mlp.down_proj" and p.golden.key.io == "input")
    assert down.my.key.name == "2_4_4" and down.rule.endswith("first input")
    # The core attention kernel (before o_proj) has no torch module: it is left unpaired, not mispaired.
    assert not any(pair.my.key.name.endswith("_1_3") for pair in pairs)


def test_compare_of_atb_against_torch_finds_the_perturbed_op(model_and_ids, torch_dump, tmp_path):
    model, input_ids = model_and_ids
    my = write_atb_dump(model, input_ids, tmp_path / "my", perturb=PERTURBED_MODULE)
    summary = _summary(torch_dump, my, tmp_path / "report")
    introduced = summary["first_introduced"]
    assert (introduced["name"], introduced["my_name"], introduced["attribution"]) == (
        PERTURBED_MODULE,
        PERTURBED_OP,
        "introduced",
    )


def test_atb_atb_pairing_follows_ops_whose_ids_moved_by_type_and_order(model_and_ids, tmp_path):
    from llmcheck.core.records import Dump

    model, input_ids = model_and_ids
    plugins = get_plugins()
    golden = plugins.load_tensors(write_atb_dump(model, input_ids, tmp_path / "golden"))
    # The same graph, its layers renumbered (10, 11 for 1, 2) and its linears quantised.
    moved = []
    for record in golden.records:
        name = record.key.name
        head, _, rest = name.partition("_")
        if head in ("1", "2"):
            name = "_".join([str(int(head) + 9), *([rest] if rest else [])])
        op_type = "LinearQuantOperation" if record.op_type == "LinearOperation" else record.op_type
        moved.append(
            record.with_changes(
                key=record.key.__class__(**{**{s: getattr(record.key, s) for s in record.key.__slots__}, "name": name}),
                op_type=op_type,
                attrs={**record.attrs, "op_path": ""},
            )
        )
    my = Dump(source="atb", root=tmp_path, records=moved)
    pairs = plugins.map_pairs(golden, my, None)
    by_rule: dict[str, set[tuple[str, str]]] = {}
    for pair in pairs:
        if pair.rule.startswith("atb-atb"):
            by_rule.setdefault(pair.rule, set()).add((pair.golden.key.name, pair.my.key.name))
    same_id = by_rule["atb-atb: same op id, step, tensor and op type"]
    assert ("4", "4") in same_id and ("0", "0") in same_id  # lm head (quantised, same id) and embedding
    structural = set().union(*(names for rule, names in by_rule.items() if "order under a paired parent" in rule))
    assert {("2", "11"), ("2_4_4", "11_4_4"), ("1_1_3", "10_1_3")} <= structural


def test_user_mapping_entries_name_types_paired_in_order_before_the_table(model_and_ids, torch_dump, tmp_path):
    from llmcheck.core.records import UserMapping

    model, input_ids = model_and_ids
    plugins = get_plugins()
    golden, my = plugins.load_tensors(torch_dump), plugins.load_tensors(write_atb_dump(model, input_ids, tmp_path))
    mapping = UserMapping(path=tmp_path / "mapping.json", entries=(("SiLU*", "ActivationOperation"),))
    activation_pairs = [
        pair
        for pair in plugins.map_pairs(golden, my, mapping)
        if pair.golden.key.name.endswith("act_fn") and pair.golden.key.io == "output"
    ]
    assert [(pair.golden.key.name, pair.my.key.name, pair.priority) for pair in activation_pairs] == [
        ("model.layers.0.mlp.act_fn", "1_4_2", 60),
        ("model.layers.1.mlp.act_fn", "2_4_2", 60),
    ]
    assert activation_pairs[0].rule == "atb-torch: user mapping 'SiLU*' <-> 'ActivationOperation' #0 in layer #0"
