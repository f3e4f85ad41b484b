"""The plugin core: entry points, allow/block lists, tracing, clashes, and one test per hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from llmcheck import hookimpl
from llmcheck.core.capture.backend_options import BackendOption
from llmcheck.core.capture.seed_flags import seed_dump_options
from llmcheck.core.cli import main
from llmcheck.core.errors import DumpNotFoundError, PluginError, UsageError
from llmcheck.core.plugins import build_plugins, get_plugins
from llmcheck.core.records import Dump, MetricSpec, Pair, RecordKey, SourceInfo, TensorRecord
from llmcheck.core.reporting.reporters import Reporter

BUILTIN_PLUGINS = {"atb", "torch_hooks", "torchair_ge", "torchair_fx", "manual", "reports"}
THIRD_PARTY = Path(__file__).parent / "third_party_plugin"


def _plugin(name: str, **hooks: object) -> types.ModuleType:
    """Return a module-like plugin object holding the given hook implementations."""
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        setattr(module, hook_name, hookimpl(function))
    return module


def test_plugins_json_lists_the_builtin_plugins_found_through_entry_points(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert set(listed) >= BUILTIN_PLUGINS
    for name in BUILTIN_PLUGINS:
        assert listed[name]["distribution"] == "llmcheck"
        assert listed[name]["version"]
    assert "llmcheck_load_tensors" in listed["native"]["hooks"]


def test_allow_list_loads_only_the_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMCHECK_LOAD_PLUGINS", "native, atb")
    names = {info.name for info in build_plugins().infos()}
    assert names == {"native", "atb"}


def test_block_list_removes_the_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMCHECK_DISABLE_PLUGINS", "atb,manual")
    names = {info.name for info in build_plugins().infos()}
    assert "atb" not in names and "manual" not in names and "native" in names


def test_trace_logs_every_hook_call_to_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMCHECK_TRACE_PLUGINS", "1")
    build_plugins().sources()
    err = capsys.readouterr().err
    assert "llmcheck: trace: llmcheck_register_sources(register)" in err
    assert "llmcheck: trace: llmcheck_register_sources returned" in err


def test_misspelt_hook_is_an_error_naming_the_plugin_and_the_closest_hook() -> None:
    misspelt = _plugin("typo_plugin", llmcheck_register_metricz=lambda register: None)
    with pytest.raises(PluginError) as error:
        build_plugins(extra_plugins=[misspelt])
    assert error.value.one_line() == (
        "plugin 'typo_plugin' implements llmcheck_register_metricz, a hook that does not exist "
        "(did you mean 'llmcheck_register_metrics'? rename it in the plugin)"
    )


def test_an_exception_in_a_plugins_hook_is_a_plugin_error_naming_the_plugin_and_the_hook() -> None:
    def explode(register):
        raise ValueError("metric registration exploded")

    facade = build_plugins(extra_plugins=[_plugin("exploding", llmcheck_register_metrics=explode)])
    with pytest.raises(PluginError) as error:
        facade.metrics()
    assert error.value.what == (
        "plugin 'exploding' failed in its llmcheck_register_metrics hook: ValueError: metric registration exploded"
    )
    assert isinstance(error.value.__cause__, ValueError)  # the plugin's traceback, for -l debug


def test_an_llmcheck_error_a_plugins_hook_raises_reaches_the_user_unchanged(tmp_path: Path) -> None:
    def refuse(path, source):
        raise UsageError("not a dump I read", where=path, hint="give another path")

    facade = build_plugins(extra_plugins=[_plugin("refusing", llmcheck_load_tensors=refuse)])
    with pytest.raises(UsageError) as error:
        facade.load_tensors(tmp_path)
    assert error.value.one_line() == f"{tmp_path}: not a dump I read (give another path)"


def _installed_plugins() -> str:
    from importlib import metadata

    return ", ".join(sorted({entry_point.name for entry_point in metadata.entry_points(group="llmcheck")}))


def test_a_misspelt_name_in_disable_plugins_is_a_warning_and_disables_nothing() -> None:
    result = _run_llmcheck(["plugins", "--json"], env={"LLMCHECK_DISABLE_PLUGINS": "torch_hook"})
    assert result.returncode == 0
    assert result.stderr == (
        "llmcheck: WARNING: LLMCHECK_DISABLE_PLUGINS: unknown plugin 'torch_hook', ignored "
        f"(did you mean 'torch_hooks'? installed plugins: {_installed_plugins()})\n"
    )
    assert "torch_hooks" in {entry["name"] for entry in json.loads(result.stdout)}


def test_an_allow_list_naming_no_installed_plugin_warns_that_no_plugin_is_loaded() -> None:
    result = _run_llmcheck(["plugins", "--json"], env={"LLMCHECK_LOAD_PLUGINS": "torch_hook"})
    assert result.returncode == 0
    assert result.stderr == (
        "llmcheck: WARNING: LLMCHECK_LOAD_PLUGINS: unknown plugin 'torch_hook', ignored; no name in "
        "LLMCHECK_LOAD_PLUGINS is installed, so no plugin is loaded "
        f"(did you mean 'torch_hooks'? installed plugins: {_installed_plugins()})\n"
    )
    assert json.loads(result.stdout) == []


def test_an_allow_list_with_one_unknown_name_warns_and_loads_the_others() -> None:
    result = _run_llmcheck(["plugins", "--json"], env={"LLMCHECK_LOAD_PLUGINS": "native,atbb"})
    assert result.returncode == 0
    assert result.stderr == (
        "llmcheck: WARNING: LLMCHECK_LOAD_PLUGINS: unknown plugin 'atbb', ignored "
        f"(did you mean 'atb'? installed plugins: {_installed_plugins()})\n"
    )
    assert [entry["name"] for entry in json.loads(result.stdout)] == ["native"]


def test_two_plugins_registering_one_metric_name_is_an_error_naming_both() -> None:
    def register_twice(register):
        register(MetricSpec("dup", "a duplicate", True, make_accumulator=lambda: None))

    first = _plugin("first_plugin", llmcheck_register_metrics=register_twice)
    second = _plugin("second_plugin", llmcheck_register_metrics=register_twice)
    facade = build_plugins(extra_plugins=[first, second])
    with pytest.raises(PluginError) as error:
        facade.metrics()
    message = str(error.value)
    assert "'dup'" in message and "first_plugin" in message and "second_plugin" in message


def test_cli_start_up_does_not_import_torch() -> None:
    code = "import sys; from llmcheck.core.cli import main; rc = main(['--help']); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith("False")


def test_a_compare_of_statistics_dumps_does_not_import_torch(tmp_path: Path) -> None:
    # every source plugin is asked whether it reads the dump: none may import torch to answer
    from llmcheck.core.dumps.store import DumpWriter
    from llmcheck.core.records import RecordKey, TensorRecord, TensorStats

    for side in ("golden", "my"):
        with DumpWriter(tmp_path / side, "test") as writer:
            stats = TensorStats(min=-1.0, max=1.0, mean=0.0, l2norm=2.0, nan_count=0, inf_count=0)
            writer.add(TensorRecord(RecordKey("layer", "output"), "float32", (4,), order=0, stats=stats), None)
    compare = ["compare", "-gp", str(tmp_path / "golden"), "-mp", str(tmp_path / "my"), "-o", str(tmp_path / "out")]
    code = f"import sys; from llmcheck.core.cli import main; rc = main({compare!r}); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith("False"), result.stdout + result.stderr


# --- one test per hook (tests/test_hook_docs.py checks every hook has one) ----------------


class _RecordingBackend:
    """A capture backend that runs the command for real and remembers the request."""

    name = "recorder"
    description = "runs the command unchanged and records the request"

    def __init__(self) -> None:
        self.requests = []

    def run(self, request):
        self.requests.append(request)
        return subprocess.run(list(request.command), check=False).returncode


def _register_seed_flags(register) -> None:
    for option in seed_dump_options("recorder"):
        register(option)


def test_hook_llmcheck_register_capture_backends(llmcheck_plugins, tmp_path: Path) -> None:
    backend = _RecordingBackend()
    llmcheck_plugins(
        _plugin(
            "recorder_plugin",
            llmcheck_register_capture_backends=lambda register: register(backend),
            llmcheck_register_backend_options=_register_seed_flags,
        )
    )
    code = main(
        [
            "dump",
            "--backend",
            "recorder",
            "-o",
            str(tmp_path),
            "-er",
            "3,5,7,7",
            "--type",
            "tensor",
            "model",
            "--exec",
            f"{sys.executable} -c 'import sys; sys.exit(3)'",
        ]
    )
    assert code == 3  # the child's exit code comes back
    (request,) = backend.requests
    assert request.command == [sys.executable, "-c", "import sys; sys.exit(3)"]  # quotes honoured, no shell
    assert request.options["execute_range"] == [(3, 5), (7, 7)]
    assert request.options["type"] == ["tensor", "model"]
    assert request.output_dir == tmp_path


def test_dump_without_backend_uses_the_backend_that_declares_itself_default(
    llmcheck_plugins, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert get_plugins().capture_backend(None).name == "torch"  # the built-in torch backend declares is_default
    claimant = _RecordingBackend()
    claimant.is_default = True
    llmcheck_plugins(_plugin("claimant_plugin", llmcheck_register_capture_backends=lambda register: register(claimant)))
    assert main(["dump", "-o", str(tmp_path), "--", "true"]) == 2
    assert "--backend: several backends claim to be the default (" in capsys.readouterr().err
    assert claimant.requests == []


def _positive_shots(value: int, flag: str) -> int:
    if value < 1:
        raise UsageError(f"invalid value {value}", where=flag, hint="give 1 or more shots")
    return value


def _register_recorder_options(register) -> None:
    register(
        BackendOption(
            "recorder",
            "shots",
            "How many times to run the program.",
            type=int,
            default=1,
            aliases=("-n",),
            parse=_positive_shots,
        )
    )
    register(BackendOption("recorder", "mode", "How to run it.", choices=("fast", "careful"), default="fast"))
    register(BackendOption("recorder", "quiet", "Say nothing.", type=bool))
    register(BackendOption("another", "only_elsewhere", "An option of another backend."))


def test_hook_llmcheck_register_backend_options(
    llmcheck_plugins, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = _RecordingBackend()
    llmcheck_plugins(
        _plugin(
            "recorder_plugin",
            llmcheck_register_capture_backends=lambda register: register(backend),
            llmcheck_register_backend_options=_register_recorder_options,
        )
    )
    assert (
        main(
            [
                "dump",
                "--backend",
                "recorder",
                "-o",
                str(tmp_path / "a"),
                "-n",
                "3",
                "--mode",
                "careful",
                "--",
                sys.executable,
                "-c",
                "pass",
            ]
        )
        == 0
    )
    assert main(["dump", "--backend=recorder", "-o", str(tmp_path / "b"), "--quiet", "--", "true"]) == 0
    assert [request.options for request in backend.requests] == [
        {"shots": 3, "mode": "careful", "quiet": False},
        {"shots": 1, "mode": "fast", "quiet": True},
    ]
    capsys.readouterr()
    assert main(["dump", "--backend", "recorder", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "-n, --shots INTEGER How many times to run the program. [default: 1]" in help_text
    assert "--mode [fast|careful]" in help_text and "--only-elsewhere" not in help_text
    assert "--save-time" not in help_text  # the seed flags are the torch and atb backends' own
    for args, expected in (
        (["-n", "0"], "llmcheck: error: -n/--shots: invalid value 0 (give 1 or more shots)\n"),
        (
            ["--mode", "slow"],
            "llmcheck: error: Invalid value for '--mode': 'slow' is not one of 'fast', 'careful'. "
            "(see 'llmcheck dump --help')\n",
        ),
        (
            ["--only-elsewhere", "x"],
            "llmcheck: error: --only-elsewhere: is an option of backend another, not recorder "
            "('llmcheck dump --backend recorder --help' lists recorder's options)\n",
        ),
    ):
        assert main(["dump", "--backend", "recorder", "-o", str(tmp_path / "c"), *args, "--", "true"]) == 2
        assert capsys.readouterr().err == expected
    assert len(backend.requests) == 2  # a wrong flag runs nothing


def test_two_plugins_declaring_one_flag_of_a_backend_is_an_error_naming_both(llmcheck_plugins) -> None:
    def register_save_time(register) -> None:
        register(BackendOption("torch", "step_time", "Clashes with the seed's -time.", aliases=("-time",)))

    facade = llmcheck_plugins(_plugin("timing_plugin", llmcheck_register_backend_options=register_save_time))
    with pytest.raises(PluginError, match="backend option 'torch -time' is registered by both") as raised:
        facade.backend_options("torch")
    assert {"'torch_hooks'", "'timing_plugin'"} <= set(str(raised.value).split())


def test_a_backend_option_that_cannot_be_a_flag_is_a_plugin_error(llmcheck_plugins) -> None:
    facade = llmcheck_plugins(
        _plugin(
            "bad_plugin",
            llmcheck_register_backend_options=lambda register: register(
                BackendOption("torch", "output", "Takes dump's own -o.")
            ),
        )
    )
    with pytest.raises(PluginError, match="backend option '--output' of backend 'torch' cannot be a flag"):
        facade.backend_options()


def _write_verdicts(result, path: Path) -> None:
    path.write_text("".join(f"{row.golden.key.name} {row.verdict}\n" for row in result.rows))


def test_hook_llmcheck_register_reporters(llmcheck_plugins, make_llmcheck_dump, tmp_path: Path) -> None:
    import torch

    llmcheck_plugins(
        _plugin(
            "verdicts_plugin",
            llmcheck_register_reporters=lambda register: register(
                Reporter("verdicts", "one line per pair: name and verdict", "verdicts.txt", _write_verdicts)
            ),
        )
    )
    golden = make_llmcheck_dump(tmp_path / "golden", {"a": torch.ones(4), "b": torch.ones(4)})
    my = make_llmcheck_dump(tmp_path / "my", {"a": torch.ones(4), "b": torch.full((4,), 2.0)})
    out = tmp_path / "out"
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(out), "-j", "1", "--report", "verdicts"]) == 3
    assert (out / "verdicts.txt").read_text() == "a pass\nb fail\n"
    assert (out / "cmp_report.csv").is_file()  # the default reports are still written
    assert main(["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "plain"), "-j", "1"]) == 3
    assert not (tmp_path / "plain" / "verdicts.txt").exists()  # not a default: only on request


def test_two_plugins_registering_one_report_name_is_an_error_naming_both(llmcheck_plugins) -> None:
    facade = llmcheck_plugins(
        _plugin(
            "csv_plugin",
            llmcheck_register_reporters=lambda register: register(
                Reporter("csv", "another CSV", "other.csv", _write_verdicts)
            ),
        )
    )
    with pytest.raises(PluginError, match="reporter 'csv' is registered by both") as raised:
        facade.reporters()
    assert {"'reports'", "'csv_plugin'"} <= set(str(raised.value).split())


def _load_csv_dump(path: Path, source: str | None) -> Dump | None:
    if source not in (None, "csvtensors") or path.suffix != ".csv":
        return None
    records = [
        TensorRecord(key=RecordKey(name=line.split(",")[0]), dtype="float32", shape=(1,), order=order)
        for order, line in enumerate(path.read_text().splitlines())
    ]
    return Dump(source="csvtensors", root=path, records=records)


def test_hook_llmcheck_register_sources(llmcheck_plugins) -> None:
    facade = llmcheck_plugins(
        _plugin(
            "csv_plugin",
            llmcheck_register_sources=lambda register: register(SourceInfo("csvtensors", "one tensor per CSV line")),
        )
    )
    assert facade.sources()["csvtensors"].description == "one tensor per CSV line"
    assert "llmcheck" in facade.sources()


def test_hook_llmcheck_load_tensors(llmcheck_plugins, tmp_path: Path) -> None:
    facade = llmcheck_plugins(
        _plugin(
            "csv_plugin",
            llmcheck_load_tensors=_load_csv_dump,
            llmcheck_register_sources=lambda register: register(SourceInfo("csvtensors", "csv")),
        )
    )
    csv_file = tmp_path / "run.csv"
    csv_file.write_text("embed,1\nlayer0,2\n")
    dump = facade.load_tensors(csv_file)
    assert dump.source == "csvtensors" and [r.key.name for r in dump.records] == ["embed", "layer0"]
    with pytest.raises(UsageError, match="unknown dump source 'nosuch'"):
        facade.load_tensors(csv_file, "nosuch")
    with pytest.raises(DumpNotFoundError, match="not a llmcheck dump"):
        facade.load_tensors(csv_file, "llmcheck")
    with pytest.raises(DumpNotFoundError, match="no such file"):
        facade.load_tensors(tmp_path / "missing.csv")


def test_hook_llmcheck_map_pairs(llmcheck_plugins, tmp_path: Path) -> None:
    def pair_by_reversed_order(golden: Dump, my: Dump, user_mapping):
        return [Pair(g, m, rule="reversed", priority=10) for g, m in zip(golden.records, reversed(my.records))]

    facade = llmcheck_plugins(_plugin("reverse_plugin", llmcheck_map_pairs=pair_by_reversed_order))
    records = [TensorRecord(key=RecordKey(name=n), dtype="float32", shape=(1,), order=i) for i, n in enumerate("ab")]
    golden = Dump("test", tmp_path, records)
    my = Dump("test", tmp_path, list(records))
    proposals = [p for p in facade.map_pairs(golden, my, None) if p.rule == "reversed"]
    assert [(p.golden.key.name, p.my.key.name) for p in proposals] == [("a", "b"), ("b", "a")]


@pytest.fixture(scope="session")
def third_party_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Install tests/third_party_plugin with pip into a private folder, as a user would install a plugin."""
    import shutil

    site = tmp_path_factory.mktemp("third_party_site")
    source = tmp_path_factory.mktemp("third_party_source") / "llmcheck-maxulp"
    shutil.copytree(THIRD_PARTY, source)  # building writes build/ and egg-info beside the sources: not in the repo
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
    )
    return site


