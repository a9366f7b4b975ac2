"""``@endpoint``: marks the methods of an :class:`Actor` that meshes can message.

On an actor instance an endpoint is an ordinary bound method; on an actor
mesh it becomes an :class:`~danaus._actor.api.adverbs.Endpoint` with the adverbs
``call``, ``call_one``, ``choose``, ``stream`` and ``broadcast``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

__all__ = ["EndpointProperty", "concurrent_endpoint", "endpoint", "endpoints_of"]

F = TypeVar("F", bound=Callable[..., Any])

Propagator = Literal["cached", "inspect", "mocked"] | Callable[..., Any] | None


class EndpointProperty:
    """The descriptor ``@endpoint`` leaves on the class."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        propagate: Propagator = None,
        explicit_response_port: bool = False,
        instrument: bool = True,
        concurrent: bool = False,
    ) -> None:
        if isinstance(fn, EndpointProperty):
            raise ValueError(f"{fn.name!r} is already an endpoint; apply @endpoint once")
        if not callable(fn):
            raise TypeError(f"@endpoint must decorate a function, got {fn!r}")
        _check_options(fn, propagate, instrument)
        self.fn = fn
        self.name: str = getattr(fn, "__name__", "endpoint")
        self.is_async = inspect.iscoroutinefunction(fn)
        self.propagate = propagate
        self.explicit_response_port = explicit_response_port
        self.instrument = instrument
        self.concurrent = concurrent
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters.values())[2 if explicit_response_port else 1 :]
        plain = all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params)
        # When every parameter is plain, a call with exactly that many positional
        # arguments and no keywords binds: skip inspect's slower general check.
        self._arity: int | None = len(params) if plain else None
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self.fn.__get__(obj, objtype)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Check ``args``/``kwargs`` against the signature; ``TypeError`` if they do not fit."""
        if not kwargs and len(args) == self._arity:
            return
        lead: tuple[Any, ...] = (None, None) if self.explicit_response_port else (None,)
        try:
            self.signature.bind(*lead, *args, **kwargs)
        except TypeError as e:
            raise TypeError(
                f"bad arguments for endpoint {self.name}{self.signature}: {e}"
            ) from None

    def __repr__(self) -> str:
        return f"<endpoint {self.name}>"


_PROPAGATORS = ("cached", "inspect", "mocked")


def _check_options(fn: Any, propagate: Any, instrument: Any) -> None:
    """``ValueError``/``TypeError`` for an option Monarch would not accept either."""
    if propagate is not None and propagate not in _PROPAGATORS and not callable(propagate):
        raise ValueError(
            f"@endpoint(propagate={propagate!r}) on {getattr(fn, '__name__', fn)!r}: propagate "
            f"must be None, one of {list(_PROPAGATORS)} or a function computing fake outputs"
        )
    if not isinstance(instrument, bool):
        raise TypeError(
            f"@endpoint(instrument={instrument!r}) on {getattr(fn, '__name__', fn)!r}: "
            "instrument must be True or False"
        )


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


def endpoints_of(cls: type) -> dict[str, EndpointProperty]:
    """Every endpoint of ``cls``, inherited ones included."""
    found: dict[str, EndpointProperty] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty):
                found[name] = value
            elif name in found:
                del found[name]  # overridden by a plain attribute
    return found
