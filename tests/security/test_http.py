"""Every HTTP endpoint danaus serves (the dashboard, ``serve_metrics``) against other users
and idle connections: one stack (``_observe/web.py``), so one set of tests, run against
each endpoint (issue 40: N2 and "One HTTP stack")."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import danaus.dashboard
from danaus import config, telemetry
from danaus.actor import this_host
from danaus.testing import wait_until

TIMEOUT = 30.0  # bound on each wait below; a pass never comes near it
IDLE = 300
# Threads that may start in this process meanwhile for reasons of their own (the
# runtime's timers, the HTTP pool's workers); a thread per connection adds hundreds.
SLACK = 4


def _as_nobody() -> list[str]:
    """The command that runs a Python script as a second user (nobody): the system's
    Python, which every user may run (the test's own may sit in root's home)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to act as a second user, nobody) and setpriv")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("needs a system python3 (/usr/bin/python3) that nobody may run")
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", python]


@dataclass
class Endpoint:
    """One HTTP endpoint under test: where it is, its token, a path that answers 200."""

    name: str
    port: int
    token: str
    path: str
    server: Any  # the web.HttpServer: its connections()

    def url(self, token: str | None = None) -> str:
        query = f"?token={token}" if token is not None else ""
        return f"http://127.0.0.1:{self.port}{self.path}{query}"

    def get(self, token: str | None = None) -> int:
        """The status of a GET (with ``token`` in the URL, if any)."""
        try:
            with urllib.request.urlopen(self.url(token), timeout=TIMEOUT) as r:
                r.read()
                return int(r.status)
        except urllib.error.HTTPError as e:
            e.close()
            return int(e.code)


