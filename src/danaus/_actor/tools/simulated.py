"""A simulated large mesh: thousands of procs as lightweight objects in this process.

Each simulated proc is a real `Runtime` (its
peers, ports, cast tree router and mailboxes are the real ones) that talks
over the in-process transport (``inproc:NAME``, ``danaus._transport.inproc``)
instead of a socket. All of them share one event loop on one thread, and
each hosts one actor whose endpoints run on that thread (a shared executor,
not a thread per actor): sync endpoints only, and no actor ``context()``.
The client reaches them with its ordinary runtime and ordinary
[`ActorMesh`][danaus.actor.ActorMesh] adverbs, so a cast to 8,192 simulated ranks runs exactly
the tree forwarding and gathering code that real procs run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ... import _config as config
from ..._mesh import Shape, Slice
from ..._mesh.tree import Selection
from ..._runtime.messaging.runtime import STATUS_EXC, STATUS_OK, Runtime
from ..._runtime.node import this_node
from ..._transport.address import host_token
from ..._wire import codec
from ..._wire.ids import ProcId
from ..._wire.protocol import Cast, Message
from ..api.mesh import ActorMesh, MeshRef
from ..core.endpoints import endpoints_of
from ..core.failing import exception_payload

__all__ = ["SimulatedMesh"]

T = TypeVar("T")


class _SimCell:
    """The mailbox of a simulated actor: runs each call inline on the shared loop."""

    def __init__(self, rt: Runtime, instance: Any) -> None:
        self.rt = rt
        self.instance = instance
        self.endpoints = endpoints_of(type(instance))
        self.calls = 0

    def deliver(self, frame: Message, sender: ProcId | None) -> None:
        h = frame.header
        self.calls += 1
        try:
            args, kwargs = codec.loads(frame.body, frame.buffers)
            result = self.endpoints[h.method].fn(self.instance, *args, **kwargs)
            status = STATUS_OK
        except BaseException as e:  # it belongs to the caller, as in a real actor
            result, status = exception_payload(e), STATUS_EXC
        if h.port is not None:
            self.rt.reply(h.port, h.slot, status, result)


class SimulatedMesh:
    """``n`` simulated procs (``sizes`` gives the mesh's dimensions), one actor of
    ``cls(*args, **kwargs)`` each; `mesh` is an ordinary [`ActorMesh`][danaus.actor.ActorMesh].

    Blocks until all are up. ``close()`` (or ``with``) takes them down:

        with SimulatedMesh(Counter, {"hosts": 512, "gpus": 16}) as sim:
            sim.mesh.incr.broadcast()
            values = sim.mesh.value.call().get()
    """

    def __init__(
        self,
        cls: type,
        sizes: dict[str, int],
        *args: Any,
        name: str = "sim",
        **kwargs: Any,
    ) -> None:
        if not sizes or any(not isinstance(v, int) or v < 1 for v in sizes.values()):
            raise ValueError(f"sizes must map dimension names to sizes >= 1, got {sizes!r}")
        # The client (or actor) that builds it reaches it, and is reached back, in-process.
        client = this_node().runtime
        client.listen_inproc()
        self._transport = client.transport  # its in-process network: the procs join it
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="danaus-sim", daemon=True)
        self.thread.start()
        self._token = secrets.token_hex(3)
        self.mesh_id = f"sim{self._token}"
        n = 1
        for v in sizes.values():
            n *= v
        self.runtimes: list[Runtime] = []
        self.cells: list[_SimCell] = []

        def build() -> None:
            for rank in range(n):
                rt = self._runtime(f"s{self._token}-{rank}")
                inst: Any = object.__new__(cls)
                inst.__init__(*args, **kwargs)
                cell = _SimCell(rt, inst)
                rt.router.mailboxes[(self.mesh_id, rank)] = cell
                self.runtimes.append(rt)
                self.cells.append(cell)

        self.on_loop(build)
        procs = tuple(rt.proc_id for rt in self.runtimes)
        ref = MeshRef(self.mesh_id, name, cls, procs, None)
        self.mesh: ActorMesh[Any] = ActorMesh(
            ref, Shape(list(sizes), Slice.new_row_major(list(sizes.values())))
        )

    def _runtime(self, name: str) -> Runtime:
        rt = Runtime(
            name, "", host=host_token(), loop=self.loop, inproc=True, transport=self._transport
        )
        rt.start(in_thread=False)
        return rt

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the simulated procs' thread and return its result (blocks)."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:
                done.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return done.result()

    def instance(self, rank: int) -> Any:
        """The actor object of ``rank`` (read it through `on_loop()`)."""
        return self.cells[rank].instance

    def kill(self, rank: int) -> None:
        """Take proc ``rank`` down as if its process died: its peers see EOF."""

        def down() -> None:
            rt = self.runtimes[rank]
            rt.close()
            for conn in rt.links.all_connections():
                conn.close()

        self.on_loop(down)

    def sender(self) -> SimSender:
        """Another sender: a simulated proc outside the mesh that casts to it."""
        return SimSender(self, self.on_loop(lambda: self._runtime(f"s{self._token}-sender")))

    def close(self) -> None:
        """Close every simulated proc and stop their thread. Idempotent."""
        if not self.loop.is_running():
            return

        def down() -> None:
            for rt in self.runtimes:
                rt.close()

        self.on_loop(down)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)

    def __enter__(self) -> SimulatedMesh:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SimSender:
    """A simulated proc that broadcasts to a simulated mesh through the same cast tree
    code as an adverb (``TreeRouter.cast``)."""

    def __init__(self, sim: SimulatedMesh, rt: Runtime) -> None:
        self.sim = sim
        self.rt = rt

    def broadcast(self, method: str, *args: Any, mesh: ActorMesh[Any] | None = None) -> None:
        """``mesh.method.broadcast(*args)`` from this proc (``mesh`` defaults to the whole)."""
        mesh = mesh if mesh is not None else self.sim.mesh
        selection = Selection.of(mesh._shape.ndslice)
        labels, sizes = mesh._labels_sizes()
        procs: Sequence[ProcId] = mesh._ref.procs
        header = Cast(
            mesh._ref.mesh_id,
            mesh._ref.name,
            method,
            None,
            False,
            selection.to_wire(),
            0,
            len(procs),
            config.get("tree_fanout"),
            None,
            labels,
            sizes,
            None,
            (),
            0,
            0,
        )
        body, bufs = codec.dumps((args, {}))
        self.rt.tree.cast(procs, selection, header, body, bufs)
