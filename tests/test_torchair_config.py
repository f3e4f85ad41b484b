"""torchair dump configuration: the settings, the fusion switch file, and a clear error where torchair is absent."""

from __future__ import annotations

import importlib.util
import json

import pytest

from llmcheck.core.cli import main
from llmcheck.core.errors import BackendUnavailableError, UsageError
from llmcheck.plugins.torchair_ge.config import (
    fx_dump_settings,
    ge_dump_settings,
    get_fx_dump_config,
    get_ge_dump_config,
    write_fusion_switch_file,
)

TORCHAIR_MISSING = importlib.util.find_spec("torchair") is None


def test_ge_dump_settings_turn_on_graph_text_and_data_dump(tmp_path):
    switch = write_fusion_switch_file(tmp_path / "fusion_switch.json")

    settings = ge_dump_settings(
        tmp_path / "dump", switch, "output", dump_token=[0, 3], dump_layer=["Add_1", "MatMul_2"]
    )

    assert settings == {
        "debug.graph_dump.type": "txt",
        "debug.graph_dump.path": str(tmp_path / "dump"),
        "dump_config.enable_dump": True,
        "dump_config.dump_mode": "output",
        "dump_config.dump_path": str(tmp_path / "dump"),
        "fusion_config.fusion_switch_file": str(switch),
        "dump_config.dump_step": "0|3",
        "dump_config.dump_layer": "Add_1 MatMul_2",
    }
    assert fx_dump_settings(tmp_path) == {"debug.data_dump.type": "npy", "debug.data_dump.path": str(tmp_path)}


def test_bad_dump_settings_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="dump_mode must be one of input, output, all"):
        ge_dump_settings(tmp_path, dump_mode="everything")
    with pytest.raises(UsageError, match="no such fusion switch file"):
        ge_dump_settings(tmp_path, fusion_switch_file=tmp_path / "missing.json")


def test_fusion_switch_file_turns_graph_and_ub_fusion_off(tmp_path):
    path = write_fusion_switch_file(
        tmp_path / "fusion_switch.json", passes={"GraphFusion": {"MatMulBiasAddFusionPass": "on"}}
    )

    assert json.loads(path.read_text()) == {
        "Switch": {"GraphFusion": {"ALL": "off", "MatMulBiasAddFusionPass": "on"}, "UBFusion": {"ALL": "off"}}
    }
    with pytest.raises(UsageError, match="'on' or 'off'"):
        write_fusion_switch_file(tmp_path / "bad.json", graph_fusion="disabled")


@pytest.mark.skipif(not TORCHAIR_MISSING, reason="torchair is installed here")
def test_config_helpers_say_torchair_is_missing_and_create_nothing(tmp_path):
    for call in (lambda: get_ge_dump_config(tmp_path / "ge"), lambda: get_fx_dump_config(tmp_path / "fx")):
        with pytest.raises(BackendUnavailableError) as caught:
            call()
        assert caught.value.one_line().startswith("torchair: torchair is not importable here")
        assert "fx_dump_backend" in caught.value.one_line()
    assert list(tmp_path.iterdir()) == []


def test_unknown_source_name_is_a_usage_error_listing_fx_and_ge(tmp_path, capsys):
    assert (
        main(
            [
                "compare",
                "--golden-path",
                str(tmp_path),
                "--my-path",
                str(tmp_path),
                "--golden-source",
                "gee",
                "-o",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    error = capsys.readouterr().err
    assert "unknown dump source 'gee'" in error and "fx" in error and "ge" in error
