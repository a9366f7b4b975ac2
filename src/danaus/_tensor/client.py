"""The client's tensor-engine state, in one place: a part of the client's node.

Process-wide (every thread sees the same): the stack of active meshes and
their activations (``stack``, ``acts``), so that autograd's backward pass,
which torch may run on another thread, sees the mesh its forward used.
Per thread (``here()``): whether a ``coalescing()`` block is open on it and
the ops that block holds, so a block on one thread neither holds nor refuses
another thread's work. The part belongs to the node, so ending the node
drops all of it and a new node in the same process starts clean.

The dispatch mode is not kept here: torch keeps it, per thread (see
``active``). A thread torch runs work on for another (autograd's device
threads inherit the caller's modes) acts for that thread
(``acting_for``): its ops join the caller's coalescing block.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from .._runtime.node import this_node

__all__ = ["ClientState", "ThreadState", "active_mesh", "same_mesh", "state", "state_if_started"]


class ThreadState:
    """One thread's tensor-engine state: its open ``coalescing()`` blocks and their ops."""

    __slots__ = ("__weakref__", "depth", "held")

    def __init__(self) -> None:
        self.depth = 0  # open coalescing blocks (nested ones count)
        self.held: dict[Any, list[tuple[Any, str, Any]]] = {}  # engine -> (shape, stream, cmd)


class ClientState:
    """The client's tensor-engine state (``node.part(ClientState)``)."""

    def __init__(self) -> None:
        self.stack: list[Any] = []  # active meshes (``None`` is ``no_mesh``)
        self.acts: list[Any] = []  # their ``Activation``s
        self.lock = threading.Lock()  # guards stack, acts and _threads
        self._local = threading.local()
        self._threads: weakref.WeakKeyDictionary[threading.Thread, ThreadState] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def mesh(self) -> Any:
        stack = self.stack
        return stack[-1] if stack else None

    def here(self) -> ThreadState:
        """The calling thread's state (made on first use)."""
        try:
            return self._local.state  # type: ignore[no-any-return]
        except AttributeError:
            rec = self._local.state = ThreadState()
            with self.lock:
                self._threads[threading.current_thread()] = rec
            return rec

    def coalescing(self) -> bool:
        """Whether a ``coalescing()`` block is open on the calling thread."""
        rec = getattr(self._local, "state", None)
        return rec is not None and rec.depth > 0

    def holding(self) -> dict[Any, list[tuple[Any, str, Any]]] | None:
        """The calling thread's held ops by engine, if a block is open on it, else ``None``."""
        rec = getattr(self._local, "state", None)
        return rec.held if rec is not None and rec.depth > 0 else None

    @contextlib.contextmanager
    def acting_for(self, thread: threading.Thread) -> Iterator[None]:
        """The calling thread's work counts as ``thread``'s until the block ends."""
        with self.lock:
            rec = self._threads.get(thread)
        local = self._local
        prev = getattr(local, "state", None)
        if rec is None:  # that thread has no state here: nothing to act for
            yield
            return
        local.state = rec
        try:
            yield
        finally:
            if prev is None:
                del local.state
            else:
                local.state = prev


def state() -> ClientState:
    """The client's tensor-engine state (starts the client's node if needed)."""
    return this_node().part(ClientState)


def state_if_started() -> ClientState | None:
    """The client's tensor-engine state, if a node has started (never starts one)."""
    node = this_node(start=False)
    return None if node is None else node.part(ClientState)


def active_mesh() -> Any:
    """The active proc mesh, or ``None`` (none, or ``no_mesh``). Does not block; cheap."""
    state = state_if_started()
    if state is None:
        return None
    stack = state.stack
    return stack[-1] if stack else None


def same_mesh(a: Any, b: Any) -> bool:
    """Whether two proc meshes are the same procs with the same named dimensions."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    return bool(a._state is b._state and a._shape == b._shape)
