"""Issue 40, N2 and the HTTP stack, from another host: what a process in a second
network namespace of the lab gets from danaus's HTTP endpoints.

By default the dashboard and ``serve_metrics`` listen on loopback, so the
stranger cannot even connect; bound to every interface (the metrics need a token
of the caller's, the dashboard an opt-in), the stranger connects through the
bridge and gets 401 without the token and 403 with a wrong one, while the
holder of the token gets the page.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

import danaus.dashboard
from danaus import telemetry

from .conftest import IP, Host, Network

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

PROBE = r"""
import json, sys, urllib.error, urllib.request
out = []
for url, token in json.loads(sys.argv[1]):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            out.append([r.status, r.read(200).decode(errors="replace")])
    except urllib.error.HTTPError as e:
        out.append([e.code, ""])
    except OSError as e:
        out.append([None, type(e).__name__ + ": " + str(getattr(e, "reason", e))])
print(json.dumps(out))
"""


@pytest.fixture
def stranger(network: Network) -> Iterator[Host]:
    host = network.add_host()
    try:
        yield host
    finally:
        network.remove_host(host)


def from_stranger(host: Host, requests: list[tuple[str, str | None]]) -> list[list]:
    done = subprocess.run(
        [IP, "netns", "exec", host.netns, sys.executable, "-c", PROBE, json.dumps(requests)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_metrics_on_every_interface_answer_another_host_only_with_the_token(
    network: Network, stranger: Host
) -> None:
    with pytest.raises(ValueError, match="without a token"):
        telemetry.serve_metrics(host="0.0.0.0")
    with telemetry.serve_metrics(host="0.0.0.0", token="the-right-token") as server:
        url = f"http://{network.gateway}:{server.port}/metrics"
        got = from_stranger(
            stranger, [(url, None), (url, "a-wrong-token"), (url, "the-right-token")]
        )
    assert [status for status, _ in got] == [401, 403, 200], got
    assert "danaus" in got[2][1]  # the exposition itself


def test_loopback_endpoints_cannot_be_reached_from_another_host(
    network: Network, stranger: Host
) -> None:
    with telemetry.serve_metrics() as server:  # 127.0.0.1, a token made here
        dash = danaus.dashboard.serve(port=0)
        try:
            targets = [
                (f"http://{network.gateway}:{server.port}/metrics", server.token),
                (f"http://{network.gateway}:{dash.port}/api/state", dash.token),
            ]
            got = from_stranger(stranger, targets)
        finally:
            dash.stop()
    # not even a connection: nothing listens on the bridge's address
    assert all(status is None and "refused" in why.lower() for status, why in got), got


def test_a_dashboard_on_every_interface_wants_its_token_from_another_host(
    network: Network, stranger: Host
) -> None:
    dash = danaus.dashboard.serve(port=0, host="0.0.0.0", all_interfaces=True)
    try:
        url = f"http://{network.gateway}:{dash.port}/api/state"
        got = from_stranger(stranger, [(url, None), (url, "a-wrong-token"), (url, dash.token)])
    finally:
        dash.stop()
    assert [status for status, _ in got] == [401, 403, 200], got
