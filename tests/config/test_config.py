"""danaus.config: one table of settings, defaults < environment < configure()."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

import danaus.config
from danaus import _config
from danaus._config import Config, parse_duration, parse_size

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_defaults_apply_when_nothing_is_set() -> None:
    cfg = Config(environ={})
    assert cfg.get("heartbeat_timeout") == 5.0
    assert cfg.get("codec_max_frame_length") == _config._default_max_frame() <= 4 << 30


def test_environment_overrides_the_default_and_configure_overrides_both() -> None:
    cfg = Config(environ={"DANAUS_HEARTBEAT_TIMEOUT": "2s", "DANAUS_OFFLOAD_MIN": "64KiB"})
    assert cfg.get("heartbeat_timeout") == 2.0
    assert cfg.get("offload_min") == 64 << 10
    cfg.configure(heartbeat_timeout=0.75)
    assert cfg.get("heartbeat_timeout") == 0.75
    assert cfg.runtime() == {"heartbeat_timeout": 0.75}
    cfg.restore({})
    assert cfg.get("heartbeat_timeout") == 2.0


def test_values_are_the_settings_as_attributes_and_follow_configure_and_restore() -> None:
    cfg = Config(environ={"DANAUS_SPIN_WAIT": "1ms"})
    assert cfg.values.spin_wait == 0.001 == cfg.get("spin_wait")
    assert "spin_wait" in vars(cfg.values)  # a plain attribute from now on: no call to read it
    cfg.configure(spin_wait=0.005)
    assert cfg.values.spin_wait == 0.005
    cfg.restore({})
    assert cfg.values.spin_wait == 0.001
    with pytest.raises(AttributeError, match="Did you mean 'spin_wait'"):
        cfg.values.spin_wiat  # noqa: B018
    assert _config.get("send_batch") == _config.values.send_batch


def test_an_unknown_setting_is_a_value_error_listing_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="heartbeat_timeout") as info:
        danaus.config.configure(heartbeat_timout=1.0)
    assert "Did you mean 'heartbeat_timeout'" in str(info.value)
    assert "codec_max_frame_length" in str(info.value)  # the list of valid names


def test_a_value_of_the_wrong_type_is_a_type_error_and_changes_nothing() -> None:
    before = danaus.config.get_runtime_config()
    with pytest.raises(TypeError, match="heartbeat_interval takes seconds"):
        danaus.config.configure(heartbeat_interval=[1], offload_min=0)
    with pytest.raises(TypeError, match="rdma_streams takes int"):
        danaus.config.configure(rdma_streams="4")
    assert danaus.config.get_runtime_config() == before


def test_a_malformed_environment_variable_names_the_variable() -> None:
    cfg = Config(environ={"DANAUS_HEARTBEAT_INTERVAL": "soon"})
    with pytest.raises(ValueError, match="DANAUS_HEARTBEAT_INTERVAL='soon'"):
        cfg.get("heartbeat_interval")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1.5", 1.5), ("500ms", 0.5), ("30s", 30.0), ("5m", 300.0), ("1h 30m", 5400.0)],
)
def test_durations_take_humantime_strings(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "size"), [("4096", 4096), ("64MiB", 64 << 20), ("4 GiB", 4 << 30), ("10GB", 10**10)]
)
def test_sizes_take_binary_and_decimal_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "fast", "5 parsecs", "1h30"])
def test_bad_durations_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_configured_restores_the_previous_values_even_on_error() -> None:
    base = danaus.config.get_global_config()["early_call_hold"]
    with pytest.raises(RuntimeError), danaus.config.configured(early_call_hold="250ms") as eff:
        assert eff["early_call_hold"] == 0.25
        assert _config.get("early_call_hold") == 0.25
        raise RuntimeError("boom")
    assert _config.get("early_call_hold") == base


def test_configure_values_reach_child_processes_through_their_environment() -> None:
    with danaus.config.configured(heartbeat_timeout=3.5, tls_ca="/x/ca.pem"):
        env = _config.env_for_children()
    assert env == {"DANAUS_HEARTBEAT_TIMEOUT": "3.5", "DANAUS_TLS_CA": "/x/ca.pem"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from danaus import _config; print(_config.get('heartbeat_timeout'))",
        ],
        env={**env, "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "3.5"


def test_every_setting_is_documented_in_the_config_page() -> None:
    assert _config.markdown_table() in DOCS.read_text(), (
        "docs/config.md is out of date: paste the output of `python -m danaus._config`"
    )
