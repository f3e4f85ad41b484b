"""Seeded mutation fuzzing of every kind of input llmcheck reads: a clean error or a correct load, never a crash.

Each *input kind* builds a small valid seed (real files in their real format, written by
the real writers) and names the one file of it to mutate and the command that reads it.
A case copies the seed, mutates that file with a ``random.Random(case)`` -- bytes flipped,
inserted, deleted, truncated, non-UTF-8 bytes; for JSON a value replaced by another type,
a key dropped; for binary headers the header text edited -- and runs the command in this
process through ``llmcheck.core.cli.main``.

The *hostile* kinds do not edit bytes: each case picks one of the valid seeds above and one
file of its mutated run (``Seed.run``) and puts something else in its place -- a FIFO, a
link to a device (``/dev/zero``), a symbolic link that loops -- or writes into one of its
JSON documents a value nested 1,000 to 100,000 deep or a name longer than the system
allows (a seed without JSON gets the long name in its path argument). The outcome is one of:

* ``clean error`` -- exit 1 or 2 with one ``llmcheck: error:`` line that names a file;
* ``loaded`` -- exit 0 or 3 (the mutation left a readable input, or changed only values);
* ``internal error`` -- the CLI's ``internal error: ...`` line, an error naming no file, or
  an exception out of ``main``: a bug;
* ``hang`` -- over :data:`CASE_TIMEOUT_S`;
* ``silent drop`` -- a file replaced by a FIFO, a device link or a loop, and the command
  exits 0 or 3 without a line naming it: the file was dropped without a word.

Used by ``tests/test_fuzz_inputs.py`` (a few cases per kind) and
``benchmarks/fuzz_inputs.py`` (hundreds per kind, printing the table of outcomes).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CLEAN_ERROR, LOADED, INTERNAL_ERROR, HANG = "clean error", "loaded", "internal error", "hang"
SILENT_DROP = "silent drop"
OUTCOMES = (CLEAN_ERROR, LOADED, INTERNAL_ERROR, HANG, SILENT_DROP)
CASE_TIMEOUT_S = 30
DATA = Path(__file__).parent / "data"

#: Values a JSON mutation puts in place of a field: each of another type, or out of range.
REPLACEMENTS: tuple[Any, ...] = (
    None,
    -1,
    2**70,
    -(2**70),
    1.5,
    "x",
    "",
    [],
    [0],
    {},
    {"a": 1},
    True,
    "../../etc/passwd",
    "/abs/path",
    [[1]],
    1e308,
    "nan",
    "\u00e9\u00ff",
)


@dataclass(frozen=True)
class Seed:
    """A valid input built in a folder: the file to mutate, how it is mutated, the command that reads it."""

    target: Path
    style: str  # "json", "jsonl", "safetensors", "npy", "atb_bin", "text", "bytes"
    command: Callable[[Path], list[str]]  # given the output folder, the CLI arguments
    run: Path  # the folder of the run the target belongs to: a hostile kind edits any file below it


@dataclass(frozen=True)
class InputKind:
    """One kind of input and how to build its seed in a folder (a hostile kind edits the other kinds' seeds)."""

    name: str
    build: Callable[[Path], Seed] | None
    hostile: Callable[[Seed, random.Random], Hostile] | None = None


@dataclass(frozen=True)
class Hostile:
    """What a hostile edit did: the file it replaced (``None``: a value in a file), the command's arguments after it."""

    replaced: Path | None
    arguments: Callable[[list[str]], list[str]] = lambda arguments: arguments


# --- mutations ------------------------------------------------------------------------------


def _mutate_bytes(data: bytes, rng: random.Random, header_bytes: int | None = None) -> bytes:
    """Return ``data`` with one random byte-level change (biased to the first ``header_bytes``)."""
    if not data:
        return bytes([rng.randrange(256)])
    span = min(len(data), header_bytes) if header_bytes else len(data)
    at = rng.randrange(span)
    choice = rng.randrange(7)
    if choice == 0:  # flip bits
        return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
    if choice == 1:  # a random byte
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
    if choice == 2:  # insert bytes
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + data[at:]
    if choice == 3:  # delete a range
        return data[:at] + data[at + rng.randint(1, 16) :]
    if choice == 4:  # truncate
        return data[:at]
    if choice == 5:  # a non-UTF-8 byte
        return data[:at] + b"\xff" + data[at + 1 :]
    return data[:at] + data[at : at + rng.randint(1, 32)] + data[at:]  # duplicate a chunk


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Return the path of every value nested in a JSON document."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found.extend(_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found.extend(_paths(child, (*prefix, index)))
    return found


def _mutate_json_value(document: Any, rng: random.Random) -> Any:
    """Return the document with one value replaced by another type, or one key dropped."""
    paths = [path for path in _paths(document) if path]
    if not paths:
        return rng.choice(REPLACEMENTS)
    path = rng.choice(paths)
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and rng.random() < 0.25:
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(REPLACEMENTS)
    return document


def mutate(seed: Seed, rng: random.Random) -> None:
    """Apply one seeded mutation to the seed's target file, in place."""
    data = seed.target.read_bytes()
    structural = rng.random() < 0.6
    if seed.style == "json" and structural:
        document = _mutate_json_value(json.loads(data), rng)
        seed.target.write_text(json.dumps(document))
    elif seed.style == "jsonl" and structural:
        lines = data.decode().splitlines()
        at = rng.randrange(len(lines))
        lines[at] = json.dumps(_mutate_json_value(json.loads(lines[at]), rng))
        seed.target.write_text("\n".join(lines) + "\n")
    elif seed.style == "safetensors" and structural:
        size = int.from_bytes(data[:8], "little")
        header = _mutate_json_value(json.loads(data[8 : 8 + size]), rng)
        encoded = json.dumps(header).encode()
        encoded += b" " * (-len(encoded) % 8)
        seed.target.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + size :])
    elif seed.style == "npy" and structural:
        header_end = data.index(b"\n") + 1
        header = data[10:header_end].decode("latin-1")
        replacements = ["'|O'", "'|V4'", "[('a', '<f4')]", "'<U3'", "'>f4'", "'<f2'", "'<i8'", "'x'", "7", "(", "'<f4"]
        fields = ["'descr': '<f4'", "'shape': (4,)", "'fortran_order': False"]
        field = rng.choice(fields)
        if field.startswith("'descr'"):
            header = header.replace("'<f4'", rng.choice(replacements))
        elif field.startswith("'shape'"):
            header = header.replace(
                "(4,)", rng.choice(["(-1,)", "(4, 4)", "()", "(0,)", "(2**40,)", "(4.0,)", "[4]", "('a',)", "(4,"])
            )
        else:
            header = header.replace("False", rng.choice(["True", "None", "1", "'x'"]))
        encoded = header.encode("latin-1")
        seed.target.write_bytes(data[:8] + len(encoded).to_bytes(2, "little") + encoded + data[header_end:])
    elif seed.style == "atb_bin" and structural:
        end = data.find(b"$End=1\n")
        lines = data[:end].decode("latin-1").splitlines() if end > 0 else []
        if lines:
            at = rng.randrange(len(lines))
            key = lines[at].split("=", 1)[0]
            lines[at] = f"{key}={rng.choice(['-1', '', 'x', '99999999999999', '1,2', '2,,3', '1.5', '0'])}"
        seed.target.write_bytes(("\n".join(lines) + "\n").encode("latin-1") + data[end:])
    elif seed.style in ("text", "jsonl", "json") and structural:
        text = data.decode("utf-8", errors="replace").splitlines(keepends=True)
        at = rng.randrange(len(text))
        text[at] = rng.choice(["", "}\n", "{\n", '"\n', "op {\n", text[at] * 2, text[at][::-1], "x: 1\n"])
        seed.target.write_text("".join(text))
    else:
        header_bytes = {"safetensors": 512, "npy": 128, "atb_bin": 128, "bytes": 256}.get(seed.style)
        seed.target.write_bytes(_mutate_bytes(data, rng, header_bytes))


