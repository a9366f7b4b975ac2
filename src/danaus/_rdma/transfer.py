"""Running transfers: check the handles with their owners, then copy on worker threads.

One `Transfer` runs one ``read_into`` / ``write_from`` or one
``RDMAAction`` batch. Each owner's operations take one of three routes:
this process (a memmove), another process of this host (``process_vm``), or
a process on another host (TCP, ``net.py``)::

    caller thread   validate arguments, group the ops by owner, arm the deadline
    I/O thread      same host: RDMA_CHECK to the owner (skipped when it is this process);
                    other host: RDMA_DATA (where its data server is; asked once);
                    the reply, or the owner's loss, arrives here
    worker threads  the copies: process_vm_readv/writev (or memmove for our own
                    buffers), a large one split across threads, in chunks
    net threads     other host: FETCH / STORE requests on pooled data connections,
                    a large copy split across several connections
    any of them     the first failure, or the deadline, completes the future;
                    unfinished copies stop at their next chunk, and data
                    connections still in use are shut down

Nothing runs on the owner's actor threads, and nothing waits without a
deadline: the owner's proc is watched for the whole transfer (its loss
fails the future at once), and the deadline fails it with ``TimeoutError``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .._actor.core import telemetry
from .._actor.core.collect import Collector, decode_reply, set_future
from .._actor.core.future import Future
from .._errors import InternalError, SupervisionError
from .._runtime.messaging.runtime import Runtime
from .._runtime.node import Node
from .._transport.auth import AuthError
from .._wire.ids import PortId, ProcId
from .._wire.protocol import Message, RdmaCheck, RdmaData, RdmaRelease
from . import backend as _backend
from . import cuda, net, plane, vm
from .copies import CopyThreads, copy_bytes, entry, served
from .copies import parts as copy_parts
from .errors import RDMAError, RDMATamperedError
from .failures import cuda_error, os_error, owner_lost
from .net import DataClient
from .op import BufferRef, Op
from .registry import BufferRegistry

__all__ = ["CopyThreads", "Op", "Transfer", "check_timeout", "same_host"]


def same_host(buf: BufferRef, rt: Runtime) -> bool:
    """True if ``process_vm`` can reach ``buf``'s owner from this process.

    The owner must run under this kernel and pid namespace *and* on this
    runtime host: the host token is what the runtime goes by to pick a Unix
    socket over TCP, so a worker of another host on this machine (a
    ``ProcessJob``, a network namespace) is another host here too.
    """
    if buf._host != vm.host_key():
        return False
    token = next((e[5:] for e in buf._owner_proc.addr.split(";") if e.startswith("host:")), None)
    return token is None or token == rt.host


def check_timeout(timeout: Any) -> float:
    """``timeout`` as a float, or ``ValueError`` saying what is accepted."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    t = float(timeout)
    if not (t > 0 and t < float("inf")):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    return t


# -- worker threads ------------------------------------------------------------------


# -- one transfer ---------------------------------------------------------------------