def _run_llmcheck(
    args: list[str], site: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh process (plugins load there anew), with ``site`` first on its path."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("LLMCHECK_LOAD_PLUGINS", "LLMCHECK_DISABLE_PLUGINS", "LLMCHECK_TRACE_PLUGINS")
    }
    if site is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "llmcheck.core.cli", *args], capture_output=True, text=True, env=environment
    )


def test_hook_llmcheck_register_metrics(third_party_site: Path) -> None:
    result = _run_llmcheck(["plugins", "--json"], third_party_site)
    assert result.returncode == 0, result.stderr
    listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert listed["maxulp"]["distribution"] == "llmcheck-maxulp"
    assert listed["maxulp"]["version"] == "1.2.3"
    assert listed["maxulp"]["hooks"] == [
        "llmcheck_register_backend_options",
        "llmcheck_register_capture_backends",
        "llmcheck_register_metrics",
        "llmcheck_register_reporters",
    ]
    assert set(listed) >= BUILTIN_PLUGINS
    table = _run_llmcheck(["plugins"], third_party_site)
    assert "max_ulp" in table.stdout


def test_hook_llmcheck_export_onnx(llmcheck_plugins, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def export(topology_path: Path, level: int, output_path: Path | None):
        if topology_path.suffix != ".tree":
            return None
        target = output_path or topology_path.with_suffix(".onnx")
        target.write_text(f"level {level}")
        return target

    llmcheck_plugins(_plugin("tree_plugin", llmcheck_export_onnx=export))
    tree = tmp_path / "model.tree"
    tree.write_text("root")
    assert main(["export", "onnx", str(tree), "--level", "2"]) == 0
    assert (tmp_path / "model.onnx").read_text() == "level 2"
    assert "model.onnx" in capsys.readouterr().out
    other = tmp_path / "model.unknown"
    other.write_text("?")
    assert main(["export", "onnx", str(other)]) == 1
    assert "no plugin recognises this topology file" in capsys.readouterr().err


def test_third_party_metric_is_a_column_of_every_compare(
    third_party_site: Path, make_llmcheck_dump, tmp_path: Path
) -> None:
    import csv

    import torch

    golden = make_llmcheck_dump(tmp_path / "golden", {"x": torch.ones(8)})
    my = make_llmcheck_dump(tmp_path / "my", {"x": torch.full((8,), 1 + 2**-20)})  # 8 float32 ULPs off
    result = _run_llmcheck(
        ["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out"), "-j", "1"], third_party_site
    )
    assert result.returncode in (0, 3), result.stderr
    with open(tmp_path / "out" / "cmp_report.csv", newline="") as report:
        (row,) = list(csv.DictReader(report))
    assert float(row["max_ulp"]) == 8.0


