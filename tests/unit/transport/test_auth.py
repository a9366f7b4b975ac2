"""Who may talk to a proc, in this process: the handshake, each frame's tag, the secret
and the private socket directory (the worker's refusal is in tests/transport/test_security.py)."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat

import pytest

import danaus.config
from danaus._transport.address import make_job_dir
from danaus._transport.auth import TAG, AuthError, Handshake, Session, load_secret, new_secret

SECRET = b"s" * 32


def _run(client: Handshake, server: Handshake) -> None:
    """Drive both ends of a handshake to completion (or an AuthError)."""
    to_client = server.start()
    to_server = client.feed(to_client)
    to_client = server.feed(to_server)
    client.feed(to_client)


def test_a_handshake_with_the_same_secret_authenticates_both_ends() -> None:
    client, server = Handshake(SECRET, "client"), Handshake(SECRET, "server")
    _run(client, server)
    assert client.done and server.done


def test_a_client_without_the_secret_is_refused_by_the_server() -> None:
    client, server = Handshake(b"x" * 32, "client"), Handshake(SECRET, "server")
    with pytest.raises(AuthError, match="does not know the job secret"):
        _run(client, server)
    assert not server.done


def test_a_server_without_the_secret_is_refused_by_the_client() -> None:
    client, impostor = Handshake(SECRET, "client"), Handshake(b"y" * 32, "server")
    to_server = client.feed(impostor.start())
    # The impostor cannot check the client's answer; it confirms with its own secret.
    client_nonce = to_server[32:]
    forged = hmac.new(b"y" * 32, b"s" + client_nonce, hashlib.sha256).digest()
    with pytest.raises(AuthError, match="does not know the job secret"):
        client.feed(forged)
    assert not client.done


def test_a_peer_that_is_not_danaus_is_refused_by_its_magic() -> None:
    with pytest.raises(AuthError, match="magic"):
        Handshake(SECRET, "client").feed(b"HTTP" + b"\0" * 32)


def test_a_short_secret_is_refused_with_advice() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        load_secret("short")


def test_job_directories_are_private_to_the_user(tmp_path) -> None:
    base = tmp_path / "sockets"
    with danaus.config.configured(socket_dir=str(base)):
        d = make_job_dir()
    for path in (base, d):
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode == 0o700, oct(mode)


def test_a_socket_directory_others_can_open_is_refused(tmp_path) -> None:
    base = tmp_path / "open"
    base.mkdir(mode=0o777)
    os.chmod(base, 0o777)
    with danaus.config.configured(socket_dir=str(base)), pytest.raises(RuntimeError, match="0700"):
        make_job_dir()


def test_both_ends_derive_the_same_keys_and_each_handshake_new_ones() -> None:
    def pair() -> tuple[Session, Session]:
        client, server = Handshake(SECRET, "client"), Handshake(SECRET, "server")
        _run(client, server)
        return client.session(), server.session()

    client, server = pair()
    parts = [b"header", memoryview(b"body")]
    for _ in range(3):  # each direction keeps its own sequence
        tag = client.seal(parts)
        assert len(tag) == TAG
        server.check(b"header", memoryview(b"body"), memoryview(tag))
        reply = server.seal([b"ok"])
        client.check(b"ok", memoryview(b""), memoryview(reply))
    other_client, _ = pair()
    # a tag sealed for another connection's keys is refused
    with pytest.raises(AuthError, match="failed its authentication check"):
        server.check(b"header", memoryview(b"body"), memoryview(other_client.seal(parts)))


def test_a_replayed_reordered_or_altered_frame_is_refused() -> None:
    client, server = Handshake(SECRET, "client"), Handshake(SECRET, "server")
    _run(client, server)
    send, recv = client.session(), server.session()
    first, second = send.seal([b"a"]), send.seal([b"b"])
    with pytest.raises(AuthError, match="frame 0 failed"):  # the second before the first
        recv.check(b"b", memoryview(b""), memoryview(second))
    recv.check(b"a", memoryview(b""), memoryview(first))
    with pytest.raises(AuthError, match="frame 1 failed"):  # the first again
        recv.check(b"a", memoryview(b""), memoryview(first))
    with pytest.raises(AuthError):  # one byte changed
        recv.check(b"c", memoryview(b""), memoryview(second))
    recv.check(b"b", memoryview(b""), memoryview(second))
    third = send.seal([b"dropped"])
    fourth = send.seal([b"d"])
    recv.skip_recv()  # a frame discarded unread still counts
    recv.check(b"d", memoryview(b""), memoryview(fourth))
    assert third != fourth


def test_a_handshake_step_of_the_wrong_size_or_a_session_too_early_is_refused() -> None:
    server = Handshake(SECRET, "server")
    assert server.start()[:4] == b"DNS1" and server.want() == 64
    with pytest.raises(AuthError, match="handshake step of 3 bytes, expected 64"):
        server.feed(b"abc")
    with pytest.raises(RuntimeError, match="the handshake is not done"):
        server.session()
    assert Handshake(SECRET, "client").start() == b""  # the server speaks first


def test_the_secret_comes_from_the_argument_the_file_or_the_environment(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DANAUS_SECRET", "e" * 20)
    assert load_secret() == b"e" * 20
    assert load_secret("a" * 16) == b"a" * 16
    path = tmp_path / "secret"
    path.write_text("f" * 24 + "\n")
    path.chmod(0o600)
    assert load_secret(secret_file=str(path)) == b"f" * 24  # stripped
    path.chmod(0o644)  # others may read it: refused
    with pytest.raises(ValueError, match="the secret file"):
        load_secret(secret_file=str(path))
    monkeypatch.delenv("DANAUS_SECRET")
    assert load_secret() is None
    assert len(bytes.fromhex(new_secret())) == 32 and new_secret() != new_secret()
