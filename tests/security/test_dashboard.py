"""The dashboard against other users on the host: no thread per stranger, idle connections
closed, every interface only when asked (issue 26, F3 and F5)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

import danaus.dashboard
from danaus import config
from danaus.testing import wait_until

TIMEOUT = 30.0  # bound on each wait below; a pass never comes near it
STRANGERS = 300
# Threads that may start in this process meanwhile for reasons of their own (the
# runtime's timers); a thread per connection would add hundreds.
SLACK = 4


@pytest.fixture
def dash() -> Iterator[danaus.dashboard.Dashboard]:
    # No connection times out during a test: what closes one is what the test checks.
    with config.configured(dashboard_request_timeout=3600):
        d = danaus.dashboard.serve()
        yield d
        d.stop()


def _state(d: danaus.dashboard.Dashboard) -> dict[str, object]:
    url = f"http://127.0.0.1:{d.port}/api/state?token={d.token}"
    with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
        doc: dict[str, object] = json.load(r)
    return doc


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    s.settimeout(TIMEOUT)
    return s


def _read_until_closed(s: socket.socket) -> bytes:
    """Everything the server sends until it closes (a timeout here fails the test).

    A server that closes a socket holding unread bytes resets it: closed too."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def test_idle_connections_without_the_token_hold_no_thread_and_the_oldest_are_shed(
    dash: danaus.dashboard.Dashboard,
) -> None:
    baseline = threading.active_count()
    strangers = [_connect(dash.port) for _ in range(STRANGERS)]
    try:
        # The server accepts in order, so when this answer comes every stranger was
        # accepted (a thread-per-connection server has started all their threads).
        assert "hosts" in _state(dash)
        assert threading.active_count() <= baseline + SLACK
        # Beyond max_pending_handshakes the oldest were closed: they read EOF.
        shed = STRANGERS - config.get_global_config()["max_pending_handshakes"]
        for s in strangers[:shed]:
            assert _read_until_closed(s) == b""
        assert "hosts" in _state(dash)  # and the token's holder is still served
    finally:
        for s in strangers:
            s.close()


def test_requests_without_the_token_are_refused_without_a_thread(
    dash: danaus.dashboard.Dashboard,
) -> None:
    baseline = threading.active_count()
    strangers = []
    try:
        for _ in range(STRANGERS):
            s = _connect(dash.port)
            s.sendall(b"GET /api/state?token=guess HTTP/1.1\r\nHost: x\r\n\r\n")
            strangers.append(s)
        answers = [_read_until_closed(s) for s in strangers]
        # Each got 403 and was closed, or was shed unread while newer ones queued (EOF);
        # the newest is never shed.
        assert all(a.startswith(b"HTTP/1.1 403 ") or a == b"" for a in answers)
        assert answers[-1].startswith(b"HTTP/1.1 403 ")
        assert threading.active_count() <= baseline + SLACK
        assert "hosts" in _state(dash)
    finally:
        for s in strangers:
            s.close()


def test_an_idle_connection_is_closed_after_the_request_timeout() -> None:
    # The timeout is also the deadline of the kept connection's head: long enough that a
    # loaded machine sends it in time (the test waits for the close, not for a time).
    with config.configured(dashboard_request_timeout=2.0):
        d = danaus.dashboard.serve()
        try:
            silent = _connect(d.port)  # says nothing at all
            assert _read_until_closed(silent) == b""
            silent.close()
            # One that made a request and keeps the connection open (HTTP/1.1 keep-alive)
            # holds a thread, and is closed once idle as long.
            kept = _connect(d.port)
            kept.sendall(f"GET /api/state?token={d.token} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = _read_until_closed(kept)
            kept.close()
            assert answer.startswith(b"HTTP/1.1 200 ")
        finally:
            d.stop()


def test_tokened_requests_beyond_the_connection_cap_get_503() -> None:
    with config.configured(dashboard_max_connections=2):
        d = danaus.dashboard.serve()
        streams = []
        try:
            for _ in range(2):  # two open pages' live updates hold both handler threads
                s = _connect(d.port)
                s.sendall(f"GET /api/events?token={d.token} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
                streams.append(s)
            third = _connect(d.port)
            third.sendall(f"GET /api/state?token={d.token} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert _read_until_closed(third).startswith(b"HTTP/1.1 503 ")
            third.close()
        finally:
            for s in streams:
                s.close()
            d.stop()


def test_a_closed_connection_gives_its_slot_back() -> None:
    with config.configured(dashboard_max_connections=1):
        d = danaus.dashboard.serve()
        try:
            for _ in range(3):  # each holds the one slot, then closes it for the next
                s = _connect(d.port)
                s.sendall(f"GET /api/state?token={d.token} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
                s.close()
                wait_until(
                    d._server.connections,
                    timeout=TIMEOUT,
                    what="the server to see the connection closed",
                    until=lambda c: c == (0, 0),
                )
        finally:
            d.stop()


# -- F5: every interface only when asked -----------------------------------------------


def test_an_empty_dashboard_host_means_this_machine_only() -> None:
    with config.configured(dashboard_host=""):
        d = danaus.dashboard.serve()
        d.stop()
    assert d.host == "127.0.0.1"


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", "0"])
def test_every_interface_is_refused_without_the_opt_in(wildcard: str) -> None:
    with (
        config.configured(dashboard_host=wildcard),
        pytest.raises(ValueError, match=r"every network interface.*ALL_INTERFACES=1"),
    ):
        danaus.dashboard.serve()


def test_every_interface_with_the_opt_in_warns_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with config.configured(dashboard_host="0.0.0.0", dashboard_all_interfaces=True):
        d = danaus.dashboard.serve()
        d.stop()
    assert d.host == "0.0.0.0"
    assert "WARNING" in capsys.readouterr().err