def test_a_pip_installed_plugin_adds_a_reporter_and_a_backend_with_options_without_a_core_change(
    third_party_site: Path, make_llmcheck_dump, tmp_path: Path
) -> None:
    import torch

    golden = make_llmcheck_dump(tmp_path / "golden", {"x": torch.ones(8)})
    my = make_llmcheck_dump(tmp_path / "my", {"x": torch.full((8,), 1 + 2**-20)})  # 8 float32 ULPs off
    compared = _run_llmcheck(
        ["compare", "-gp", str(golden), "-mp", str(my), "-o", str(tmp_path / "out"), "-j", "1", "--report", "ulp"],
        third_party_site,
    )
    assert compared.returncode in (0, 3), compared.stderr
    assert json.loads((tmp_path / "out" / "max_ulp.json").read_text()) == {"x step 0 output.0": 8.0}

    helped = _run_llmcheck(["dump", "--backend", "stamp", "--help"], third_party_site)
    assert helped.returncode == 0 and "--label TEXT" in helped.stdout and "--times INTEGER" in helped.stdout
    out = tmp_path / "stamped"
    dumped = _run_llmcheck(
        [
            "dump",
            "--backend",
            "stamp",
            "--label",
            "golden",
            "--times",
            "2",
            "-o",
            str(out),
            "--",
            sys.executable,
            "-c",
            "import sys; sys.exit(4)",
        ],
        third_party_site,
    )
    assert dumped.returncode == 4, dumped.stderr
    stamp = json.loads((out / "stamp.json").read_text())
    assert stamp == {"label": "golden", "argv": [sys.executable, "-c", "import sys; sys.exit(4)"], "exit_codes": [4, 4]}
    wrong = _run_llmcheck(
        ["dump", "--backend", "stamp", "--times", "twice", "-o", str(out), "--", "true"], third_party_site
    )
    assert wrong.returncode == 2
    assert wrong.stderr == (
        "llmcheck: error: Invalid value for '--times': 'twice' is not a valid integer. (see 'llmcheck dump --help')\n"
    )


