"""The RDMA data connection is as protected as the message connection.

Its requests are sealed with the session key of their connection: a STORE
that was not sealed for this connection never writes a byte into a
registered buffer. Its server bounds what an unauthenticated peer costs: one
deadline for the whole handshake and a bounded number of threads.
"""

from __future__ import annotations

import ctypes
import select
import socket
import ssl
import threading
from collections.abc import Iterator

import pytest

from danaus._rdma import net
from danaus._rdma.memory import LocalMemory

from .conftest import CHALLENGE, SECRET, TIMEOUT, recv_exactly, wait_closed

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def buffer(rdma_memory) -> Iterator[tuple[bytearray, tuple[int, int, int]]]:
    buf = bytearray(b"A" * 64)
    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    buffer_id = rdma_memory.register(LocalMemory(addr, len(buf), False, buf, "bytearray"))
    yield buf, (buffer_id, addr, len(buf))
    rdma_memory.drop([buffer_id])


def _store_head(entry: tuple[int, int, int], nbytes: int) -> bytes:
    buffer_id, addr, size = entry
    return net._REQ.pack(net.STORE, buffer_id, addr, size, 0, nbytes)


def test_a_sealed_store_writes_the_buffer(data_server, buffer) -> None:
    _node, address = data_server()
    buf, entry = buffer
    sock, session = net.connect(address, SECRET, TIMEOUT, lambda s: True)
    with sock:
        assert session is not None
        payload = b"B" * 64
        net._send_all(sock, net._seal(session, [_store_head(entry, 64)])
                      + net._seal(session, [payload]))  # fmt: skip
        resp = recv_exactly(sock, net._RESP.size)
        net._check(sock, session, resp)
        assert net._RESP.unpack(resp)[0] == net._OK
    assert bytes(buf) == payload


@pytest.mark.parametrize("tag", ["none", "forged"])
def test_a_store_not_sealed_for_this_connection_writes_nothing(data_server, buffer, tag) -> None:
    _node, address = data_server()
    buf, entry = buffer
    sock, _session = net.connect(address, SECRET, TIMEOUT, lambda s: True)
    with sock:
        # What an attacker on the path would inject after the (relayed) handshake.
        forged = bytes(32) if tag == "forged" else b""
        sock.sendall(_store_head(entry, 64) + forged + b"X" * 64 + forged)
        assert wait_closed(sock) == b""
    assert bytes(buf) == b"A" * 64


def test_a_handshake_dripped_byte_by_byte_hits_one_overall_deadline(data_server, settings) -> None:
    settings(handshake_timeout=0.3)
    _node, address = data_server()
    with socket.create_connection(address, timeout=TIMEOUT) as s:
        assert recv_exactly(s, CHALLENGE)
        sent = 0
        while sent < 64:  # an answer of 64 bytes, one byte per 0.1 s: 6.4 s in all
            try:
                s.sendall(b"\0")
            except OSError:
                break
            sent += 1
            readable, _, _ = select.select([s], [], [], 0.1)  # pacing, not synchronising
            if readable:
                break
        assert sent < 64, "the server waited for the whole slow handshake"
        wait_closed(s)


def test_the_data_server_runs_a_bounded_number_of_threads(data_server, settings) -> None:
    settings(rdma_max_data_threads=3)
    _node, address = data_server()
    held = [socket.create_connection(address, timeout=TIMEOUT) for _ in range(3)]
    try:
        for s in held:
            assert recv_exactly(s, CHALLENGE)  # each has a thread
        with socket.create_connection(address, timeout=TIMEOUT) as extra:
            assert wait_closed(extra) == b"", "a thread beyond the bound served a connection"
        held.pop().close()  # its thread ends, its slot is free again
        for _ in range(1000):
            with socket.create_connection(address, timeout=TIMEOUT) as again:
                try:
                    if recv_exactly(again, CHALLENGE):
                        break
                except (EOFError, ConnectionResetError):
                    continue  # the freed thread had not ended yet
        else:
            pytest.fail("the data server never served again after a slot was freed")
    finally:
        for s in held:
            s.close()