# --- seeds ----------------------------------------------------------------------------------


def _tiny_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _torch_dump(folder: Path, mode: str = "module") -> Path:
    import torch

    from llmcheck import DumpConfig, register_hook

    model = _tiny_model()
    with register_hook(model, DumpConfig(dump_path=folder, token_range=[0, 1], mode=(mode,))) as session:
        with torch.no_grad():
            for step in range(2):
                model(torch.full((2, 4), float(step + 1)))
    assert session.path is not None
    return session.path


def _compare_with_pristine(golden: Path, my: Path, *extra: str) -> Callable[[Path], list[str]]:
    return lambda output: ["compare", "-gp", str(golden), "-mp", str(my), "-o", str(output), "-j", "1", *extra]


def _llmcheck_dump_seed(file_name: str, style: str) -> Callable[[Path], Seed]:
    def build(folder: Path) -> Seed:
        golden = _torch_dump(folder / "golden")
        pristine = Path(shutil.copytree(golden, folder / "my" / golden.name))
        return Seed(golden / file_name, style, _compare_with_pristine(golden, pristine), golden)

    return build


def _opcheck_seed(folder: Path) -> Seed:
    dump = _torch_dump(folder / "ops", mode="op")
    return Seed(
        dump / "index.jsonl", "jsonl", lambda output: ["opcheck", "-i", str(dump), "-o", str(output), "-j", "1"], dump
    )


