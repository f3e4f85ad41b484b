"""Manual mapping end to end: the two seed documents' dump_data flows, compare on their metadata.json, many writers.

The ATB side is a format-exact ATB tensor tree (``.bin`` files written by the ATB writer)
holding what an fp16 device computed: the golden fp32 tensor rounded to fp16, except for
one data id in one token, where the "device" got it wrong.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from llmcheck import dump_data
from llmcheck.core.cli import main
from llmcheck.core.errors import PathOutsideDumpError, UsageError
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.atb.bin_format import write_bin

HIDDEN = 32
NORM_PATH = (
    "0_ChatGlm6BModelEncoderTorch/{layer}_ChatGlm6BLayerEncoderOperationGraphRunner/"
    "6_NormOpsRunner/after/outTensor0.bin"
)


def _golden(data_id: int, token_id: int) -> torch.Tensor:
    return torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(100 * data_id + token_id))


def _device_output(data_id: int, token_id: int, broken: tuple[int, int]) -> torch.Tensor:
    value = _golden(data_id, token_id)
    if (data_id, token_id) == broken:
        value = value + 0.5 * torch.randn(value.shape, generator=torch.Generator().manual_seed(1))
    return value.to(torch.float16)


def _write_atb_tensor(dump_root: Path, token_id: int, tensor_path: str, tensor: torch.Tensor) -> Path:
    path = dump_root / "tensors" / f"0_{os.getpid()}" / str(token_id) / tensor_path
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bin(path, tensor)
    return path


def _report(folder: Path) -> list[dict[str, str]]:
    with open(folder / "cmp_report.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_seed_mapped_flow_keeps_every_token_and_compares_each_golden_tensor_with_its_bin(tmp_path: Path) -> None:
    dump_dir = tmp_path / "dump_dir"
    atb_root = dump_dir / "ait_dump"  # step 1 of the seed: the ATB dump, here written file by file
    broken = (1, 1)
    for token_id in (0, 1):
        for data_id in (0, 1):
            my_path = _write_atb_tensor(
                atb_root, token_id, NORM_PATH.format(layer=data_id), _device_output(data_id, token_id, broken)
            )
            metadata = dump_data(token_id, data_id, _golden(data_id, token_id), str(my_path), str(dump_dir))
    run_folder = dump_dir / "ait_dump" / f"{os.getpid()}_-1"
    assert metadata == run_folder / "golden_tensor" / "metadata.json"
    recorded = json.loads(metadata.read_text())
    assert sorted(recorded) == ["0", "1"] and all(sorted(tokens) == ["0", "1"] for tokens in recorded.values())
    assert recorded["1"]["1"] == [
        "1/1_tensor.safetensors",
        str(atb_root / "tensors" / f"0_{os.getpid()}" / "1" / NORM_PATH.format(layer=1)),
    ]
    assert (run_folder / "golden_tensor" / "1" / "1_tensor.safetensors").is_file()

    # Step 3: the seed gives the run folder as golden path and one .bin as my path.
    one_bin = atb_root / "tensors" / f"0_{os.getpid()}" / "0" / NORM_PATH.format(layer=0)
    assert main(["compare", "-gp", str(run_folder), "-mp", str(one_bin), "-o", str(tmp_path / "cmp")]) == 3
    rows = _report(tmp_path / "cmp")
    assert [(row["name"], row["token_id"]) for row in rows] == [("0", "0"), ("1", "0"), ("0", "1"), ("1", "1")]
    assert {row["pairing_rule"] for row in rows} == {"manual_mapping"}
    assert all(row["golden_dtype"] == "torch.float32" and row["my_dtype"] == "torch.float16" for row in rows)
    verdicts = {(row["name"], row["token_id"]): row["verdict"] for row in rows}
    assert verdicts.pop(("1", "1")) == "fail"
    assert set(verdicts.values()) <= {"pass", "warn"}
    assert rows[3]["my_data_path"].endswith("1/" + NORM_PATH.format(layer=1))

    # The metadata.json itself is a golden path too, and the report is the same.
    assert main(["compare", "-gp", str(metadata), "-mp", str(one_bin), "-o", str(tmp_path / "cmp2")]) == 3
    assert [row["verdict"] for row in _report(tmp_path / "cmp2")] == [row["verdict"] for row in rows]


def test_seed_sided_flow_pairs_golden_and_acl_metadata_by_data_id_and_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the seed writes {PID}_cmp_dump_data into the working directory
    monkeypatch.delenv("ATB_OUTPUT_DIR", raising=False)
    broken = (0, 1)
    for token_id in (0, 1):
        for data_id in (0, 1):
            dump_data("golden", data_id, _golden(data_id, token_id), token_id=token_id)
        # acl, high level: the model output tensor itself
        dump_data("acl", 0, data_val=_device_output(0, token_id, broken), token_id=token_id)
        # acl, low level: a tensor inside the ATB dump this process writes (here: written by hand)
        tensor_path = NORM_PATH.format(layer=1)
        _write_atb_tensor(
            tmp_path / "msit_dump_20240101_000000", token_id, tensor_path, _device_output(1, token_id, broken)
        )
        dump_data("acl", 1, tensor_path=tensor_path, token_id=token_id)
    dump_dir = tmp_path / f"{os.getpid()}_cmp_dump_data"
    acl = json.loads((dump_dir / "acl_tensor" / "metadata.json").read_text())
    assert acl["1"]["1"]["atb_tensor_path"] == NORM_PATH.format(layer=1)
    assert sorted(acl["0"]) == ["0", "1"]

    assert (
        main(
            [
                "compare",
                "-gp",
                str(dump_dir / "golden_tensor" / "metadata.json"),
                "-mp",
                str(dump_dir / "acl_tensor" / "metadata.json"),
                "-o",
                str(tmp_path / "cmp"),
            ]
        )
        == 3
    )
    rows = _report(tmp_path / "cmp")
    assert len(rows) == 4 and {row["pairing_rule"] for row in rows} == {"manual_mapping"}
    verdicts = {(row["name"], row["token_id"]): row["verdict"] for row in rows}
    assert verdicts.pop(("0", "1")) == "fail"
    assert set(verdicts.values()) <= {"pass", "warn"}
    low_level = next(row for row in rows if (row["name"], row["token_id"]) == ("1", "1"))
    assert low_level["my_data_path"].endswith("1/" + NORM_PATH.format(layer=1))

    # A folder holding both sides is ambiguous: one clear error naming both.
    assert main(["compare", "-gp", str(dump_dir), "-mp", str(dump_dir), "-o", str(tmp_path / "cmp3")]) == 1


_WRITER = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from llmcheck import dump_data
    from llmcheck.plugins.manual.metadata_file import record_entry

    shared, output, worker = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for index in range(60):
        record_entry(shared, f"w{worker}_{index % 6}", str(index // 6), f"{index}.safetensors")
        dump_data(index // 6, index % 6, torch.full((4,), float(index)), "device.bin", output)
""")


