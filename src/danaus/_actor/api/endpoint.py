"""``@endpoint``: marks the methods of an [`Actor`][danaus.actor.Actor] that meshes can message.

On an actor instance an endpoint is an ordinary bound method; on an actor
mesh it becomes an `Endpoint` with the adverbs
``call``, ``call_one``, ``choose``, ``stream`` and ``broadcast``. What the
decorators leave on the class is the actor core's descriptor
(``danaus._actor.core.endpoints.EndpointProperty``) as `EndpointDescriptor`,
which adds only its type: ``Endpoint[P, R]`` on a mesh, where ``P`` are the
method's parameters and ``R`` its result, so a type checker sees
``mesh.method.call_one(x)`` as a ``Future[R]`` and flags a wrong argument.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

from ..core.endpoints import EndpointProperty, Propagator
from ..core.ports import Port
from .adverbs import Endpoint

__all__ = ["EndpointDescriptor", "concurrent_endpoint", "endpoint"]

P = ParamSpec("P")
R = TypeVar("R")
_E = TypeVar("_E", bound="EndpointDescriptor[Any, Any]")


class EndpointDescriptor(EndpointProperty, Generic[P, R]):
    """What ``@endpoint`` puts on an actor class, as a type checker sees it.

    The same descriptor as the core's `EndpointProperty` at run time;
    its only addition is the type of an access: on the class, the descriptor
    itself; on an actor mesh (whose static type is the actor class, as
    ``spawn`` returns it), an [`Endpoint`][danaus.actor.Endpoint] ``[P, R]``, so that
    ``mesh.method.call_one(x)`` is a ``Future[R]`` and a wrong argument is a
    type error. On the actor itself (``self.method`` inside the actor) the
    access gives the bound method at run time, which the type checker sees as
    the endpoint too: calling it is allowed, its result unchecked (``Any``).
    """

    if TYPE_CHECKING:

        @overload
        def __get__(self: _E, obj: None, objtype: type | None = None) -> _E: ...

        @overload
        def __get__(self, obj: object, objtype: type | None = None) -> Endpoint[P, R]: ...

        def __get__(self, obj: Any, objtype: type | None = None) -> Any: ...


class _Decorator(Protocol):
    """``@endpoint(...)`` with options: what it makes of the method it decorates."""

    @overload
    def __call__(
        self, method: Callable[Concatenate[Any, P], Awaitable[R]]
    ) -> EndpointDescriptor[P, R]: ...

    @overload
    def __call__(self, method: Callable[Concatenate[Any, P], R]) -> EndpointDescriptor[P, R]: ...


class _PortDecorator(Protocol):
    """``@endpoint(explicit_response_port=True, ...)``: the result type is the port's."""

    @overload
    def __call__(
        self, method: Callable[Concatenate[Any, Port[R], P], Awaitable[None]]
    ) -> EndpointDescriptor[P, R]: ...

    @overload
    def __call__(
        self, method: Callable[Concatenate[Any, Port[R], P], None]
    ) -> EndpointDescriptor[P, R]: ...


class _AsyncDecorator(Protocol):
    """``@concurrent_endpoint(...)`` with options (async methods only)."""

    def __call__(
        self, method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]
    ) -> EndpointDescriptor[P, R]: ...


# The overloads follow Monarch's (monarch/_src/actor/endpoint.py): an endpoint's
# parameters are the method's after ``self`` (and after the port, for
# ``explicit_response_port=True``); its result is what the method returns, or
# awaits, or (with a port) what the port carries.


@overload
def endpoint(
    method: Callable[Concatenate[Any, P], Awaitable[R]],
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> EndpointDescriptor[P, R]: ...


@overload
def endpoint(
    method: Callable[Concatenate[Any, P], R],
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> EndpointDescriptor[P, R]: ...


@overload
def endpoint(
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> _Decorator: ...


@overload
def endpoint(
    method: Callable[Concatenate[Any, Port[R], P], Awaitable[None]],
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> EndpointDescriptor[P, R]: ...


@overload
def endpoint(
    method: Callable[Concatenate[Any, Port[R], P], None],
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> EndpointDescriptor[P, R]: ...


@overload
def endpoint(
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> _PortDecorator: ...


def endpoint(
    method: Any = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Make an actor method callable through meshes; use bare or with options.

    ``propagate`` (``None``, ``"cached"``, ``"inspect"``, ``"mocked"`` or a
    function) is kept on the endpoint for the tensor engine, which uses it to
    infer the outputs of ``rref`` calls without running them; other adverbs do
    not use it, as in Monarch. ``instrument=False`` keeps the endpoint out of
    telemetry: no span of its own when a call made inside a span reaches it
    (``danaus.actor.span``; the caller's context still reaches what it does).
    Raises ``ValueError``/``TypeError`` for other values.

    Example:

        class Counter(Actor):
            @endpoint
            def value(self) -> int: ...

            @endpoint(explicit_response_port=True)
            def later(self, port, x): port.send(x)
    """

    def wrap(fn: Any) -> Any:
        return EndpointDescriptor(
            fn,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )

    if method is not None:
        return wrap(method)
    return wrap


@overload
def concurrent_endpoint(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> EndpointDescriptor[P, R]: ...


@overload
def concurrent_endpoint(
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[False] = False,
    instrument: bool = True,
) -> _AsyncDecorator: ...


@overload
def concurrent_endpoint(
    method: Callable[Concatenate[Any, Port[R], P], Coroutine[Any, Any, None]],
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> EndpointDescriptor[P, R]: ...


@overload
def concurrent_endpoint(
    *,
    propagate: Propagator = None,
    explicit_response_port: Literal[True],
    instrument: bool = True,
) -> _PortDecorator: ...


def concurrent_endpoint(
    method: Any = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """An async endpoint whose bodies may overlap later messages to the same actor.

    Bodies start in the order messages arrive from one sender (up to their
    first ``await``); bodies still running when the actor stops are cancelled
    before ``__cleanup__``. Raises ``ValueError`` for a sync function or when
    stacked on ``@endpoint``.
    """

    def wrap(fn: Any) -> Any:
        if isinstance(fn, EndpointProperty):
            raise ValueError(
                "@concurrent_endpoint does not wrap @endpoint; use @concurrent_endpoint alone"
            )
        if not inspect.iscoroutinefunction(fn):
            raise ValueError(
                f"@concurrent_endpoint can only wrap async endpoints; {fn!r} is not 'async def'"
            )
        return EndpointDescriptor(
            fn,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
            concurrent=True,
        )

    if method is not None:
        return wrap(method)
    return wrap
