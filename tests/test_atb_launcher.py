"""``llmcheck dump --backend atb``: the seed flags reach a real child process as the probe's environment
contract, a real probe library (built here with gcc) is preloaded for libatb.so's ABI, the exit code
comes back, and the post-steps turn the dump's topology into ONNX and its cpu profiling into CSV."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from llmcheck.core.cli import main
from llmcheck.core.errors import BackendUnavailableError, LlmcheckError
from llmcheck.core.plugins import get_plugins
from llmcheck.plugins.atb.probe_library import PROBE_DIR, choose_probe, dynamic_symbols, uses_cxx11_abi

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("g++") is None,
    reason="needs gcc and g++ to build a real probe library and libatb.so",
)

PROBE_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void report_loaded(void) {
    const char *marker = getenv("LLMCHECK_TEST_PROBE_MARKER");
    if (marker) { FILE *f = fopen(marker, "a"); if (f) { fputs(PROBE_NAME "\n", f); fclose(f); } }
}
"""
LIBATB_SOURCE = r"""
#include <cstdint>
#include <string>
#include <vector>
namespace atb {
class Probe {
public:
    static bool IsTensorNeedSave(const std::vector<int64_t> &ids, const std::string &opType);
    static bool IsSaveTensorData();
};
bool Probe::IsTensorNeedSave(const std::vector<int64_t> &ids, const std::string &opType) { return !ids.empty() && !opType.empty(); }
bool Probe::IsSaveTensorData() { return false; }
}
"""
# The child: records what it received, then writes a small dump in the probe's layout, as ATB would.
CHILD_SOURCE = textwrap.dedent(r"""
    import json, os, struct, sys
    out = os.environ["ATB_OUTPUT_DIR"]
    with open(os.path.join(out, "child_env.json"), "w") as f:
        json.dump({"env": {k: v for k, v in os.environ.items() if k.startswith(("ATB_", "LD_", "LCCL", "HCCL",
                                                                                "PYTHONHASHSEED"))},
                   "argv": sys.argv}, f)
    root = os.path.join(out, "msit_dump_" + os.environ["ATB_TIMESTAMP"])
    pid = str(os.getpid())
    op = os.path.join(root, "tensors", "0_" + pid, "0", "0_LinearOperation")
    os.makedirs(os.path.join(op, "after"))
    payload = struct.pack("<4e", 1.0, 2.0, 3.0, 4.0)
    header = "$Version=1.0\n$Object.Count=1\n$Object.Length=8\nformat=2\ndtype=1\ndims=2,2\n$Object.data=0,8\n$End=1\n"
    with open(os.path.join(op, "after", "outtensor0.bin"), "wb") as f:
        f.write(header.encode() + payload)
    with open(os.path.join(op, "op_param.json"), "w") as f:
        f.write('{"transposeB":true}')
    layer_dir = os.path.join(root, "layer", pid)
    os.makedirs(layer_dir)
    layer_json = os.path.join(layer_dir, "Decoder_layer_0.json")
    with open(layer_json, "w") as f:
        json.dump({"opName": "Decoder_layer_0", "opType": "Decoder_layer", "param": "", "inTensors": ["a", "w"],
                   "outTensors": ["b"], "nodes": [{"opName": "LinearOperation_0_0", "opType": "LinearOperation",
                   "param": {"transposeB": True}, "inTensors": ["a", "w"], "outTensors": ["b"]}]}, f)
    info = os.environ.get("ATB_DUMP_SUB_PROC_INFO_SAVE_PATH")
    if info:
        with open(os.path.join(info, "subprocess_info.txt"), "a") as f:
            f.write(layer_json + "\n")
    if os.environ.get("ATB_SAVE_CPU_PROFILING") == "1":
        folder = os.path.join(root, "cpu_profiling", pid)
        os.makedirs(folder)
        with open(os.path.join(folder, "operation_statistic_0.txt"), "w") as f:
            f.write("[LinearOperation_0_0]:totalTime:9, runnerCreateTime:1, runnerSetupTime:4\n")
            f.write("[LinearOperation_0_0]:totalTime:7, streamSyncTime:0, kernelExecuteTime:5, launchTime:1\n")
    sys.exit(int(sys.argv[1]))
""")


