"""The host lab (``danaus._netlab``): link shaping takes effect and goes away, and
``scripts/netlab run`` brings hosts and workers up, runs a client, and leaves nothing.

Each test shapes hosts of its own (added to the session's bridge), so the shared
hosts keep their datacenter links. Measurements are compared as ratios between two
settings on the same hosts, never against a wall-clock threshold.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from danaus import _netlab, _netlab_measure

from .conftest import TIMEOUT, Host, Network, _ip, client_env, wait_pids_gone

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pair(network: Network) -> Iterator[tuple[Host, Host]]:
    """Two hosts of this test's own, with the lab's default (datacenter) links."""
    a, b = network.add_host(), network.add_host()
    try:
        yield a, b
    finally:
        network.remove_host(a)
        network.remove_host(b)


def test_new_hosts_get_datacenter_links(pair: tuple[Host, Host]) -> None:
    a, _ = pair
    assert a.link.rate == "10gbit" and a.link.loss_pct == 0
    assert a.link.delay_us == (25.0 if _netlab.netem_available() else 0.0)
    qdisc = subprocess.run(
        [_netlab.TC, "qdisc", "show", "dev", a.veth], capture_output=True, text=True, check=True
    ).stdout
    assert "rate 10Gbit" in qdisc, qdisc
    inside = subprocess.run(
        [_netlab.TC, "-n", a.netns, "qdisc", "show", "dev", a.peer],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "rate 10Gbit" in inside, inside


def test_a_configured_delay_raises_the_round_trip(pair: tuple[Host, Host]) -> None:
    if not _netlab.netem_available():
        pytest.skip(
            "this kernel has no sch_netem (CONFIG_NET_SCH_NETEM is not set, no module to "
            "load): a link delay cannot be emulated here; rate and loss are tested"
        )
    a, b = pair
    base = _netlab_measure.tcp_rtt(a, b)
    a.set_link(delay_us=20_000)
    try:
        slow = _netlab_measure.tcp_rtt(a, b)
    finally:
        a.set_link(delay_us=_netlab.DATACENTER.delay_us)
    back = _netlab_measure.tcp_rtt(a, b)
    # 20 ms each way on one of the two links: a round trip of at least 40 ms.
    assert slow >= 10 * base, (base, slow)
    assert slow >= 10 * back, (back, slow)


def test_a_delay_without_netem_is_refused_by_name(pair: tuple[Host, Host]) -> None:
    if _netlab.netem_available():
        pytest.skip("this kernel has sch_netem: delays are emulated (tested above)")
    a, _ = pair
    with pytest.raises(_netlab.NetemUnavailable, match="sch_netem"):
        a.set_link(delay_us=200_000)
    assert a.link.delay_us == 0.0  # unchanged


def test_loss_can_be_set_and_removed(pair: tuple[Host, Host]) -> None:
    a, b = pair
    sent = 400
    assert _netlab_measure.udp_delivered(a, b, sent) == sent
    a.set_link(loss_pct=50)
    # Each datagram crosses a's link once: about half arrive.
    lossy = _netlab_measure.udp_delivered(a, b, sent)
    assert 0.25 * sent < lossy < 0.75 * sent, lossy
    a.set_link(loss_pct=0)
    assert _netlab_measure.udp_delivered(a, b, sent) == sent


def test_a_rate_limits_throughput(pair: tuple[Host, Host]) -> None:
    a, b = pair
    fast = _netlab_measure.tcp_throughput(a, b, 2 << 20)
    a.set_link(rate="20mbit")
    try:
        slow = _netlab_measure.tcp_throughput(a, b, 2 << 20)
    finally:
        a.set_link(rate=_netlab.DATACENTER.rate)
    assert slow <= 20e6 / 8 * 1.2, slow  # the limit holds (20 Mbit/s, with tbf's burst)
    assert fast >= 5 * slow, (fast, slow)


def test_bad_link_settings_are_refused_by_name(pair: tuple[Host, Host]) -> None:
    a, _ = pair
    with pytest.raises(ValueError, match="loss_pct"):
        a.set_link(loss_pct=150)
    with pytest.raises(ValueError, match="not a tc rate"):
        a.set_link(rate="fast")
    assert a.link.loss_pct == 0 and a.link.rate == "10gbit"


_CLIENT = textwrap.dedent(
    """
    import os
    from danaus.actor import Actor, attach_to_workers, endpoint

    class Where(Actor):
        @endpoint
        def netns(self) -> str:
            return os.readlink("/proc/self/ns/net")

    workers = os.environ["DANAUS_NETLAB_WORKERS"].split(",")
    hosts = attach_to_workers(workers=workers, secret=os.environ["DANAUS_SECRET"])
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    where = procs.spawn("where", Where)
    seen = sorted(v for _, v in where.netns.call().get(timeout=60).items())
    print("TAG", os.environ["DANAUS_NETLAB_TAG"], flush=True)
    print("NETNS", len(workers), len(set(seen)), os.readlink("/proc/self/ns/net") in seen)
    hosts.shutdown().get(timeout=60)
    """
)


def _lab_left(tag: str) -> list[str]:
    names = [e.split()[0] for e in _ip("netns", "list").stdout.splitlines() if e.strip()]
    left = [n for n in names if n.startswith(f"dn-{tag}-")]
    if _ip("link", "show", f"dn{tag}b", check=False).returncode == 0:
        left.append(f"dn{tag}b")
    return left


def test_netlab_run_serves_a_client_and_leaves_nothing(network: Network) -> None:
    env = client_env()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "danaus._netlab_cli",
            "run",
            "2",
            "--",
            sys.executable,
            "-c",
            _CLIENT,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    # Two workers, actors in two namespaces, neither the client's.
    assert lines["NETNS"] == "2 2 False", out.stdout
    tag = lines["TAG"].strip()
    assert f"netlab {tag}: 2 hosts" in out.stderr
    assert _lab_left(tag) == []
    assert not [p for p in os.listdir("/tmp") if p.startswith(f"dn-{tag}-")]


def _start_run(cmd: list[str]) -> tuple[subprocess.Popen[str], str]:
    """``netlab run 1 -- cmd``, once its host and worker are up; returns it and its tag."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "danaus._netlab_cli", "run", "1", "--", *cmd],
        env=client_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("netlab "), line + proc.stderr.read()
    return proc, line.split()[1].rstrip(":")


