"""A malformed message never kills an actor silently: its caller hears, its owner hears.
Large arrays between procs arrive whole and as snapshots. A stopped actor of the
client's own proc is freed: ``tests/unit/actor/test_lifecycle.py``."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest

import danaus
import danaus.actor as da
from danaus._actor.core.collect import Collector, set_future
from danaus._errors import SupervisionError
from danaus._runtime.node import this_node
from danaus._wire import codec
from danaus._wire.protocol import Call
from danaus.actor import Actor, concurrent_endpoint, endpoint, this_host


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
        rt = this_node().runtime
        cf: concurrent.futures.Future[object] = concurrent.futures.Future()
        collector = Collector(rt, "echo.echo()", 1, lambda i, ok, v: set_future(cf, ok, v))
        proc = mesh._ref.procs[0]
        collector.expect(0, proc)
        # A CALL whose extent is not one (as a buggy peer might send): danaus itself
        # fails while preparing the call, not the endpoint.
        body, bufs = codec.dumps(((1,), {}))
        bad = Call(mesh._ref.mesh_id, 0, "echo", collector.port, 0, None, None, None, (), 0)
        rt.send(proc, bad, body, bufs)
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
        rt = this_node().runtime
        # The proc proved at hello time that it can read this process's memory.
        [proc] = danaus.stats(mesh).get(timeout=30).procs
        assert proc.proc in rt.offload.ok_peers
        out[0] = -1  # what arrived is ordinary writable memory
    finally:
        procs.stop().get(timeout=30)


class Holder(Actor):
    def __init__(self) -> None:
        import numpy

        self.arr = numpy.zeros(1 << 19, dtype=numpy.int64)  # 4 MiB

    @endpoint
    def get(self):
        return self.arr

    @endpoint
    def bump(self) -> None:
        self.arr += 1


@pytest.mark.timeout(60)
def test_a_reply_is_a_snapshot_even_if_the_actor_changes_it_right_after() -> None:
    procs = this_host().spawn_procs(per_host={"x": 1})
    try:
        h = procs.spawn("holder", Holder)
        futures = []
        for _ in range(10):
            futures.append(h.get.call_one())
            h.bump.broadcast()
        for step, f in enumerate(futures):
            arr = f.get(timeout=30)
            assert int(arr.min()) == int(arr.max()) == step  # never torn, never a later step
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(60)
def test_a_large_argument_sent_before_the_proc_is_up_is_a_snapshot() -> None:
    """The call is queued until the proc connects: its 32 MiB argument is copied then
    (outside the runtime's lock, in chunks), and later changes do not reach it."""
    np = pytest.importorskip("numpy")
    procs = this_host().spawn_procs(per_host={"x": 1})
    try:
        echo = procs.spawn("echo_early", Echo)  # returns before the proc has booted
        arr = np.zeros(1 << 22, dtype=np.int64)  # 32 MiB
        first = echo.echo.call_one(arr)
        arr += 7  # after the call: must not show in what was sent
        second = echo.echo.call_one(arr)
        got = first.get(timeout=30)
        assert int(got.min()) == int(got.max()) == 0
        again = second.get(timeout=30)
        assert int(again.min()) == int(again.max()) == 7
    finally:
        procs.stop().get(timeout=30)


@pytest.mark.timeout(60)
def test_a_message_with_thousands_of_small_arrays_arrives() -> None:
    np = pytest.importorskip("numpy")
    procs = this_host().spawn_procs(per_host={"x": 1})
    try:
        echo = procs.spawn("echo", Echo)
        arrays = [np.full(8, i) for i in range(5000)]
        back = echo.echo.call_one(arrays).get(timeout=30)
        assert len(back) == 5000 and all(int(a[0]) == i for i, a in enumerate(back))
    finally:
        procs.stop().get(timeout=30)


class Front(Actor):
    @concurrent_endpoint
    async def x(self, b: Any) -> str:
        return await b.foo.call_one()

    @endpoint
    async def bar(self) -> str:
        return "bar ran"


class Back(Actor):
    def __init__(self, a: Any) -> None:
        self.a = a

    @endpoint
    async def foo(self) -> str:
        return await self.a.bar.call_one()


@pytest.mark.timeout(60)
def test_a_concurrent_endpoint_waiting_does_not_make_its_actor_refuse_calls_as_deadlock() -> None:
    procs = this_host().spawn_procs(per_host={"x": 2})
    try:
        a = procs.slice(x=0).spawn("front", Front)
        b = procs.slice(x=1).spawn("back", Back, a)
        assert a.x.call_one(b).get(timeout=30) == "bar ran"
    finally:
        procs.stop().get(timeout=30)