def _build(source: str, target: Path, *flags: str, compiler: str = "gcc", language: str = "c") -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [compiler, "-x", language, "-shared", "-fPIC", *flags, "-o", str(target), "-"],
        input=source.encode(),
        check=True,
        capture_output=True,
    )
    target.chmod(0o755)
    return target


@pytest.fixture(scope="module")
def ascend(tmp_path_factory) -> dict[str, Path]:
    """A fake Ascend install holding real ELF objects: both probe builds and three libatb.so flavours."""
    base = tmp_path_factory.mktemp("ascend")
    toolkit = base / "ascend-toolkit" / "latest"
    for abi in (0, 1):
        _build(PROBE_SOURCE, toolkit / PROBE_DIR / f"libatb_probe_abi{abi}.so", f'-DPROBE_NAME="abi{abi}"')
    atb = {}
    for abi in (0, 1):
        atb[f"atb_abi{abi}"] = base / f"atb_abi{abi}"
        _build(
            LIBATB_SOURCE,
            atb[f"atb_abi{abi}"] / "lib" / "libatb.so",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            compiler="g++",
            language="c++",
        )
    atb["atb_old"] = base / "atb_old"
    _build("int atb_version(void) { return 1; }", atb["atb_old"] / "lib" / "libatb.so")
    child = base / "child_dump.py"
    child.write_text(CHILD_SOURCE)
    return {"toolkit": toolkit, "child": child, **atb}


@pytest.fixture
def ascend_env(ascend, monkeypatch, tmp_path):
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(ascend["toolkit"]))
    monkeypatch.setenv("ATB_HOME_PATH", str(ascend["atb_abi1"]))
    monkeypatch.setenv("LLMCHECK_TEST_PROBE_MARKER", str(tmp_path / "probe_loaded.txt"))
    monkeypatch.delenv("LLMCHECK_ATB_PROBE", raising=False)
    return ascend


def test_libatb_abi_is_read_from_its_dynamic_symbols(ascend):
    abi1_names = [name for name in dynamic_symbols(ascend["atb_abi1"] / "lib" / "libatb.so") if "Probe" in name]
    assert any("__cxx11" in name for name in abi1_names) and len(abi1_names) == 2
    assert uses_cxx11_abi(ascend["atb_abi1"] / "lib" / "libatb.so") is True
    assert uses_cxx11_abi(ascend["atb_abi0"] / "lib" / "libatb.so") is False
    with pytest.raises(BackendUnavailableError, match="no atb::Probe symbols"):
        uses_cxx11_abi(ascend["atb_old"] / "lib" / "libatb.so")
    with pytest.raises(LlmcheckError, match="not an ELF"):
        dynamic_symbols(ascend["child"])


