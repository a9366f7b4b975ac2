"""Where process groups meet: a ``torch.distributed.Store`` carried on actor messages.

A ``TCPStore`` listens on every interface and takes no secret: any process
that reaches its port (another user of the host, another host) can list,
read, set, delete and block its keys, and so join or break the job's process
groups. The rendezvous here opens no port at all: its keys live in an actor
(``RendezvousStore``), and each member's ``torch.distributed.Store`` (made by
``actor_store``) sends it one call per operation, over danaus's own
connections: Unix sockets in the user's private directory on one host,
TCP authenticated with the job secret (and TLS where configured) across
hosts. Only the job can reach it, as it can reach any of its actors:

    member proc (gloo, NCCL)                       the owner's proc
      PrefixStore ─▶ ActorStore.get(k) ── call ──▶ RendezvousStore.get(k, timeout)
                                       ◀─ reply ──  (waits until k is set or timeout)

torch calls a Python ``Store`` subclass from its own threads (gloo's and
NCCL's rendezvous), through the ``PythonStore`` trampoline: ``set``, ``get``,
``add``, ``compare_set``, ``wait``, ``check``, ``append``, ``multi_get``,
``multi_set``. ``delete_key`` and ``num_keys`` are answered here too, though
torch 2.13's trampoline does not forward them from C++ (a ``PrefixStore``
over this store raises for them; gloo and NCCL never use them).

No torch at import: the actor needs none, and ``actor_store`` imports it.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import threading
from typing import Any

from .._actor.api.actor import Actor
from .._actor.api.endpoint import concurrent_endpoint
from .._actor.core.context import acting_as, context

__all__ = ["RendezvousStore", "actor_store"]

# How much longer than the store's own wait a member waits for the answer: the
# round trip, on a loaded machine.
_REPLY_GRACE = 10.0


class RendezvousStore(Actor):
    """The keys of one rendezvous (``str -> bytes``), served to the members by calls.

    Every endpoint is concurrent: a ``get`` or ``wait`` for a key not yet set
    waits (up to the timeout it is given) without holding up the ``set`` that
    will end it. ``get``/``wait``/``multi_get`` answer ``None``/``False`` on a
    timeout; the member's store turns that into ``DistStoreError``.
    """

    _danaus_internal = True  # infrastructure, not one of the caller's children

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._changed: asyncio.Event | None = None  # set (and replaced) at every change

    def _touch(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _until(self, keys: list[str], timeout: float) -> bool:
        """Whether every key of ``keys`` is set within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not all(k in self._keys for k in keys):
            left = deadline - loop.time()
            if left <= 0:
                return False
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return False
        return True

    @concurrent_endpoint
    async def store_set(self, key: str, value: bytes) -> None:
        self._keys[key] = bytes(value)
        self._touch()

    @concurrent_endpoint
    async def store_get(self, key: str, timeout: float) -> bytes | None:
        return self._keys[key] if await self._until([key], timeout) else None

    @concurrent_endpoint
    async def store_multi_get(self, keys: list[str], timeout: float) -> list[bytes] | None:
        return [self._keys[k] for k in keys] if await self._until(keys, timeout) else None

    @concurrent_endpoint
    async def store_multi_set(self, keys: list[str], values: list[bytes]) -> None:
        self._keys.update(zip(keys, map(bytes, values), strict=True))
        self._touch()

    @concurrent_endpoint
    async def store_add(self, key: str, amount: int) -> int:
        value = int(self._keys.get(key, b"0")) + amount
        self._keys[key] = str(value).encode()
        self._touch()
        return value

    @concurrent_endpoint
    async def store_append(self, key: str, value: bytes) -> None:
        self._keys[key] = self._keys.get(key, b"") + bytes(value)
        self._touch()

    @concurrent_endpoint
    async def store_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """``TCPStore``'s semantics: set ``desired`` if the key holds ``expected`` (or is
        missing and ``expected`` is empty); the key's value afterwards (``expected`` if
        it is missing and stays so)."""
        current = self._keys.get(key)
        if (current is None and not expected) or current == expected:
            self._keys[key] = bytes(desired)
            self._touch()
            return bytes(desired)
        return current if current is not None else bytes(expected)

    @concurrent_endpoint
    async def store_wait(self, keys: list[str], timeout: float) -> bool:
        return await self._until(keys, timeout)

    @concurrent_endpoint
    async def store_check(self, keys: list[str]) -> bool:
        return all(k in self._keys for k in keys)

    @concurrent_endpoint
    async def store_delete_key(self, key: str) -> bool:
        found = self._keys.pop(key, None) is not None
        self._touch()
        return found

    @concurrent_endpoint
    async def store_num_keys(self) -> int:
        return len(self._keys)


