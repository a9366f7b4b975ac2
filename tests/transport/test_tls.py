"""Optional TLS between hosts: mutual certificates, with the job secret checked inside."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl tool")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A throwaway CA and one certificate it signed (PEM files)."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "1", "-subj", "/CN=danaus-test-ca", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key",
             "-out", "node.csr", "-subj", "/CN=node", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "node.pem", "-days", "1", cwd=d)  # fmt: skip
    return {
        "DANAUS_TLS_CERT": str(d / "node.pem"),
        "DANAUS_TLS_KEY": str(d / "node.key"),
        "DANAUS_TLS_CA": str(d / "ca.pem"),
    }


CLIENT = textwrap.dedent(
    """
    import os, ssl
    from danaus.actor import Actor, endpoint
    from danaus.job import ProcessJob
    from danaus._transport import tls

    class Echo(Actor):
        @endpoint
        def echo(self, x):
            return x

    job = ProcessJob({"hosts": 2})
    try:
        procs = job.state().hosts.spawn_procs(per_host={"gpus": 1})
        mesh = procs.spawn("echo", Echo)
        print("values", mesh.echo.call(21).get(timeout=60).values())
        print("tls", tls.client_context() is not None)
    finally:
        job.kill()
    """
)


@pytest.mark.timeout(120)
def test_hosts_talk_over_mutual_tls_when_certificates_are_given(tmp_path, pki) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = {**os.environ, **pki, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=110
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "values [21, 21]" in r.stdout and "tls True" in r.stdout


@pytest.mark.timeout(120)
def test_a_client_without_tls_cannot_attach_to_a_tls_worker(tmp_path, pki) -> None:
    env = {
        **os.environ,
        "DANAUS_SECRET": "t" * 32,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://127.0.0.1:0",
         "--tls-cert", pki["DANAUS_TLS_CERT"], "--tls-key", pki["DANAUS_TLS_KEY"],
         "--tls-ca", pki["DANAUS_TLS_CA"]],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        addr = worker.stdout.readline().split()[-1]
        script = tmp_path / "plain.py"
        script.write_text(
            "from danaus.actor import attach_to_workers\n"
            f"h = attach_to_workers(workers=[{addr!r}])\n"
            "try:\n"
            "    h.initialized.get(timeout=30)\n"
            "    print('attached')\n"
            "except Exception as e:\n"
            "    print('refused', type(e).__name__)\n"
        )
        r = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=100
        )
        assert "refused" in r.stdout and "attached" not in r.stdout, r.stdout + r.stderr[-2000:]
    finally:
        worker.kill()
        worker.wait(timeout=30)
        if worker.stdout is not None:
            worker.stdout.close()
