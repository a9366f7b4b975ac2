"""Adverbs: how a message reaches a mesh — ``call``, ``call_one``, ``choose``, ``stream``,
``broadcast``.

Every adverb binds the arguments against the endpoint's signature and
pickles them once, on the caller's thread, before anything is sent: a wrong
call raises ``TypeError`` at the call site. The encoded body is then written
to each destination proc's connection, so each sender→actor pair stays FIFO.

Each adverb is one call into the mesh's route (``route.py``), chosen once per
mesh. A mesh of at least ``tree_min_ranks`` actors is messaged through its cast
tree instead (``danaus._runtime.messaging.tree``), every message to it, whatever it
selects: the path from this proc to each actor is then always the same, so
FIFO holds per destination. ``call()`` gathers replies up the tree;
``stream()``, ``call_one``, ``choose`` and port sends have each reply come
straight back, as soon as it is ready.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

from ..._mesh import ValueMesh
from ..core.cell import FLAG_AS_ENDPOINT, FLAG_EXPLICIT
from ..core.collect import set_future
from ..core.endpoints import EndpointProperty
from ..core.future import Deferred, Future, resolve
from ..core.ports import Port
from .envelope import Method
from .extensions import tensor_engine

if TYPE_CHECKING:
    from ..._wire.ids import ProcId
    from .route import Route

__all__ = ["Accumulator", "Endpoint", "NotAnEndpoint", "as_endpoint", "send"]

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")


class Endpoint(Generic[P, R]):
    """An endpoint of a mesh; pick an adverb to send a message.

    Generic in the endpoint method's parameters ``P`` (after ``self``) and its
    result ``R`` (what it returns or awaits, or what its response port carries),
    as Monarch's ``Endpoint[P, R]``: ``call_one``/``choose`` give a
    ``Future[R]``, ``call`` a ``Future[ValueMesh[R]]``, ``stream`` an iterator
    of ``Future[R]``, and a type checker flags arguments that do not fit ``P``
    (at run time they raise ``TypeError`` before anything is sent).

    It is a `Method` (what its messages name)
    and its mesh's route; each adverb is one call into the route.
    """

    def __init__(self, route: Route, name: str, prop: EndpointProperty, flags: int = 0) -> None:
        self._route = route
        self._name = name
        self._prop = prop
        self._given = flags  # as made (as_endpoint's flag), for pickling
        flags |= FLAG_EXPLICIT if prop.explicit_response_port else 0
        self._method = Method(route.ref.name, name, prop, flags)
        self._what = self._method.what

    def _targets(self) -> list[tuple[int, int, ProcId]]:
        """``(index in this slice, rank in the whole mesh, proc)`` for each actor addressed."""
        return self._route.targets()

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the only actor of a one-actor mesh. ``ValueError`` (before sending) otherwise."""
        return self._route.call_one(self._method, args, kwargs)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Send to every actor of the mesh; the future holds a ``ValueMesh`` of the replies.

        Does not block. The future raises ``ActorError`` if any actor raised, and
        ``SupervisionError`` if an actor's proc died.
        """
        return self._route.call(self._method, args, kwargs)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one actor of the mesh, chosen at random (load balancing)."""
        return self._route.choose(self._method, args, kwargs)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Iterator[Future[R]]:
        """Call every actor; yield one future per actor, in the order replies arrive."""
        return self._route.stream(self._method, args, kwargs)

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every actor without waiting for anything (fire and forget).

        An exception in the endpoint fails the actor (there is no caller to tell).
        """
        self._route.broadcast(self._method, args, kwargs)

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Call every actor; their results become distributed tensors (tensor engine).

        Needs torch. The endpoint's ``propagate`` function gives the results'
        shapes from meta tensors on the client, so this returns at once: the
        mesh tensors (in the structure ``propagate`` returned) of the mesh of
        the distributed tensors passed, or of the active mesh. The actors must
        be one per proc of that mesh. The call is ordered with the tensor ops
        of the active stream both ways, as a call with tensor arguments is; an
        endpoint that raises fails the result tensors, not the actor. See
        ``docs/tensor.md``.
        """
        return tensor_engine(self._route.node).actor_rref(self, args, kwargs)

    def _send_returning(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        hand_off: Any,
    ) -> None:
        """Send to every actor with no reply port; the outcome of each call goes to the
        producers on its proc, which ``hand_off(key, count, refs, recipients)`` sets up
        (it may raise, before anything is sent). See ``handoff``."""
        self._route.returning(self._method, args, kwargs, hand_off)

    def _send_to_port(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Port[Any] | None,
        selection: str,
    ) -> None:
        """The primitive under the adverbs: replies (one per actor) go to ``port``."""
        self._route.to_port(self._method, args, kwargs, port, selection)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Not on a mesh: raises ``TypeError`` (pick an adverb). Typed for the one place
        the call is right: inside the actor, ``self.method(...)`` is the bound method,
        which a type checker sees as this endpoint."""
        raise TypeError(
            f"endpoint {self._name}() of an actor mesh cannot be called directly; pick an "
            f"adverb: .call(), .call_one(), .choose(), .stream(), .broadcast() or .rref()"
        )

    def __repr__(self) -> str:
        return f"<Endpoint {self._what}>"

    def __reduce__(self) -> Any:
        """Pickled as its mesh and name (the route, with its runtime, stays here)."""
        return (_rebuild, (self._route.mesh, self._name, self._prop, self._given))


def _rebuild(mesh: Any, name: str, prop: EndpointProperty, flags: int) -> Endpoint[Any, Any]:
    got = getattr(mesh, name)  # the mesh's own endpoint, or its plain method (as_endpoint)
    if not flags and isinstance(got, Endpoint):
        return got
    return Endpoint(got._route, name, prop, flags)


def send(
    endpoint: Endpoint[P, R] | Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port[R] | None = None,
    selection: Literal["all", "choose"] = "all",
) -> None:
    """Send ``endpoint(*args, **kwargs)`` to its mesh; each actor's reply goes to ``port``.

    ``endpoint`` is an endpoint of an actor mesh (``mesh.method``) or, as in
    Monarch, a remote function (``danaus.remote``: one reply per proc of the
    active mesh). ``selection`` is ``"all"`` or ``"choose"`` (one actor at
    random). Does not block.
    """
    if not isinstance(endpoint, Endpoint) and not hasattr(endpoint, "_send_to_port"):
        raise TypeError(
            "send() needs an endpoint of an actor mesh (mesh.method) or a remote function, "
            f"got {endpoint!r}"
        )
    endpoint._send_to_port(tuple(args), dict(kwargs), port, selection)


@overload
def as_endpoint(
    not_an_endpoint: Callable[P, Awaitable[R]],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
) -> Endpoint[P, R]: ...


@overload
def as_endpoint(
    not_an_endpoint: Callable[P, R],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[False] = False,
) -> Endpoint[P, R]: ...


@overload
def as_endpoint(
    not_an_endpoint: Callable[Concatenate[Port[R], P], Awaitable[None] | None],
    *,
    propagate: Any = None,
    explicit_response_port: Literal[True],
) -> Endpoint[P, R]: ...


def as_endpoint(
    not_an_endpoint: Any,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
) -> Endpoint[Any, Any]:
    """Make a plain method of an actor mesh callable with the adverbs.

    ``as_endpoint(mesh.helper).call(...)``. Raises ``TypeError`` for anything
    but a mesh's non-endpoint method.
    """
    if isinstance(not_an_endpoint, Endpoint):
        return not_an_endpoint
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise TypeError(
            f"as_endpoint() takes a method of an actor mesh (mesh.method), got {not_an_endpoint!r}"
        )
    route, name = not_an_endpoint._route, not_an_endpoint._name
    fn = getattr(route.ref.cls, name)
    prop = EndpointProperty(fn, propagate=propagate, explicit_response_port=explicit_response_port)
    ep: Endpoint[Any, Any] = Endpoint(route, name, prop, FLAG_AS_ENDPOINT)
    return ep


class Accumulator(Generic[P, R, A]):
    """A client-side left fold over the replies of an endpoint, in arrival order.

    ``Accumulator(mesh.value, 0, operator.add).accumulate().get()``; an empty
    mesh yields ``identity``.
    """

    def __init__(self, endpoint: Endpoint[P, R], identity: A, combine: Callable[[A, R], A]) -> None:
        if not isinstance(endpoint, Endpoint):
            raise TypeError(f"Accumulator needs an actor mesh's endpoint, got {endpoint!r}")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: P.args, **kwargs: P.kwargs) -> Future[A]:
        """Call every actor; the future holds ``combine(...combine(identity, r1)..., rn)``."""
        futures = list(self._endpoint.stream(*args, **kwargs))
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        arrived: list[Any] = []  # replies in arrival order, folded by whoever reads cf
        lock = threading.Lock()  # guards arrived (against cf completing)
        if not futures:
            cf.set_result(self._identity)

        def fold() -> Any:
            acc = self._identity
            for reply in arrived:
                acc = self._combine(acc, resolve(reply))
            return acc

        def one(f: Future[Any]) -> None:
            exc = f._cf.exception()
            with lock:
                if cf.done():
                    return
                reply = f._cf.result() if exc is None else None
                if exc is not None or not getattr(reply, "ok", True):
                    set_future(cf, False, exc if exc is not None else reply)
                    return
                arrived.append(reply)
                if len(arrived) == len(futures):
                    # The fold runs user code: on the reader's thread, not the I/O thread.
                    set_future(cf, True, Deferred(fold))

        for f in futures:
            f.add_done_callback(one)
        return Future._create(cf, f"accumulating {self._endpoint._what}")


class NotAnEndpoint:
    """A method of the actor class that is not marked ``@endpoint``.

    As in Monarch: calling it raises ``RuntimeError``, and it has no adverbs, so
    ``mesh.method.call()`` raises ``AttributeError`` (both saying what to do).
    """

    _ADVERBS = frozenset({"call", "call_one", "choose", "stream", "broadcast", "rref"})

    def __init__(self, route: Route, name: str) -> None:
        self._route = route
        self._name = name

    def _message(self) -> str:
        return (
            f"Actor {self._route.ref.cls.__qualname__}.{self._name} is not annotated as an "
            "endpoint; decorate it with @endpoint (or wrap it with as_endpoint()) to call it "
            "through a mesh"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(self._message())

    def __getattr__(self, name: str) -> Any:
        if name in NotAnEndpoint._ADVERBS:
            raise AttributeError(f"{self._message()} (so it has no .{name})", name=name, obj=self)
        raise AttributeError(name)