_SLEEPER = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"]


def test_netlab_run_stopped_by_sigterm_tears_down_and_stops_its_command(
    network: Network,
) -> None:
    proc, tag = _start_run(_SLEEPER)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    worker_pids = [int(p) for p in _ip("netns", "pids", f"dn-{tag}-0").stdout.split()]
    assert worker_pids and _lab_left(tag)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    proc.stdout.close()
    assert proc.stderr is not None
    proc.stderr.close()
    assert _lab_left(tag) == []
    assert wait_pids_gone([child, *worker_pids], timeout=TIMEOUT) == []


def test_netlab_run_killed_leaves_what_the_next_lab_sweeps(network: Network) -> None:
    proc, tag = _start_run(_SLEEPER)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    worker_pids = [int(p) for p in _ip("netns", "pids", f"dn-{tag}-0").stdout.split()]
    try:
        proc.kill()
        proc.wait(timeout=30)
        assert (
            wait_pids_gone(worker_pids, timeout=TIMEOUT) == []
        )  # pdeathsig: the workers die with it
        assert _lab_left(tag)  # no teardown ran ...
        _netlab.sweep_stale_networks()  # ... what every new lab does first removes it
        assert _lab_left(tag) == []
    finally:
        os.kill(child, signal.SIGKILL)  # CMD is not tied to the lab's life
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()


def test_netlab_up_status_down(network: Network) -> None:
    def netlab(*args: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "danaus._netlab_cli", *args],
            env=client_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    up = netlab("up", "2", "--rate", "100mbit", "--loss", "1")
    tag = up.split()[1]
    try:
        status = netlab("status")
        assert f"lab {tag}: bridge dn{tag}b" in status and "owner scripts/netlab up" in status
        assert status.count(f"dn-{tag}-") == 2 and "rate 100Mbit" in status, status
        # A lab made by `up` outlives its maker and is not swept as stale.
        _netlab.sweep_stale_networks()
        assert len(_lab_left(tag)) == 3
    finally:
        netlab("down")
    assert _lab_left(tag) == []
    assert not [t for t in _netlab._run([_netlab.NFT, "list", "tables"]).stdout.split() if tag in t]


def test_without_netem_or_nft_hosts_come_up_and_loss_is_refused_by_name(
    network: Network, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _netlab.netem_available():
        pytest.skip("this kernel has sch_netem: loss is netem's, nft is not used")
    monkeypatch.setattr(_netlab, "NFT", "/nonexistent/nft")
    host = network.add_host()
    try:
        with pytest.raises(_netlab.NetemUnavailable, match="nftables"):
            host.set_link(loss_pct=5)
        assert host.link == _netlab.Link(delay_us=0.0)  # unchanged
    finally:
        network.remove_host(host)
