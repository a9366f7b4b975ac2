"""The worker's refusal to listen beyond loopback without a secret (a ``danaus worker``
process each); the handshake and the socket directory are unit tests
(tests/unit/transport/test_auth.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


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
