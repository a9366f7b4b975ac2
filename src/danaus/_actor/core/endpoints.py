"""What ``@endpoint`` leaves on an actor class: the `EndpointProperty` descriptor.

The actor core dispatches messages on it (``endpoints_of``); the decorators that
make one, ``endpoint`` and ``concurrent_endpoint``, are the actor API's
(``danaus._actor.api.endpoint``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["EndpointProperty", "EndpointTable", "Propagator", "endpoints_of"]

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
        # arguments and no keywords binds: skip inspect's slower general check
        # (a route checks this before it calls `bind`).
        self.arity: int | None = len(params) if plain else None
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
        if not kwargs and len(args) == self.arity:
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


class EndpointTable(dict[str, EndpointProperty]):
    """An actor's endpoints by name (`endpoints_of()` its class), and the plain
    methods called through ``as_endpoint``, made endpoints on their first call
    (`adhoc()`). A dict, so a lookup by name costs what a dict's does."""

    __slots__ = ("_adhoc", "_cls")

    def __init__(self, cls: type | None = None) -> None:
        super().__init__(endpoints_of(cls) if cls is not None else {})
        self._cls = cls
        self._adhoc: dict[tuple[str, bool], EndpointProperty] = {}

    def adhoc(self, method: str, explicit: bool) -> EndpointProperty | None:
        """Method ``method`` of the class as an endpoint (``explicit``: it answers through
        a response port), or None if the class has no such method."""
        key = (method, explicit)
        prop = self._adhoc.get(key)
        if prop is None:
            fn = getattr(self._cls, method, None)
            if not callable(fn):
                return None
            prop = self._adhoc[key] = EndpointProperty(fn, explicit_response_port=explicit)
        return prop
