"""A connection is bound to its handshake: nothing but the two ends' own frames gets through.

An attacker on the path relays a real handshake between a client and a server
(both are satisfied: the attacker never needs the secret), then tries to slip
frames of its own into the server: a forged one, a replay of the client's, a
reflection of the server's own, or one spliced in from another connection.
Every one of them must close the connection before anything is unpickled.
"""

from __future__ import annotations

import os
import pickle
import queue

import pytest

from danaus._transport.auth import Handshake
from danaus._wire.frame import encode_frame

from .conftest import KIND, SECRET, TIMEOUT, note, ping

pytestmark = pytest.mark.timeout(60)


class _Boom:
    """A pickle that would create ``path`` when unpickled (stands in for any code)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.mkdir, (self.path,))


def _relayed(nodes, relay):
    """A server, a client, and a relayed, authenticated connection carrying one frame."""
    server = nodes("srv")
    client = nodes("cli")
    r = relay(server.port)
    via = type(server.tcp)(server.rt.proc_id.name, f"tcp://127.0.0.1:{r.port}")
    client.rt.send(via, note("legit"))
    assert server.got.get(timeout=TIMEOUT) == (KIND, "legit")
    link = r.links.get(timeout=TIMEOUT)
    return server, client, via, link


def _assert_refused(server, link, tmp_path) -> None:
    link.server_closed.wait(TIMEOUT)
    assert link.server_closed.is_set(), "the server kept the spliced connection open"
    assert not (tmp_path / "pwned").exists(), "an injected pickle ran"
    with pytest.raises(queue.Empty):
        server.got.get_nowait()


def test_a_forged_frame_after_a_relayed_handshake_is_refused(nodes, relay, tmp_path) -> None:
    server, _client, _via, link = _relayed(nodes, relay)
    link.inject(b"".join(map(bytes, encode_frame((KIND, _Boom(str(tmp_path / "pwned")))))))
    _assert_refused(server, link, tmp_path)


def test_a_well_formed_frame_with_a_forged_tag_is_refused(nodes, relay, tmp_path) -> None:
    # A header the restricted unpickler accepts: only the tag stands in the way.
    server, _client, _via, link = _relayed(nodes, relay)
    link.inject(b"".join(map(bytes, encode_frame((KIND, "forged")))) + os.urandom(32))
    _assert_refused(server, link, tmp_path)


def test_a_replayed_frame_is_refused(nodes, relay, tmp_path) -> None:
    server, _client, _via, link = _relayed(nodes, relay)
    frames = []
    while not frames or b"legit" not in frames[-1]:
        frames.append(link.to_server.get(timeout=TIMEOUT))
    link.inject(frames[-1])  # the client's own, authentic frame, a second time
    _assert_refused(server, link, tmp_path)


def test_a_frame_reflected_back_to_its_sender_is_refused(nodes, relay, tmp_path) -> None:
    server, client, via, link = _relayed(nodes, relay)
    client.rt.send(via, ping("ping"))  # the server answers on this connection
    assert client.got.get(timeout=TIMEOUT) == (KIND, "echo ping")
    answer = link.to_client.get(timeout=TIMEOUT)
    while b"echo" not in answer:
        answer = link.to_client.get(timeout=TIMEOUT)
    link.inject(answer)  # the server's own frame, sealed by the server, sent back to it
    _assert_refused(server, link, tmp_path)


def test_a_frame_spliced_in_from_another_connection_is_refused(nodes, relay, tmp_path) -> None:
    server, _client, _via, link = _relayed(nodes, relay)
    other = nodes("other")
    r2 = relay(server.port)
    other.rt.send(type(server.tcp)(server.rt.proc_id.name, f"tcp://127.0.0.1:{r2.port}"),
                  note("from-other"))  # fmt: skip
    assert server.got.get(timeout=TIMEOUT) == (KIND, "from-other")
    link2 = r2.links.get(timeout=TIMEOUT)
    frames = []
    while not frames or b"from-other" not in frames[-1]:
        frames.append(link2.to_server.get(timeout=TIMEOUT))
    # Frame 1 of the other connection, sealed for the same server with the same secret,
    # arrives where frame 1 is expected, yet under another handshake's key.
    link.inject(frames[-1])
    _assert_refused(server, link, tmp_path)


def test_the_session_keys_differ_per_direction_and_per_handshake() -> None:
    c, s = Handshake(SECRET, "client"), Handshake(SECRET, "server")
    c.feed(s.feed(c.feed(s.start())))
    cs, ss = c.session(), s.session()
    tag = cs.seal([b"frame"])
    ss.check(b"", b"frame", tag)  # the server accepts the client's frame
    with pytest.raises(Exception, match="authentication"):
        cs.check(b"", b"frame", tag)  # the client refuses its own frame reflected back
    c2, s2 = Handshake(SECRET, "client"), Handshake(SECRET, "server")
    c2.feed(s2.feed(c2.feed(s2.start())))
    with pytest.raises(Exception, match="authentication"):
        s2.session().check(b"", b"frame", tag)  # another connection's server refuses it


def test_an_unauthenticated_pickle_never_runs_on_a_tcp_listener(nodes, tmp_path) -> None:
    import socket

    server = nodes("srv")
    bomb = b"".join(map(bytes, encode_frame((KIND, _Boom(str(tmp_path / "pwned"))))))
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as s:
        s.sendall(bomb + pickle.dumps(_Boom(str(tmp_path / "pwned"))))
        from .conftest import wait_closed

        wait_closed(s)
    assert not (tmp_path / "pwned").exists()
