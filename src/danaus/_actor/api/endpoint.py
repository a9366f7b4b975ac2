"""``@endpoint``: marks the methods of an :class:`Actor` that meshes can message.

On an actor instance an endpoint is an ordinary bound method; on an actor
mesh it becomes an :class:`~danaus._actor.api.adverbs.Endpoint` with the adverbs
``call``, ``call_one``, ``choose``, ``stream`` and ``broadcast``. What the
decorators leave on the class, :class:`EndpointProperty`, is the actor core's
(``danaus._actor.core.endpoints``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar, overload

from ..core.endpoints import EndpointProperty, Propagator

__all__ = ["concurrent_endpoint", "endpoint"]

F = TypeVar("F", bound=Callable[..., Any])


@overload
def endpoint(method: F) -> F: ...


@overload
def endpoint(
    method: None = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Callable[[F], F]: ...


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

    Example::

        class Counter(Actor):
            @endpoint
            def value(self) -> int: ...

            @endpoint(explicit_response_port=True)
            def later(self, port, x): port.send(x)
    """

    def wrap(fn: Any) -> Any:
        return EndpointProperty(
            fn,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )

    if method is not None:
        return wrap(method)
    return wrap


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
        return EndpointProperty(
            fn,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
            concurrent=True,
        )

    if method is not None:
        return wrap(method)
    return wrap
