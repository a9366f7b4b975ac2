"""Monarch's option names in danaus.config: aliases, kept no-effect options, helpers."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import danaus.config
from danaus import _config
from danaus._config import MONARCH_OPTIONS, Config, Encoding, NoEffectWarning
from danaus._config import store as config_store
from danaus.config import parametrize_config, parametrize_config_pointwise
from danaus.testing import ClientScript

# The keyword arguments of Monarch's typed ``configure()`` signature
# (python/monarch/config/__init__.py, ConfigureArgs, meta-pytorch/monarch 3fc0a66).
MONARCH_TYPED = [
    "default_transport",
    "enable_log_forwarding",
    "enable_file_capture",
    "tail_log_lines",
    "codec_max_frame_length",
    "message_delivery_timeout",
    "host_spawn_ready_timeout",
    "mesh_proc_spawn_max_idle",
    "process_exit_timeout",
    "message_ack_time_interval",
    "message_ack_every_n_messages",
    "message_ttl_default",
    "split_max_buffer_size",
    "split_max_buffer_age",
    "stop_actor_timeout",
    "cleanup_timeout",
    "default_encoding",
    "channel_net_rx_buffer_full_check_interval",
    "channel_tcp_congestion",
    "message_latency_sampling_rate",
    "enable_dest_actor_reordering_buffer",
    "mesh_bootstrap_enable_pdeathsig",
    "mesh_terminate_concurrency",
    "mesh_terminate_timeout",
    "small_write_threshold",
    "max_cast_dimension_size",
    "remote_alloc_bind_to_inaddr_any",
    "remote_alloc_bootstrap_addr",
    "remote_alloc_allowed_port_range",
    "read_log_buffer",
    "force_file_log",
    "prefix_with_rank",
    "actor_spawn_max_idle",
    "get_actor_state_max_idle",
    "supervision_watchdog_timeout",
    "proc_stop_max_idle",
    "get_proc_state_max_idle",
    "mesh_admin_addr",
    "mesh_attach_config_timeout",
    "mesh_orphan_timeout",
    "rdma_allow_tcp_fallback",
    "rdma_disable_ibverbs",
    "rdma_max_chunk_size_mb",
    "rdma_ibverbs_target",
    "rdma_peer_device_affinity",
    "rdma_runtime_worker_threads",
]

ALIASES = [o for o in MONARCH_OPTIONS if o.setting]
KEPT = [o for o in MONARCH_OPTIONS if not o.setting]

# alias -> (a Monarch value, the danaus value it sets, how Monarch shows it back)
ALIAS_VALUES: dict[str, tuple[Any, Any, Any]] = {
    "codec_max_frame_length": (1 << 30, 1 << 30, 1 << 30),
    "stop_actor_timeout": ("1m 30s", 90.0, "1m 30s"),
    "tail_log_lines": (7, 7, 7),
    "max_cast_fanout": (4, 4, 4),
    "rdma_tcp_fallback_parallelism": (3, 3, 3),
    "terminated_snapshot_retention": (50, 50, 50),
    "file_log_level": ("warn", "WARNING", "warn"),
    "forwarder_flush_timeout": ("250ms", 0.25, "250ms"),
    "mesh_admin_pyspy_timeout": ("3s", 3.0, "3s"),
    "pyspy_bin": ("/opt/bin/py-spy", "/opt/bin/py-spy", "/opt/bin/py-spy"),
    "channel_tcp_keepalive_idle": ("2m", 120.0, "2m"),
}

# A value of each kind other than Monarch's default, for the kept options.
SAMPLES: dict[str, Any] = {
    "bool": None,  # the default negated
    "int": 3,
    "nonzero": 2,
    "opt_nonzero": 4,
    "float": 0.5,
    "str": "x",
    "duration": "2m 5s",
    "opt_duration": None,
    "encoding": Encoding.Json,
    "transport": "tcp",
    "port_range": slice(8000, 9000),
    "socket_addr": "0.0.0.0:8080",
}


def _sample(opt: _config.MonarchOption) -> Any:
    if opt.kind == "bool":
        return not opt.default
    if opt.kind == "opt_duration":
        return "45s" if opt.default is None else None
    return SAMPLES[opt.kind]


@pytest.fixture
def fresh_reports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Forget which options this process has reported, and restore the settings after."""
    monkeypatch.setattr(config_store, "_reported", set())
    saved = danaus.config.get_runtime_config()
    yield
    danaus.config.clear_runtime_config()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoEffectWarning)
        danaus.config.configure(**saved)


