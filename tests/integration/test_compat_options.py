"""Monarch's options that danaus implements or refuses by name, on procs and in client
processes: ``@endpoint(propagate=, instrument=)``, ``attach_to_workers(name=)``,
``enable_transport("ipc")`` and the deprecated ``proc_mesh`` functions. What is checked
where the option is given: ``tests/unit/actor/test_compat_options.py``."""

from __future__ import annotations

import json

import pytest

from danaus.actor import (
    Actor,
    ProcMesh,
    endpoint,
    local_proc_mesh,
    proc_mesh,
    sim_proc_mesh,
)

from .conftest import REPLY_TIMEOUT


def _fake_outputs(x: object) -> object:
    return x


class Options(Actor):
    @endpoint(propagate="inspect", instrument=False)
    def inspected(self, x: int) -> int:
        return x + 1

    @endpoint(propagate=_fake_outputs)
    def mocked(self, x: int) -> int:
        return x * 2


def test_endpoints_with_propagate_and_instrument_are_called_as_usual(procs: ProcMesh) -> None:
    mesh = procs.spawn("options", Options)
    assert list(mesh.inspected.call(1).get(timeout=REPLY_TIMEOUT).values()) == [2, 2]
    assert mesh.slice(gpus=1).mocked.call_one(4).get(timeout=REPLY_TIMEOUT) == 8
    mesh.stop().get(timeout=REPLY_TIMEOUT)


ATTACH_NAMED = """
import json
import os
import danaus.config
from danaus.actor import attach_to_workers

os.environ["DANAUS_SECRET"] = "s" * 32  # attaching needs the job's secret
danaus.config.configure(attach_retry_deadline=0.2)  # no worker will come: give up soon

# Port 9 (discard) has no worker: attaching fails, but only when waited for.
hosts = attach_to_workers(name="trainers", workers=["tcp://127.0.0.1:9"])
out = {"repr": repr(hosts)}
try:
    hosts.initialized.get(timeout=30)
except RuntimeError as e:
    out["error"] = str(e)
print(json.dumps(out))
"""

IPC = """
import json
from danaus.actor import Actor, endpoint, enable_transport, attach_to_workers, this_host

class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

from danaus.actor import ChannelTransport
enable_transport("ipc")
enable_transport("ipc")  # the same again is a no-op
enable_transport(ChannelTransport.Unix)  # the same transport, by Monarch's enum
out = {}
procs = this_host().spawn_procs(per_host={"gpus": 2})
out["values"] = list(procs.spawn("echo", Echo).echo.call(5).get(timeout=30).values())
for attempt in (lambda: enable_transport("tcp"),
                lambda: attach_to_workers(workers=["tcp://127.0.0.1:9"]),
                lambda: enable_transport("metatls"),
                lambda: enable_transport(ChannelTransport.Tls)):
    try:
        attempt()
    except (RuntimeError, ValueError, NotImplementedError) as e:
        out.setdefault("errors", []).append([type(e).__name__, str(e)])
procs.stop().get(timeout=30)
print(json.dumps(out))
"""


def test_attach_to_workers_names_the_host_mesh(client_script) -> None:
    r = client_script.run(ATTACH_NAMED)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["repr"] == "<HostMesh 'trainers' {'hosts': 1}>"
    assert "attach failed" in out["error"]


def test_enable_transport_ipc_keeps_the_client_on_this_host(client_script) -> None:
    r = client_script.run(IPC)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["values"] == [5, 5]
    (change, attach, unknown, tls) = out["errors"]
    assert tls[0] == "NotImplementedError" and "ChannelTransport.Tls" in tls[1]
    assert change[0] == "RuntimeError" and "already 'ipc'" in change[1]
    assert attach[0] == "RuntimeError" and "cannot attach to workers" in attach[1]
    assert unknown[0] == "ValueError" and "'metatls'" in unknown[1]


class Where(Actor):
    @endpoint
    def point(self) -> dict[str, int]:
        from danaus.actor import current_rank

        return dict(current_rank())


@pytest.mark.parametrize(
    ("make", "sizes"),
    [
        (lambda: proc_mesh(gpus=2), {"hosts": 1, "gpus": 2}),
        (lambda: local_proc_mesh(gpus=1, hosts=2), {"hosts": 2, "gpus": 1}),
        (
            lambda: sim_proc_mesh(gpus=1, hosts=2),
            {"regions": 1, "dcs": 1, "zones": 1, "racks": 1, "hosts": 2, "gpus": 1},
        ),
    ],
    ids=["proc_mesh", "local_proc_mesh", "sim_proc_mesh"],
)
def test_deprecated_proc_mesh_functions_warn_and_spawn_working_procs(make, sizes) -> None:
    with pytest.warns(DeprecationWarning, match="deprecated"):
        pm = make()
    try:
        assert pm.sizes == sizes
        points = pm.spawn("where", Where).point.call().get(timeout=REPLY_TIMEOUT)
        assert len(list(points.values())) == len(pm)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)
