"""With TLS, one thread at a time uses an SSL socket: the I/O thread, and no other.

An SSL object is not safe to use from two threads at once, yet actor threads
send while the I/O thread receives. Here eight threads send on one TLS
connection while the peer floods it back, with every call on the SSL sockets
recorded: only the I/O thread may touch them, never two calls at once, and
every frame arrives intact and in per-thread order.
"""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Any

import pytest

from danaus._transport import conn as conn_mod
from danaus._wire.frame import encode_frame

from .conftest import KIND, TIMEOUT

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def contexts(pki: dict[str, str]) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts: mutual TLS against a throwaway CA."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    for ctx in (server, client):
        ctx.load_cert_chain(pki["tls_cert"], pki["tls_key"])
        ctx.load_verify_locations(pki["tls_ca"])
        ctx.verify_mode = ssl.CERT_REQUIRED
    return server, client


class Watch:
    """Records which threads call an SSL socket's methods, and whether two ever overlap."""

    METHODS = ("send", "sendall", "sendmsg", "recv", "recv_into", "pending", "do_handshake")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: set[int] = set()
        self.inside = 0
        self.overlaps = 0

    def wrap(self, sock: Any) -> None:
        for name in self.METHODS:
            if hasattr(sock, name):
                setattr(sock, name, self._recording(getattr(sock, name)))

    def _recording(self, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.threads.add(threading.get_ident())
                self.inside += 1
                self.overlaps += self.inside > 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.inside -= 1

        return call


def test_only_the_io_thread_uses_an_ssl_socket_while_threads_send(loop, contexts) -> None:
    server_ctx, client_ctx = contexts
    a_sock, b_sock = socket.socketpair()
    got: dict[str, list[Any]] = {"a": [], "b": []}
    done = {"a": threading.Event(), "b": threading.Event()}
    threads_n, frames_n = 8, 150
    expect = {"a": 200, "b": threads_n * frames_n}
    watch = Watch()
    made: dict[str, conn_mod.Connection] = {}
    io_thread: list[int] = []
    ready = threading.Event()

    def receiver(side: str) -> Any:
        def on_frame(conn: Any, frame: Any) -> None:
            got[side].append(frame.header[1:])
            if len(got[side]) == expect[side]:
                done[side].set()

        return on_frame

    def build() -> None:
        io_thread.append(threading.get_ident())
        made["a"] = conn_mod.Connection(
            a_sock, loop, receiver("a"), lambda c, e: None, tls=client_ctx
        )
        made["b"] = conn_mod.Connection(
            b_sock, loop, receiver("b"), lambda c, e: None, tls=server_ctx, server_side=True
        )
        for c in made.values():
            watch.wrap(c.sock)
        ready.set()

    loop.call_soon_threadsafe(build)
    assert ready.wait(TIMEOUT)
    a, b = made["a"], made["b"]
    payload = b"p" * 20_000  # several TLS records per frame: partial writes happen

    def send_many(t: int) -> None:
        for i in range(frames_n):
            a.send(encode_frame((KIND, t, i), b"", [payload]))

    def flood_back() -> None:  # b sends to a meanwhile: the I/O thread reads a's SSL object
        for i in range(expect["a"]):
            b.send(encode_frame((KIND, "back", i), b"", [payload]))

    senders = [threading.Thread(target=send_many, args=(t,)) for t in range(threads_n)]
    senders.append(threading.Thread(target=flood_back))
    for t in senders:
        t.start()
    for t in senders:
        t.join(TIMEOUT)
    assert done["b"].wait(TIMEOUT) and done["a"].wait(TIMEOUT), (len(got["a"]), len(got["b"]))
    assert watch.threads == set(io_thread), "a thread other than the I/O thread used an SSL socket"
    assert watch.overlaps == 0
    for t in range(threads_n):
        assert [i for s, i in got["b"] if s == t] == list(range(frames_n))
    assert [i for _s, i in got["a"]] == list(range(expect["a"]))
    loop.call_soon_threadsafe(a.close)
    loop.call_soon_threadsafe(b.close)
