"""The job secret: required for any TCP listener, never in a frame, kept from user code."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from danaus._actor.api.joining import _advertise_for
from danaus._runtime.hosting.proc import _safe_path_entry
from danaus._runtime.messaging.runtime import Runtime
from danaus._transport.address import make_job_dir
from danaus._transport.auth import load_secret
from danaus.testing import ClientScript, client_env

from .conftest import SECRET

pytestmark = pytest.mark.timeout(60)


def _without_secret() -> dict[str, str]:
    env = client_env()
    env.pop("DANAUS_SECRET", None)
    env.pop("DANAUS_INSECURE", None)
    return env


def test_a_runtime_without_a_secret_refuses_to_listen_on_tcp() -> None:
    rt = Runtime("nosecret", make_job_dir())
    with pytest.raises(RuntimeError, match=r"without a job secret.*DANAUS_SECRET"):
        rt.listen_tcp("127.0.0.1", "127.0.0.1")
    rt.loop.close()
    os.rmdir(rt.job_dir)


def test_attaching_without_a_secret_is_refused_and_says_how_to_set_one(tmp_path) -> None:
    script = ClientScript(tmp_path).write(
        """
        from danaus.actor import attach_to_workers
        try:
            attach_to_workers(workers=["tcp://127.0.0.1:9"])
        except RuntimeError as e:
            print("refused:", e)
        else:
            print("attached")
        """
    )
    out = subprocess.run(
        [sys.executable, str(script)], env=_without_secret(), capture_output=True, text=True,
        timeout=50,
    )  # fmt: skip
    assert out.stdout.startswith("refused:"), (out.stdout, out.stderr)
    assert "DANAUS_SECRET" in out.stdout and "secret=" in out.stdout


def test_the_clients_listener_binds_to_the_address_workers_reach_not_every_interface() -> None:
    bind, advertise, _port = _advertise_for(("127.0.0.1", 9))
    assert bind == advertise == "127.0.0.1"


@pytest.mark.parametrize("listen", ["tcp://127.0.0.1:0", "tcp://0.0.0.0:0"])
def test_a_worker_without_a_secret_refuses_to_start_even_on_loopback(listen: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "danaus", "worker", "--listen", listen],
        env=_without_secret(), capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "without a job secret" in r.stderr and "--insecure" in r.stderr


def test_an_insecure_worker_warns_that_anyone_can_run_code() -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://127.0.0.1:0", "--insecure"],
        env=_without_secret(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert p.stderr is not None and p.stdout is not None
        assert "WARNING" in p.stderr.readline()
        assert p.stdout.readline().startswith("danaus worker listening on tcp://127.0.0.1:")
    finally:
        p.kill()
        p.wait(timeout=30)
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


# -- the secret file --------------------------------------------------------------


def test_a_secret_file_others_can_read_is_refused_with_the_fix(tmp_path) -> None:
    f = tmp_path / "secret"
    f.write_bytes(SECRET)
    f.chmod(0o644)
    with pytest.raises(ValueError, match=r"readable or writable by others.*chmod 600"):
        load_secret(secret_file=str(f))
    f.chmod(0o600)
    assert load_secret(secret_file=str(f)) == SECRET


def test_a_secret_file_owned_by_someone_else_is_refused(tmp_path) -> None:
    if os.getuid() != 0:
        pytest.skip("only root can give a file away")
    f = tmp_path / "secret"
    f.write_bytes(SECRET)
    f.chmod(0o600)
    os.chown(f, 65534, 65534)
    with pytest.raises(ValueError, match="belongs to uid 65534"):
        load_secret(secret_file=str(f))


# -- never in a frame, never in user code's environment --------------------------------


def test_the_secret_is_in_no_frame_a_spawn_sends_and_not_in_the_procs_environment(
    tmp_path,
) -> None:
    # A client with a secret spawns a proc on its host: the SPAWN_PROCS frame to the
    # agent is captured and scanned, and the proc's user code looks for the secret.
    script = ClientScript(tmp_path).write(
        f"""
        import os
        from danaus._runtime.node import this_node
        from danaus._wire.frame import encode_frame
        from danaus._wire.protocol import SpawnProcs, wire
        from danaus.actor import Actor, endpoint, this_host

        class Peek(Actor):
            @endpoint
            def env(self):
                return os.environ.get("DANAUS_SECRET")

        rt = this_node().runtime
        rt.set_secret({SECRET!r})
        sent = []
        plain = rt.send

        def spy(proc, header, body=b"", buffers=(), on_fail=None, **kw):
            raw = encode_frame(wire(header), body, buffers)
            sent.append((type(header), b"".join(map(bytes, raw))))
            return plain(proc, header, body, buffers, on_fail, **kw)

        rt.send = spy
        procs = this_host().spawn_procs(per_host={{"gpus": 1}})
        print("env", procs.spawn("peek", Peek).env.call_one().get(timeout=30))
        rt.send = plain
        print("spawn frames", any(kind is SpawnProcs for kind, _ in sent))
        for needle in ({SECRET!r}, {SECRET.hex()!r}.encode()):
            print("in frames", any(needle in f for _, f in sent))
        procs.stop().get(timeout=30)
        """
    )
    env = client_env()
    env["DANAUS_SECRET"] = SECRET.decode()
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=50
    )
    assert out.returncode == 0, out.stderr
    assert "env None" in out.stdout and "spawn frames True" in out.stdout, out.stdout
    assert out.stdout.count("in frames False") == 2, out.stdout


def test_sys_path_entries_from_another_host_are_used_only_if_safe_here(tmp_path) -> None:
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert _safe_path_entry(str(safe))
    assert not _safe_path_entry(str(shared))  # anyone could plant a module there
    assert not _safe_path_entry(str(tmp_path / "missing"))
    assert stat.S_IMODE(shared.stat().st_mode) == 0o777


def test_the_insecure_opt_out_works_end_to_end_when_both_sides_ask_for_it(tmp_path) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://127.0.0.1:0", "--insecure"],
        env=_without_secret(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        address = worker.stdout.readline().split()[-1]
        script = ClientScript(tmp_path).write(
            """
            import sys
            from danaus.actor import Actor, attach_to_workers, endpoint

            class Echo(Actor):
                @endpoint
                def echo(self, x):
                    return x

            hosts = attach_to_workers(workers=[sys.argv[1]])
            procs = hosts.spawn_procs(per_host={"gpus": 1})
            print("echo", procs.spawn("echo", Echo).echo.call_one(5).get(timeout=30))
            hosts.shutdown().get(timeout=30)
            """
        )
        env = _without_secret()
        env["DANAUS_INSECURE"] = "1"
        out = subprocess.run(
            [sys.executable, str(script), address], env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert "echo 5" in out.stdout, (out.stdout, out.stderr[-3000:])
    finally:
        worker.kill()
        worker.wait(timeout=30)
        for stream in (worker.stdout, worker.stderr):
            if stream is not None:
                stream.close()