@pytest.mark.slow  # two Python processes importing torch
def test_two_processes_writing_at_once_lose_no_entry(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "golden_tensor"
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    workers = [
        subprocess.Popen([sys.executable, str(script), str(shared), str(tmp_path / "out"), str(worker)])
        for worker in (0, 1)
    ]
    assert [worker.wait(timeout=120) for worker in workers] == [0, 0]
    recorded = json.loads((shared / "metadata.json").read_text())
    assert sorted(recorded) == [f"w{worker}_{data}" for worker in (0, 1) for data in range(6)]
    assert all(sorted(tokens, key=int) == [str(token) for token in range(10)] for tokens in recorded.values())
    runs = sorted((tmp_path / "out" / "ait_dump").iterdir())
    assert [run.name for run in runs] == sorted(f"{worker.pid}_-1" for worker in workers)
    for run in runs:
        mapping = json.loads((run / "golden_tensor" / "metadata.json").read_text())
        assert len(mapping) == 6 and all(len(tokens) == 10 for tokens in mapping.values())
    assert list(shared.glob(".*.tmp")) == []


def test_dump_data_rejects_wrong_arguments_with_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="data_src must be 'golden' or 'acl'"):
        dump_data("gold", 0, torch.ones(2), output_path=tmp_path)
    with pytest.raises(UsageError, match="exactly one"):
        dump_data("acl", 0, output_path=tmp_path)
    with pytest.raises(PathOutsideDumpError, match=r"without '\.\.'"):
        dump_data("acl", 0, tensor_path="../../etc/passwd.bin", output_path=tmp_path)
    with pytest.raises(UsageError, match=r"golden_data must be a torch\.Tensor"):
        dump_data(0, 0, [1.0, 2.0], "my.bin", tmp_path)
    with pytest.raises(UsageError, match="token_id must be an int"):
        dump_data(-1, 0, torch.ones(2), "my.bin", tmp_path)


