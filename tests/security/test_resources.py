"""What an unauthenticated or misbehaving peer can cost a listener: little, and bounded.

Slowloris (connections that never finish their handshake), ten thousand
connections opened and dropped, garbage, a frame announcing a huge size, and
a peer that stops reading while we close: each is shed, and the listener
goes on serving its legitimate peers.
"""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from danaus import _config as danaus_config
from danaus._transport import conn as conn_mod
from danaus._transport.auth import TAG, Handshake
from danaus._wire.frame import encode_frame

from .conftest import CHALLENGE, KIND, SECRET, TIMEOUT, Node, note, recv_exactly, wait_closed

pytestmark = pytest.mark.timeout(120)


def _dial(node: Node) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", node.port), timeout=TIMEOUT)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, no TIME_WAIT
    return s


def _legit_frame_arrives(node: Node, client: Node, text: str) -> None:
    client.rt.send(node.tcp, note(text))
    assert node.got.get(timeout=TIMEOUT) == (KIND, text)


def _pending(node: Node) -> int:
    return int(node.on_io(lambda: sum(not c.authenticated for c in node.rt.links.incoming)))


def test_slowloris_holds_at_most_the_cap_of_handshakes_and_legit_peers_get_in(nodes) -> None:
    server, client = nodes("srv"), nodes("cli")
    cap = danaus_config.get("max_pending_handshakes")
    extra = 8
    socks = [_dial(server) for _ in range(cap + extra)]
    try:
        for s in socks:
            assert recv_exactly(s, CHALLENGE)  # each was accepted and challenged
        # The oldest were shed at once, long before the handshake deadline ...
        for s in socks[:extra]:
            assert wait_closed(s) == b""
        # ... while the newest still wait, and hold no decode buffer.
        last = socks[-1]
        last.setblocking(False)
        with pytest.raises(BlockingIOError):
            last.recv(1)
        assert _pending(server) <= cap
        assert server.on_io(
            lambda: all(
                c.reader.decoder is None for c in server.rt.links.incoming if not c.authenticated
            )
        )
        _legit_frame_arrives(server, client, "through the crowd")
    finally:
        for s in socks:
            s.close()


def test_ten_thousand_connections_opened_and_dropped_leave_nothing_behind(nodes) -> None:
    server, client = nodes("srv"), nodes("cli")
    for _ in range(10_000):
        _dial(server).close()
    _legit_frame_arrives(server, client, "after the storm")
    # Every dropped connection is gone from the server (checked on its I/O thread).
    for _ in range(100_000):
        if server.on_io(lambda: len(server.rt.links.incoming)) <= 1:
            break
    assert server.on_io(lambda: len(server.rt.links.incoming)) <= 1