def _manual_seed(folder: Path) -> Seed:
    import torch

    from llmcheck import dump_data

    for token in (0, 1):
        for data_id in ("attn_out", "mlp_out"):
            value = torch.full((3,), float(token))
            golden = dump_data("golden", data_id, value, token_id=token, output_path=folder)
            acl = dump_data("acl", data_id, value, token_id=token, output_path=folder)
    return Seed(golden, "json", _compare_with_pristine(golden, acl), golden.parent)


def _fx_seed(folder: Path) -> Seed:
    paths = []
    for side in ("golden", "my"):
        step = folder / side / "gm_20240101000000000001_dump" / "0"
        step.mkdir(parents=True)
        np.save(step / "mm-aten.mm.default.INPUT.0.20240101000000000002.npy", np.ones((2, 4), np.float32))
        np.save(step / "mm-aten.mm.default.OUTPUT.0.20240101000000000002.npy", np.ones(4, np.float32))
        np.save(step / "to-aten._to_copy.default.INPUT.1.20240101000000000003.npy", np.array("torch.float16"))
        paths.append(folder / side)
    target = paths[0] / "gm_20240101000000000001_dump" / "0" / "mm-aten.mm.default.OUTPUT.0.20240101000000000002.npy"
    command = _compare_with_pristine(paths[0], paths[1], "--golden-source", "fx", "--my-source", "fx")
    return Seed(target, "npy", command, paths[0])


def _atb_seed(file_glob: str, style: str) -> Callable[[Path], Seed]:
    def build(folder: Path) -> Seed:
        source = DATA / "atb" / "msit_dump_20240131_120000"
        golden = Path(shutil.copytree(source, folder / "golden" / source.name))
        my = Path(shutil.copytree(source, folder / "my" / source.name))
        target = sorted(golden.rglob(file_glob))[0]
        return Seed(target, style, _compare_with_pristine(golden, my), golden)

    return build


