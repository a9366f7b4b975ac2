"""Measuring a link of the lab (``_netlab``): TCP round trips and throughput, UDP
delivery, each between processes in two hosts' namespaces."""

from __future__ import annotations

import subprocess
import sys
import threading

from ._netlab import DIE_WITH_PARENT, Host

__all__ = ["tcp_rtt", "tcp_throughput", "udp_delivered"]

_ECHO_SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)):
    c.sendall(b)
"""

_ECHO_CLIENT = """
import socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); c.sendall(b"x"); assert c.recv(1) == b"x"
    times.append(time.perf_counter() - t)
print(statistics.median(times))
"""


def _one_stream(
    a: Host,
    b: Host,
    server: str,
    client: str,
    args: list[str],
    names: tuple[str, str],
    timeout: float,
) -> float:
    """Run the script ``server`` in ``a`` (it prints its port), then ``client`` in ``b``
    with ``a``'s address, the port and ``args``; the number the client prints."""
    proc = subprocess.Popen(
        [*DIE_WITH_PARENT, *a.exec_argv(sys.executable, "-c", server, a.ip)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the {names[0]} in {a.netns} did not start: {port!r}")
        r = subprocess.run(
            b.exec_argv(sys.executable, "-c", client, a.ip, port, *args),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            raise RuntimeError(f"the {names[1]} in {b.netns} failed: {r.stderr.strip()}")
        return float(r.stdout)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def tcp_rtt(a: Host, b: Host, count: int = 20, timeout: float = 60.0) -> float:
    """The median round trip, in seconds, of one byte over TCP from ``b`` to ``a``."""
    names = ("echo server", "echo client")
    return _one_stream(a, b, _ECHO_SERVER, _ECHO_CLIENT, [str(count)], names, timeout)


_SINK = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
n = 0
while (b := c.recv(1 << 20)):
    n += len(b)
c.sendall(str(n).encode()); c.close()
"""

_SOURCE = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
left, block = int(sys.argv[3]), b"x" * (1 << 16)
t = time.perf_counter()
while left > 0:
    c.sendall(block[:left]); left -= len(block)
c.shutdown(socket.SHUT_WR)
n = int(c.recv(64))
print(n / (time.perf_counter() - t))
"""


def tcp_throughput(a: Host, b: Host, nbytes: int = 4 << 20, timeout: float = 120.0) -> float:
    """Bytes per second of one TCP stream of ``nbytes`` from ``b`` to ``a``."""
    return _one_stream(a, b, _SINK, _SOURCE, [str(nbytes)], ("sink", "source"), timeout)


_UDP_COUNT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 0))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
print(s.getsockname()[1], flush=True)
sys.stdin.readline()  # the sender is done
s.setblocking(False)
n = 0
while True:
    try:
        s.recv(64)
    except BlockingIOError:
        break
    n += 1
print(n, flush=True)
"""

_UDP_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[3])):
    s.sendto(b"x", (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.0005)
"""


def udp_delivered(a: Host, b: Host, count: int = 400) -> int:
    """How many of ``count`` UDP datagrams sent from ``b`` to ``a`` arrive."""
    rx = subprocess.Popen(
        [*DIE_WITH_PARENT, *a.exec_argv(sys.executable, "-c", _UDP_COUNT, a.ip)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rx.stdout is not None and rx.stdin is not None
        port = rx.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the UDP receiver in {a.netns} did not start: {port!r}")
        subprocess.run(
            b.exec_argv(sys.executable, "-c", _UDP_SEND, a.ip, port, str(count)),
            check=True,
            timeout=60,
        )
        # Arrivals may still be in flight behind a delay: the rates here are far below
        # the link's, so one round trip's worth of waiting is ample.
        delay_s = (a.link.delay_us + b.link.delay_us) * 2e-6
        threading.Event().wait(delay_s + 0.2)
        out, _ = rx.communicate("done\n", timeout=30)
        return int(out.strip())
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
