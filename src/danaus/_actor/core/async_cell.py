"""``AsyncActorCell``: the cell of an async actor, whose items run on an event loop.

The actor's thread runs an event loop. Calls to a ``@concurrent_endpoint``
start at once, each body a task of its own; every other item (calls, hooks,
the stop) runs on one serial task, each to completion before the next, in the
order the inbox gave them, as Monarch 0.7 does. Only the serial task's waits
block the actor (``ActorCell.waits``): a concurrent body may wait while others
run. At the stop, the concurrent bodies still running are cancelled and
awaited first (their cancellation is not a failure: their callers hear "was
stopped").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ... import _config as config
from ..._runtime.node import Node
from ..._wire.protocol import Message
from . import owned, telemetry
from .cell import ActorCell
from .inbox import HookItem, Item, Stop
from .invoke import Invocation, invoke_async

__all__ = ["AsyncActorCell", "new_cell"]


def new_cell(
    node: Node,
    mesh_id: str,
    rank: int,
    spawn: Message,
    on_exit: Callable[[ActorCell], None],
) -> ActorCell:
    """The cell for the actor ``spawn`` makes: an async actor's or a sync one's."""
    cls = AsyncActorCell if spawn.header.mode == "async" else ActorCell
    return cls(node, mesh_id, rank, spawn, on_exit)


class AsyncActorCell(ActorCell):
    """An async actor living in this proc (the module doc)."""

    def _new_loop(self) -> asyncio.AbstractEventLoop | None:
        # Called by the base's __init__, before it starts the actor's thread: the loop,
        # and the concurrent endpoints' bodies that will run on it.
        self._tasks: set[asyncio.Task[Any]] = set()
        return asyncio.new_event_loop()

    def _serve(self, cls: type | None, args: Any, kwargs: Any) -> None:
        loop = self.inbox.loop
        assert loop is not None
        if cls is not None:
            asyncio.set_event_loop(loop)
        loop.run_until_complete(self._amain(cls, args, kwargs))
        self.inbox.close_loop()

    async def _amain(self, cls: type | None, args: Any, kwargs: Any) -> None:
        """Dispatch: concurrent endpoints start at once, everything else runs in order."""
        if cls is not None:
            self._construct(cls, args, kwargs)
        loop = self.inbox.loop
        assert loop is not None
        serial: asyncio.Queue[Item] = asyncio.Queue()
        worker = loop.create_task(self._serial(serial))
        self.serial_task = worker  # only its waits block the actor (concurrent tasks' do not)
        next_item = self.inbox.next_async
        while True:
            item = await next_item()
            if type(item) is Message and self._is_concurrent(item):
                try:
                    call = self._prepare(item)
                except BaseException as e:
                    self.fate.internal_error(item, e)
                    continue
                if call is not None:
                    task = loop.create_task(self._handle_async(call))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                continue
            serial.put_nowait(item)
            if type(item) is Stop:
                break
        await worker

    def _is_concurrent(self, frame: Message) -> bool:
        prop = self.endpoints.get(frame.header.method)
        return prop is not None and prop.concurrent and self.fate.failed is None

    async def _serial(self, serial: asyncio.Queue[Item]) -> None:
        """Run the non-concurrent items one at a time, each to completion."""
        fate = self.fate
        while True:
            if serial.empty():
                # idle now: replies held for a batched write go out
                self.rt.transport.batching.flush_held()
            item = await serial.get()
            if type(item) is Message:
                try:
                    call = self._prepare(item)
                    if call is not None:
                        await self._handle_async(call)
                except BaseException as e:  # a bug of ours: fail loudly, never die silently
                    fate.internal_error(item, e)
            elif type(item) is Stop:
                await self._cancel_tasks()
                # Waiting for the children must not block this actor's event loop. Only
                # when there are any: at interpreter exit (an actor of the client stopped
                # by the at-exit handler) the default executor can no longer start.
                inst = self.ctx_instance
                if inst is not None and any(owned.owned_by(self.node, inst.actor_id)):
                    await asyncio.get_running_loop().run_in_executor(
                        None, self._stop_children, item.reason
                    )
                exc = None if fate.failed is None else fate.fail_exc
                await self.hooks.cleanup_async(self.instance, exc)
                self._finish(item, cleanup=False)
                return
            else:
                assert isinstance(item, HookItem)
                await self.hooks.run_async(self.instance, item)
            if fate.failed is not None and not self.hooks.cleaned:
                deadline = time.monotonic() + config.get("stop_proc_timeout")
                stopping = fate.owned_stopping
                while stopping is not None and stopping.is_alive() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)  # the meshes it owned stop first
                await self.hooks.cleanup_async(self.instance, fate.fail_exc)

    async def _handle_async(self, call: Invocation) -> None:
        active = telemetry.endpoint_span(self, call.prop, call.carried) if call.carried else None
        self.meter.running = call.prop.name
        self._settle(call, await invoke_async(self.instance, call), active)

    async def _cancel_tasks(self) -> None:
        """Cancel the bodies of concurrent endpoints still running (before __cleanup__).

        Waits until every body has finished, its cancellation handlers included.
        """
        self.stopping = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