def test_every_seed_flag_reaches_the_child_as_the_probe_contract_says(ascend_env, tmp_path, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/already/preloaded.so")
    out = tmp_path / "out"
    code = main(
        [
            "dump",
            "--backend",
            "atb",
            "--type",
            "tensor",
            "layer",
            "onnx",
            "cpu_profiling",
            "stats",
            "-sd",
            "-ids",
            "2,3_1",
            "-er",
            "3,5,7,7",
            "-child",
            "False",
            "-time",
            "2",
            "-opname",
            "Self,Linear",
            "-tiling",
            "-stp",
            "1",
            "-o",
            str(out),
            "-device",
            "1",
            "-seed",
            "7",
            "-l",
            "error",
            "--exec",
            f"{sys.executable} {ascend_env['child']} 3 'two words'",
        ]
    )
    assert code == 3  # the child's own exit code
    received = json.loads((out / "child_env.json").read_text())
    env = received["env"]
    assert received["argv"][1:] == ["3", "two words"]
    expected = {
        "ATB_SAVE_TENSOR": "2",
        "ATB_SAVE_TENSOR_IN_BEFORE_OUT_AFTER": "0",
        "ATB_SAVE_TENSOR_TIME": "2",
        "ATB_SAVE_TENSOR_IDS": "2,3_1",
        "ATB_SAVE_TENSOR_RUNNER": "self,linear",
        "ATB_SAVE_TENSOR_RANGE": "3,5,7,7",
        "ATB_SAVE_CHILD": "0",
        "ATB_SAVE_TILING": "1",
        "ATB_SAVE_TENSOR_PART": "1",
        "ATB_OUTPUT_DIR": str(out.absolute()) + "/",
        "ATB_DEVICE_ID": "1",
        "ATB_AIT_LOG_LEVEL": "3",
        "ATB_DUMP_TYPE": "tensor|layer|onnx|cpu_profiling|stats|model|op",
        "ATB_SAVE_TENSOR_STATISTICS": "1",
        "ATB_SAVE_CPU_PROFILING": "1",
        "ATB_DUMP_SUB_PROC_INFO_SAVE_PATH": str(out.absolute() / str(os.getpid())),
        "ATB_CUR_PID": str(os.getpid()),
        "PYTHONHASHSEED": "7",
        "LCCL_DETERMINISTIC": "1",
        "HCCL_DETERMINISTIC": "true",
        "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
        "ATB_LLM_LCOC_ENABLE": "0",
    }
    assert {name: env.get(name) for name in expected} == expected
    assert re.fullmatch(r"\d{8}_\d{6}", env["ATB_TIMESTAMP"])
    probe = ascend_env["toolkit"] / PROBE_DIR / "libatb_probe_abi1.so"
    assert env["LD_PRELOAD"] == f"{probe}:/opt/already/preloaded.so"
    assert (tmp_path / "probe_loaded.txt").read_text().split() == ["abi1"]  # the dynamic loader really loaded it
    root = out / f"msit_dump_{env['ATB_TIMESTAMP']}"
    (layer_json,) = (root / "layer").glob("*/Decoder_layer_0.json")
    assert onnx.load(layer_json.with_suffix(".onnx")).graph.node[0].op_type == "LinearOperation"
    (profiling_csv,) = (root / "cpu_profiling").glob("*/operation_statistic_0.csv")
    assert profiling_csv.read_text().splitlines()[1].startswith("LinearOperation_0_0,")
    assert not (out / str(os.getpid())).exists()  # the probe's temporary list is cleaned up
    (record,) = get_plugins().load_tensors(root).records
    assert record.attrs["op_param"] == {"transposeB": True} and record.data.load().tolist() == [[1, 2], [3, 4]]


def test_defaults_follow_the_seed_and_stale_filters_are_cleared(ascend_env, tmp_path, monkeypatch):
    monkeypatch.setenv("ATB_HOME_PATH", str(ascend_env["atb_abi0"]))
    monkeypatch.setenv("ATB_SAVE_TENSOR_IDS", "99")  # left over in the user's shell: would filter everything
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    out = tmp_path / "out"
    assert (
        main(["dump", "--backend", "atb", "-o", str(out), "--exec", f"{sys.executable} {ascend_env['child']} 0"]) == 0
    )
    env = json.loads((out / "child_env.json").read_text())["env"]
    assert {
        name: env.get(name)
        for name in (
            "ATB_SAVE_TENSOR",
            "ATB_SAVE_TENSOR_IN_BEFORE_OUT_AFTER",
            "ATB_SAVE_TENSOR_TIME",
            "ATB_SAVE_TENSOR_RANGE",
            "ATB_SAVE_CHILD",
            "ATB_SAVE_TILING",
            "ATB_SAVE_TENSOR_PART",
            "ATB_DUMP_TYPE",
            "ATB_SAVE_CPU_PROFILING",
            "ATB_AIT_LOG_LEVEL",
            "ATB_SAVE_TENSOR_IDS",
            "ATB_SAVE_TENSOR_RUNNER",
            "ATB_DEVICE_ID",
            "ATB_SAVE_TENSOR_STATISTICS",
            "ATB_DUMP_SUB_PROC_INFO_SAVE_PATH",
        )
    } == {
        "ATB_SAVE_TENSOR": "1",
        "ATB_SAVE_TENSOR_IN_BEFORE_OUT_AFTER": "1",
        "ATB_SAVE_TENSOR_TIME": "1",
        "ATB_SAVE_TENSOR_RANGE": "0,0",
        "ATB_SAVE_CHILD": "1",
        "ATB_SAVE_TILING": "0",
        "ATB_SAVE_TENSOR_PART": "2",
        "ATB_DUMP_TYPE": "tensor",
        "ATB_SAVE_CPU_PROFILING": "0",
        "ATB_AIT_LOG_LEVEL": "1",
        "ATB_SAVE_TENSOR_IDS": None,
        "ATB_SAVE_TENSOR_RUNNER": None,
        "ATB_DEVICE_ID": None,
        "ATB_SAVE_TENSOR_STATISTICS": None,
        "ATB_DUMP_SUB_PROC_INFO_SAVE_PATH": None,
    }
    assert env["LD_PRELOAD"] == str(ascend_env["toolkit"] / PROBE_DIR / "libatb_probe_abi0.so")
    assert (tmp_path / "probe_loaded.txt").read_text().split() == ["abi0"]


def test_execute_range_all_is_passed_as_all(ascend_env, tmp_path):
    out = tmp_path / "out"
    assert (
        main(
            [
                "dump",
                "--backend",
                "atb",
                "-er",
                "all",
                "-o",
                str(out),
                "--exec",
                f"{sys.executable} {ascend_env['child']} 0",
            ]
        )
        == 0
    )
    assert json.loads((out / "child_env.json").read_text())["env"]["ATB_SAVE_TENSOR_RANGE"] == "all"


def test_no_ascend_toolkit_is_one_line_and_nothing_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "no_such_toolkit"))
    monkeypatch.delenv("LLMCHECK_ATB_PROBE", raising=False)
    marker = tmp_path / "ran.txt"
    code = main(
        [
            "dump",
            "--backend",
            "atb",
            "-o",
            str(tmp_path / "out"),
            "--exec",
            f"{sys.executable} -c \"open('{marker}', 'w').write('ran')\"",
        ]
    )
    assert code == 1 and not marker.exists() and not (tmp_path / "out").exists()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"llmcheck: error: {tmp_path / 'no_such_toolkit'}: ASCEND_TOOLKIT_HOME is not a folder")


