"""Who may talk to a worker, and what a worker does with bytes it cannot use.

A TCP peer must prove it knows the job secret before a single frame is read
(see ``danaus._transport.auth``); one that sends garbage, nothing, or a wrong
answer is disconnected, and a client with the wrong secret gets an attach
error that says so. A peer that does authenticate but then sends malformed
frames loses its own connection, nothing more. Throughout, the legitimate
client keeps working.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from danaus._transport.auth import MAGIC, TAG, Handshake, Session, load_secret
from danaus._wire.frame import Frame, FrameDecoder
from danaus._wire.protocol import Kind
from danaus.actor import this_host
from wire_bytes import recv_exactly

from .conftest import TIMEOUT, Probe, client_env, recv_until_closed

CHALLENGE = len(MAGIC) + 32  # what a worker sends first: MAGIC | nonce
HANDSHAKE_TIMEOUT = 5.0  # the server's bound on an unfinished handshake


def _connect(address: str) -> socket.socket:
    host, _, port = address[len("tcp://") :].rpartition(":")
    return socket.create_connection((host, int(port)), timeout=TIMEOUT)


@pytest.fixture
def legit(procs) -> Iterator[object]:
    """Probes on the shared procs; checked to answer before and after each test."""
    probes = procs.spawn("legit", Probe)
    assert len(probes.echo.call(0).get(timeout=TIMEOUT)) == len(procs)
    yield probes
    assert set(probes.echo.call(1).get(timeout=TIMEOUT).values()) == {1}


# -- unauthenticated peers ---------------------------------------------------------


def _answer_garbage(sock: socket.socket, challenge: bytes) -> None:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))


def _answer_nothing(sock: socket.socket, challenge: bytes) -> None:
    pass


def _answer_wrong_hmac(sock: socket.socket, challenge: bytes) -> None:
    sock.sendall(Handshake(b"not the job secret at all", "client").feed(challenge))


@pytest.mark.parametrize(
    "answer, within",
    [
        (_answer_garbage, 2.0),
        (_answer_nothing, HANDSHAKE_TIMEOUT + 2.0),
        (_answer_wrong_hmac, 2.0),
    ],
    ids=["garbage", "nothing", "wrong-hmac"],
)
def test_an_unauthenticated_peer_is_disconnected_without_a_frame(
    workers, legit, answer, within
) -> None:
    with _connect(workers[1].address) as sock:
        challenge = recv_exactly(sock, CHALLENGE)
        assert challenge.startswith(MAGIC)
        during = legit.echo.call("during")  # the legit client is served meanwhile
        answer(sock, challenge)
        rest, took = recv_until_closed(sock, timeout=within)
        assert rest == b"", f"the worker sent {rest!r} to an unauthenticated peer"
        assert took < within
        assert set(during.get(timeout=TIMEOUT).values()) == {"during"}


def test_a_client_with_the_wrong_secret_gets_a_clear_attach_error(workers, legit, tmp_path):
    script = tmp_path / "wrong_secret.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from danaus.actor import attach_to_workers

            hosts = attach_to_workers(workers=[sys.argv[1]], secret="f" * 64)
            try:
                hosts.initialized.get(timeout=20)
            except Exception as e:
                print(f"{type(e).__name__}: {e}")
                sys.exit(3)
            print("attached")
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script), workers[2].address],
        env=client_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert out.stdout.startswith("RuntimeError: attach failed: worker " + workers[2].address)
    assert "job secret" in out.stdout, out.stdout
    assert set(legit.slice(hosts=2).echo.call(2).get(timeout=TIMEOUT).values()) == {2}


# -- authenticated peers sending bad frames ------------------------------------------


def _authenticated(address: str, secret: str) -> tuple[socket.socket, Session]:
    """A TCP connection to ``address`` that has passed the handshake, as a client,
    and its session (every frame after the handshake is sealed with it)."""
    key = load_secret(secret)
    assert key is not None
    hs = Handshake(key, "client")
    sock = _connect(address)
    sock.sendall(hs.feed(recv_exactly(sock, hs.want())))
    assert hs.feed(recv_exactly(sock, hs.want())) == b""
    assert hs.done
    return sock, hs.session()


def _read_frame(sock: socket.socket, session: Session) -> Frame:
    decoder = FrameDecoder(trailer=TAG, check=session.check)
    while True:
        buf = decoder.buffer()
        n = sock.recv_into(buf)
        assert n, "the connection was closed"
        frames = decoder.feed(n)
        if frames:
            return frames[0]


def _frame(total: int, header_len: int, nbufs: int, body_len: int, rest: bytes) -> bytes:
    return struct.pack("<QIIQ", total, header_len, nbufs, body_len) + rest


BAD_FRAMES = {
    # A length prefix far beyond any frame the decoder accepts.
    "absurd-length": struct.pack("<Q", 2**60) + b"\0" * 64,
    # Lengths that do not add up: 8 bytes of header announced, 100 sent.
    "inconsistent-lengths": _frame(16 + 100, 8, 0, 0, b"x" * 100),
    # Lengths that add up, around a header that is not a pickle.
    "undecodable-header": _frame(16 + 12, 12, 0, 0, b"garbage!\xff\xfe\x00\x01"),
    # A buffer table announcing more buffers than allowed.
    "too-many-buffers": _frame(16, 0, 1 << 30, 0, b""),
    # Bytes that are no frame at all.
    "noise": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("payload", list(BAD_FRAMES.values()), ids=list(BAD_FRAMES))
def test_bad_frames_close_only_the_senders_connection(workers, secret, legit, payload) -> None:
    worker = workers[0]
    bystander, session = _authenticated(worker.address, secret)  # another peer of the worker
    sock, mine = _authenticated(worker.address, secret)
    with sock:
        # Sealed, so it is the frame's shape, not its tag, that the worker refuses.
        sock.sendall(payload + mine.seal([payload]))
        rest, _ = recv_until_closed(sock, timeout=5.0)
        assert rest == b""
    # The worker lives on: it still serves the client, and still accepts peers.
    assert worker.proc.poll() is None
    assert set(legit.slice(hosts=0).echo.call(3).get(timeout=TIMEOUT).values()) == {3}
    with bystander:  # still open: the worker's heartbeat reaches it
        assert _read_frame(bystander, session).header == (Kind.PING,)
    _authenticated(worker.address, secret)[0].close()


# -- Unix sockets of local procs ---------------------------------------------------


@pytest.fixture(scope="module")
def local_probe():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    assert pm.initialized.get(timeout=TIMEOUT) is True
    yield pm.spawn("local_probe", Probe)
    pm.stop().get(timeout=TIMEOUT)


@pytest.mark.parametrize("payload", list(BAD_FRAMES.values()), ids=list(BAD_FRAMES))
def test_garbage_on_a_local_procs_unix_socket_closes_only_that_connection(
    local_probe, payload
) -> None:
    facts = local_probe.facts.call_one().get(timeout=TIMEOUT)
    assert facts.unix
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(facts.unix)
        sock.sendall(payload)
        rest, _ = recv_until_closed(sock, timeout=5.0)
        assert rest == b""
    assert local_probe.echo.call_one("still here").get(timeout=TIMEOUT) == "still here"
    assert local_probe.pid.call_one().get(timeout=TIMEOUT) == facts.pid
