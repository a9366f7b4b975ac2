"""``OpaqueRef``: a reference to an object that lives only on the tensor-engine workers.

A remote function builds the object and returns ``OpaqueRef(obj)``; the client
gets a handle, passes it to later remote functions, and they read
``ref.value`` on each worker. The object never leaves its worker.

How it is carried (Monarch's design): an ``OpaqueRef`` is a pytree node whose
one leaf is its *key*, a small int64 tensor. On the worker, a table keyed
weakly by that tensor holds the object; the worker's tensor table holds the
key like any result, so the object lives until the client drops its handle
(the key is deleted, the table forgets the object). On the client the key is
a mesh ``Tensor``, so the handle travels through ``remote`` as a tensor does.
Pickled, any subclass becomes a plain ``OpaqueRef`` holding the same key.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import register_pytree_node
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["OpaqueRef", "mark_worker", "propagating"]

_key_table: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
_key_counter = itertools.count(1)
_worker = [False]  # this process holds a tensor-engine worker (``mark_worker``)
_local = threading.local()  # ``propagating``: this thread computes a propagation


def mark_worker() -> None:
    """This process runs a tensor-engine worker: OpaqueRefs may be made and read here."""
    _worker[0] = True


class propagating:  # used as a function: ``with propagating():``
    """The block computes a remote function's result shapes on the client: an
    ``OpaqueRef`` made there only stands for the workers' one. (A class, not a
    generator: it runs once per remote call.)"""

    __slots__ = ("_before",)

    def __enter__(self) -> None:
        self._before = getattr(_local, "on", False)
        _local.on = True

    def __exit__(self, *exc: object) -> None:
        _local.on = self._before


def _rebuild(create: Callable[[Any], OpaqueRef], leaves: list[Any]) -> OpaqueRef:
    return create(leaves[0])


class OpaqueRef:
    """A reference to an object that only the workers can read (Monarch's ``OpaqueRef``).

    Make it inside a remote function and return it; pass the handle the client
    gets to other remote functions, which read and write ``ref.value``::

        @remote(propagate=lambda: OpaqueRef(None))
        def build() -> OpaqueRef:
            return OpaqueRef(nn.Linear(3, 4))

        @remote(propagate=lambda ref, x: x.new_empty(x.shape[0], 4))
        def forward(ref: OpaqueRef, x: torch.Tensor) -> torch.Tensor:
            return ref.value(x)

        with procs.activate():
            model = build()
            y = forward(model, torch.rand(2, 3))

    Making one, or reading or writing ``value``, on the client raises
    ``RuntimeError``.
    """

    _key: Any

    def __init__(self, value: Any = None) -> None:
        self._key = torch.tensor(next(_key_counter), dtype=torch.int64)
        self._check("create")
        _key_table[self._key] = value

    @classmethod
    def _create(cls, key: Any) -> OpaqueRef:
        ref = cls.__new__(cls)
        ref._key = key
        return ref

    def __reduce_ex__(self, protocol: Any) -> Any:
        # the key only, as a plain OpaqueRef: a subclass degrades to this class
        return OpaqueRef._create, (self._key,)

    def __repr__(self) -> str:
        return f"OpaqueRef({self._key!r})"

    @property
    def value(self) -> Any:
        """The object, on a worker; ``RuntimeError`` on the client."""
        self._check("access")
        if getattr(_local, "on", False):
            raise RuntimeError(
                "the value of an OpaqueRef exists only on the workers, and this remote "
                "function is being run on the client to learn its result's shapes: give it "
                "remote(..., propagate=...)"
            )
        try:
            return _key_table[self._key]
        except KeyError:
            raise KeyError(
                f"{self!r} is not known on this worker: it was made on another proc, or its "
                "handle was dropped"
            ) from None

    @value.setter
    def value(self, v: Any) -> None:
        self._check("set")
        _key_table[self._key] = v

    def _check(self, what: str) -> None:
        if not (_worker[0] or getattr(_local, "on", False)):
            raise RuntimeError(
                f"Client is attempting to {what} an OpaqueRef. This can only be done in a "
                "remote function."
            )


def _flatten(ref: OpaqueRef) -> tuple[list[Any], Any]:
    return [ref._key], functools.partial(_rebuild, type(ref)._create)


def _unflatten(leaves: Any, context: Any) -> OpaqueRef:
    return context(list(leaves))  # type: ignore[no-any-return]


register_pytree_node(OpaqueRef, _flatten, _unflatten)

OpaqueRef.__module__ = "danaus"  # Monarch's top-level name; pickles name it there
