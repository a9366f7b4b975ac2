"""The client side of one proc mesh's tensor engine: its workers, ids and command stream.

One ``Engine`` per spawned proc mesh (shared by its slices), made at first
activation. It spawns one ``TensorWorker`` per proc on a flat view of all
the mesh's procs, so a worker's global rank is its proc's index in the mesh,
the same numbering every slice's ``Shape`` uses. Commands go out at once, in
the order they are issued, with ``broadcast`` (per-sender FIFO keeps them in
order with each other and with later fetches); the client never waits for
a worker. The engine also spawns the ``RendezvousStore`` actor the workers'
process groups meet through (``rendezvous``: no port of its own; only the job
reaches it, over danaus's authenticated connections).

    client ── run([cmds]) ──▶ worker r  (one per proc; refs: id -> tensor | Failure)
           ◀─ fetch(ids) ───
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import os
import pickle
import secrets
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .. import _config as config
from .._actor.api.actor import Actor
from .._actor.api.endpoint import endpoint
from .._actor.api.procs import ProcMesh, this_proc
from .._actor.core.context import Context, acting_as, context
from .._errors import SupervisionError
from .._mesh import Shape, Slice
from .._runtime.node import Node, this_node
from .client import ClientState
from .messages import CallOp, Delete, Reduce, ReduceMany
from .rendezvous import RendezvousStore
from .stream import get_active_stream
from .worker import TensorWorker

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = ["Engine", "engine_for", "flush_all"]

log = logging.getLogger("danaus.tensor")

# Guards each proc mesh's tensor_engine, made once (a lock, not state: one per process serves
# every session).
_create_lock = threading.Lock()


class _Engines:
    """The client's engines by token, for their owner actors to find (a part of its node)."""

    def __init__(self) -> None:
        self.by_token: weakref.WeakValueDictionary[str, Engine] = weakref.WeakValueDictionary()


def _engines(node: Node) -> weakref.WeakValueDictionary[str, Engine]:
    return node.part(_Engines).by_token


