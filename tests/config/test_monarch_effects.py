"""Monarch option names that act in danaus: configuring the Monarch name changes what
danaus does (each test fails if the name is turned back into a no-effect option)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

import danaus.config
from danaus._actor.tools import introspect
from danaus._transport import address


def _fake_py_spy(tmp_path: Path, body: str) -> Path:
    """An executable standing in for py-spy (a shell script running ``body``)."""
    exe = tmp_path / "fake-py-spy"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_pyspy_bin_names_the_py_spy_a_stack_dump_runs(tmp_path: Path) -> None:
    exe = _fake_py_spy(tmp_path, 'echo "fake py-spy was asked: $*"')
    with danaus.config.configured(pyspy_bin=str(exe)):
        out = introspect.dump_stacks()
    assert out == f"fake py-spy was asked: dump --pid {os.getpid()}\n"


def test_a_pyspy_bin_that_is_not_executable_falls_back_as_in_monarch(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-py-spy"
    with danaus.config.configured(pyspy_bin=str(missing)):
        chosen = introspect._py_spy()
    assert chosen != str(missing)
    with danaus.config.configured(pyspy_bin=""):
        assert introspect._py_spy() == chosen  # the lookup without the setting


def test_mesh_admin_pyspy_timeout_bounds_one_py_spy_dump(tmp_path: Path) -> None:
    exe = _fake_py_spy(tmp_path, "exec sleep 60")  # a py-spy that never answers
    with danaus.config.configured(pyspy_bin=str(exe), mesh_admin_pyspy_timeout="1s"):
        out = introspect.dump_stacks()
    # the dump gave up after Monarch's timeout, and says so, then shows Python's view
    assert "py-spy failed" in out
    assert "timed out after 1.0 seconds" in out
    assert "Python's own view of the threads follows" in out


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="TCP_KEEPIDLE is Linux's")
@pytest.mark.parametrize(("given", "idle"), [("2m", 120), ("1500ms", 2), ("0s", 1), ("1d", 32767)])
def test_channel_tcp_keepalive_idle_sets_the_kernels_idle_time(given: str, idle: int) -> None:
    server = address.listen("tcp://127.0.0.1:0")
    port = server.getsockname()[1]
    try:
        with danaus.config.configured(channel_tcp_keepalive_idle=given):
            s = address.connect_socket(f"tcp://127.0.0.1:{port}")
        try:
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == idle
        finally:
            s.close()
    finally:
        server.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="TCP_KEEPIDLE is Linux's")
def test_danaus_keeps_monarchs_keepalive_default() -> None:
    server = address.listen("tcp://127.0.0.1:0")
    try:
        s = address.connect_socket(f"tcp://127.0.0.1:{server.getsockname()[1]}")
        try:
            assert danaus.config.get_global_config()["channel_tcp_keepalive_idle"] == "1m"
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 60
        finally:
            s.close()
    finally:
        server.close()
