"""How ``remote``'s target becomes the function a worker calls: ``function_resolvers``.

``remote(target)`` asks each resolver of the public, mutable list
``resolvers`` in turn (Monarch's ``monarch.common.function.resolvers``,
``danaus.function_resolvers``) for a *resolvable*: a picklable object whose
``resolve()`` returns the function. The first that does not answer ``None``
wins; none answering is a ``ValueError`` naming the target. The resolvable
is what goes to the workers, which call ``resolve()`` and then the function.

The default resolvers, in order: torch operators (``torch.ops.aten.add.Tensor``)
by their path, ``"package.module.function"`` strings by their path, and any
other callable by value (pickled as the actor codec pickles functions: by
reference when importable, else by value). Insert your own before them to
send, say, a handle your workers look up in a registry.

Torch is not imported here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = [
    "ResolvableFunction",
    "ResolvableFunctionFromPath",
    "ResolvableFunctionFromValue",
    "resolvable_function",
    "resolve_function",
    "resolvers",
    "target_name",
]


@runtime_checkable
class ResolvableFunction(Protocol):
    """What a resolver returns: picklable, and ``resolve()`` gives the function to call."""

    def resolve(self) -> Callable[..., Any]: ...


class ResolvableFunctionFromPath(NamedTuple):
    """The function at ``path``: ``"package.module.function"``, or ``"torch.ops.aten.add.Tensor"``
    (attributes from ``torch`` down)."""

    path: str

    def resolve(self) -> Callable[..., Any]:
        first, _, rest = self.path.partition(".")
        if first == "torch":
            fn: Any = importlib.import_module("torch")
            for part in rest.split("."):
                fn = getattr(fn, part)
            return fn  # type: ignore[no-any-return]
        module, _, name = self.path.rpartition(".")
        fn = getattr(importlib.import_module(module), name)
        # a ``@remote``-decorated function: its module holds the wrapper, call the function
        return getattr(fn, "_remote_impl", fn)  # type: ignore[no-any-return]

    def __str__(self) -> str:
        return self.path


class ResolvableFunctionFromValue(NamedTuple):
    """A function sent as itself (by reference when importable, else by value)."""

    function: Callable[..., Any]

    def resolve(self) -> Callable[..., Any]:
        return self.function

    def __str__(self) -> str:
        return getattr(self.function, "__qualname__", None) or repr(self.function)


def _torch_resolver(target: Any) -> ResolvableFunction | None:
    torch = sys.modules.get("torch")  # a torch operator means torch was imported
    ops = getattr(torch, "_ops", None)
    if ops is not None and isinstance(target, (ops.OpOverload, ops.OpOverloadPacket)):
        return ResolvableFunctionFromPath(f"torch.ops.{target}")
    return None


def _string_resolver(target: Any) -> ResolvableFunction | None:
    if isinstance(target, str) and "." in target.strip("."):
        return ResolvableFunctionFromPath(target)
    return None


def _function_resolver(target: Any) -> ResolvableFunction | None:
    if not callable(target) or isinstance(target, type):
        return None
    # A ``@remote``-decorated module-level function: its module's name is bound to the
    # wrapper (``_remote_impl`` is the function), so send its path, as Monarch does.
    module = sys.modules.get(getattr(target, "__module__", None) or "")
    qualname = getattr(target, "__qualname__", "")
    if module is not None and module.__name__ != "__main__" and "." not in qualname:
        loader = type(getattr(module, "__loader__", None)).__module__
        bound = getattr(module, qualname, None)
        if "pytest" not in loader and getattr(bound, "_remote_impl", None) is target:
            return ResolvableFunctionFromPath(f"{module.__name__}.{qualname}")
    return ResolvableFunctionFromValue(target)


# Public and mutable (``danaus.function_resolvers``): consulted in order by ``remote``.
resolvers: list[Callable[[Any], ResolvableFunction | None]] = [
    _torch_resolver,
    _string_resolver,
    _function_resolver,
]


def resolvable_function(target: Any) -> ResolvableFunction:
    """``target`` if it is already resolvable, else what the first of ``resolvers`` that
    answers makes of it. Raises ``ValueError`` naming ``target`` when none does."""
    if isinstance(target, ResolvableFunction) and not callable(target):
        return target
    for resolver in resolvers:
        r = resolver(target)
        if r is not None:
            if not isinstance(r, ResolvableFunction):
                raise TypeError(
                    f"function resolver {resolver!r} turned {target!r} into {r!r}, which has "
                    "no resolve() method; a resolver returns None or a resolvable"
                )
            return r
    raise ValueError(
        f"Unsupported target for a remote call: {target!r}; remote() takes a function, a "
        "torch operator or a 'package.module.function' string, or a target one of "
        "danaus.function_resolvers turns into a resolvable"
    )


def resolve_function(target: Any) -> Callable[..., Any]:
    """The function a resolvable (a ``RunRemote``'s ``fn``) names, on the client or a
    worker. A plain function or a path string (older clients) is taken as is."""
    if isinstance(target, str):
        return ResolvableFunctionFromPath(target).resolve()
    resolve = getattr(target, "resolve", None)
    if resolve is not None and not callable(target):
        return resolve()  # type: ignore[no-any-return]
    return target  # type: ignore[no-any-return]


def target_name(target: Any) -> str:
    """How error messages name a remote function's target or resolvable."""
    if isinstance(target, str):
        return target
    if isinstance(target, (ResolvableFunctionFromPath, ResolvableFunctionFromValue)):
        return str(target)
    return getattr(target, "__qualname__", None) or repr(target)
