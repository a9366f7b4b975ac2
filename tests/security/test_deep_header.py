"""Issue 40, N6: a header nested too deeply closes its own connection, with a log line,
and nothing else.

An authenticated peer (it knows the secret) sends a well-sealed frame whose header
nests thousands of tuples: before, decoding it raised ``RecursionError``, which
nothing caught, and the connection stayed open. Now the frame is refused where
decoding starts (``MAX_HEADER_DEPTH``): the connection closes, the reason is
logged, and the runtime serves its other connections as before.
"""

from __future__ import annotations

import logging
import pickle
import socket

import pytest

from danaus._transport.auth import Handshake
from danaus._wire.frame import MAX_HEADER_DEPTH, _depth_problem, encode_pickled
from danaus._wire.protocol import Call, Kind, Refused
from wire_bytes import recv_exactly

from .conftest import KIND, SECRET, TIMEOUT, note, wait_closed

pytestmark = pytest.mark.timeout(60)

DEPTH = 20_000  # far beyond the interpreter's recursion limit


def _nested(depth: int) -> bytes:
    """A pickle fragment pushing ``depth`` tuples, each inside the next (too deep for
    ``pickle.dumps`` to write: it recurses)."""
    return b")" + b"\x85" * (depth - 1)


def _header_pickle(kind: Kind, fields: list[bytes]) -> bytes:
    """The pickle of the wire tuple ``(kind, *fields)``, each field a pickle fragment."""
    return b"\x80\x05(K" + bytes([int(kind)]) + b"".join(fields) + b"t."


def _deep_call() -> bytes:
    """A CALL header whose reply port nests ``DEPTH`` tuples (the old decoder's error
    message took its ``repr``: ``RecursionError``)."""
    fields = [b"N"] * len(Call._fields)
    fields[Call._fields.index("port")] = _nested(DEPTH)
    return _header_pickle(Kind.CALL, fields)


def _deep_refused() -> bytes:
    """A REFUSED header whose reason nests ``DEPTH`` tuples (decodes as a string field)."""
    return _header_pickle(Kind.REFUSED, [_nested(DEPTH)] * len(Refused._fields))


def _authenticated(port: int) -> tuple[socket.socket, object]:
    hs = Handshake(SECRET, "client")
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(hs.feed(recv_exactly(sock, hs.want())))
    assert hs.feed(recv_exactly(sock, hs.want())) == b""
    return sock, hs.session()


@pytest.mark.parametrize("header", [_deep_call(), _deep_refused()], ids=["call", "refused"])
def test_a_deeply_nested_header_closes_only_its_connection_with_a_log_line(
    nodes, caplog, header
) -> None:
    server = nodes("srv")
    client = nodes("cli")
    client.rt.send(server.tcp, note("before"))  # another peer, connected before
    assert server.got.get(timeout=TIMEOUT) == (KIND, "before")
    sock, session = _authenticated(server.port)
    with caplog.at_level(logging.INFO, logger="danaus"), sock:
        parts = encode_pickled(header)
        sock.sendall(b"".join(parts) + session.seal(parts))  # type: ignore[attr-defined]
        wait_closed(sock)  # the server closed it (the old code kept it open: timeout)
        text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"deeper than {MAX_HEADER_DEPTH} levels" in text, text
    # Everything else goes on: the other peer's connection, and new ones.
    client.rt.send(server.tcp, note("after"))
    assert server.got.get(timeout=TIMEOUT) == (KIND, "after")
    other, session = _authenticated(server.port)
    with other:
        parts = encode_pickled(pickle.dumps((KIND, "fresh"), protocol=5))
        other.sendall(b"".join(parts) + session.seal(parts))  # type: ignore[attr-defined]
        assert server.got.get(timeout=TIMEOUT) == (KIND, "fresh")


def test_the_depth_check_takes_shared_and_wide_headers_and_refuses_loops() -> None:
    # 31 levels, each holding the level below twice: 2**31 paths, walked once per node.
    shared: tuple[object, ...] = ("leaf",)
    for _ in range(MAX_HEADER_DEPTH - 1):
        shared = (shared, shared)
    assert _depth_problem(shared, MAX_HEADER_DEPTH) == ""
    assert "deeper than" in _depth_problem((shared,) * 2 + ((shared,),), MAX_HEADER_DEPTH)
    wide = tuple((i, [i], {"k": (i,)}) for i in range(1000))
    assert _depth_problem(wide, MAX_HEADER_DEPTH) == ""
    loop: list[object] = []
    loop.append([loop])
    assert _depth_problem((1, loop), MAX_HEADER_DEPTH) == "a container holds itself"