@pytest.mark.parametrize(
    "garbage",
    [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", bytes(range(256)) * 64, b"\0" * 100],
    ids=["http", "noise", "zeros"],
)
def test_garbage_instead_of_a_handshake_is_dropped(nodes, garbage: bytes) -> None:
    server, client = nodes("srv"), nodes("cli")
    with _dial(server) as s:
        s.sendall(garbage)
        wait_closed(s)
    _legit_frame_arrives(server, client, "still serving")


def _authenticated(node: Node) -> tuple[socket.socket, object]:
    s = socket.create_connection(("127.0.0.1", node.port), timeout=TIMEOUT)
    hs = Handshake(SECRET, "client")
    s.sendall(hs.feed(recv_exactly(s, hs.want())))
    hs.feed(recv_exactly(s, hs.want()))
    return s, hs.session()


def test_a_frame_announcing_a_huge_size_is_refused_before_allocation(nodes) -> None:
    server, client = nodes("srv"), nodes("cli")
    s, _session = _authenticated(server)
    with s:
        s.sendall(struct.pack("<Q", 1 << 44) + b"\0" * 64)  # 16 TiB announced
        wait_closed(s)
    _legit_frame_arrives(server, client, "still serving")


def test_a_frame_over_the_configured_limit_is_refused_though_it_would_fit(nodes, settings) -> None:
    # 64 MiB could be allocated at once here: only the limit (1 MiB) refuses it, as soon
    # as its length is read (otherwise the server would wait for the 64 MiB to come).
    settings(codec_max_frame_length=1 << 20)
    server, client = nodes("srv"), nodes("cli")
    s, _session = _authenticated(server)
    with s:
        s.sendall(struct.pack("<Q", 64 << 20) + b"\0" * 64)
        assert wait_closed(s) == b""
    _legit_frame_arrives(server, client, "still serving")


def test_the_default_frame_limit_is_well_under_this_machines_memory() -> None:
    import os

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert ram // 4 >= danaus_config.get("codec_max_frame_length")


def test_an_authenticated_peer_sends_sealed_frames_the_server_accepts(nodes) -> None:
    # The protocol as documented in docs/security.md, spoken by hand.
    server = nodes("srv")
    s, session = _authenticated(server)
    with s:
        parts = encode_frame((KIND, "by hand"))
        s.sendall(b"".join(map(bytes, parts)) + session.seal(parts))  # type: ignore[attr-defined]
        assert server.got.get(timeout=TIMEOUT) == (KIND, "by hand")
        assert len(session.seal([b""])) == TAG  # type: ignore[attr-defined]


def test_flush_and_close_gives_up_on_a_peer_that_stops_reading(loop, settings) -> None:
    settings(flush_timeout=0.2)
    ours, theirs = socket.socketpair()
    closed = threading.Event()
    made: list[conn_mod.Connection] = []
    ready = threading.Event()

    def build() -> None:
        made.append(conn_mod.Connection(ours, loop, lambda c, f: None, lambda c, e: closed.set()))
        ready.set()

    loop.call_soon_threadsafe(build)
    assert ready.wait(TIMEOUT)
    conn = made[0]
    conn.send(encode_frame((KIND,), b"x" * (64 << 20)))  # far more than the socket buffers
    loop.call_soon_threadsafe(conn.flush_and_close)
    assert closed.wait(TIMEOUT), "flush_and_close waited forever on a peer that never reads"
    theirs.close()


EMFILE_CLIENT = """
import logging, resource, socket, sys, threading
from danaus._runtime.messaging.runtime import Runtime
from danaus._transport.address import make_job_dir
from danaus._transport.auth import Handshake

SECRET = b"s" * 32
paused = threading.Event()
pauses = []

class Seen(logging.Handler):
    def emit(self, record):
        if "pausing" in record.getMessage():
            pauses.append(float(record.getMessage().split("pausing for ")[1].split()[0]))
            if len(pauses) >= 4:
                paused.set()

logging.getLogger("danaus.runtime").addHandler(Seen())
rt = Runtime("emfile", make_job_dir(), secret=SECRET)
rt.start(in_thread=True)
port = int(rt.listen_tcp("127.0.0.1", "127.0.0.1").rsplit(":", 1)[1])
import os
in_use = len(os.listdir("/proc/self/fd"))
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 32, hard))
held = []
try:
    while True:  # until this process (client and server alike) is out of descriptors
        held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
except OSError:
    pass
print("out of descriptors after", len(held), flush=True)
assert paused.wait(20), f"the listener did not pause on EMFILE, again and again: {pauses}"
# Each retry waits longer than the one before (it does not spin on the error).
print("pauses", pauses[:4], pauses[:4] == sorted(set(pauses[:4])), flush=True)
for s in held:
    s.close()
s = socket.create_connection(("127.0.0.1", port), timeout=20)
hs = Handshake(SECRET, "client")
def exactly(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b)); assert c; b += c
    return b
s.sendall(hs.feed(exactly(hs.want())))
hs.feed(exactly(hs.want()))
print("served again", hs.done, flush=True)
"""


def test_a_listener_out_of_descriptors_backs_off_then_serves_again(tmp_path) -> None:
    from danaus.testing import ClientScript

    out = ClientScript(tmp_path).run(EMFILE_CLIENT, timeout=60)
    assert "served again True" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "True" in out.stdout.split("pauses", 1)[1].splitlines()[0], out.stdout