class Transfer:
    """Runs ``ops`` in parallel; ``start()`` returns a Future that fails with the first error.

    ``lazy()`` returns that Future without starting: the transfer starts when the
    Future is first waited for (``get``, ``await``, ``as_asyncio``), which is when
    Monarch starts the coroutine behind its transfer futures.
    """

    def __init__(self, node: Node, ops: list[Op], timeout: float, what: str) -> None:
        self.ops = ops
        self.timeout = timeout
        self.what = what
        self.cf: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._lock = threading.Lock()  # guards _left and _socks (against cf completing)
        self._left = 0  # owner checks and copy parts not yet done
        self._timer: Any = None
        self._rt: Runtime | None = None
        self._node = node  # the node of the process that copies (the public call's)
        self._net: DataClient | None = None  # the node's data connections (other hosts)
        self._deadline = 0.0  # time.monotonic() at which the transfer times out
        self._socks: set[socket.socket] = set()  # data connections in use (other hosts)

    def lazy(self) -> Future[None]:
        return Future._lazy(self.cf, self._begin, self.what)

    def start(self) -> Future[None]:
        self._begin()
        return Future._create(self.cf, self.what)

    def _begin(self) -> None:
        node = self._node
        rt = self._rt = node.runtime
        self._deadline = time.monotonic() + self.timeout
        groups: dict[tuple[str, int, str], list[Op]] = {}
        for op in self.ops:
            group = (op.buf._owner_proc.name, op.buf._pid, op.buf._backend)
            groups.setdefault(group, []).append(op)
        self._left = len(groups)
        if not groups:
            self.cf.set_result(None)
            return
        telemetry.transfer_started(self.cf, self.what, sum(op.nbytes for op in self.ops))
        rt.call_soon(self._arm)
        self.cf.add_done_callback(lambda _: self._disarm_soon())
        self.cf.add_done_callback(lambda _: self._shut_sockets())
        me = (rt.proc_id.name, os.getpid())
        for (name, pid, backend), ops in groups.items():
            key = (name, pid)
            if backend != _backend.BUILTIN:  # another backend moves these bytes (NIXL)
                self._start_backend(backend, key == me, ops)
            elif key == me:
                memory = node.part(BufferRegistry)
                answers, lease_id, regs = memory.lease([entry(op) for op in ops])
                # ``regs`` keeps the memory alive until the copies are done, even if the
                # node ends meanwhile and forgets the lease.
                release = functools.partial(_release_local, memory, lease_id, regs)
                self._checked(ops, answers, local=True, release=release)
            elif same_host(ops[0].buf, rt) and not any(served(op) for op in ops):
                self._check_remote(rt, ops)
            else:
                self._start_net(rt, key, ops)

    def _start_backend(self, name: str, own: bool, ops: list[Op]) -> None:
        """Hand the ops on one owner's buffers to the backend that moves them (backend.py)."""
        try:
            backend = plane.for_name(name, self._node)
        except RuntimeError as e:
            op = ops[0]
            self._fail(RDMAError(f"{self._label(op)} failed: {e}", buffer=str(op.buf),
                                 owner=op.buf.owner))  # fmt: skip
            return
        group = _backend.Group(
            ops=ops,
            owner_is_me=own,
            deadline=self._deadline,
            over=self.cf.done,
            fail=self._fail,
            finish=self._part_done,
            on_end=lambda fn: self.cf.add_done_callback(lambda _: fn()),
            label=self._label,
            unusable=self._unusable,
            owner_lost=lambda op, why, cause: owner_lost(self._label(op), op.buf, why, cause),
        )
        backend.run(group, self._node)

    # -- deadline (I/O thread) --

    def _arm(self) -> None:
        if self.cf.done() or self._rt is None:
            return
        self._timer = self._rt.loop.call_later(self.timeout, self._expire)

    def _disarm_soon(self) -> None:
        rt = self._rt
        if rt is None or rt.closed:
            return
        try:
            rt.call_soon(self._disarm)
        except RuntimeError:  # the loop is closed: nothing left to cancel
            pass

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.cf.done():
            return
        self._fail(self._timeout_error())

    def _timeout_error(self) -> TimeoutError:
        return TimeoutError(
            f"{self.what} timed out after {self.timeout:g} s (waiting for "
            f"{self._pending_text()}); it may have moved part of the bytes"
        )

    def _pending_text(self) -> str:
        bufs = sorted({str(op.buf) for op in self.ops})
        return ", ".join(bufs[:3]) + (f" and {len(bufs) - 3} more" if len(bufs) > 3 else "")

    # -- owner checks --

    def _check_remote(self, rt: Runtime, ops: list[Op]) -> None:
        owner = ops[0].buf._owner_proc

        def on_value(index: int, ok: bool, value: Any) -> None:
            if ok:
                answers, lease_id = value
                release = _Once(
                    lambda: (
                        rt.send(owner, RdmaRelease((lease_id,)), on_fail=_ignore)
                        if lease_id is not None
                        else None
                    )
                )
                self._checked(ops, list(answers), local=False, release=release)
            elif isinstance(value, SupervisionError):
                reason = value.reason or str(value)
                self._fail(owner_lost(self._label(ops[0]), ops[0].buf, reason, value))
            else:
                self._fail(value)

        coll = Collector(rt, f"the RDMA check of {ops[0].buf}", 1, on_value)
        coll.expect(0, owner)
        if self.cf.done():
            return
        entries = tuple(entry(op) for op in ops)
        rt.send(
            owner,
            RdmaCheck(entries, coll.port, 0, self._deadline),
            on_fail=lambda reason: coll.fail(0, reason),
        )

    def _checked(
        self,
        ops: list[Op],
        answers: list[str | None],
        *,
        local: bool,
        release: Callable[[], Any],
    ) -> None:
        """The owner answered for ``ops``: fail on the first bad handle, else copy.

        The owner pinned the buffers (a lease) if every answer was good;
        ``release`` ends the pin once every copy has returned, whatever the
        outcome, so a ``drop()`` on the owner never frees memory under a copy.
        """
        for op, why in zip(ops, answers, strict=True):
            if why is not None:
                release()
                self._fail(self._unusable(op, why))
                return
        if self.cf.done():
            release()
            return
        parts = [(op, off, n) for op in ops for off, n in copy_parts(op)]
        if not parts:
            release()
        finished = _Countdown(len(parts), release)
        pool = self._node.part(CopyThreads).pool
        self._launch(pool, self._run_part, [(*part, local, finished) for part in parts], finished)

    def _unusable(self, op: Op, why: str) -> RDMAError:
        return RDMAError(
            f"{self._label(op)} failed: the buffer cannot be used: {why} (its "
            f"owner {op.buf.owner} no longer holds the memory). A buffer cannot "
            "be used after drop(); register the memory again with RDMABuffer(data)",
            buffer=str(op.buf),
            owner=op.buf.owner,
        )

    def _launch(
        self,
        pool: Any,
        run: Callable[..., None],
        parts: list[Any],
        finished: Callable[[], None] | None = None,
    ) -> None:
        """Run ``run(*part)`` for every part on ``pool``; the group they replace is done.

        ``finished()`` is called once for each part that could not be started.
        """
        with self._lock:
            self._left += len(parts) - 1
            last = self._left == 0
        for i, part in enumerate(parts):
            try:
                pool.submit(run, *part)
            except RuntimeError as e:  # the interpreter is shutting down
                self._fail(RDMAError(f"{self.what} failed: {e}", buffer=str(part[0].buf)))
                if finished is not None:
                    for _ in parts[i:]:
                        finished()
                return
        if last:
            set_future(self.cf, True, None)

    def _part_done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            set_future(self.cf, True, None)

    # -- other hosts: data connections (net threads) --

    def _start_net(self, rt: Runtime, key: tuple[str, int], ops: list[Op]) -> None:
        """Watch the owner for the whole transfer; learn its data server; then send parts."""
        if self.cf.done():
            return
        client = self._net = self._node.part(DataClient)
        owner = rt.peers.resolve(ops[0].buf._owner_proc)
        watch = _OwnerWatch(self, rt, owner, key, ops)
        self.cf.add_done_callback(lambda _: watch.close())
        reason = rt.peers.watch(owner, watch.port.port)
        if reason is not None:
            watch.peer_lost(owner.name, reason)
            return
        if client.known_address(key) is not None:
            self._net_parts(key, ops)
            return
        rt.send(
            owner,
            RdmaData(watch.port, 0),
            on_fail=lambda reason: watch.peer_lost(owner.name, reason),
        )

    def _net_parts(self, key: tuple[str, int], ops: list[Op]) -> None:
        if self.cf.done():
            return
        parts = [(op, off, n, key) for op in ops for off, n in net.split(op.nbytes)]
        assert self._net is not None
        self._launch(self._net.executor(), self._run_net_part, parts)

    def _run_net_part(self, op: Op, off: int, n: int, key: tuple[str, int]) -> None:
        if self.cf.done():
            return
        rt, client = self._rt, self._net
        assert rt is not None and client is not None

        def move(addr: int, o: int, k: int) -> bool:
            client.request(
                key, rt.secret, self._deadline, self._track, self._untrack,
                net.STORE if op.write else net.FETCH, entry(op), o, addr, k,
            )  # fmt: skip
            return True

        local = op.local
        try:
            if not isinstance(local, cuda.CudaMemory):
                move(local.addr + off, off, n)
            elif not cuda.staged_copy(op.write, local, off, n, move, self._stop, net.CHUNK):
                return  # stopped: the transfer failed or timed out
        except net.Refused as e:
            self._fail(self._unusable(op, str(e)))
            return
        except net.Tampered as e:
            tampered = RDMATamperedError(
                f"{self._label(op)} failed: {e}. The data connection to the owner "
                f"{op.buf.owner} (proc {op.buf._owner_proc.name}) carried bytes that someone "
                "on the network path changed; none of them reached the destination. Turn on "
                "TLS (DANAUS_TLS_*) or fix the path",
                buffer=str(op.buf),
                owner=op.buf.owner,
            )
            tampered.__cause__ = e
            self._fail(tampered)
            return
        except AuthError as e:
            self._fail(
                RDMAError(
                    f"{self._label(op)} failed: the data connection to the owner {op.buf.owner} "
                    f"(proc {op.buf._owner_proc.name}) failed authentication: {e}. Both ends "
                    "must use the same job secret",
                    buffer=str(op.buf),
                    owner=op.buf.owner,
                )
            )
            return
        except (net.Closed, ConnectionResetError, BrokenPipeError, ConnectionRefusedError) as e:
            if not self.cf.done():  # else: we shut the connection down ourselves
                why = f"its process exited during the transfer (the data connection broke: {e})"
                self._fail(owner_lost(self._label(op), op.buf, why, e))
            return
        except OSError as e:  # includes a connect that timed out
            if self.cf.done():
                return
            if time.monotonic() >= self._deadline:
                self._fail(self._timeout_error())
                return
            err = RDMAError(
                f"{self._label(op)} failed: the data connection to the owner {op.buf.owner} "
                f"(proc {op.buf._owner_proc.name}) failed: {e}",
                buffer=str(op.buf),
                owner=op.buf.owner,
            )
            err.__cause__ = e
            self._fail(err)
            return
        except Exception as e:  # CUDA refused, or a bug
            self._fail_copy(op, e)
            return
        self._part_done()

    def _track(self, sock: socket.socket) -> bool:
        """Note a data connection in use; False if the transfer is already over."""
        with self._lock:
            if self.cf.done():
                return False
            self._socks.add(sock)
            return True

    def _untrack(self, sock: socket.socket) -> bool:
        """Done with ``sock``; False if the transfer ended (and shut it down) meanwhile."""
        with self._lock:
            if sock in self._socks:
                self._socks.discard(sock)
                return True
            return False

    def _shut_sockets(self) -> None:
        """The transfer is over: wake every net thread still blocked on a connection."""
        with self._lock:
            socks, self._socks = self._socks, set()
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- copies (worker threads) --

    def _run_part(
        self, op: Op, off: int, n: int, local: bool, finished: Callable[[], None]
    ) -> None:
        try:
            self._copy_part(op, off, n, local)
        finally:
            finished()  # the owner's pin ends once every part has stopped touching it

    def _stop(self) -> bool:
        """Give up between chunks: the transfer failed, or its deadline passed (the
        owner's pin expires after the deadline, so no chunk may start after it)."""
        return self.cf.done() or time.monotonic() >= self._deadline

    def _copy_part(self, op: Op, off: int, n: int, local: bool) -> None:
        if self._stop():
            return
        assert self._rt is not None
        try:
            finished = copy_bytes(op, off, n, local, self._stop, self._node, self._rt)
        except OSError as e:
            self._fail(os_error(self._label(op), op.buf, e))
            return
        except Exception as e:  # CUDA refused, or a bug
            self._fail_copy(op, e)
            return
        if finished:
            self._part_done()

    def _fail(self, error: BaseException) -> None:
        set_future(self.cf, False, error)

    def _fail_copy(self, op: Op, e: Exception) -> None:
        """Fail for ``e``, raised by a copy of ``op`` and by none of the errors its caller
        knows: CUDA refused it (torch raises ``RuntimeError``), or else a bug."""
        if isinstance(e, RuntimeError):
            self._fail(cuda_error(self._label(op), op, e))
        else:  # pragma: no cover - a bug
            self._fail(InternalError(f"{self.what} failed unexpectedly: {e!r}"))

    def _label(self, op: Op) -> str:
        """Names ``op`` in an error: the op itself, within its batch if there is one."""
        return op.describe() if len(self.ops) == 1 else f"{self.what}: {op.describe()}"