@pytest.mark.parametrize(
    ("kind", "tensor", "says"),
    [
        ("sparse", torch.eye(3).to_sparse(), " (torch.sparse_coo) (give a dense tensor: data_val.to_dense())"),
        (
            "meta",
            torch.empty(3, device="meta"),
            ", which holds no values (only a shape and a dtype) (give the tensor of a real run, on the CPU or an accelerator)",
        ),
    ],
)
def test_dump_data_refuses_a_tensor_without_dense_values_naming_the_data_id(
    tmp_path: Path, kind: str, tensor: torch.Tensor, says: str
) -> None:
    with pytest.raises(UsageError) as refused:
        dump_data("golden", "layer0.out", tensor, token_id=0, output_path=tmp_path)
    assert refused.value.one_line() == f"dump_data: data_id 'layer0.out': data_val is a {kind} tensor{says}"
    with pytest.raises(UsageError, match=f"^dump_data: data_id 'layer0.out': golden_data is a {kind} tensor"):
        dump_data(0, "layer0.out", tensor, "my.bin", tmp_path)  # the other signature says the same
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_compare_names_the_metadata_entry_whose_tensor_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metadata = dump_data(0, 7, torch.ones(3), str(tmp_path / "never_written.bin"), str(tmp_path))
    assert main(["compare", "-gp", str(metadata), "-mp", str(metadata), "-o", str(tmp_path / "cmp")]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("llmcheck: error: ") and "\n" not in error
    assert "never_written.bin" in error


def test_a_metadata_entry_climbing_out_of_the_dump_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metadata = dump_data(0, 7, torch.ones(3), str(tmp_path / "my.bin"), str(tmp_path / "out"))
    (tmp_path / "secret.npy").write_bytes(b"not for llmcheck")
    mapping = json.loads(metadata.read_text())
    mapping["7"]["0"][0] = "../../../secret.npy"
    metadata.write_text(json.dumps(mapping))
    assert main(["compare", "-gp", str(metadata), "-mp", str(metadata), "-o", str(tmp_path / "cmp")]) == 1
    error = capsys.readouterr().err
    assert "'../../../secret.npy', a path that climbs out of the dump" in error and error.count("\n") == 1


def test_data_ids_that_differ_only_in_unsafe_characters_keep_their_own_tensors(tmp_path: Path) -> None:
    from llmcheck.plugins.manual.metadata_file import read_metadata

    first, second = torch.ones(2), torch.full((2,), 7.0)
    dump_data("golden", "layer.0/out", first, output_path=tmp_path)
    metadata_path = dump_data("golden", "layer.0_out", second, output_path=tmp_path)
    recorded = read_metadata(metadata_path)
    paths = {data_id: recorded[data_id]["0"] for data_id in ("layer.0/out", "layer.0_out")}
    assert paths["layer.0/out"] != paths["layer.0_out"]
    from safetensors.torch import load_file

    assert torch.equal(load_file(metadata_path.parent / paths["layer.0/out"])["tensor"], first)
    assert torch.equal(load_file(metadata_path.parent / paths["layer.0_out"])["tensor"], second)


def test_threads_saving_the_same_data_id_at_once_never_fail(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from safetensors.torch import load_file

    values = [torch.full((64, 64), float(thread)) for thread in range(4)]

    def save(thread: int) -> Path:
        return dump_data("golden", "x", values[thread], output_path=tmp_path)

    for _ in range(25):
        with ThreadPoolExecutor(4) as pool:
            (metadata_path, *_) = list(pool.map(save, range(4)))
    saved = load_file(metadata_path.parent / "0" / "x_tensor.safetensors")["tensor"]
    assert any(torch.equal(saved, value) for value in values)  # one writer's tensor, whole
    assert sorted(path.name for path in metadata_path.parent.rglob("*")) == [
        "0",
        "metadata.json",
        "x_tensor.safetensors",
    ]


@pytest.mark.slow
def test_dump_data_onto_a_full_disk_raises_an_error_naming_the_file(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from llmcheck import dump_data
        from llmcheck.core.errors import LlmcheckError
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        try:
            dump_data("golden", "big", torch.ones(1 << 16), output_path={str(tmp_path)!r})
        except LlmcheckError as exc:
            print(type(exc).__name__, exc.one_line())
    """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    (tensor_folder,) = tmp_path.glob("*_cmp_dump_data/golden_tensor/0")
    assert completed.stdout.strip() == (
        f"WriteFailedError {tensor_folder / 'big_tensor.safetensors'}: cannot write: [Errno 27] File too large (EFBIG)"
    )
    assert list(tensor_folder.iterdir()) == []  # no temporary file left


def test_a_metadata_file_with_a_byte_that_is_not_utf8_is_one_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metadata = dump_data("golden", "mlp_out", torch.ones(2), output_path=tmp_path)
    metadata.write_bytes(metadata.read_bytes().replace(b"mlp_out", b"mlp_\xeeout"))
    assert main(["compare", "-gp", str(metadata), "-mp", str(metadata), "-o", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.startswith(f"llmcheck: error: {metadata}: not valid UTF-8: byte b'\\xee'")


def test_paths_relative_to_the_writers_working_folder_are_found_and_the_missing_ones_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for data_id in ("attn_out", "mlp_out"):  # dump_data(..., output_path="./output") run in tmp_path
        golden = dump_data("golden", data_id, torch.full((3,), 2.0), token_id=3, output_path=tmp_path / "output")
        acl = dump_data("acl", data_id, torch.full((3,), 2.0), token_id=3, output_path=tmp_path / "output")
    run = golden.parent.parent.name  # {pid}_cmp_dump_data
    for metadata in (golden, acl):  # the original tool's form: relative to the writer's working folder
        mapping = json.loads(metadata.read_text())
        for tokens in mapping.values():
            tokens["3"] = f"./output/{run}/{metadata.parent.name}/{tokens['3']}"
        metadata.write_text(json.dumps(mapping))
    moved = tmp_path / "elsewhere"
    shutil.move(tmp_path / "output", moved)  # read from another folder: paths resolve against the dump
    golden, acl = (moved / run / side / "metadata.json" for side in ("golden_tensor", "acl_tensor"))
    assert main(["compare", "-gp", str(golden), "-mp", str(acl), "-o", str(tmp_path / "cmp")]) == 0
    assert [row["data_id"] for row in _report(tmp_path / "cmp")] == ["attn_out", "mlp_out"]
    for name in ("attn_out", "mlp_out"):
        (golden.parent / "3" / f"{name}_tensor.safetensors").unlink()
    assert main(["compare", "-gp", str(golden), "-mp", str(acl), "-o", str(tmp_path / "cmp")]) == 1
    error = capsys.readouterr().err
    assert (
        error.startswith(
            f"llmcheck: error: {golden}: 2 of 2 entries name tensor files that are not found: "
            "data_id attn_out token 3 names './output/"
        )
        and "data_id mlp_out token 3" in error
    )


def test_the_my_path_may_be_the_folder_holding_the_files_the_mapping_names(tmp_path: Path) -> None:
    mine = tmp_path / "my_tensors"
    mine.mkdir()
    for data_id in (0, 1):
        write_bin(mine / f"outtensor{data_id}.bin", _golden(data_id, 0).to(torch.float16))
        metadata = dump_data(0, data_id, _golden(data_id, 0), str(mine / f"outtensor{data_id}.bin"), str(tmp_path))
    (mine / "notes.txt").write_text("not a tensor")
    assert main(["compare", "-gp", str(metadata), "-mp", str(mine), "-o", str(tmp_path / "cmp")]) == 0
    rows = _report(tmp_path / "cmp")
    assert [(row["data_id"], row["pairing_rule"], Path(row["my_data_path"]).name) for row in rows] == [
        ("0", "manual_mapping", "outtensor0.bin"),
        ("1", "manual_mapping", "outtensor1.bin"),
    ]


# --- rule and name-pattern entries of a --mapping file ----------------------------------------


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Return two dumps of one seeded tiny Llama on the same tokens (every record pairs by its key)."""
    from llmcheck import DumpConfig, register_hook
    from llmcheck.bundled_model import random_llama

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("llama_runs")
    model = random_llama(seed=0)
    paths = []
    for run in ("golden", "my"):
        with register_hook(model, DumpConfig(dump_path=root / run)) as session, torch.no_grad():
            model(torch.tensor([[1, 7, 42, 9]]))
        paths.append(Path(session.path))
    return paths[0], paths[1]


def test_a_mapping_rule_no_plugin_reads_is_a_usage_error_naming_the_file_the_entries_and_the_known_rules(
    llama_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, my = llama_runs
    mapping = tmp_path / "mapping.json"
    mapping.write_text(
        json.dumps(
            [
                {"golden": "*.mlp.down_proj:output.*", "rule": "tp_unshrd(sum)"},
                {"golden": "*.self_attn", "rule": "frobnicate"},
                {"golden": "*.input_layernorm", "rule": "tp_replicated"},
            ]
        )
    )
    out = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "--mapping", str(mapping)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"llmcheck: error: {mapping}: entry 1: unknown rule 'tp_unshrd(sum)' (did you mean tp_unshard?); "
        "entry 2: unknown rule 'frobnicate' "
        '(known rules: tp_unshard, tp_replicated; pair by name with {"golden": pattern, "my": pattern})\n'
    )
    assert not out.exists()


def test_a_name_pattern_entry_that_pairs_nothing_is_a_warning_naming_it(
    llama_runs: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    golden, my = llama_runs
    mapping = tmp_path / "mapping.json"
    mapping.write_text(
        json.dumps(
            {
                "*.mlp.down_proj": "*.mlp.down_proj",
                "model.decoder.*.ffn": "model.decoder.*.ffn",
                "lm_head": "output_layer",
            }
        )
    )
    out = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "--mapping", str(mapping)]) == 0
    assert (
        f"{mapping}: 2 of the 3 name-pattern entries pair nothing: "
        "'model.decoder.*.ffn' -> 'model.decoder.*.ffn' (no record of either run has a name like it); "
        "'lm_head' -> 'output_layer' (no my record has a name like it)"
    ) in caplog.text
    pairs = json.loads((out / "pairs.json").read_text())["pairs"]
    assert {pair["rule"] for pair in pairs if pair["golden"]["name"].endswith("mlp.down_proj")} == {"user_mapping"}


def test_hook_llmcheck_register_mapping_rules(llmcheck_plugins, tmp_path: Path) -> None:
    """A plugin's registered rule is accepted in a mapping file; a name two plugins register names both."""
    from llmcheck.core.errors import PluginError
    from llmcheck.core.pairing.merge import load_user_mapping
    from llmcheck.plugin_api import hookimpl

    class TransposedRule:
        @staticmethod
        @hookimpl
        def llmcheck_register_mapping_rules(register):
            register("npy_transposed")

    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps([{"golden": "*.attn.qk", "rule": "npy_transposed(1, 0)"}]))
    plugins = llmcheck_plugins(TransposedRule())
    assert set(plugins.mapping_rules()) == {"tp_unshard", "tp_replicated", "npy_transposed"}
    assert load_user_mapping(mapping, get_plugins().mapping_rules()).rules == (("*.attn.qk", "npy_transposed(1, 0)"),)

    class ClashingRule:
        @staticmethod
        @hookimpl
        def llmcheck_register_mapping_rules(register):
            register("tp_unshard")

    with pytest.raises(PluginError, match=r"mapping rule 'tp_unshard' is registered by both .*'tensor_parallel'"):
        llmcheck_plugins(ClashingRule()).mapping_rules()