def test_garbage_on_the_data_server_closes_only_that_connection(data_server, buffer) -> None:
    _node, address = data_server()
    with socket.create_connection(address, timeout=TIMEOUT) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)))
        wait_closed(s)
    sock, _session = net.connect(address, SECRET, TIMEOUT, lambda s: True)
    sock.close()


def test_the_data_server_survives_a_thread_that_cannot_start(data_server, monkeypatch) -> None:
    # "can't start new thread" (a process at its thread limit) for the first data thread:
    # that connection is shed, the accept loop goes on and serves the next one.
    real = net.threading.Thread
    failed: list[str] = []

    class Failing(real):  # type: ignore[misc, valid-type]
        def start(self) -> None:
            if self.name == "danaus-rdma-data" and not failed:
                failed.append(self.name)
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(net.threading, "Thread", Failing)
    _node, address = data_server()
    with socket.create_connection(address, timeout=TIMEOUT) as first:
        assert wait_closed(first) == b"", "the connection whose thread failed was served"
    assert failed == ["danaus-rdma-data"]
    sock, session = net.connect(address, SECRET, TIMEOUT, lambda s: True)
    sock.close()
    assert session is not None


def test_with_tls_the_data_connection_is_tls(data_server, buffer, pki, settings) -> None:
    from danaus._transport import tls
    from danaus._transport.auth import MAGIC

    assert tls.client_context() is None  # first used without TLS ...
    settings(**pki)  # ... then configured: it takes effect, it is not cached away
    _node, address = data_server()
    buf, entry = buffer
    with socket.create_connection(address, timeout=TIMEOUT) as plain:
        plain.sendall(b"\0" * 64)  # no TLS ClientHello: refused, and nothing in the clear
        assert MAGIC not in wait_closed(plain)
    sock, session = net.connect(address, SECRET, TIMEOUT, lambda s: True)
    with sock:
        assert isinstance(sock, ssl.SSLSocket) and session is None  # TLS protects every byte
        net._send_all(sock, [_store_head(entry, 64), b"T" * 64])
        assert net._RESP.unpack(recv_exactly(sock, net._RESP.size))[0] == net._OK
    assert bytes(buf) == b"T" * 64


def test_a_requester_turned_away_by_a_busy_data_server_tries_again(data_server, settings) -> None:
    # One data thread, held by a peer that never answers the challenge: a requester is
    # closed unserved until the handshake deadline frees the thread, and then served
    # (it was a failed transfer before: the 65th concurrent requester of one owner).
    settings(rdma_max_data_threads=1, handshake_timeout=0.5)
    _node, address = data_server()
    with socket.create_connection(address, timeout=TIMEOUT) as holder:
        assert recv_exactly(holder, CHALLENGE)  # it has the only thread
        with socket.create_connection(address, timeout=TIMEOUT) as extra:
            assert wait_closed(extra) == b"", "a second thread served a connection"
        sock, session = net.connect(address, SECRET, TIMEOUT, lambda s: True)
        with sock:
            assert session is not None
        assert wait_closed(holder) == b""  # the holder was timed out: that freed the thread


def test_a_data_server_busy_for_the_whole_transfer_time_is_named(data_server, settings) -> None:
    settings(rdma_max_data_threads=1, handshake_timeout=30)
    _node, address = data_server()
    with socket.create_connection(address, timeout=TIMEOUT) as holder:
        assert recv_exactly(holder, CHALLENGE)
        with pytest.raises(net.Unserved, match="data threads stayed busy"):
            net.connect(address, SECRET, 0.5, lambda s: True)


def test_a_try_that_times_out_after_refusals_is_named_busy_too() -> None:
    """A loaded owner leaves the next connection in its accept queue until the
    transfer's time is up: after refusals, that is the same busy server."""
    with socket.create_server(("127.0.0.1", 0)) as lsock:

        def refuse_once() -> None:
            conn, _ = lsock.accept()
            conn.close()  # unserved; later connections wait in the backlog, unanswered

        t = threading.Thread(target=refuse_once)
        t.start()
        with pytest.raises(net.Unserved, match="data threads stayed busy") as caught:
            net.connect(lsock.getsockname()[:2], SECRET, 1.0, lambda s: True)
        t.join(TIMEOUT)
    assert isinstance(caught.value.__cause__, TimeoutError)