class _OwnerWatch:
    """A port that hears the owner's data address and, until the transfer ends, its loss."""

    def __init__(
        self, transfer: Transfer, rt: Runtime, owner: ProcId, key: tuple[str, int], ops: list[Op]
    ) -> None:
        self.transfer = transfer
        self.rt = rt
        self.owner = owner
        self.key = key
        self.ops = ops
        self.answered = False
        self.port: PortId = rt.router.open_port(self)

    def deliver(self, frame: Message) -> None:  # I/O thread: the answer to RDMA_DATA
        if self.answered:
            return
        self.answered = True
        t, op = self.transfer, self.ops[0]
        ok, value = decode_reply(frame, f"the RDMA data address of {op.buf}")
        if not ok:
            t._fail(value)
            return
        host, port, why = value
        if why is not None:
            t._fail(
                RDMAError(
                    f"{t._label(op)} failed: the owner {op.buf.owner} (proc {self.owner.name}) "
                    f"cannot serve it to another host: {why}",
                    buffer=str(op.buf),
                    owner=op.buf.owner,
                )
            )
            return
        client = t._net
        assert client is not None
        client.remember_address(self.key, (host, port))
        t._net_parts(self.key, self.ops)

    def peer_lost(self, proc: str, reason: str) -> None:
        t, op = self.transfer, self.ops[0]
        t._fail(owner_lost(t._label(op), op.buf, reason))

    def close(self) -> None:
        self.rt.router.close_port(self.port.port)
        self.rt.peers.unwatch([self.owner.name], self.port.port)


class _Countdown:
    """Calls ``fn`` when it has been called ``n`` times (from any threads)."""

    def __init__(self, n: int, fn: Callable[[], Any]) -> None:
        self._n = n
        self._fn = fn
        self._lock = threading.Lock()  # guards _n, the calls still due

    def __call__(self) -> None:
        with self._lock:
            self._n -= 1
            last = self._n == 0
        if last:
            self._fn()


class _Once:
    """Calls ``fn`` the first time it is called."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn: Callable[[], Any] | None = fn
        self._lock = threading.Lock()  # guards _fn, taken by the first call

    def __call__(self) -> None:
        with self._lock:
            fn, self._fn = self._fn, None
        if fn is not None:
            fn()


def _ignore(reason: str) -> None:
    pass


def _release_local(memory: BufferRegistry, lease_id: int | None, regs: Any) -> None:
    memory.release(lease_id)