@pytest.fixture(params=["dashboard", "metrics"])
def endpoint(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    # No connection times out during a test: what closes one is what the test checks.
    with config.configured(dashboard_request_timeout=3600):
        if request.param == "dashboard":
            d = danaus.dashboard.serve()
            yield Endpoint("dashboard", d.port, d.token, "/api/state", d._server)
            d.stop()
        else:
            m = telemetry.serve_metrics()  # the default: a token made and printed
            yield Endpoint("metrics", m.port, m.token, "/metrics", m._server)
            m.stop()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    s.settimeout(TIMEOUT)
    return s


def test_300_idle_connections_leave_the_thread_count_flat_and_the_endpoint_answering(
    endpoint: Endpoint,
) -> None:
    assert endpoint.get(endpoint.token) == 200  # the shared worker pool has started
    baseline = threading.active_count()
    idle = [_connect(endpoint.port) for _ in range(IDLE)]
    try:
        # The server accepts in order, so when this answers every idle one was accepted.
        assert endpoint.get(endpoint.token) == 200
        assert threading.active_count() <= baseline + SLACK
        pending, _ = endpoint.server.connections()
        assert pending <= config.get_global_config()["max_pending_handshakes"]
        # And tokened connections kept open (keep-alive) hold no thread either.
        kept = []
        for _ in range(20):
            s = _connect(endpoint.port)
            s.sendall(
                f"GET {endpoint.path}?token={endpoint.token} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
            kept.append(s)
        assert threading.active_count() <= baseline + SLACK
        assert endpoint.get(endpoint.token) == 200
        for s in kept:
            s.close()
    finally:
        for s in idle:
            s.close()


def test_a_second_user_gets_nothing_without_the_token(endpoint: Endpoint) -> None:
    """N2: serve_metrics() used to answer anyone on the host; now, as the dashboard, only
    the token's holder. A process of another uid tries without it and with a guess."""
    script = (
        "import sys, urllib.request, urllib.error\n"
        "for url in sys.argv[1:]:\n"
        "    try:\n"
        "        with urllib.request.urlopen(url, timeout=30) as r:\n"
        "            print(r.status, len(r.read()))\n"
        "    except urllib.error.HTTPError as e:\n"
        "        print(e.code, len(e.read()))\n"
    )
    out = subprocess.run(
        [*_as_nobody(), "-c", script, endpoint.url(), endpoint.url("guess")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout.split()
    assert out[0] == "401" and out[2] == "403", out
    assert endpoint.get(endpoint.token) == 200


def test_an_idle_tokenless_connection_is_closed_after_the_request_timeout(
    endpoint: Endpoint,
) -> None:
    with config.configured(dashboard_request_timeout=1.0):
        s = _connect(endpoint.port)  # opened under the short timeout: says nothing at all
        assert s.recv(1) == b""  # closed by the server (a timeout here fails the test)
        s.close()


def test_tokened_connections_beyond_the_cap_get_503(endpoint: Endpoint) -> None:
    with config.configured(dashboard_max_connections=2):
        kept = []
        for _ in range(2):
            s = _connect(endpoint.port)
            s.sendall(
                f"GET {endpoint.path}?token={endpoint.token} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
            kept.append(s)
        third = _connect(endpoint.port)
        third.sendall(
            f"GET {endpoint.path}?token={endpoint.token} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        assert third.recv(4096).startswith(b"HTTP/1.1 503 ")
        third.close()
        kept.pop().close()
        wait_until(
            endpoint.server.connections,
            timeout=TIMEOUT,
            what="the server to see a connection closed",
            until=lambda c: c[1] == 1,
        )
        assert endpoint.get(endpoint.token) == 200  # a slot is free again
        for s in kept:
            s.close()


def test_a_request_head_over_the_limit_is_refused(endpoint: Endpoint) -> None:
    s = _connect(endpoint.port)
    s.sendall(b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = s.recv(4096)
    s.close()
    assert answer.split(b" ")[1] in (b"400", b"414", b"431"), answer[:80]


# -- N2: serve_metrics' defaults --------------------------------------------------------


def test_serve_metrics_makes_a_token_and_prints_it_once(capsys: pytest.CaptureFixture[str]) -> None:
    m = telemetry.serve_metrics()
    try:
        err = capsys.readouterr().err
        assert err.count(m.token) == 1 and m.url in err
        assert m.url.startswith("http://127.0.0.1:")
        request = urllib.request.Request(m.url, headers={"Authorization": f"Bearer {m.token}"})
        with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
            assert b"danaus_procs" in r.read()
        assert capsys.readouterr().err == ""  # printed once, not per scrape
    finally:
        m.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_serve_metrics_refuses_another_hosts_address_without_a_token(host: str) -> None:
    with pytest.raises(ValueError, match=r"without a token.*token="):
        telemetry.serve_metrics(host=host)


def test_serve_metrics_on_every_interface_with_a_token_wants_it() -> None:
    m = telemetry.serve_metrics(host="0.0.0.0", token="tok-en")
    try:
        assert m.url.startswith("http://0.0.0.0:")
        ep = Endpoint("metrics", m.port, m.token, "/metrics", m._server)
        assert ep.get() == 401 and ep.get("tok-en") == 200
    finally:
        m.stop()


def _scrape(m: telemetry.MetricsServer) -> bytes:
    request = urllib.request.Request(m.url, headers={"Authorization": f"Bearer {m.token}"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
        return bytes(r.read())


def _sent_by_client(body: bytes) -> list[bytes]:
    return [line for line in body.splitlines() if line.startswith(b"danaus_proc_sent_bytes")]


def test_scrapes_within_metrics_min_interval_do_not_ask_the_procs_again() -> None:
    """N2: a scrape asks every proc (a STATS round, whose frames count in the bytes sent);
    scrapes within metrics_min_interval get the last collection, so the procs see one
    round however many scrapers come."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    m = telemetry.serve_metrics(token="t")
    try:
        with config.configured(metrics_min_interval=0):
            first, second = _scrape(m), _scrape(m)
            # Each collection was a new STATS round: the bytes sent grew.
            assert _sent_by_client(first) != _sent_by_client(second)
        with config.configured(metrics_min_interval=3600):
            bodies = {_scrape(m) for _ in range(20)}
            assert len(bodies) == 1  # one collection, served again
    finally:
        m.stop()
        procs.stop().get(timeout=60)


def test_a_client_that_stops_reading_its_answer_is_closed() -> None:
    """A tokened client that asks for an answer and never reads it would hold its buffers
    for good: the server closes it once the answer has waited unread for the timeout."""
    from danaus._observe.web import HttpServer, aiohttp_web

    web = aiohttp_web()
    big = b"x" * (64 << 20)  # more than every socket buffer on the way holds

    async def large(request: Any) -> Any:
        return web.Response(body=big)

    with config.configured(dashboard_request_timeout=1.0):
        server = HttpServer("127.0.0.1", 0, "tok", {"/large": large}, name="test server")
    try:
        s = _connect(int(server.address[1]))
        s.sendall(b"GET /large?token=tok HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200 ")  # then reads nothing more
        wait_until(
            server.connections,
            timeout=TIMEOUT,
            what="the server to close the connection that stopped reading",
            until=lambda c: c == (0, 0),
        )
        s.close()
    finally:
        server.stop()