class _EngineOwner(Actor):
    """Spawns an engine's workers, so that their failures come here, not to the client.

    A dead worker makes every later use of its engine raise ``SupervisionError``
    (and fails the fetches waiting on it) instead of ending the program.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self._node = context().actor_instance._home()  # the client's: its engines are there

    @endpoint
    def spawn_workers(self, procs: ProcMesh, args: tuple[Any, ...]) -> Any:
        engine = _engines(self._node).get(self.token)
        if engine is not None:
            engine._sender = context()
        return procs.spawn("tensor_engine", TensorWorker, *args)

    def _handle_undeliverable_message(self, envelope: Any) -> bool:
        # Commands in flight to a worker that died: __supervise__ reports the death.
        return True

    def __supervise__(self, failure: Any) -> bool:
        engine = _engines(self._node).get(self.token)
        if engine is not None:
            engine.on_failure(failure)
        return True


class Engine:
    """The tensor-engine workers of one proc mesh and the client's bookkeeping for them."""

    def __init__(self, mesh: ProcMesh) -> None:
        procs = mesh._procs
        n = len(procs)
        self.device = _device()
        flat = ProcMesh(procs, Shape(["rank"], Slice.new_row_major([n])), mesh._state, None)
        token = secrets.token_hex(4)
        # The keys process groups rendezvous through, in an actor of the client: reached by
        # actor calls only, never by a listening port (issue 40, N1).
        self.store: Any = this_proc().spawn(f"tensor_engine_store_{token}", RendezvousStore)
        node = mesh._node()  # the node this engine belongs to: its mesh's
        _engines(node)[token] = self
        self.broken: SupervisionError | None = None
        self._sender: Context | None = None  # the owner's identity, set by spawn_workers
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._owner: Any = this_proc().spawn(f"tensor_engine_owner_{token}", _EngineOwner, token)
        timeout = config.get("tensor_collective_timeout")
        hosts = len(mesh._host_mesh) if mesh._host_mesh is not None else 1
        threads = config.get("tensor_threads") or max(1, (os.cpu_count() or 1) * hosts // n)
        args = (self.store, timeout, self.device.type, threads)
        spawn: Any = self._owner.spawn_workers
        self.workers = spawn.call_one(flat, args).get(timeout=config.get("tensor_spawn_timeout"))
        self.size = n
        self._ids = itertools.count(1)
        self._dead: dict[str, list[int]] = {}  # per stream
        self._live: dict[Any, tuple[int, str]] = {}  # weakref to handle -> (id, stream)
        self._lock = threading.Lock()  # guards broken and _pending
        self._queue: list[tuple[Shape, str, Any]] = []
        self._client = node.part(ClientState)
        self._holders = 0  # threads' open coalescing blocks holding ops for this engine
        # Guards _queue, _holders, closed and the swap of _dead; notified when one is queued.
        self._cond = threading.Condition()
        # Guards the order of sends, and what only a send touches (_targets, messages_sent).
        self._send_lock = threading.Lock()
        self._targets: dict[Shape, Any] = {}
        self.closed = False
        self.messages_sent = 0  # batches of commands broadcast (a statistic, for tests)
        self._delay = config.get("tensor_send_delay")
        self._max_delay = max(self._delay, config.get("tensor_send_max_delay"))
        self._batch = config.get("tensor_send_batch")
        self._sender_thread = threading.Thread(
            target=self._send_loop, name="danaus-tensor-send", daemon=True
        )
        self._sender_thread.start()

    def new_id(self) -> int:
        return next(self._ids)

    def track(self, handle: Any, ref: int, stream: str) -> None:
        """Release ``ref`` (on ``stream``) when ``handle`` is collected."""
        self._live[weakref.ref(handle, self._collected)] = (ref, stream)

    def _collected(self, wr: Any) -> None:
        entry = self._live.pop(wr, None)  # atomic; runs in a GC callback on any thread
        if entry is not None:
            self.release(*entry)

    def release(self, ref: int, stream: str = "main") -> None:
        """A handle was collected: its id goes to the workers (its stream) with the next batch."""
        if not self.closed:  # setdefault and append are atomic; may run in a GC callback
            self._dead.setdefault(stream, []).append(ref)

    @contextlib.contextmanager
    def as_owner(self) -> Iterator[None]:
        """Send as the owner actor: what cannot be delivered goes back to it, not the client.

        Every message to the workers is sent this way, so all share one sender
        and stay in order.
        """
        if self._sender is None:
            yield
            return
        with acting_as(self._sender):
            yield

    def targets(self, shape: Shape) -> Any:
        """The worker actors of the procs in ``shape`` (a mesh of this engine)."""
        t = self._targets.get(shape)
        if t is None:
            t = self._targets[shape] = self.workers._new_with_shape(shape)
        return t

    def on_failure(self, failure: Any) -> None:
        """A worker died: fail what waits on this engine and refuse what comes next."""
        self._break(failure.crashed_ranks, failure.reason, failure.mesh_name)

    def worker_lost(self, rank: int, exc: SupervisionError) -> None:
        """A call to the worker at ``rank`` failed with ``exc``: its proc is gone.

        Breaks the engine at once, as ``on_failure`` will when the supervision
        event reaches the owner: that event travels on its own and can come
        after the caller has already seen the failed call and moved on.
        """
        self._break([rank], exc.reason or str(exc), exc.actor)

    def _break(self, ranks: Any, reason: str, actor: str) -> None:
        err = SupervisionError(
            f"tensor engine worker(s) at rank(s) {ranks} failed: "
            f"{reason}. The tensors of this mesh are lost; spawn new procs to go on.",
            actor=actor,
            reason=reason,
            during="call",
        )
        with self._lock:
            if self.broken is not None:  # the first report stands
                return
            self.broken = err
            pending, self._pending = self._pending, set()
        for cf in list(pending):
            if not cf.done():
                try:
                    cf.set_exception(err)
                except concurrent.futures.InvalidStateError:
                    pass

    def check(self) -> None:
        """Raise the engine's ``SupervisionError`` if one of its workers has died.

        Raises ``RuntimeError`` once the mesh has been stopped.
        """
        if self.broken is not None:
            raise self.broken
        if self.closed:
            raise RuntimeError(
                "this mesh's procs were stopped (ProcMesh.stop()); its tensors are gone. "
                "Spawn new procs to go on"
            )

    def close(self) -> None:
        """The mesh stopped: end the sender thread, the rendezvous store and the owner actor.

        Idempotent; does not wait for the workers (they stop with their procs).
        """
        with self._cond:
            if self.closed:
                return
            self.closed = True
            self._queue.clear()
            self._cond.notify_all()
        if self._sender_thread is not threading.current_thread():
            self._sender_thread.join(timeout=5.0)
        self._dead.clear()
        self._targets.clear()
        for actor in (self.store, self._owner):
            try:
                actor.stop("the tensor engine's mesh stopped")
            except Exception:  # the client's runtime is already shutting down
                log.debug("stopping the tensor engine's %s failed", actor, exc_info=True)

    def watch(self, cf: concurrent.futures.Future[Any]) -> None:
        """Fail ``cf`` with ``SupervisionError`` if a worker dies before it completes."""
        with self._lock:
            if self.broken is None:
                self._pending.add(cf)
                cf.add_done_callback(self._pending.discard)
                return
        cf.set_exception(self.broken)

    def send(self, shape: Shape, *cmds: Any, stream: str | None = None) -> None:
        """Queue ``cmds`` for the workers of ``shape`` on ``stream`` (the active one), in order.

        Never waits. The engine's sender thread sends what has queued as soon
        as it can (consecutive commands for the same procs and stream go in
        one message); anything that waits for the workers (a fetch) first
        sends what is queued. Raises ``SupervisionError`` once a worker of this
        engine has died, ``RuntimeError`` once the mesh has stopped.
        """
        self.check()
        if stream is None:
            stream = get_active_stream().name
        held = self._client.holding()
        if held is not None:  # this thread's coalescing block holds them until it ends
            ops = held.get(self)
            if ops is None:
                with self._cond:
                    self._holders += 1
                ops = held[self] = []
            ops.extend((shape, stream, c) for c in cmds)
            return
        with self._cond:
            queue = self._queue  # under the lock: the sender swaps it for a new list
            if len(cmds) == 1:
                queue.append((shape, stream, cmds[0]))
            else:
                queue.extend((shape, stream, c) for c in cmds)
            n = len(queue)
            if n == len(cmds) or n - len(cmds) < self._batch <= n:
                self._cond.notify()

    def flush(self) -> None:
        """Send everything queued (and pending deletions) now, on this thread."""
        with self._send_lock, self.as_owner():
            self._send_queued()

    def send_held(self, ops: list[tuple[Shape, str, Any]]) -> None:
        """A thread's coalescing block ended: send the ops it held for this engine now,
        after what is queued, with the deletions no open block still waits on."""
        with self._send_lock, self.as_owner():
            with self._cond:
                self._holders -= 1
                if self.closed:
                    return
                self._queue.extend(ops)
            self._send_queued()

    def _send_queued(self) -> None:
        # Called with _send_lock held, so batches leave in the order they were taken.
        with self._cond:  # no command is queued between the two swaps
            if self.closed:
                return
            queued, self._queue = self._queue, []
            if self._holders:
                # an open block may hold ops that use ids dropped meanwhile: their deletion
                # leaves after the last such block's ops
                dead: dict[str, list[int]] = {}
            else:
                dead, self._dead = self._dead, {}
        # every command that uses a dead id was queued (on the id's stream) before it died
        for stream, ids in dead.items():
            queued.append((self.workers._shape, stream, Delete(tuple(ids))))
        i = 0
        while i < len(queued):
            shape, stream = queued[i][0], queued[i][1]
            j = i
            while j < len(queued) and queued[j][0] == shape and queued[j][1] == stream:
                j += 1
            self.targets(shape).run.broadcast(stream, _packed([c for _, _, c in queued[i:j]]))
            self.messages_sent += 1
            i = j

    def _send_loop(self) -> None:
        """The sender thread: waits for queued commands and sends them, batch by batch.

        After the first command it keeps gathering while the client keeps
        issuing (each ``tensor_send_delay`` brings more), until the client
        pauses, ``tensor_send_batch`` commands are queued or
        ``tensor_send_max_delay`` has passed: a training step's burst of ops
        then goes in one message per worker instead of several, and each
        message costs every worker an actor dispatch and a thread wake-up.
        """
        delay, batch = self._delay, self._batch
        while True:
            with self._cond:
                while not self._queue and not self.closed:
                    self._cond.wait()
                if delay > 0:
                    deadline = time.monotonic() + self._max_delay
                    seen = 0
                    while not self.closed and seen < len(self._queue) < batch:
                        seen = len(self._queue)  # send() wakes it early when the batch is full
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(min(delay, left))
                if self.closed:
                    return
            with self._send_lock, self.as_owner():
                self._send_queued()


# Commands made only of plain data (ids, numbers, strings, dtypes, sizes): a batch of
# them is pickled here with the C pickler, several times cheaper per command than the
# actor codec's (which calls into Python for every object, to find functions and
# large tensors). Ops that carry a local tensor's value go through the codec.
_PLAIN_COMMANDS = (CallOp, Delete, Reduce, ReduceMany)
_VALUE_CARRIERS = {"aten::lift_fresh", "aten::lift_fresh_copy", "aten::lift"}


def flush_all() -> None:
    """Send what every live engine has queued (a coalescing block opens), and wake its
    sender."""
    node = this_node(start=False)
    if node is None:  # no node: no engine, and nothing to start one for
        return
    for engine in list(_engines(node).values()):
        try:
            engine.flush()
        except Exception:  # its mesh is gone, say: its tensors' next use says so
            log.exception("tensor engine: sending what a coalescing block held failed")
        finally:
            with engine._cond:
                engine._cond.notify()


def _packed(cmds: list[Any]) -> Any:
    """``cmds`` as pickled bytes when all are plain commands, else ``cmds`` itself."""
    for c in cmds:
        if type(c) not in _PLAIN_COMMANDS or (type(c) is CallOp and c.op in _VALUE_CARRIERS):
            return cmds
    try:
        return pickle.dumps(cmds, protocol=5)
    except Exception:  # something unusual in an op's arguments: the codec knows more
        return cmds


def _device() -> torch.device:
    """The device workers keep shards on, as the client sees it (``tensor_device``)."""
    kind = config.get("tensor_device")
    if kind not in ("auto", "cpu", "cuda"):
        raise ValueError(f"setting tensor_device is {kind!r}; it must be 'auto', 'cpu' or 'cuda'")
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    # On the client a CUDA shard is on "cuda:0": torch's autograd engine needs an index to
    # run a backward pass over them. Each worker reads any CUDA device as its own GPU.
    return torch.device("cuda", 0) if kind == "cuda" else torch.device(kind)


def engine_for(mesh: ProcMesh) -> Engine:
    """The engine of ``mesh``'s procs, spawning its workers at first use. Does not block.

    Raises ``TypeError`` if ``mesh`` is not a ``ProcMesh``.
    """
    if not isinstance(mesh, ProcMesh):
        raise TypeError(
            f"expected a ProcMesh (from this_host().spawn_procs(...)), got {mesh!r}; "
            "tensors live on proc meshes"
        )
    state = mesh._state
    engine = state.tensor_engine
    if engine is None or engine.closed:
        with _create_lock:
            engine = state.tensor_engine
            if engine is None or engine.closed:
                if state.stopped:
                    raise RuntimeError(
                        f"{mesh!r} was stopped (ProcMesh.stop()); tensors need running procs. "
                        "Spawn new procs to go on"
                    )
                engine = state.tensor_engine = Engine(mesh)
    return engine  # type: ignore[no-any-return]