#: A third-party package with two broken plugins: one whose hook raises, one with a misspelt hook.
BROKEN_PLUGINS = {
    "pyproject.toml": """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "llmcheck-broken"
version = "0.0.1"

[project.entry-points.llmcheck]
exploding = "llmcheck_broken.exploding"
misspelt = "llmcheck_broken.misspelt"

[tool.setuptools.packages.find]
where = ["src"]
""",
    "src/llmcheck_broken/__init__.py": "",
    "src/llmcheck_broken/exploding.py": """\
from llmcheck.plugin_api import hookimpl


@hookimpl
def llmcheck_register_metrics(register):
    raise ValueError("metric registration exploded")
""",
    "src/llmcheck_broken/misspelt.py": """\
from llmcheck.plugin_api import hookimpl


@hookimpl
def llmcheck_register_metricz(register):
    pass
""",
}


PIP_INSTALL = (sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation")


@pytest.fixture(scope="session")
def broken_plugins_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Install :data:`BROKEN_PLUGINS` with pip into a private folder, as a user would install a plugin."""
    source = tmp_path_factory.mktemp("broken_source")
    for relative, text in BROKEN_PLUGINS.items():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_text(text)
    site = tmp_path_factory.mktemp("broken_site")
    subprocess.run(
        [*PIP_INSTALL, "--target", str(site), str(source)],
        check=True,
    )
    return site


def test_a_third_party_hook_that_raises_is_one_error_naming_the_plugin_not_an_internal_error(
    broken_plugins_site: Path,
) -> None:
    result = _run_llmcheck(["plugins"], broken_plugins_site, env={"LLMCHECK_DISABLE_PLUGINS": "misspelt"})
    assert result.returncode == 1
    assert result.stderr == (
        "llmcheck: error: plugin 'exploding' (llmcheck-broken 0.0.1) failed in its llmcheck_register_metrics "
        "hook: ValueError: metric registration exploded (a bug in that plugin, not in llmcheck: fix it, or set "
        "LLMCHECK_DISABLE_PLUGINS=exploding to run without it; rerun with -l debug for the traceback to report "
        "to its authors)\n"
    )


def test_a_third_party_misspelt_hook_is_one_error_naming_the_plugin_and_the_closest_hook(
    broken_plugins_site: Path,
) -> None:
    result = _run_llmcheck(["plugins"], broken_plugins_site, env={"LLMCHECK_DISABLE_PLUGINS": "exploding"})
    assert result.returncode == 1
    assert result.stderr == (
        "llmcheck: error: plugin 'misspelt' (llmcheck-broken 0.0.1) implements llmcheck_register_metricz, "
        "a hook that does not exist (did you mean 'llmcheck_register_metrics'? rename it in the plugin, or set "
        "LLMCHECK_DISABLE_PLUGINS=misspelt to run without it)\n"
    )


def test_disabling_the_broken_plugins_as_their_errors_say_lets_llmcheck_run(broken_plugins_site: Path) -> None:
    result = _run_llmcheck(
        ["plugins", "--json"], broken_plugins_site, env={"LLMCHECK_DISABLE_PLUGINS": "exploding,misspelt"}
    )
    assert result.returncode == 0 and result.stderr == ""
    assert {"exploding", "misspelt"}.isdisjoint(entry["name"] for entry in json.loads(result.stdout))
