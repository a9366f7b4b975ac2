"""``attach_to_workers`` waits for workers that are still starting, then names the missing."""

from __future__ import annotations

import json

from .conftest import LocalWorker, Scripts, free_port

WAITING_CLIENT = """
    import json, os, sys
    import danaus.config
    from danaus.actor import Actor, attach_to_workers, endpoint

    danaus.config.configure(attach_progress_every=0.0)  # a progress line at every retry

    class Pid(Actor):
        @endpoint
        def pid(self):
            return os.getpid()

    mesh = attach_to_workers(workers=[sys.argv[1]], secret=sys.argv[2])
    procs = mesh.spawn_procs(per_host={"gpus": 1})
    pid = procs.spawn("pid", Pid).pid.call_one().get(timeout=30)
    print(json.dumps({"pid": pid}), flush=True)
    mesh.shutdown().get(timeout=30)
"""


def test_attach_retries_until_a_worker_started_later_listens(
    scripts: Scripts, local_workers: list[LocalWorker], job_secret: str
) -> None:
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    path = scripts.write(WAITING_CLIENT)
    client = scripts.start_path(path, address, job_secret)
    assert client.stderr is not None and client.stdout is not None
    # The progress line proves the client is already retrying: only now start the worker.
    line = client.stderr.readline()
    assert "waiting for 1 worker(s) still starting" in line, line
    assert address in line
    local_workers.append(LocalWorker(port, job_secret))
    assert local_workers[0].line.startswith("danaus worker listening on"), local_workers[0].line
    out = client.stdout.readline()
    assert client.wait(30) == 0, client.stderr.read()
    assert json.loads(out)["pid"] > 0


GIVING_UP_CLIENT = """
    import sys
    import danaus.config
    from danaus.actor import attach_to_workers

    danaus.config.configure(attach_retry_deadline=0.3)
    mesh = attach_to_workers(workers=sys.argv[1:3], secret="s" * 32)
    try:
        mesh.initialized.get(timeout=30)
    except RuntimeError as e:
        print(e, flush=True)
"""


def test_attach_gives_up_after_its_deadline_naming_the_missing_workers(
    scripts: Scripts,
) -> None:
    missing = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    path = scripts.write(GIVING_UP_CLIENT)
    client = scripts.start_path(path, *missing)
    out, err = client.communicate(timeout=30)
    assert client.returncode == 0, err
    assert out.startswith("attach failed: worker tcp://127.0.0.1:"), out
    assert "Connection refused" in out
    assert "still unreachable after 0.3 s of retrying" in out
    assert f"missing: {missing[0]}, {missing[1]}" in out or (
        f"missing: {missing[1]}, {missing[0]}" in out
    )
