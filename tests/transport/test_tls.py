"""Optional TLS between hosts: mutual certificates, with the job secret checked inside."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture
def tls_env(pki: dict[str, str]) -> dict[str, str]:
    """The shared test PKI as the environment variables danaus reads."""
    return {f"DANAUS_{key.upper()}": path for key, path in pki.items()}


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
def test_hosts_talk_over_mutual_tls_when_certificates_are_given(tmp_path, tls_env) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = {**os.environ, **tls_env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=110
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "values [21, 21]" in r.stdout and "tls True" in r.stdout


@pytest.mark.timeout(120)
def test_a_client_without_tls_cannot_attach_to_a_tls_worker(tmp_path, tls_env) -> None:
    env = {
        **os.environ,
        "DANAUS_SECRET": "t" * 32,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://127.0.0.1:0",
         "--tls-cert", tls_env["DANAUS_TLS_CERT"], "--tls-key", tls_env["DANAUS_TLS_KEY"],
         "--tls-ca", tls_env["DANAUS_TLS_CA"]],
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
