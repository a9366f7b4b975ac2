"""``Actor``: the base class of user actors, and the checks a class must pass to be spawned."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, SupportsIndex, TypeVar

from ..core.endpoints import EndpointProperty, endpoints_of

if TYPE_CHECKING:
    from ..._mesh import Extent
    from ..core.future import Future

__all__ = ["Actor", "actor_mode", "validate_actor_class"]

_A = TypeVar("_A", bound="Actor")
_PySlice = slice


class Actor:
    """Base class of actors. Subclass it and mark methods with ``@endpoint``.

    Optional hooks: ``__supervise__(self, failure)`` (handle the failure of a
    mesh this actor owns; return truthy when handled) and
    ``__cleanup__(self, exc)`` (runs when the actor stops). Both may be sync or
    async, matching the endpoints.

    Example:

        class Counter(Actor):
            def __init__(self, start: int):
                self.n = start

            @endpoint
            def incr(self) -> None:
                self.n += 1
    """

    @property
    def logger(self) -> logging.Logger:
        """A ``logging.Logger`` named after the actor's class."""
        return logging.getLogger(f"{type(self).__module__}.{type(self).__qualname__}")

    if TYPE_CHECKING:
        # The optional hooks, for the API reference and type checkers only: an actor
        # has them when its class defines them (the runtime looks them up by name,
        # and checks that __cleanup__ is sync or async as the endpoints are).

        def __supervise__(self, failure: Any) -> Any:
            """Handle the failure of a mesh this actor owns (optional hook).

            Called with a ``MeshFailure`` (``mesh_name``, ``crashed_ranks``,
            ``reason``, ``mesh``) on the actor's own thread, between messages,
            when an actor of a mesh it spawned (or a supervisor it made) fails.
            Return truthy when handled; otherwise this actor fails too and the
            failure goes on to its own owner. ``def`` or ``async def``, as the
            endpoints are. See the concepts page on supervision.
            """

        def __cleanup__(self, exc: BaseException | None) -> Any:
            """Run when the actor stops (optional hook).

            ``exc`` is ``None`` after ``stop()``, or the exception that failed
            the actor; it runs once, on the actor's thread, after the meshes it
            owns have stopped. A crash of its process runs nothing. ``def`` or
            ``async def``, as the endpoints are.
            """

        # What an actor mesh has beside its endpoints, for type checkers: ``spawn``
        # returns the mesh typed as the actor class (as Monarch's does), so that
        # ``mesh.method`` is the endpoint's ``Endpoint[P, R]`` (see ``@endpoint``)
        # and these are the mesh's own (``ActorMesh``). Not attributes of an actor.

        name: str

        @property
        def initialized(self) -> Future[None]: ...

        def stop(self, reason: str = "stopped by client") -> Future[None]: ...

        def slice(self: _A, **dims: SupportsIndex | _PySlice) -> _A: ...

        def split(self: _A, **kwargs: object) -> _A: ...

        def rename(self: _A, **kwargs: str) -> _A: ...

        def flatten(self: _A, name: str) -> _A: ...

        def size(self, dim: str | Iterable[str] | None = None) -> int: ...

        @property
        def sizes(self) -> dict[str, int]: ...

        @property
        def extent(self) -> Extent: ...

        def to_table(self) -> str: ...

        @property
        def proc_mesh(self) -> Any: ...


# Names an endpoint must not take: they are attributes of every actor mesh.
RESERVED = frozenset(
    {
        "slice",
        "split",
        "rename",
        "flatten",
        "size",
        "sizes",
        "extent",
        "stop",
        "initialized",
        "to_table",
        "proc_mesh",
        "name",
    }
)


def validate_actor_class(cls: Any) -> dict[str, EndpointProperty]:
    """Check that ``cls`` can be spawned; return its endpoints. Raises ``ValueError``."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise ValueError(
            f"{cls!r} is not an Actor subclass; spawn(name, ActorClass, *args) expects a class "
            "deriving from danaus.actor.Actor"
        )
    eps = endpoints_of(cls)
    clash = sorted(n for n in eps if n in RESERVED or n.startswith("_"))
    if clash:
        raise ValueError(
            f"{cls.__qualname__} has endpoints named like actor mesh attributes: {clash}; "
            f"rename them (reserved names: {sorted(RESERVED)})"
        )
    actor_mode(cls, eps)
    return eps


def actor_mode(cls: type, eps: dict[str, EndpointProperty] | None = None) -> str:
    """``"async"`` when the class's endpoints are coroutines, else ``"sync"``.

    Raises ``ValueError`` when sync and async endpoints (or ``__cleanup__``) are mixed.
    """
    eps = endpoints_of(cls) if eps is None else eps
    sync = sorted(n for n, e in eps.items() if not e.is_async)
    async_ = sorted(n for n, e in eps.items() if e.is_async)
    if sync and async_:
        raise ValueError(
            f"{cls.__qualname__} mixes both async and sync endpoints (async: {async_}; sync: "
            f"{sync}); make them all 'def' or all 'async def'"
        )
    mode = "async" if async_ else "sync"
    cleanup = getattr(cls, "__cleanup__", None)
    if cleanup is not None and eps:
        is_async = inspect.iscoroutinefunction(cleanup)
        if is_async != (mode == "async"):
            raise ValueError(
                f"{cls.__qualname__}.__cleanup__ is {'async' if is_async else 'sync'} but its "
                f"endpoints are {mode}; make them match"
            )
    if cleanup is not None and not eps and inspect.iscoroutinefunction(cleanup):
        mode = "async"
    return mode
