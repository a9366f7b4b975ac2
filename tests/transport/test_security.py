"""Who may talk to a proc: the private socket directory, the handshake, the worker's refusal."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import subprocess
import sys

import pytest

import danaus.config
from danaus._transport.address import make_job_dir
from danaus._transport.auth import AuthError, Handshake, load_secret

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


@pytest.mark.timeout(60)
def test_a_worker_without_a_secret_refuses_a_non_loopback_address_and_says_why() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DANAUS_SECRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run(
        [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://0.0.0.0:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert r.returncode == 2
    assert "without a job secret" in r.stderr and "--insecure" in r.stderr


@pytest.mark.timeout(60)
def test_an_insecure_worker_listens_when_told_to() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DANAUS_SECRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    p = subprocess.Popen(
        [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://0.0.0.0:0", "--insecure"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        # On every interface, and it says so (not a loopback address others cannot use).
        assert p.stdout.readline().startswith("danaus worker listening on tcp://0.0.0.0:")
    finally:
        p.kill()
        p.wait(timeout=30)
        if p.stdout is not None:
            p.stdout.close()