def test_every_name_of_monarchs_typed_configure_is_accepted() -> None:
    names = [o.name for o in MONARCH_OPTIONS]
    assert len(names) == len(set(names)) == 81
    assert set(MONARCH_TYPED) <= set(names)
    same_name = {"codec_max_frame_length", "pyspy_bin"}  # Monarch's name is danaus's too
    assert not set(names) & ({s.name for s in _config.SETTINGS} - same_name)
    for opt in ALIASES:
        assert opt.setting in {s.name for s in _config.SETTINGS}, opt.name


def test_every_alias_has_a_round_trip_case() -> None:
    assert set(ALIAS_VALUES) == {o.name for o in ALIASES}


@pytest.mark.parametrize("name", sorted(ALIAS_VALUES))
def test_an_alias_reads_and_writes_its_danaus_setting(name: str) -> None:
    opt = _config._MONARCH[name]
    given, danaus_value, shown = ALIAS_VALUES[name]
    cfg = Config(environ={})
    cfg.configure(**{name: given})
    assert cfg.get(opt.setting) == danaus_value
    assert cfg.effective()[name] == shown
    assert cfg.runtime() == {opt.setting: danaus_value}  # one value, under danaus's name
    cfg.restore({})
    cfg.configure(**{opt.setting: danaus_value})  # the other way round
    assert cfg.monarch(name) == shown
    # and through the environment variable of the danaus setting
    env = Config(environ={_config._BY_NAME[opt.setting].env: str(danaus_value)})
    assert env.monarch(name) == shown


def test_monarch_durations_are_converted_to_seconds_and_back() -> None:
    cfg = Config(environ={})
    assert cfg.effective()["stop_actor_timeout"] == "10s"  # danaus's default, Monarch's form
    cfg.configure(stop_actor_timeout="1h 30m")
    assert cfg.get("stop_proc_timeout") == 5400.0
    cfg.configure(stop_proc_timeout=0.0015)
    assert cfg.monarch("stop_actor_timeout") == "1ms 500us"
    assert _config.format_duration(0) == "0s"
    assert _config.format_duration(90061) == "1d 1h 1m 1s"


def test_the_public_configured_sees_an_alias_both_ways() -> None:
    with danaus.config.configured(stop_actor_timeout="3s", tail_log_lines=11) as eff:
        assert eff["stop_proc_timeout"] == 3.0
        assert eff["log_tail_lines"] == 11
        assert danaus.config.get_global_config()["stop_actor_timeout"] == "3s"
        assert _config.get("stop_proc_timeout") == 3.0
    assert danaus.config.get_global_config()["stop_actor_timeout"] == _config.format_duration(
        _config.get("stop_proc_timeout")
    )


@pytest.mark.parametrize("opt", KEPT, ids=lambda o: o.name)
def test_a_no_effect_option_is_accepted_stored_returned_and_reaches_children(
    opt: _config.MonarchOption,
) -> None:
    value = _sample(opt)
    cfg = Config(environ={})
    if opt.default is not None or opt.kind.startswith("opt_"):
        assert cfg.effective()[opt.name] == opt.default  # Monarch's default before any configure
    else:
        assert opt.name not in cfg.effective()  # no default: absent until set, as in Monarch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoEffectWarning)
        cfg.configure(**{opt.name: value})
    assert cfg.runtime() == {opt.name: value}
    assert cfg.effective()[opt.name] == value
    env = cfg.env_for_children()
    assert list(env) == [opt.env]
    assert Config(environ=env).effective()[opt.name] == value  # a child reads it back


