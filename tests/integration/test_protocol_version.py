"""Peers that speak another protocol version refuse each other and say so; garbage
from an authenticated peer (an unknown kind, a malformed id) closes only its own
connection; a call to an actor that does not exist is answered, not dropped."""

from __future__ import annotations

import socket

import pytest

from danaus._errors import SupervisionError
from danaus._runtime.messaging.runtime import STATUS_ERROR
from danaus._wire import codec
from danaus._wire.frame import FrameDecoder, encode_frame
from danaus._wire.ids import PortId, ProcId
from danaus._wire.protocol import PROTOCOL_VERSION, Call, Hello, Kind, decode, wire
from danaus.actor import Actor, ProcMesh, context, endpoint

from .conftest import REPLY_TIMEOUT


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x

    @endpoint
    def addr(self) -> str:
        return context().actor_instance.actor_id.addr


def _connect_to(procs: ProcMesh) -> socket.socket:
    mesh = procs.spawn("version_echo", Echo)
    assert mesh.echo.call(1).get(timeout=REPLY_TIMEOUT).values() == [1, 1]
    addr = mesh.addr.call().get(timeout=REPLY_TIMEOUT).values()[0]  # rank 0's proc
    unix = next(e for e in addr.split(";") if e.startswith("unix:"))
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(REPLY_TIMEOUT)
    s.connect(unix.partition(":")[2])
    return s


def _read_until_eof(s: socket.socket) -> list:
    dec, frames = FrameDecoder(), []
    while True:
        buf = dec.buffer()
        n = s.recv_into(buf)
        if n == 0:
            return frames
        frames.extend(dec.feed(n))


@pytest.mark.timeout(60)
def test_a_proc_refuses_a_peer_of_another_version_naming_both_and_serves_on(procs) -> None:
    s = _connect_to(procs)
    with s:
        old = Hello(ProcId("old-peer", "unix:/nonexistent.sock"), PROTOCOL_VERSION - 1, ())
        s.sendall(b"".join(bytes(memoryview(p).cast("B")) for p in encode_frame(wire(old))))
        frames = _read_until_eof(s)  # the proc answers once, then closes
    (refused,) = [decode(f) for f in frames]
    assert refused.kind is Kind.REFUSED
    assert f"version {PROTOCOL_VERSION}" in refused.header.reason
    assert f"version {PROTOCOL_VERSION - 1}" in refused.header.reason
    mesh = procs.spawn("version_echo_after", Echo)
    assert mesh.echo.call(2).get(timeout=REPLY_TIMEOUT).values() == [2, 2]  # the proc lives on


@pytest.mark.timeout(60)
def test_a_frame_of_an_unknown_kind_closes_only_its_connection(procs) -> None:
    s = _connect_to(procs)
    with s:
        hello = Hello(ProcId("bad-peer", "unix:/nonexistent.sock"), PROTOCOL_VERSION, ())
        s.sendall(b"".join(bytes(memoryview(p).cast("B")) for p in encode_frame(wire(hello))))
        s.sendall(b"".join(bytes(memoryview(p).cast("B")) for p in encode_frame((250, "x"))))
        # Welcomed (the proc would send to "bad-peer" on it), then closed with no answer.
        assert [decode(f).kind for f in _read_until_eof(s)] == [Kind.WELCOME]
    mesh = procs.spawn("unknown_kind_after", Echo)
    assert mesh.echo.call(3).get(timeout=REPLY_TIMEOUT).values() == [3, 3]


@pytest.mark.timeout(90)
def test_a_client_of_another_version_is_told_why_it_cannot_spawn(client_script) -> None:
    result = client_script.run(
        """
        import danaus._runtime.messaging.links as links  # the handshake's side
        links.PROTOCOL_VERSION = 99  # as if this client were another danaus release
        from danaus.actor import SupervisionError, this_host
        try:
            this_host().spawn_procs(per_host={"x": 1}).initialized.get(timeout=30)
        except SupervisionError as e:
            print("REFUSED:", e)
        """,
        timeout=80,
    )
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("REFUSED:"))
    assert "speaks danaus protocol version 99" in line
    assert f"speaks version {PROTOCOL_VERSION}" in line
    assert "run the same danaus release on every host" in line


def _frame_bytes(raw: tuple) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in encode_frame(raw))


@pytest.mark.timeout(60)
def test_a_header_with_a_malformed_id_closes_only_its_connection(procs) -> None:
    s = _connect_to(procs)
    with s:
        hello = Hello(ProcId("bad-id-peer", "unix:/nonexistent.sock"), PROTOCOL_VERSION, ())
        s.sendall(_frame_bytes(wire(hello)))
        call = wire(Call("version_echo", 0, "echo", None, 0, (), (), None, (), 0))
        s.sendall(_frame_bytes((*call[:4], ("not", "a", "port"), *call[5:])))
        assert [decode(f).kind for f in _read_until_eof(s)] == [Kind.WELCOME]
    mesh = procs.spawn("malformed_id_after", Echo)
    assert mesh.echo.call(4).get(timeout=REPLY_TIMEOUT).values() == [4, 4]


@pytest.mark.timeout(60)
def test_a_call_to_an_actor_that_does_not_exist_is_answered_undeliverable(procs) -> None:
    s = _connect_to(procs)
    with s:
        me = ProcId("no-actor-peer", "unix:/nonexistent.sock")
        s.sendall(_frame_bytes(wire(Hello(me, PROTOCOL_VERSION, ()))))
        body, _ = codec.dumps(((1,), {}))
        call = Call("no_such_mesh", 0, "echo", PortId(me, 7), 3, (), (), None, (), 0)
        s.sendall(b"".join(bytes(memoryview(p).cast("B")) for p in encode_frame(wire(call), body)))
        dec, msgs = FrameDecoder(), []
        while not any(m.kind is Kind.REPLY for m in msgs):  # after early_call_hold
            buf = dec.buffer()
            n = s.recv_into(buf)
            assert n, "the proc closed the connection without answering"
            msgs.extend(decode(f) for f in dec.feed(n))
    (reply,) = [m for m in msgs if m.kind is Kind.REPLY]
    assert (reply.header.port, reply.header.slot, reply.header.status) == (7, 3, STATUS_ERROR)
    err = codec.loads(reply.body, reply.buffers)
    assert isinstance(err, SupervisionError)
    assert "no actor no_such_mesh[0]" in str(err)