def actor_store(server: Any, timeout: float) -> Any:
    """A ``torch.distributed.Store`` whose keys are those of ``server`` (a
    ``RendezvousStore`` mesh of one actor): pass it (or a ``PrefixStore`` over it)
    to a process group, or to ``init_process_group(store=...)``.

    Each operation blocks its thread for one call to ``server``; one that waits for
    keys waits at most ``timeout`` seconds (or the ``timeout`` torch passes), then
    raises ``torch.distributed.DistStoreError``. A lost server raises
    ``SupervisionError`` at once.

    Make it where its calls should come from (in an actor's endpoint or constructor:
    they are sent as that actor, from any thread). Keep a reference to the returned
    store for as long as torch may use it: a ``PrefixStore`` or process group holds
    only its C++ side, and once the Python object is collected every operation
    fails ("Not implemented").

    ``store.close(why)`` gives up on the rendezvous: every operation waiting then,
    and every later one, raises ``DistStoreError`` at once. A process group being
    built over the store then fails at once instead of waiting out its timeout
    (for a member that will never come) inside torch's C++.
    """
    return _store_class()(server, timeout)


@functools.cache
def _store_class() -> type[Any]:
    import torch.distributed as dist

    def _seconds(t: Any) -> float:
        return t.total_seconds() if isinstance(t, datetime.timedelta) else float(t)

    class ActorStore(dist.Store):  # type: ignore[misc,name-defined]
        """A member's side of a ``RendezvousStore``; see ``actor_store``."""

        def __init__(self, server: Any, timeout: float) -> None:
            super().__init__()
            self._server = server
            # Calls go out as whoever made the store (the worker or replica actor), from
            # whatever thread torch runs them on: a stream thread must not become the
            # proc's root (whose name would then prefix that thread's log records).
            self._sender = context()
            self.set_timeout(datetime.timedelta(seconds=timeout))
            self._lock = threading.Lock()
            self._closed: str | None = None  # why, once closed
            self._waiting: set[threading.Event] = set()

        def close(self, why: str = "closed") -> None:
            """Fail every operation waiting now, and every later one (see ``actor_store``)."""
            with self._lock:
                if self._closed is not None:
                    return
                self._closed = why
                waiting = list(self._waiting)
            for ev in waiting:
                ev.set()

        def _closed_error(self) -> Exception:
            return dist.DistStoreError(f"rendezvous store closed: {self._closed}")

        def _call(self, name: str, *args: Any, wait: float = 0.0) -> Any:
            endpoint = getattr(self._server, name)
            woken = threading.Event()
            with self._lock:
                if self._closed is not None:
                    raise self._closed_error()
                self._waiting.add(woken)
            try:
                with acting_as(self._sender):
                    fut = endpoint.call_one(*args)
                fut.add_done_callback(lambda _: woken.set())
                woken.wait(wait + _REPLY_GRACE)
            finally:
                with self._lock:
                    self._waiting.discard(woken)
            if not fut.done():
                if self._closed is not None:
                    raise self._closed_error()
                raise TimeoutError(
                    f"rendezvous store: no answer to {name} within {wait + _REPLY_GRACE} s"
                )
            return fut.get(timeout=0)

        def _timed_out(self, keys: list[str], wait: float) -> Exception:
            return dist.DistStoreError(
                f"rendezvous store: keys {keys!r} were not set within {wait} s "
                "(a member of the process group did not join in time)"
            )

        def set(self, key: str, value: Any) -> None:
            self._call("store_set", key, _bytes(value))

        def get(self, key: str) -> bytes:
            wait = _seconds(self.timeout)
            got = self._call("store_get", key, wait, wait=wait)
            if got is None:
                raise self._timed_out([key], wait)
            return got  # type: ignore[no-any-return]

        def multi_get(self, keys: list[str]) -> list[bytes]:
            wait = _seconds(self.timeout)
            got = self._call("store_multi_get", list(keys), wait, wait=wait)
            if got is None:
                raise self._timed_out(list(keys), wait)
            return got  # type: ignore[no-any-return]

        def multi_set(self, keys: list[str], values: list[Any]) -> None:
            self._call("store_multi_set", list(keys), [_bytes(v) for v in values])

        def add(self, key: str, amount: int) -> int:
            return self._call("store_add", key, int(amount))  # type: ignore[no-any-return]

        def append(self, key: str, value: Any) -> None:
            self._call("store_append", key, _bytes(value))

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            return self._call(  # type: ignore[no-any-return]
                "store_compare_set", key, _bytes(expected), _bytes(desired)
            )

        def wait(self, keys: list[str], timeout: Any = None) -> None:
            wait = _seconds(self.timeout if timeout is None else timeout)
            if not self._call("store_wait", list(keys), wait, wait=wait):
                raise self._timed_out(list(keys), wait)

        def check(self, keys: list[str]) -> bool:
            return self._call("store_check", list(keys))  # type: ignore[no-any-return]

        def delete_key(self, key: str) -> bool:
            return self._call("store_delete_key", key)  # type: ignore[no-any-return]

        def num_keys(self) -> int:
            return self._call("store_num_keys")  # type: ignore[no-any-return]

        def has_extended_api(self) -> bool:
            return True  # append, multi_get, multi_set: one call each

    return ActorStore


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