def test_a_no_effect_option_is_reported_once_naming_it_and_why(fresh_reports: None) -> None:
    with pytest.warns(NoEffectWarning, match="'rdma_disable_ibverbs'.*ibverbs") as record:
        danaus.config.configure(rdma_disable_ibverbs=True)
    assert len(record) == 1
    assert record[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second report would raise here
        danaus.config.configure(rdma_disable_ibverbs=False)
        with danaus.config.configured(rdma_disable_ibverbs=True) as eff:
            assert eff["rdma_disable_ibverbs"] is True
        danaus.config.configure(stop_actor_timeout="2s")  # an alias is never reported
    assert danaus.config.get_global_config()["rdma_disable_ibverbs"] is False
    assert danaus.config.get_runtime_config()["rdma_disable_ibverbs"] is False


@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        ("enable_log_forwarding", "yes", TypeError, "enable_log_forwarding takes a bool"),
        ("tail_log_lines", True, TypeError, "tail_log_lines takes an int"),
        ("tail_log_lines", -1, ValueError, "tail_log_lines must be >= 0"),
        ("stop_actor_timeout", [1], TypeError, "stop_actor_timeout takes a duration"),
        ("stop_actor_timeout", "soon", ValueError, "not a duration"),
        ("message_delivery_timeout", "30 parsecs", ValueError, "not a duration"),
        ("message_ttl_default", 256, ValueError, "<= 255"),
        ("max_cast_fanout", 0, ValueError, "max_cast_fanout must be >= 1"),
        ("message_latency_sampling_rate", "0.1", TypeError, "takes a float"),
        ("default_encoding", 3, TypeError, "takes an Encoding"),
        ("default_transport", 5, TypeError, "ChannelTransport"),
        ("remote_alloc_allowed_port_range", (8000, 9000), TypeError, r"slice\(start, stop\)"),
        ("remote_alloc_allowed_port_range", slice(9000, 8000), ValueError, "starts after"),
        ("remote_alloc_allowed_port_range", slice(1, 70000), TypeError, r"\[0, 65535\]"),
        ("remote_alloc_allowed_port_range", slice(1, 9, 2), ValueError, "no step"),
        ("file_log_level", "loud", ValueError, "'debug', 'info', 'warn' or 'error'"),
        ("mesh_admin_addr", "nowhere", ValueError, "socket address"),
        ("tokio_worker_threads", 0, ValueError, "must be >= 1"),
    ],
)
def test_a_bad_value_is_a_clear_error_and_changes_nothing(
    name: str, value: Any, error: type[Exception], match: str
) -> None:
    before = danaus.config.get_runtime_config()
    with pytest.raises(error, match=match):
        danaus.config.configure(early_call_hold=0.5, **{name: value})
    assert danaus.config.get_runtime_config() == before


def test_an_unknown_name_suggests_a_monarch_name_too() -> None:
    with pytest.raises(ValueError, match="Did you mean 'enable_log_forwarding'"):
        danaus.config.configure(enable_log_forwardin=True)


def test_a_malformed_monarch_environment_variable_is_logged_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The option has no effect, so a stray variable must not stop a node from starting.
    cfg = Config(environ={"MONARCH_RDMA_DISABLE_IBVERBS": "maybe"})
    with caplog.at_level("WARNING", logger="danaus.config"):
        assert cfg.effective()["rdma_disable_ibverbs"] is False
    assert "MONARCH_RDMA_DISABLE_IBVERBS='maybe'" in caplog.text


def test_encoding_is_monarchs_enum() -> None:
    assert danaus.config.Encoding is Encoding
    assert [e.name for e in Encoding] == ["Bincode", "Json", "Multipart"]
    assert Encoding.Json == 1 and str(Encoding.Json) == "Encoding.Json"
    assert Encoding.__module__ == "danaus.config"
    assert Config(environ={}).effective()["default_encoding"] is Encoding.Multipart


# -- parametrize_config and parametrize_config_pointwise ---------------------------


@pytest.mark.filterwarnings("ignore::danaus._config.NoEffectWarning")
@parametrize_config(tail_log_lines={3, 4}, prefix_with_rank={True, False})
def test_parametrize_config_runs_under_each_combination() -> None:
    g = danaus.config.get_global_config()
    assert g["tail_log_lines"] in (3, 4) and g["log_tail_lines"] == g["tail_log_lines"]
    assert isinstance(g["prefix_with_rank"], bool)
    assert "prefix_with_rank" in danaus.config.get_runtime_config()


@parametrize_config_pointwise(stop_actor_timeout=["1s", "2s"], tail_log_lines=[1, 2])
def test_parametrize_config_pointwise_runs_in_lockstep() -> None:
    g = danaus.config.get_global_config()
    assert (g["stop_actor_timeout"], g["tail_log_lines"]) in (("1s", 1), ("2s", 2))


def _mark(fn: Any) -> tuple[list[dict[str, Any]], list[str]]:
    (mark,) = fn.pytestmark
    assert mark.args[0] == "_config_overrides"
    return mark.args[1], mark.kwargs["ids"]


def _body() -> None:
    pass


