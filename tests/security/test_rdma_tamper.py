"""A payload altered on the way never becomes visible, and is reported as tampering.

Without TLS, a data connection's payload travels in chunks of ``net.CHUNK``
bytes, each with its HMAC tag. The receiver (the owner for a STORE, the
requester for a FETCH) stages each chunk in a scratch buffer, checks its tag
there, and copies only a verified chunk into the destination. A relay on the
path (real sockets, the handshake passed through unchanged) flips one byte of
the payload: the destination holds none of the altered chunk nor anything
after it (the verified chunks before it have landed: per-chunk semantics),
and the requester gets ``net.Tampered`` / ``RDMATamperedError`` ("tag check
failed: the data was altered on the way"), not "the owner exited".
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import threading
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from danaus._rdma import net
from danaus._rdma.memory import LocalMemory
from danaus._runtime.node import this_node
from danaus._transport.auth import TAG
from danaus.actor import Actor, ActorMesh, endpoint
from danaus.rdma import RDMABuffer, RDMAError, RDMAOwnerLostError, RDMATamperedError
from loopback_worker import REPLY_TIMEOUT, loopback_worker

from .conftest import CHALLENGE, CONFIRM, RESPONSE, SECRET, TIMEOUT

pytestmark = pytest.mark.timeout(120)

CHUNK = net.CHUNK
N = 4 * CHUNK + 1000  # five chunks, the last one short
HEAD = net._REQ.size + TAG  # a sealed request
ANSWER = net._RESP.size + TAG  # a sealed OK response
UP_PAYLOAD = RESPONSE + HEAD  # where a STORE's payload starts, client -> server
DOWN_PAYLOAD = CHALLENGE + CONFIRM + ANSWER  # where a FETCH's payload starts, server -> client


def random_bytes(n: int, seed: int) -> np.ndarray:
    """``n`` random bytes in 1..255 (never zero)."""
    return np.random.default_rng(seed).integers(1, 256, n, dtype=np.uint8)


class Holder(Actor):
    """Owns named buffers of random bytes (on the other host)."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[np.ndarray, RDMABuffer]] = {}

    @endpoint
    def make(self, name: str, n: int, seed: int) -> RDMABuffer:
        data = random_bytes(n, seed)
        self.items[name] = (data, RDMABuffer(data))
        return self.items[name][1]

    @endpoint
    def contents(self, name: str) -> bytes:
        return self.items[name][0].tobytes()