def _ge_tree(folder: Path) -> Path:
    import torch

    from llmcheck.plugins.torchair_ge.ge_dump import GeDumpFileName, payload_from_tensor, write_ge_dump
    from llmcheck.plugins.torchair_ge.ge_graph_text import GeGraphOp, write_ge_graph_text

    step = folder / "20240101120000" / "0" / "graph_1" / "1" / "0"
    for op_type, name, timestamp in (("Mul", "Mul_1", 100), ("Add", "Add_2", 200)):
        tensor = torch.full((2, 2), float(timestamp))
        write_ge_dump(
            step,
            GeDumpFileName(op_type, name, 1, 0, timestamp),
            [payload_from_tensor(tensor)],
            [payload_from_tensor(tensor + 1)],
        )
    ops = (
        GeGraphOp("arg0", "Data", (), (None,)),
        GeGraphOp("Mul_1", "Mul", ("arg0:0",), ("mul-aten.mul.Tensor.OUTPUT.0",)),
        GeGraphOp("Add_2", "Add", ("Mul_1:0",), ("add-aten.add.Tensor.OUTPUT.0",)),
    )
    write_ge_graph_text(
        folder,
        "graph_1",
        [GeGraphOp(o.name, o.op_type, o.inputs, o.fx_tensor_names, i) for i, o in enumerate(ops)],
        graph_id=1,
        rank=0,
        pid=10,
    )
    return folder


def _ge_seed(which: str) -> Callable[[Path], Seed]:
    def build(folder: Path) -> Seed:
        golden, my = _ge_tree(folder / "golden"), _ge_tree(folder / "my")
        if which == "graph":
            target, style = next(golden.glob("dynamo_original_graph_*.txt")), "text"
        else:
            target, style = sorted(golden.rglob("Mul.Mul_1.*"))[0], "bytes"
        command = _compare_with_pristine(golden, my, "--golden-source", "ge", "--my-source", "ge")
        return Seed(target, style, command, golden)

    return build


def _checkpoint_seed(folder: Path) -> Seed:
    from safetensors.torch import save_file

    golden, my = folder / "golden", folder / "my"
    for side in (golden, my):
        side.mkdir()
        (side / "config.json").write_text(json.dumps({"model_type": "tiny"}))
        save_file(dict(_tiny_model().state_dict()), str(side / "model.safetensors"))
    return Seed(golden / "model.safetensors", "safetensors", _compare_with_pristine(golden, my), golden)


def _msprobe_seed(folder: Path) -> Seed:
    source = DATA / "msprobe" / "msprobe_pytorch_dump"
    golden = Path(shutil.copytree(source, folder / "golden" / "step0" / "rank0"))
    shutil.copytree(source, folder / "my" / "step0" / "rank0")
    return Seed(golden / "dump.json", "json", _compare_with_pristine(folder / "golden", folder / "my"), golden)


KINDS: tuple[InputKind, ...] = (
    InputKind("llmcheck index.jsonl", _llmcheck_dump_seed("index.jsonl", "jsonl")),
    InputKind("llmcheck manifest.json", _llmcheck_dump_seed("manifest.json", "json")),
    InputKind("llmcheck topology.json", _llmcheck_dump_seed("topology.json", "json")),
    InputKind("llmcheck shard", _llmcheck_dump_seed("shard_00000.safetensors", "safetensors")),
    InputKind("op-level dump (opcheck)", _opcheck_seed),
    InputKind("manual metadata.json", _manual_seed),
    InputKind("FX .npy", _fx_seed),
    InputKind("ATB .bin", _atb_seed("outtensor0.bin", "atb_bin")),
    InputKind("ATB op csv", _atb_seed("operation_tensors_0.csv", "text")),
    InputKind("ATB layer JSON", _atb_seed("Decoder_layer_0.json", "json")),
    InputKind("GE dump file", _ge_seed("dump")),
    InputKind("GE graph text", _ge_seed("graph")),
    InputKind("checkpoint model.safetensors", _checkpoint_seed),
    InputKind("msprobe dump.json", _msprobe_seed),
)


# --- hostile edits: something else in place of a file, a value no parser or file system takes ---------


def _run_files(seed: Seed) -> list[Path]:
    """Return the regular files of the seed's mutated run, in a stable order."""
    return sorted(path for path in seed.run.rglob("*") if path.is_file() and not path.is_symlink())