def test_missing_atb_home_and_old_atb_are_reported_before_running(ascend, monkeypatch):
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(ascend["toolkit"]))
    monkeypatch.delenv("LLMCHECK_ATB_PROBE", raising=False)
    monkeypatch.delenv("ATB_HOME_PATH", raising=False)
    with pytest.raises(BackendUnavailableError, match="ATB_HOME_PATH is not set"):
        choose_probe(os.environ)
    monkeypatch.setenv("ATB_HOME_PATH", str(ascend["atb_old"]))
    with pytest.raises(BackendUnavailableError, match="no dump hooks"):
        choose_probe(os.environ)


def test_a_probe_given_by_the_user_is_preloaded_as_is(ascend, tmp_path, monkeypatch):
    own = tmp_path / "my_probe.so"
    shutil.copy(ascend["toolkit"] / PROBE_DIR / "libatb_probe_abi1.so", own)
    own.chmod(0o755)
    monkeypatch.setenv("LLMCHECK_ATB_PROBE", str(own))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.delenv("ATB_HOME_PATH", raising=False)
    choice = choose_probe(os.environ)
    assert choice.path == own and choice.abi is None
    own.chmod(0o777)
    with pytest.raises(LlmcheckError, match="writable by group or others"):
        choose_probe(os.environ)


def test_a_program_that_does_not_exist_is_a_usage_error(ascend_env, tmp_path, capsys):
    assert main(["dump", "--backend", "atb", "-o", str(tmp_path / "o"), "--exec", "no-such-program-xyz --flag"]) == 2
    assert "cannot run 'no-such-program-xyz': no such program" in capsys.readouterr().err


@pytest.mark.parametrize(("program_exit", "dump_exit"), [(0, 1), (4, 4)])
def test_a_program_that_wrote_no_atb_dump_fails_the_dump_unless_it_failed_itself(
    ascend_env, tmp_path, capsys, caplog, program_exit: int, dump_exit: int
):
    out = tmp_path / "o"
    program = f"{sys.executable} -c 'import sys; sys.exit({program_exit})'"  # runs, but no ATB op: no dump
    assert main(["dump", "--backend", "atb", "-o", str(out), "--exec", program]) == dump_exit
    why = (
        "no ATB dump was written (check that the program uses ATB, that the probe matches its ABI, and that no "
        "stale ATB_SAVE_* variable filters every op)"
    )
    if program_exit == 0:  # the program succeeded, so nothing else would tell a CI step that the dump is missing
        assert capsys.readouterr().err == f"llmcheck: error: {out}: {why}\n"
    else:  # the program's own exit code says it failed; the warning says why there is no dump as well
        (warning,) = [record for record in caplog.records if "no ATB dump" in record.getMessage()]
        assert (
            warning.levelname == "WARNING" and warning.getMessage() == f"{out}: {why}; the program exited with code 4"
        )
