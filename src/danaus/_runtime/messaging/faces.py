"""What the parts of messaging need of the runtime that holds them, as Protocols.

The runtime (``runtime.Runtime``) builds the offload, the cast tree's router and the
relay and hands each itself; each part types it as the narrow face below, so no
part imports the runtime, not even for annotations, and the graph of imports has
no cycle. The runtime satisfies every face (mypy checks it where it builds them).
Members are read-only: a part reads the runtime's, it never replaces them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from ..._wire.ids import ProcId

__all__ = ["OffloadRuntime", "RelayRuntime", "TreeRuntime"]


class _Base(Protocol):
    """What every part uses: who this proc is, handlers by kind, and sending."""

    @property
    def proc_id(self) -> ProcId: ...

    @property
    def register(self) -> Callable[..., None]: ...

    @property
    def _dispatch(self) -> Callable[..., None]: ...


class OffloadRuntime(_Base, Protocol):
    """What ``offload.Offloader`` uses of the runtime."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def lost_callbacks(self) -> list[Callable[[str, str], None]]: ...

    @property
    def ports(self) -> dict[int, Any]: ...

    @property
    def send(self) -> Callable[..., None]: ...

    @property
    def bounce(self) -> Callable[..., None]: ...

    @property
    def notify_room(self) -> Callable[..., None]: ...

    @property
    def undeliverable(self) -> Callable[..., None]: ...


class TreeRuntime(_Base, Protocol):
    """What ``tree.TreeRouter`` (and its gathers, ``gathers.GatherRuntime``) use."""

    @property
    def handlers(self) -> dict[Any, Any]: ...

    @property
    def ports(self) -> dict[int, Any]: ...

    @property
    def router(self) -> Any: ...  # routing.Router: deliver_call

    @property
    def send(self) -> Callable[..., None]: ...

    @property
    def bounce(self) -> Callable[..., None]: ...

    @property
    def reply(self) -> Callable[..., int]: ...

    @property
    def resolve(self) -> Callable[[ProcId], ProcId]: ...

    @property
    def is_lost(self) -> Callable[[str], str | None]: ...

    @property
    def open_port(self) -> Callable[..., Any]: ...

    @property
    def close_port(self) -> Callable[[int], None]: ...

    @property
    def watch(self) -> Callable[..., str | None]: ...

    @property
    def unwatch(self) -> Callable[..., None]: ...


class RelayRuntime(_Base, Protocol):
    """What ``relay.Relay`` uses of the runtime: links, listeners and the loop."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def host(self) -> str: ...

    @property
    def transport(self) -> Any: ...  # _transport.Transport: its inproc registry

    @property
    def tcp_advertise(self) -> str | None: ...

    @property
    def call_soon(self) -> Callable[..., None]: ...

    @property
    def dial(self) -> Callable[..., Any]: ...

    @property
    def _dialing(self) -> Callable[..., Any]: ...

    @property
    def _on_conn_closed(self) -> Callable[..., Any]: ...

    @property
    def accept_relayed(self) -> Callable[..., Any]: ...

    @property
    def advertise_via(self) -> Callable[[str], None]: ...

    @property
    def open_relay_port(self) -> Callable[..., Any]: ...

    @property
    def close_relay_port(self) -> Callable[..., None]: ...

    @property
    def peer_lost(self) -> Callable[..., None]: ...

    @property
    def notify_room(self) -> Callable[..., None]: ...