def _fifo(seed: Seed, rng: random.Random) -> Hostile:
    target = rng.choice(_run_files(seed))
    target.unlink()
    os.mkfifo(target)
    return Hostile(target)


def _device_link(seed: Seed, rng: random.Random) -> Hostile:
    target = rng.choice(_run_files(seed))
    target.unlink()
    target.symlink_to(rng.choice(("/dev/zero", "/dev/null", "/dev/urandom")))
    return Hostile(target)


def _link_loop(seed: Seed, rng: random.Random) -> Hostile:
    target = rng.choice(_run_files(seed))
    target.unlink()
    if rng.random() < 0.5:
        target.symlink_to(target.name)  # a link to itself
    else:
        partner = target.with_name(target.name + ".loop")
        partner.symlink_to(target.name)
        target.symlink_to(partner.name)  # two links, each to the other
    return Hostile(target)


def _json_documents(seed: Seed) -> list[Path]:
    """Return the files of the run holding JSON: ``.json``, ``.jsonl`` and the headers of ``.safetensors``."""
    return [path for path in _run_files(seed) if path.suffix in (".json", ".jsonl", ".safetensors")]


def _replace_json_value(path: Path, rng: random.Random, value_text: str) -> None:
    """Put ``value_text`` (raw JSON) in place of one value of one of the file's documents."""
    sentinel = "\u0000llmcheck-fuzz\u0000"
    data = path.read_bytes()

    def edited(document_text: bytes) -> bytes:
        document = json.loads(document_text)
        paths = [found for found in _paths(document) if found]
        if not paths:
            return value_text.encode()
        where = rng.choice(paths)
        parent = document
        for step in where[:-1]:
            parent = parent[step]
        parent[where[-1]] = sentinel
        return json.dumps(document).replace(json.dumps(sentinel), value_text).encode()

    if path.suffix == ".safetensors":
        size = int.from_bytes(data[:8], "little")
        header = edited(data[8 : 8 + size])
        header += b" " * (-len(header) % 8)
        path.write_bytes(len(header).to_bytes(8, "little") + header + data[8 + size :])
    elif path.suffix == ".jsonl":
        lines = data.splitlines()
        at = rng.randrange(len(lines))
        lines[at] = edited(lines[at])
        path.write_bytes(b"\n".join(lines) + b"\n")
    else:
        path.write_bytes(edited(data))


def _deep_json(seed: Seed, rng: random.Random) -> Hostile:
    documents = _json_documents(seed)
    if not documents:  # a run without JSON: the nesting goes into a file its reader would parse as one
        documents = [seed.target]
    depth = rng.choice((1_000, 10_000, 100_000))
    opening, closing = rng.choice((("[", "]"), ('{"a":', "}")))
    target = rng.choice(documents)
    if target.suffix in (".json", ".jsonl", ".safetensors"):
        _replace_json_value(target, rng, opening * depth + "0" + closing * depth)
    else:
        target.write_text(opening * depth + "0" + closing * depth)
    return Hostile(None)


def _long_name(seed: Seed, rng: random.Random) -> Hostile:
    name = rng.choice(("x" * 256, "y" * 5_000, "/".join(["z"] * 2_100)))  # over NAME_MAX, and over PATH_MAX
    documents = _json_documents(seed)
    if documents and rng.random() < 0.75:
        _replace_json_value(rng.choice(documents), rng, json.dumps(name))
        return Hostile(None)
    run = str(seed.run)  # no JSON to hold it: the path given on the command line gets the long name
    return Hostile(None, lambda arguments: [f"{run}/{name}" if argument == run else argument for argument in arguments])


HOSTILE_KINDS: tuple[InputKind, ...] = (
    InputKind("FIFO in place of a file", None, _fifo),
    InputKind("link to a device", None, _device_link),
    InputKind("symbolic link loop", None, _link_loop),
    InputKind("JSON nested deep", None, _deep_json),
    InputKind("name too long", None, _long_name),
)
ALL_KINDS = KINDS + HOSTILE_KINDS


