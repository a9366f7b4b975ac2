"""In-process connections (``_transport.inproc``): the network's names, per-connection
FIFO with real frame encoding, and an EOF that comes after every frame sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danaus._errors import ConnectionClosedError, PeerBrokenError
from danaus._transport import address
from danaus._transport.inproc import InprocConnection, Network
from danaus._wire.frame import Frame, encode_frame


class End:
    """One runtime's view of a connection: the frames and the close it saw."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.closed: list[BaseException | None] = []
        self.conn: InprocConnection | None = None

    def on_frame(self, conn: InprocConnection, frame: Frame) -> None:
        self.frames.append(frame)

    def on_close(self, conn: InprocConnection, exc: BaseException | None) -> None:
        self.closed.append(exc)

    def accept(self, conn: InprocConnection) -> None:
        self.conn = conn
        conn.bind(self.on_frame, self.on_close)


async def _settle() -> None:
    """Let every hand-over queued on this loop run (they are ``call_soon``-ed)."""
    for _ in range(5):
        await asyncio.sleep(0)


def _pair(net: Network, name: str = "p") -> tuple[End, End, Any]:
    loop = asyncio.get_running_loop()
    server, client = End(), End()
    net.listen(name, loop, server.accept)
    client.conn = net.connect(name, loop, client.on_frame, client.on_close)
    return server, client, loop


def test_frames_arrive_decoded_in_the_order_sent_both_ways() -> None:
    async def main() -> None:
        net = Network()
        server, client, _ = _pair(net)
        assert client.conn is not None
        for i in range(50):
            client.conn.send(encode_frame(("call", i), f"body{i}".encode(), [b"buf" * i]))
        await _settle()
        assert server.conn is not None and server.conn.authenticated
        assert [f.header for f in server.frames] == [("call", i) for i in range(50)]
        assert bytes(server.frames[7].body) == b"body7"
        assert [bytes(b) for b in server.frames[7].buffers] == [b"buf" * 7]
        server.conn.send_message(("reply", 1), bytearray(b"r"), [bytearray(b"xy")])
        await _settle()
        assert [(f.header, bytes(f.body)) for f in client.frames] == [(("reply", 1), b"r")]
        assert (client.conn.frames_sent, server.conn.frames_recv) == (50, 50)

    asyncio.run(main())


def test_a_sent_frame_is_a_copy_the_sender_may_reuse_its_buffers_at_once() -> None:
    async def main() -> None:
        net = Network()
        server, client, _ = _pair(net)
        assert client.conn is not None
        buf = bytearray(b"before")
        left: list[bool] = []
        client.conn.send(encode_frame(("x",), b"", [buf]), on_left=lambda: left.append(True))
        assert left == [True]  # told at once that its parts are no longer needed
        buf[:] = b"AFTER!"
        client.conn.send_message(("y",), b"", [buf])
        buf[:] = b"later!"
        await _settle()
        assert [bytes(f.buffers[0]) for f in server.frames] == [b"before", b"AFTER!"]

    asyncio.run(main())


def test_closing_one_end_shows_the_other_eof_after_every_frame_already_sent() -> None:
    async def main() -> None:
        net = Network()
        server, client, _ = _pair(net)
        assert client.conn is not None
        client.conn.send(encode_frame(("last",), b""))
        client.conn.close()
        assert client.closed == [None]  # closed by us: no error
        with pytest.raises(ConnectionClosedError):
            client.conn.send(encode_frame(("too late",), b""))
        await _settle()
        assert [f.header for f in server.frames] == [("last",)]
        (exc,) = server.closed
        assert isinstance(exc, PeerBrokenError) and "EOF" in str(exc)
        assert server.conn is not None and server.conn.closed
        server.conn.close()  # closing twice tells nobody twice
        assert len(server.closed) == 1 and client.closed == [None]

    asyncio.run(main())


def test_a_name_is_listened_on_once_and_nothing_listens_after_unlisten_or_close() -> None:
    async def main() -> None:
        net = Network()
        loop = asyncio.get_running_loop()
        net.listen("a", loop, End().accept)
        with pytest.raises(OSError, match="'a' is in use"):
            net.listen("a", loop, End().accept)
        assert net.is_listening("a") and not net.is_listening("b")
        with pytest.raises(ConnectionRefusedError, match="nothing listens on inproc:b"):
            net.connect("b", loop, End().on_frame, End().on_close)
        net.unlisten("a")
        with pytest.raises(ConnectionRefusedError):
            net.connect("a", loop, End().on_frame, End().on_close)
        net.close()
        with pytest.raises(OSError, match="its runtime has closed"):
            net.listen("c", loop, End().accept)

    asyncio.run(main())


def test_an_address_picks_this_processes_network_first_then_unix_on_its_host_else_tcp() -> None:
    async def main() -> None:
        net = Network()
        net.listen("p1", asyncio.get_running_loop(), End().accept)
        addr = address.join("inproc:p1", "host:h1", "unix:/run/p1.sock", "tcp://10.0.0.1:7000")
        assert address.choose(addr, "h1", net) == "inproc:p1"
        assert address.choose(addr, "h1", Network()) == "unix:/run/p1.sock"  # not ours
        assert address.choose(addr, "h2", None) == "tcp://10.0.0.1:7000"
        assert address.choose("unix:/s", "h2") == "unix:/s"  # no host given: local
        assert address.choose("host:h1;via:tcp://gw:1", "h2") == "via:tcp://gw:1"
        with pytest.raises(ValueError, match="no usable entry"):
            address.choose("host:h1", "h1")

    asyncio.run(main())


@pytest.mark.parametrize(
    ("entry", "parsed"),
    [
        ("tcp://127.0.0.1:80", ("tcp", "127.0.0.1:80")),
        ("unix:/tmp/x", ("unix", "/tmp/x")),
        ("inproc:n", ("inproc", "n")),
    ],
)
def test_address_entries_parse_by_scheme(entry: str, parsed: tuple[str, str]) -> None:
    assert address.parse(entry) == parsed


def test_malformed_addresses_are_refused_saying_what_is_expected() -> None:
    with pytest.raises(ValueError, match="expected 'unix:/path/to/socket' or 'tcp://HOST:PORT'"):
        address.parse("http://x")
    assert address.split_tcp("[::1]:8080") == ("::1", 8080)
    assert address.split_tcp("host:1") == ("host", 1)
    for bad in ("host", ":80", "host:port"):
        with pytest.raises(ValueError, match="malformed TCP address"):
            address.split_tcp(bad)
    assert address.join("a", "", "b") == "a;b"