def payload_offset(start: int, byte: int) -> int:
    """The stream offset of payload byte ``byte`` (its chunk's tags before it counted)."""
    return start + byte + (byte // CHUNK) * TAG


class FlipRelay:
    """An attacker on the path: relays every byte both ways, unchanged except one.

    ``up`` / ``down``: the offset, in the client -> server or server -> client
    byte stream of its first connection, of the byte it flips (None: none).
    Later connections are relayed unchanged.
    """

    def __init__(self, target: tuple[str, int], up: int | None = None, down: int | None = None):
        self.target, self.flips = target, {"up": up, "down": down}
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.address = ("127.0.0.1", self.lsock.getsockname()[1])
        self.flipped = threading.Event()
        self.connections = 0
        self.socks: list[socket.socket] = []  # closed with the relay
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            self.socks.append(c)
            try:
                s = socket.create_connection(self.target, timeout=TIMEOUT)
            except OSError:
                c.close()
                continue
            self.socks.append(s)
            first = self.connections == 0
            self.connections += 1
            for src, dst, way in ((c, s, "up"), (s, c, "down")):
                at = self.flips[way] if first else None
                threading.Thread(target=self._pump, args=(src, dst, at), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, at: int | None) -> None:
        seen = 0
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                if at is not None and seen <= at < seen + len(data):
                    data = bytearray(data)
                    data[at - seen] ^= 0x01
                    self.flipped.set()
                seen += len(data)
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.lsock.close()
        for sock in self.socks:
            sock.close()


@pytest.fixture
def relays() -> Iterator[Callable[..., FlipRelay]]:
    made: list[FlipRelay] = []

    def make(target: tuple[str, int], **kw: int | None) -> FlipRelay:
        r = FlipRelay(target, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def _addr(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


@pytest.fixture
def registered(rdma_memory) -> Iterator[tuple[bytearray, tuple[int, int, int]]]:
    """The owner's registered buffer: N random bytes."""
    buf = bytearray(random_bytes(N, 1).tobytes())
    buffer_id = rdma_memory.register(LocalMemory(_addr(buf), N, False, buf, "bytearray"))
    yield buf, (buffer_id, _addr(buf), N)
    rdma_memory.drop([buffer_id])


def _request(address: tuple[str, int], op: int, entry: tuple[int, int, int], local: bytearray):
    key = (f"owner-{uuid.uuid4().hex[:8]}", 1)
    client = net.DataClient()  # a requester's connections of its own
    client.remember_address(key, address)
    try:
        client.request(
            key, SECRET, float("inf"), lambda s: True, lambda s: True,
            op, entry, 0, _addr(local), len(local),
        )  # fmt: skip
    finally:
        client.on_node_end()


@pytest.mark.parametrize("chunk", [0, 2])
def test_an_altered_store_payload_never_reaches_the_owners_buffer(
    data_server, registered, relays, chunk
) -> None:
    _node, address = data_server()
    buf, entry = registered
    before = bytes(buf)
    payload = bytearray(random_bytes(N, 2).tobytes())
    byte = chunk * CHUNK + 1234
    relay = relays(address, up=payload_offset(UP_PAYLOAD, byte))
    with pytest.raises(net.Tampered, match="tag check failed: the data was altered on the way"):
        _request(relay.address, net.STORE, entry, payload)
    assert relay.flipped.is_set()
    # Only verified chunks were copied: none of the altered chunk, none after it; the
    # verified chunks before it have landed (authentic bytes of this very STORE).
    landed = chunk * CHUNK
    assert bytes(buf[:landed]) == bytes(payload[:landed])
    assert bytes(buf[landed:]) == before[landed:]


@pytest.mark.parametrize("chunk", [0, 2, 4])
def test_an_altered_fetch_payload_never_reaches_the_requesters_memory(
    data_server, registered, relays, chunk
) -> None:
    _node, address = data_server()
    buf, entry = registered
    dst = bytearray(b"\xee" * N)
    byte = chunk * CHUNK + 7
    relay = relays(address, down=payload_offset(DOWN_PAYLOAD, byte))
    with pytest.raises(net.Tampered, match="tag check failed: the data was altered on the way"):
        _request(relay.address, net.FETCH, entry, dst)
    assert relay.flipped.is_set()
    landed = chunk * CHUNK
    assert bytes(dst[:landed]) == bytes(buf[:landed])
    assert bytes(dst[landed:]) == b"\xee" * (N - landed)


def test_an_altered_chunk_tag_is_tampering_too(data_server, registered, relays) -> None:
    _node, address = data_server()
    buf, entry = registered
    before = bytes(buf)
    relay = relays(address, up=UP_PAYLOAD + CHUNK + 5)  # inside the first chunk's tag
    with pytest.raises(net.Tampered, match="tag check failed"):
        _request(relay.address, net.STORE, entry, bytearray(N))
    assert bytes(buf) == before


def test_an_unaltered_relay_passes_every_chunk(data_server, registered, relays) -> None:
    _node, address = data_server()
    buf, entry = registered
    relay = relays(address)
    payload = bytearray(random_bytes(N, 3).tobytes())
    _request(relay.address, net.STORE, entry, payload)
    assert bytes(buf) == bytes(payload)
    dst = bytearray(N)
    _request(relay.address, net.FETCH, entry, dst)
    assert dst == payload


def test_with_tls_chunked_payloads_go_both_ways(data_server, registered, pki, settings) -> None:
    settings(**pki)
    _node, address = data_server()
    buf, entry = registered
    payload = bytearray(random_bytes(N, 4).tobytes())
    _request(address, net.STORE, entry, payload)
    assert bytes(buf) == bytes(payload)
    dst = bytearray(N)
    _request(address, net.FETCH, entry, dst)
    assert dst == payload


# -- through the API: a buffer owned on another host ----------------------------------------


@pytest.fixture(scope="module")
def rholder() -> Iterator[ActorMesh[Holder]]:
    with loopback_worker() as hm:
        pm = hm.spawn_procs(per_host={"r": 1})
        mesh = pm.spawn("tamper", Holder)
        mesh.initialized.get(timeout=REPLY_TIMEOUT)
        yield mesh


def _via(buf: RDMABuffer, relays: Callable[..., FlipRelay], **flip: int) -> FlipRelay:
    """Route the transfers to ``buf``'s owner through a new relay (flipping ``flip``)."""
    key = (buf._owner_proc.name, buf._pid)
    client = this_node().part(net.DataClient)  # the client node's data connections
    client.forget(key[0])  # an earlier test's relay, if any
    buf.read_into(bytearray(buf.size())).get(timeout=REPLY_TIMEOUT)  # learns the address
    address = client.known_address(key)
    assert address is not None
    client.forget(key[0])  # no pooled connection bypasses the relay
    relay = relays(address, **flip)
    client.remember_address(key, relay.address)
    return relay


def _tampered(err: BaseException | None) -> RDMATamperedError:
    assert isinstance(err, RDMATamperedError), repr(err)
    assert isinstance(err, RDMAError) and not isinstance(err, RDMAOwnerLostError)
    assert "tag check failed: the data was altered on the way" in str(err)
    return err


def test_an_altered_write_from_fails_with_rdma_tampered_error(rholder, relays) -> None:
    name = uuid.uuid4().hex[:8]
    buf = rholder.make.call_one(name, N, 5).get(timeout=REPLY_TIMEOUT)
    assert buf.backend == "tcp"
    relay = _via(buf, relays, up=payload_offset(UP_PAYLOAD, 99))
    err = _tampered(buf.write_from(random_bytes(N, 6)).exception(timeout=REPLY_TIMEOUT))
    assert "the owner's tag check failed" in str(err)
    assert relay.flipped.is_set()
    got = rholder.contents.call_one(name).get(timeout=REPLY_TIMEOUT)
    assert got == random_bytes(N, 5).tobytes()  # not one byte written


def test_an_altered_read_into_fails_with_rdma_tampered_error(rholder, relays) -> None:
    name = uuid.uuid4().hex[:8]
    buf = rholder.make.call_one(name, N, 7).get(timeout=REPLY_TIMEOUT)
    relay = _via(buf, relays, down=payload_offset(DOWN_PAYLOAD, 3))
    dst = np.zeros(N, np.uint8)
    _tampered(buf.read_into(dst).exception(timeout=REPLY_TIMEOUT))
    assert relay.flipped.is_set()
    assert not dst.any()  # not one byte landed
    # The owner is well: the next transfer (relayed unchanged) succeeds.
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert np.array_equal(dst, random_bytes(N, 7))
