"""A mesh's route and its headers alone: no runtime, no processes."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from danaus._actor.api.envelope import Headers, Method
from danaus._actor.api.mesh import MeshRef, _State
from danaus._actor.api.route import DirectRoute, TreeRoute
from danaus._actor.core.endpoints import EndpointProperty
from danaus._errors import SupervisionError
from danaus._mesh import Shape, Slice
from danaus._mesh.tree import Selection
from danaus._wire.ids import ActorId, PortId, ProcId
from danaus._wire.protocol import Call, Cast, wire

ME = ProcId("c0", "unix:/nowhere/c0.sock")
PROCS = tuple(ProcId(f"p{i}", f"unix:/nowhere/p{i}.sock") for i in range(4))


class Worker:
    def step(self, x: int) -> int:
        return x


def method(flags: int = 0) -> Method:
    return Method("workers", "step", EndpointProperty(Worker.step), flags)


def shape(n: int) -> Shape:
    return Shape(["gpus"], Slice.new_row_major([n]))


def route(cls: Any = DirectRoute, n: int = 4, state: _State | None = None, mesh: Any = None) -> Any:
    ref = MeshRef("workers.1", "workers", Worker, PROCS[:n], None)
    return cls(object(), ref, shape(n), state or _State(), True, mesh)  # rt unused here


def test_a_call_header_is_the_typed_record_a_receiver_decodes() -> None:
    h = Headers("workers.1", "workers", 4, shape(4))
    port = PortId(ME, 7)
    sender = ActorId(ME, "root", 0)
    got = h.call(method(flags=2), 3, 1, port, sender, ())
    assert type(got) is Call
    assert got == Call("workers.1", 3, "step", port, 1, ("gpus",), (4,), sender, (), 2, None)


def test_a_cast_header_names_the_whole_mesh_and_the_selection() -> None:
    h = Headers("workers.1", "workers", 4, shape(4))
    sel = Selection.of(shape(4).ndslice)
    got = h.cast("step", 0, True, None, sel, None, ())
    assert type(got) is Cast
    assert (got.mesh, got.name, got.method, got.gather, got.lo, got.hi) == (
        "workers.1", "workers", "step", True, 0, 4,
    )  # fmt: skip
    assert got.selection == sel.to_wire() and (got.labels, got.sizes) == (("gpus",), (4,))


def test_cached_header_bytes_unpickle_to_the_header_for_every_port() -> None:
    m = method()
    h = Headers("workers.1", "workers", 4, shape(4))
    for no in (1, 2, 300):
        header = h.call(m, 0, 0, PortId(ME, no), None, ())
        raw = m.pickled(ME, header)
        assert raw is not None and pickle.loads(raw) == wire(header)
    assert len(m.templates) == 1  # one template per rank, slot, sender and chain


def test_no_cached_bytes_for_a_port_of_another_proc_or_none() -> None:
    m = method()
    h = Headers("workers.1", "workers", 4, shape(4))
    assert m.pickled(ME, h.call(m, 0, 0, None, None, ())) is None
    assert m.pickled(ME, h.call(m, 0, 0, PortId(PROCS[0], 1), None, ())) is None


def test_targets_are_the_slice_ranks_with_their_procs() -> None:
    r = route()
    assert r.targets() == [(i, i, PROCS[i]) for i in range(4)]
    assert r.tree is False and route(TreeRoute).tree is True


def test_call_one_on_a_mesh_of_several_actors_says_to_slice_it() -> None:
    with pytest.raises(ValueError, match=r"call_one requires exactly 1 actor.*has 4"):
        route().call_one(method(), (1,), {})


def test_a_stopped_mesh_refuses_calls_in_monarchs_words() -> None:
    state = _State()
    state.stopped = True
    with pytest.raises(SupervisionError, match="all its descendants have failed"):
        route(state=state).check_usable()


def test_a_failed_rank_is_known_by_its_reason() -> None:
    state = _State()
    state.failed[2] = "it raised"
    r = route(state=state)
    assert (r.failed_reason(2), r.failed_reason(1)) == ("it raised", None)


def test_an_endpoint_pickles_as_its_mesh_and_name_not_its_route() -> None:
    from danaus._actor.api.adverbs import Endpoint, _rebuild

    class Mesh:  # stands in for an ActorMesh: its endpoints are attributes
        def __init__(self) -> None:
            self.step: Endpoint[Any, Any] = Endpoint(
                route(mesh=self), "step", EndpointProperty(Worker.step)
            )

    mesh = Mesh()
    fn, args = mesh.step.__reduce__()
    assert fn is _rebuild and args[0] is mesh and args[1] == "step"
    assert fn(*args) is mesh.step  # rebuilt on the other side from its mesh


class _Conn:
    closed = False


class _Runtime:
    """What a one-actor route's call_one uses of its runtime, recorded."""

    tracer = None
    proc_id = ME

    def __init__(self) -> None:
        self.ports: dict[int, Any] = {}
        self.sent: list[tuple[Any, ...]] = []
        self.conn = _Conn()
        self.lookups = 0
        self.router = self  # the runtime's router part: open_port and the ports table

    def open_port(self, handler: Any) -> PortId:
        no = len(self.ports) + 1
        self.ports[no] = handler
        return PortId(ME, no)

    def send(self, proc: ProcId, header: Any, *args: Any, pickled: Any = None) -> None:
        self.sent.append((proc, header, pickled))

    def reader_for(self, proc: ProcId) -> Any:
        self.lookups += 1
        return self.conn


def one_actor(rt: _Runtime) -> DirectRoute:
    from danaus._actor.core.context import Context, Instance
    from danaus._mesh import Extent, Point

    ref = MeshRef("workers.1", "workers", Worker, PROCS[:1], None)
    r = DirectRoute(rt, ref, shape(1), _State(), True, None)  # type: ignore[arg-type]
    nowhere = Point(0, Extent([], []))
    # The node's root context, which the route looks up on its first call (no node here).
    root = Instance(ActorId(ME, "root", 0), "root", nowhere, "RootClient", None)
    r._root = Context(root, nowhere)
    return r


def test_call_one_finds_its_reader_once_and_again_only_once_that_connection_closed() -> None:
    rt = _Runtime()
    r = one_actor(rt)
    futs = [r.call_one(method(), (i,), {}) for i in range(3)]
    assert rt.lookups == 1 and all(f._cf.reader is rt.conn for f in futs)
    assert all(f._cf.runtime is rt for f in futs)  # what its waiter tells that it waits
    rt.conn.closed = True
    rt.conn = _Conn()
    fut = r.call_one(method(), (3,), {})
    assert rt.lookups == 2 and fut._cf.reader is rt.conn
    # Outside any actor: no sender, no chain; every call's header bytes from the template.
    for proc, header, pickled in rt.sent:
        assert proc == PROCS[0] and (header.sender, header.chain) == (None, ())
        assert pickle.loads(pickled) == wire(header)


def test_call_one_with_arguments_that_do_not_fit_raises_before_sending() -> None:
    rt = _Runtime()
    r = one_actor(rt)
    with pytest.raises(TypeError, match="bad arguments for endpoint step"):
        r.call_one(method(), (1, 2), {})
    with pytest.raises(TypeError, match="bad arguments for endpoint step"):
        r.call_one(method(), (), {"y": 1})
    assert rt.sent == [] and rt.ports == {}