# --- running ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseResult:
    """What one mutated input gave: its outcome and the line llmcheck printed."""

    kind: str
    case: int
    outcome: str
    message: str


class _Timeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def run_case(kind: InputKind, seed_folder: Path, work: Path, case: int) -> CaseResult:
    """Copy the seed, mutate it with ``random.Random(case)``, run its command and classify the outcome.

    A hostile kind picks the seed (of :data:`KINDS`) with the same generator; ``seed_folder`` is then unused.
    """
    from llmcheck.core.cli import main

    rng = random.Random(case)
    base_kind = kind if kind.hostile is None else rng.choice(KINDS)
    if kind.hostile is not None:
        seed_folder = _SEEDS[base_kind.name][1]
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(seed_folder, work)
    seed = _seed_in(base_kind, work)
    if kind.hostile is None:
        mutate(seed, rng)
        hostile = Hostile(None)
    else:
        hostile = kind.hostile(seed, rng)
    arguments = hostile.arguments(seed.command(work / "report"))
    errors, printed = io.StringIO(), io.StringIO()
    warnings = logging.StreamHandler(errors)  # the CLI's own handler writes where stderr was when it was made
    warnings.setFormatter(logging.Formatter("llmcheck: %(levelname)s: %(message)s"))
    logging.getLogger("llmcheck").addHandler(warnings)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(printed):
            code = main(arguments)
    except _Timeout:
        return CaseResult(kind.name, case, HANG, base_kind.name)
    except BaseException as exc:
        return CaseResult(kind.name, case, INTERNAL_ERROR, f"{base_kind.name}: {type(exc).__name__}: {exc}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        logging.getLogger("llmcheck").removeHandler(warnings)
    lines = [line for line in errors.getvalue().splitlines() if line.startswith("llmcheck: error:")]
    message = lines[-1] if lines else ""
    if "internal error" in message:
        return CaseResult(kind.name, case, INTERNAL_ERROR, f"{base_kind.name}: {message}")
    if code in (0, 3) and hostile.replaced is not None:
        named = any(str(hostile.replaced) in line for line in errors.getvalue().splitlines())
        if not named:
            return CaseResult(kind.name, case, SILENT_DROP, f"{base_kind.name}: {hostile.replaced} never named")
    if code in (0, 3) or (code == 1 and not message and "no pairs:" in printed.getvalue()):
        return CaseResult(kind.name, case, LOADED, message)  # read and reported (no pair at all is exit 1)
    if code in (1, 2) and message and str(work) in message:
        return CaseResult(kind.name, case, CLEAN_ERROR, message)
    return CaseResult(
        kind.name, case, INTERNAL_ERROR, f"{base_kind.name}: exit {code}, no error naming a file: {message!r}"
    )


#: each prepared kind's seed and the folder it was built in
_SEEDS: dict[str, tuple[Seed, Path]] = {}


def _seed_in(kind: InputKind, work: Path) -> Seed:
    """Return the kind's seed with its paths moved from the seed folder into ``work``."""
    seed, seed_root = _SEEDS[kind.name]

    def command(output: Path) -> list[str]:
        return [argument.replace(str(seed_root), str(work)) for argument in seed.command(output)]

    return Seed(work / seed.target.relative_to(seed_root), seed.style, command, work / seed.run.relative_to(seed_root))


def prepare(kinds: tuple[InputKind, ...], base: Path) -> dict[str, Path]:
    """Build every kind's seed under ``base`` and return each kind's seed folder (a hostile kind needs them all)."""
    needed = KINDS if any(kind.hostile is not None for kind in kinds) else kinds
    folders = {}
    for index, kind in enumerate(KINDS):
        if kind in needed:
            folder = base / f"seed{index}"
            folder.mkdir(parents=True)
            assert kind.build is not None
            _SEEDS[kind.name] = (kind.build(folder), folder)
            folders[kind.name] = folder
    folders.update({kind.name: base for kind in kinds if kind.hostile is not None})
    return folders