def test_parametrize_config_builds_the_cartesian_product() -> None:
    dicts, ids = _mark(parametrize_config(a={1, 2}, b={True})(_body))
    assert sorted(ids) == ["a=1-b=True", "a=2-b=True"]
    assert sorted(d["a"] for d in dicts) == [1, 2]
    dicts, ids = _mark(parametrize_config_pointwise(a=[1, 2], b=["x", "y"])(_body))
    assert dicts == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert ids == ["a=1-b=x", "a=2-b=y"]


def test_the_wrappers_apply_the_overrides_only_inside_the_call() -> None:
    seen = []

    def body(x: int) -> int:
        seen.append(_config.get("log_tail_lines"))
        return x + 1

    async def abody() -> float:
        return float(_config.get("stop_proc_timeout"))

    before = _config.get("log_tail_lines")
    wrapped = parametrize_config(tail_log_lines={9})(body)
    assert wrapped({"tail_log_lines": 9}, 1) == 2 and seen == [9]
    assert list(inspect.signature(wrapped).parameters) == ["_config_overrides", "x"]
    awrapped = parametrize_config_pointwise(stop_actor_timeout=["4s"])(abody)
    assert asyncio.run(awrapped({"stop_actor_timeout": "4s"})) == 4.0
    assert _config.get("log_tail_lines") == before


def test_parametrize_config_refuses_no_options_and_uneven_lengths() -> None:
    with pytest.raises(ValueError, match="at least one config option"):
        parametrize_config()
    with pytest.raises(ValueError, match="at least one config option"):
        parametrize_config_pointwise()
    with pytest.raises(ValueError, match="same number of values"):
        parametrize_config_pointwise(a=[1, 2], b=[1])


# -- a remote actor sees them ---------------------------------------------------------


def test_a_remote_actor_sees_monarch_options_through_get_global_config(tmp_path: Path) -> None:
    script = ClientScript(tmp_path)
    try:
        out = script.run(
            """
            import warnings
            from danaus.actor import Actor, endpoint, this_host
            from danaus.config import Encoding, configure, get_global_config

            NAMES = ["rdma_disable_ibverbs", "default_encoding", "stop_actor_timeout",
                     "stop_proc_timeout", "remote_alloc_allowed_port_range",
                     "mesh_orphan_timeout", "message_delivery_timeout", "tail_log_lines"]

            class Peek(Actor):
                @endpoint
                def config(self) -> dict:
                    g = get_global_config()
                    return {n: g[n] for n in NAMES}

            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                configure(rdma_disable_ibverbs=True, default_encoding=Encoding.Json,
                          stop_actor_timeout="7s", mesh_orphan_timeout=None,
                          remote_alloc_allowed_port_range=slice(8000, 9000))
            print("warned", sorted(str(w.message).split("'")[1] for w in seen))
            procs = this_host().spawn_procs(per_host={"gpus": 1})
            remote = procs.spawn("peek", Peek).config.call_one().get(timeout=60)
            print("same", remote == {n: get_global_config()[n] for n in NAMES})
            print("remote", sorted(remote.items()))
            procs.stop().get(timeout=60)
            """,
            timeout=120,
        )
    finally:
        script.close()
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert (
        "warned ['default_encoding', 'mesh_orphan_timeout', 'rdma_disable_ibverbs', "
        "'remote_alloc_allowed_port_range']" in lines
    )
    assert "same True" in lines, out.stdout
    remote = next(ln for ln in lines if ln.startswith("remote "))
    for piece in (
        "('rdma_disable_ibverbs', True)",
        "('default_encoding', <Encoding.Json: 1>)",
        "('stop_actor_timeout', '7s')",
        "('stop_proc_timeout', 7.0)",
        "('remote_alloc_allowed_port_range', slice(8000, 9000, None))",
        "('mesh_orphan_timeout', None)",
        "('message_delivery_timeout', '30s')",
    ):
        assert piece in remote, remote


def test_a_child_reads_a_kept_option_from_monarchs_environment_variable() -> None:
    # The Monarch section's claim that a child reads kept options from Monarch's variables.
    env = {"MONARCH_RDMA_DISABLE_IBVERBS": "true", "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", "import danaus.config as c; "
         "print(c.get_global_config()['rdma_disable_ibverbs'])"],
        env={**env, "PYTHONPATH": str(Path(danaus.config.__file__).parents[1])},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "True"
