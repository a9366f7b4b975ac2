"""A malformed message never kills an actor silently: its caller hears, its owner hears."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

import danaus.actor as da
from danaus._actor.collect import Collector, set_future
from danaus._errors import SupervisionError
from danaus._runtime import host
from danaus._runtime.runtime import CALL
from danaus.actor import Actor, endpoint, this_host


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


@pytest.mark.timeout(60)
def test_a_call_with_a_header_from_another_version_fails_the_actor_and_answers_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures: list[da.MeshFailure] = []
    seen = threading.Event()

    def record(failure: da.MeshFailure) -> None:
        failures.append(failure)
        seen.set()

    monkeypatch.setattr(da, "unhandled_fault_hook", record)
    procs = this_host().spawn_procs(per_host={"x": 1})
    try:
        mesh = procs.spawn("echo", Echo)
        assert mesh.echo.call_one(7).get(timeout=30) == 7
        rt = host.ensure_runtime()
        cf: concurrent.futures.Future[object] = concurrent.futures.Future()
        collector = Collector(rt, "echo.echo()", 1, lambda i, ok, v: set_future(cf, ok, v))
        proc = mesh._ref.procs[0]
        collector.expect(0, proc)
        # An 8-field CALL header, as an older peer might send: the actor cannot decode it.
        rt.send(proc, (CALL, mesh._ref.mesh_id, 0, "echo", collector.port, 0, (), ()), b"", ())
        with pytest.raises(SupervisionError, match="internal error"):
            cf.result(timeout=30)
        assert seen.wait(30)
        assert failures[0].mesh_name == "echo" and failures[0].crashed_ranks == [0]
        with pytest.raises(SupervisionError):
            mesh.echo.call_one(1).get(timeout=30)
    finally:
        procs.stop().get(timeout=30)


class Big(Actor):
    @endpoint
    def twice(self, a):
        return a * 2


@pytest.mark.timeout(60)
def test_large_arrays_skip_the_socket_between_procs_of_one_host_and_arrive_intact() -> None:
    np = pytest.importorskip("numpy")
    procs = this_host().spawn_procs(per_host={"x": 1})
    try:
        mesh = procs.spawn("big", Big)
        data = np.random.default_rng(5).integers(0, 1 << 30, size=(3 << 20) // 8, dtype=np.int64)
        out = mesh.twice.call_one(data).get(timeout=30)  # 3 MiB there, 3 MiB back
        assert out.dtype == np.int64 and np.array_equal(out, data * 2)
        rt = host.ensure_runtime()
        # The proc proved at hello time that it can read this process's memory.
        assert mesh._ref.procs[0].name in rt.offload.ok_peers
        out[0] = -1  # what arrived is ordinary writable memory
    finally:
        procs.stop().get(timeout=30)
