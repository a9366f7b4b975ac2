"""The data plane across hosts: registered bytes over a dedicated, authenticated TCP connection.

When a buffer's owner runs on another host, ``process_vm_readv`` cannot reach
it, so its bytes travel over TCP. Not over the message connection: over a
*data connection* of their own, served by threads of the data plane (never
an actor thread, never the I/O thread), that sends straight from the
registered memory and receives straight into the destination::

    requester (caller thread)                      owner
      RDMA_DATA(port, 0) ───── message conn ─────► I/O thread: start the data server once
                 ◄──────── REPLY((host, port)) ──    (a listener and an accept thread)
    requester (net worker threads)
      connect, HMAC handshake ── data conn ──────► a data thread per connection
      FETCH(id, addr, size, off, n) ─────────────►   look the id up in the registry,
      into dst ◄──────────── status | n bytes ───   send from the registered memory
      STORE(id, addr, size, off, n) | n bytes ───►   into the registered memory,
                     ◄─────── status ─────────────   then the status

- The data server's address is asked once per owner process (frame kind
  ``RDMA_DATA``, answered on the owner's I/O thread) and cached.
- Connections are authenticated with the job secret exactly like the
  runtime's (``_transport/auth.py``: mutual HMAC-SHA256 challenge-response
  before any request is read), and kept in a small pool per owner for reuse.
  With TLS on (``DANAUS_TLS_*``) they are TLS too, which protects every byte;
  without it every request, response and payload chunk carries an HMAC tag
  under the connection's session key (``auth.Session``), checked before a
  request is acted on: an injected, replayed or spliced STORE never writes a
  byte.
- Without TLS, a payload is received chunk by chunk (``CHUNK`` bytes) into a
  scratch buffer of the receiving thread, each chunk's tag is checked there,
  and only a verified chunk is copied into the destination (the owner's
  registered memory for a STORE, the requester's for a FETCH): bytes altered
  on the way never become visible, and memory stays bounded however large
  the transfer. A failed check fails the transfer with :class:`Tampered`
  (the owner reports one on a STORE's payload with the status ``TAMPERED``);
  the verified chunks before the altered one have landed, like the bytes
  before a connection that breaks. (With TLS, TLS checks each record before
  its bytes are handed over, so payloads go straight to the destination.)
- The server bounds what an unauthenticated peer costs: a deadline for the
  whole handshake, at most ``rdma_max_data_threads`` connection threads (beyond
  that a new connection is closed at once, unserved, and the requester tries
  again, backing off, within its transfer's time), and an accept loop that
  backs off when out of descriptors or threads instead of dying.
- A transfer is split into a few parts, each on its own connection, so a
  large copy uses several streams (and cores) at once.
- Nothing waits forever: the requester shuts its sockets down when its
  transfer fails or times out (a blocked ``recv`` returns at once), and the
  owner's data threads end when their connection does.

Wire format (little-endian), after the handshake::

    request   u8 op | u64 buffer id | u64 addr | u64 size | u64 offset | u64 nbytes | tag
              (STORE: followed by the payload)
    response  u8 status | u32 message length | message (utf-8) | tag
              (FETCH with status OK: followed by the payload)
    payload   nbytes bytes in chunks of CHUNK bytes (the last one shorter), each | tag

``tag`` is 32 bytes of HMAC under the session key (absent with TLS or without
a secret: then the payload is its nbytes bytes, back to back); each tag also
covers a per-direction sequence number, so chunks cannot be dropped,
reordered or replayed. ``status`` is OK, REFUSED (the message says why) or
TAMPERED (a STORE's payload failed its tag check at the owner; the owner
closes the connection after the response).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import queue
import random
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _config as config
from .._runtime import node as _node
from .._runtime.messaging.runtime import STATUS_OK, Runtime
from .._runtime.node import Node
from .._transport import tls
from .._transport.auth import TAG, AuthError, Handshake, Session
from .._wire.protocol import Kind, Message
from . import cuda, registry
from .registry import BufferRegistry, Registration

__all__ = [
    "CHUNK",
    "FETCH",
    "STORE",
    "DataClient",
    "DataServer",
    "Refused",
    "Tampered",
    "connect",
    "install",
    "split",
]

log = logging.getLogger("danaus.rdma")


FETCH, STORE = 1, 2
_OK, _REFUSED, _TAMPERED = 0, 1, 2
_REQ = struct.Struct("<BQQQQQ")
_RESP = struct.Struct("<BI")

SPLIT_MIN = 8 << 20  # a copy at least this large is split across ``rdma_streams`` connections
PART_MIN = 4 << 20  # ... into parts of at least this many bytes
POOL_MAX = 16  # idle connections kept per owner
MAX_MESSAGE = 64 << 10  # the longest refusal message a requester reads
_DRAIN = 1 << 20
_REFUSAL = bytes(32)  # in place of the server's MAC: fails the client's check
CHUNK = 256 << 10  # payload bytes per tag: what a receiver stages before it copies
ALTERED = "tag check failed: the data was altered on the way"
_BATCH = 16  # chunks sealed, then sent in one system call


class Refused(Exception):
    """The owner refused a request (the buffer was dropped, ...); ``str`` says why."""


class Closed(ConnectionError):
    """The data connection ended in the middle of a request (EOF)."""


class Tampered(AuthError):
    """A tag check failed after the handshake: bytes were altered (or injected, dropped,
    reordered) on the way between the two ends. ``str`` starts with :data:`ALTERED`.

    Not a wrong secret (the handshake had succeeded), and not a lost owner.
    ``at``: the offset in the payload of the chunk that failed (None: not a payload's).
    """

    at: int | None = None


class Unserved(Closed):
    """The owner closed a new data connection before its first byte: every data thread of
    its server was busy (``rdma_max_data_threads``), or its process is going away."""


def split(nbytes: int) -> list[tuple[int, int]]:
    """``(offset, length)`` parts of a copy: one, or up to ``rdma_streams`` for a large copy."""
    if nbytes < SPLIT_MIN:
        return [(0, nbytes)] if nbytes else []
    n = max(1, min(config.get("rdma_streams"), nbytes // PART_MIN))
    step = -(-nbytes // n)
    step = (step + 4095) & ~4095
    return [(off, min(step, nbytes - off)) for off in range(0, nbytes, step)]


def _view(addr: int, nbytes: int) -> memoryview:
    """A writable byte view of ``nbytes`` of this process's memory at ``addr`` (no copy).

    The caller keeps the object that owns the memory alive while it uses the view.
    """
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        opt = getattr(socket, name, None)
        if opt is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)
            except OSError:  # pragma: no cover - a platform without it
                pass


def _send_all(sock: socket.socket, parts: list[Any]) -> None:
    """Send ``parts`` back to back, in as few system calls as the kernel allows."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg on TLS
        for v in views:
            sock.sendall(v)
        return
    while views:
        sent = sock.sendmsg(views)
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; ``Closed`` on EOF before it is full."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise Closed(f"the peer closed the data connection ({got} of {n} bytes received)")
        got += k


def _handshake(
    sock: socket.socket, secret: bytes | None, role: Any, deadline: float
) -> Session | None:
    """Run the job-secret handshake on a blocking socket (as the runtime's connections do),
    all of it before ``deadline`` (``time.monotonic()``); returns the session, if any.

    Raises ``TimeoutError`` past the deadline, :class:`AuthError` on a wrong answer.
    """
    if secret is None:
        return None
    hs = Handshake(secret, role)
    first = hs.start()
    if first:
        sock.sendall(first)
    heard = False  # anything from the peer yet
    while not hs.done:
        buf = bytearray(hs.want())
        view, got = memoryview(buf), 0
        while got < len(buf):  # a byte at a time must not stretch the deadline
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the data connection's handshake took too long")
            sock.settimeout(left)
            k = sock.recv_into(view[got:])
            if k == 0:
                if role == "client" and not heard:
                    raise Unserved("the owner's data server closed the connection unserved")
                raise Closed("the peer closed the data connection during the handshake")
            got += k
            heard = True
        try:
            out = hs.feed(bytes(buf))
        except AuthError:
            if role == "server":
                # Say so instead of just closing: to the client, a bare EOF means that
                # the owner's process is gone, this means "wrong secret" (a bad MAC).
                sock.sendall(_REFUSAL)
            raise
        if out:
            sock.sendall(out)
    return hs.session()


def _seal(session: Session | None, parts: list[Any]) -> list[Any]:
    return parts if session is None else [*parts, session.seal(parts)]


def _verify(session: Session, head: Any, data: Any, tag: Any, what: str) -> None:
    """Check the tag of the next frame received; :class:`Tampered` (naming ``what``) if not."""
    try:
        session.check(head, data, tag)
    except AuthError as e:
        raise Tampered(f"{ALTERED} ({what} did not match its tag)") from e


def _check(
    sock: socket.socket, session: Session | None, head: bytes, what: str = "a frame"
) -> None:
    """Read the tag that follows ``head`` and check it; :class:`Tampered` if it does not match."""
    if session is not None:
        _verify(session, head, b"", _recv_exact(sock, TAG), what)


def _chunks(nbytes: int) -> int:
    return -(-nbytes // CHUNK)


def payload_size(nbytes: int, session: Session | None) -> int:
    """Bytes on the wire for a payload of ``nbytes`` (its tags included)."""
    return nbytes + (TAG * _chunks(nbytes) if session is not None else 0)


def _send_payload(
    sock: socket.socket, session: Session | None, head: list[Any], view: memoryview
) -> None:
    """Send ``head`` (sealed frames), then ``view`` as a payload: chunk by chunk, each with
    its tag (bare without a session), ``_BATCH`` chunks per system call."""
    if session is None:
        _send_all(sock, [*head, view])
        return
    parts = head
    for off in range(0, len(view), CHUNK):
        chunk = view[off : off + CHUNK]
        parts += [chunk, session.seal([chunk])]
        if len(parts) >= 2 * _BATCH:
            _send_all(sock, parts)
            parts = []
    _send_all(sock, parts)


# A per-thread cache, not state: each thread's staging buffer (see _scratch_buffer).
_scratch = threading.local()


def _scratch_buffer() -> memoryview:
    """This thread's staging buffer: one chunk and its tag (kept for the thread's life)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = memoryview(bytearray(CHUNK + TAG))
    return buf


def _recv_payload(sock: socket.socket, session: Session | None, view: memoryview) -> None:
    """Receive a payload into ``view``; only verified bytes are ever written to it.

    With a session, each chunk and its tag land in a scratch buffer first and
    the chunk is copied into ``view`` once its tag matches; :class:`Tampered`
    at the first chunk that does not (``.at``: its offset; the chunks before
    it are in ``view``, it and those after are not). Without one (TLS, or no
    secret), straight into ``view``.
    """
    if session is None:
        _recv_into(sock, view)
        return
    scratch = _scratch_buffer()
    n = len(view)
    for off in range(0, n, CHUNK):
        k = min(CHUNK, n - off)
        staged = scratch[: k + TAG]
        _recv_into(sock, staged)
        try:
            _verify(
                session, b"", staged[:k], staged[k:],
                f"payload bytes {off}..{off + k} of {n}, chunk {off // CHUNK}",
            )  # fmt: skip
        except Tampered as e:
            e.at = off
            raise
        view[off : off + k] = staged[:k]


# -- the owner's side: the data server --------------------------------------------------


class _Server:
    """A listener on the runtime's TCP interface and one daemon thread per connection."""

    def __init__(self, rt: Runtime, memory: BufferRegistry) -> None:
        # The same interface the runtime's authenticated TCP listener is bound to.
        bind = rt.tcp_bind
        if bind is None or rt.tcp_advertise is None:
            raise RuntimeError(
                f"proc {rt.proc_id.name} does not listen on TCP, so no other host can reach it"
            )
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self.rt = rt
        self.memory = memory  # the registered memory it serves
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind, 0))
        self.sock.listen(128)
        self.address = (rt.tcp_advertise, self.sock.getsockname()[1])
        self.pid = os.getpid()
        threading.Thread(target=self._accept, name="danaus-rdma-accept", daemon=True).start()

    def close(self) -> None:
        """Stop accepting (the accept thread ends); connections being served go on."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self.sock.close()

    def _accept(self) -> None:
        backoff = 0.0
        slots = threading.BoundedSemaphore(config.get("rdma_max_data_threads"))
        while True:
            try:
                s, _ = self.sock.accept()
            except OSError as e:
                if self.sock.fileno() < 0 or e.errno not in _OUT_OF_RESOURCES:
                    return  # the listener is closed (or shut down)
                backoff = _pause(backoff)  # out of descriptors: wait, do not spin
                continue
            if not slots.acquire(blocking=False):
                _close(s)  # every thread is busy: refuse rather than grow without bound
                continue
            try:
                threading.Thread(
                    target=_serve,
                    args=(s, self.rt.secret, slots, self.memory),
                    name="danaus-rdma-data",
                    daemon=True,
                ).start()
            except RuntimeError:  # "can't start new thread": shed this one, go on
                slots.release()
                _close(s)
                backoff = _pause(backoff)
                continue
            backoff = 0.0


_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _pause(backoff: float) -> float:
    """Sleep a little longer each time (the accept thread only), up to a second."""
    backoff = min(1.0, max(0.01, 2 * backoff))
    time.sleep(backoff)
    return backoff


def _serve(
    sock: socket.socket,
    secret: bytes | None,
    slots: threading.BoundedSemaphore,
    memory: BufferRegistry,
) -> None:
    """Answer the requests of one data connection until it closes (a data thread)."""
    try:
        _tune(sock)
        deadline = time.monotonic() + config.get("handshake_timeout")
        ctx = tls.server_context()
        if ctx is not None:
            sock.settimeout(config.get("handshake_timeout"))
            sock = ctx.wrap_socket(sock, server_side=True)
        session = _handshake(sock, secret, "server", deadline)
        if ctx is not None:
            session = None  # TLS protects every byte
        sock.settimeout(None)
        head = bytearray(_REQ.size)
        while True:
            try:
                _recv_into(sock, memoryview(head))
            except Closed:
                return
            _check(sock, session, bytes(head), "a request")  # before anything is looked up
            op, buffer_id, addr, size, offset, nbytes = _REQ.unpack(head)
            if op not in (FETCH, STORE):
                return  # not our protocol: close
            # Pinned for this request: a drop() meanwhile waits until it is answered.
            answers, lease_id, regs = memory.lease([(buffer_id, addr, size)])
            why = answers[0]
            reg = regs[0] if regs else None
            try:
                if not _answer(sock, session, op, reg, why, offset, nbytes):
                    return
            finally:
                memory.release(lease_id)
    except (OSError, AuthError):
        pass  # the requester went away or failed the handshake: it hears from its side
    finally:
        slots.release()
        try:
            sock.close()
        except OSError:  # pragma: no cover
            pass


def _answer(
    sock: socket.socket,
    session: Session | None,
    op: int,
    reg: Registration | None,
    why: str | None,
    offset: int,
    nbytes: int,
) -> bool:
    """Serve one FETCH or STORE of a pinned registration (or refuse it, saying why).

    False when the connection is to be closed (a STORE's payload was altered).
    """
    if reg is not None and offset + nbytes > reg.nbytes:
        why = f"a request for bytes {offset}..{offset + nbytes} is out of range"
    elif reg is not None and op == STORE and reg.readonly:
        why = "it is read-only"
    if why is not None or reg is None:
        if op == STORE:
            _drain(sock, payload_size(nbytes, session))
            if session is not None:
                for _ in range(_chunks(nbytes)):
                    session.skip_recv()  # the payload's tags: its bytes are thrown away
        msg = (why or "it is not registered").encode()[:MAX_MESSAGE]
        _send_all(sock, _seal(session, [_RESP.pack(_REFUSED, len(msg)) + msg]))
        return True
    if not reg.memory.host:  # GPU memory: staged through pinned host memory (cuda.py)
        return _answer_device(sock, session, op, reg, offset, nbytes)
    # ``reg`` holds the memory alive while we use it, even if dropped meanwhile.
    view = _view(reg.addr + offset, nbytes) if nbytes else memoryview(b"")
    try:
        if op == FETCH:
            _send_payload(sock, session, _seal(session, [_RESP.pack(_OK, 0)]), view)
            return True
        # The request was authentic; each chunk's own tag catches bytes altered on
        # the way, before the chunk is copied into the registered memory.
        try:
            _recv_payload(sock, session, view)
        except Tampered as e:
            # Read the rest (its length is authentic) so that the requester, still
            # sending, hears why instead of a reset; then close: the path is hostile.
            end = min(nbytes, (e.at or 0) + CHUNK)
            _drain(sock, payload_size(nbytes, session) - payload_size(end, session))
            msg = f"the owner's {e}".encode()[:MAX_MESSAGE]
            _send_all(sock, _seal(session, [_RESP.pack(_TAMPERED, len(msg)) + msg]))
            return False
        _send_all(sock, _seal(session, [_RESP.pack(_OK, 0)]))
        return True
    finally:
        del view, reg


def _answer_device(
    sock: socket.socket,
    session: Session | None,
    op: int,
    reg: Registration,
    offset: int,
    nbytes: int,
) -> bool:
    """:func:`_answer` for a CUDA registration: the same bytes on the wire, the payload
    staged chunk by chunk through pinned host memory (a whole number of ``CHUNK``s each,
    so the tags fall where they would for host memory)."""
    mem = reg.memory
    assert isinstance(mem, cuda.CudaMemory)
    try:
        return _answer_device_staged(sock, session, op, mem, offset, nbytes)
    except RuntimeError as e:  # CUDA failed here: close, so the requester fails at once
        log.warning("serving %s bytes of %s failed in CUDA: %s", nbytes, mem.kind, e)
        return False


def _answer_device_staged(
    sock: socket.socket,
    session: Session | None,
    op: int,
    mem: cuda.CudaMemory,
    offset: int,
    nbytes: int,
) -> bool:
    if op == FETCH:
        _send_all(sock, _seal(session, [_RESP.pack(_OK, 0)]))
        cuda.serve_fetch(
            mem, offset, nbytes, lambda view: _send_payload(sock, session, [], view), CHUNK
        )
        return True

    def recv(view: memoryview, at: int) -> None:
        try:
            _recv_payload(sock, session, view)
        except Tampered as e:
            e.at = at + (e.at or 0)
            raise

    try:
        cuda.serve_store(mem, offset, nbytes, recv, CHUNK)
    except Tampered as e:
        end = min(nbytes, (e.at or 0) + CHUNK)
        _drain(sock, payload_size(nbytes, session) - payload_size(end, session))
        msg = f"the owner's {e}".encode()[:MAX_MESSAGE]
        _send_all(sock, _seal(session, [_RESP.pack(_TAMPERED, len(msg)) + msg]))
        return False
    _send_all(sock, _seal(session, [_RESP.pack(_OK, 0)]))
    return True


def _drain(sock: socket.socket, nbytes: int) -> None:
    scratch = memoryview(bytearray(min(nbytes, _DRAIN) or 1))
    left = nbytes
    while left:
        k = sock.recv_into(scratch, min(left, len(scratch)))
        if k == 0:
            raise Closed("the requester closed the data connection")
        left -= k


class DataServer:
    """The node's part for the data plane: its data server, started on first use.

    Closed with the node (``shutdown_context()``), so a client that starts
    again gets a new server and the old listener does not outlive its session.
    """

    def __init__(self) -> None:
        self.server: _Server | None = None

    def address(self, rt: Runtime, memory: BufferRegistry) -> tuple[str, int]:
        """Where the server of ``memory`` (the node's registered memory) listens."""
        if self.server is None or self.server.pid != os.getpid() or self.server.rt is not rt:
            self.server = _Server(rt, memory)
        return self.server.address

    def on_node_end(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _server_address(rt: Runtime) -> tuple[str, int]:
    """Start this process's data server on first use (I/O thread); its ``(host, port)``."""
    node = _node.current()
    if node is None or node.runtime is not rt:
        raise RuntimeError(f"proc {rt.proc_id.name} has no running node to serve data from")
    return node.part(DataServer).address(rt, node.part(BufferRegistry))


def _on_data_address(rt: Runtime, frame: Message) -> None:
    # answered with REPLY((host, port, None) | (None, None, why))
    port, index = frame.header
    try:
        host, tcp_port = _server_address(rt)
        answer: tuple[Any, ...] = (host, tcp_port, None)
    except (OSError, RuntimeError) as e:
        answer = (None, None, f"its data server could not start: {e}")
    rt.reply(port, index, STATUS_OK, answer)


def install(node: Node, boot: dict[str, Any] | None = None) -> None:
    """The RDMA installer (idempotent): the registry's frame handlers, then ``RDMA_DATA``
    on ``node``'s runtime, and pooled connections to the procs it loses forgotten."""
    registry.install(node, boot)
    rt = node.runtime
    if rt.handlers.get(Kind.RDMA_DATA) is None:
        client = node.part(DataClient)
        rt.register(Kind.RDMA_DATA, lambda conn, msg: _on_data_address(rt, msg))
        rt.lost_callbacks.append(lambda name, reason: client.forget(name))


# -- the requester's side: pooled connections -------------------------------------------


class Pool:
    """Daemon threads that run the network parts of transfers, started as needed.

    Separate from the copy threads: a part waiting on a slow or stopped owner
    must not hold up copies on this host. Daemon threads, unlike a
    ``ThreadPoolExecutor``'s, never hold up the interpreter's exit while a
    part waits on a stopped owner (the part's deadline would end it anyway).
    """

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self._tasks: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]]
        self._tasks = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards the thread counts (_threads, _idle) and _closed
        self._threads = 0
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("its node has ended: no new RDMA transfers")
            if self._idle:  # a waiting thread will take it
                self._idle -= 1
                start = False
            else:  # all busy: another thread, up to the limit (then it queues)
                start = self._threads < self.max_threads
                self._threads += start
        self._tasks.put((fn, args))
        if start:
            threading.Thread(target=self._work, name="danaus-rdma-net", daemon=True).start()

    def close(self) -> None:
        """Take no more tasks; each thread ends once it has run the tasks already queued."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = self._threads
        for _ in range(threads):
            self._tasks.put((_stop_thread, ()))

    def _work(self) -> None:
        while True:
            fn, args = self._tasks.get()
            if fn is _stop_thread:
                return
            try:
                fn(*args)
            except BaseException:  # pragma: no cover - the parts report their own errors
                log.debug("an RDMA network task %r failed", fn, exc_info=True)
            with self._lock:
                self._idle += 1


def _stop_thread() -> None:  # pragma: no cover - never called: tells a pool thread to end
    pass


_Conn = tuple[socket.socket, Session | None]


class DataClient:
    """The node's part for the requester's side: data servers' addresses, idle
    connections to them (a small pool per owner) and the threads that run network parts.

    Ended with the node (``shutdown_context()``): the idle connections are closed,
    the addresses forgotten and the threads end, so a client that starts again
    shares nothing with the old session. A forked proc starts a node of its own, so
    it never uses a connection of its parent's.
    """

    def __init__(self) -> None:
        # Guards the addresses, the idle connections, the pool's creation and _ended.
        self._lock = threading.Lock()
        self._addresses: dict[tuple[str, int], tuple[str, int]] = {}  # (proc, pid) -> server
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._pool: Pool | None = None
        self._ended = False

    def executor(self) -> Pool:
        """The threads that run network parts (made on first use)."""
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                self._pool = Pool(max(8, min(32, 4 * (os.cpu_count() or 1))))
                if self._ended:
                    self._pool.close()
            return self._pool

    def known_address(self, key: tuple[str, int]) -> tuple[str, int] | None:
        with self._lock:
            return self._addresses.get(key)

    def remember_address(self, key: tuple[str, int], address: tuple[str, int]) -> None:
        with self._lock:
            if not self._ended:
                self._addresses[key] = address

    def forget(self, proc: str) -> None:
        """Close the idle connections to proc ``proc`` (it was lost) and forget its address."""
        with self._lock:
            keys = [k for k in self._addresses if k[0] == proc]
            keys += [k for k in self._idle if k[0] == proc]
            socks: list[socket.socket] = []
            for key in keys:
                self._addresses.pop(key, None)
                socks.extend(s for s, _ in self._idle.pop(key, []))
        for s in socks:
            _close(s)

    def idle_connections(self) -> int:
        """How many idle connections are pooled (for inspection)."""
        with self._lock:
            return sum(len(conns) for conns in self._idle.values())

    def on_node_end(self) -> None:
        """Close the idle connections, forget the addresses, end the threads."""
        with self._lock:
            self._ended = True
            socks = [s for conns in self._idle.values() for s, _ in conns]
            self._idle.clear()
            self._addresses.clear()
            pool = self._pool
        for s in socks:
            _close(s)
        if pool is not None:
            pool.close()

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def _give_back(self, key: tuple[str, int], conn: _Conn) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < POOL_MAX and key in self._addresses:
                idle.append(conn)
                return
        _close(conn[0])

    def request(
        self,
        key: tuple[str, int],
        secret: bytes | None,
        deadline: float,
        track: Any,
        untrack: Any,
        op: int,
        entry: tuple[int, int, int],
        offset: int,
        local_addr: int,
        nbytes: int,
    ) -> None:
        """One FETCH or STORE of ``nbytes`` at ``offset`` of buffer ``entry`` (a net thread).

        ``local_addr`` is where the bytes land (FETCH) or come from (STORE); the
        caller keeps that memory alive. Raises ``Refused`` (the owner said no),
        ``Closed`` / ``OSError`` (the connection failed), ``AuthError``.
        """
        address = self.known_address(key)
        if address is None:  # pragma: no cover - the caller asked for it first
            raise Closed("the owner's data server is not known")
        conn = self._take(key)
        if conn is not None and not track(conn[0]):
            self._give_back(key, conn)
            raise Closed("the transfer is over")
        if conn is None:
            conn = connect(address, secret, deadline - time.monotonic(), track, untrack)
        sock, session = conn
        ok = False
        try:
            buffer_id, addr, size = entry
            head = _REQ.pack(op, buffer_id, addr, size, offset, nbytes)
            view = _view(local_addr, nbytes) if nbytes else memoryview(b"")
            if op == STORE:
                _send_payload(sock, session, _seal(session, [head]), view)
            else:
                _send_all(sock, _seal(session, [head]))
            resp = _recv_exact(sock, _RESP.size)
            status, mlen = _RESP.unpack(resp)
            if status != _OK:
                if mlen > MAX_MESSAGE:
                    raise Closed(
                        f"the owner announced a refusal of {mlen} bytes: not a danaus peer"
                    )
                msg = _recv_exact(sock, mlen)
                _check(sock, session, resp + msg, "the owner's answer")
                text = msg.decode(errors="replace")
                if status == _TAMPERED:  # the owner closes the connection
                    raise Tampered(text)
                ok = True  # the connection is still in a good state
                raise Refused(text)
            _check(sock, session, resp, "the owner's answer")
            if op == FETCH:
                _recv_payload(sock, session, view)
            del view
            ok = True
        finally:
            if untrack(sock) and ok:
                self._give_back(key, conn)
            else:
                _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:  # pragma: no cover
        pass


def connect(
    address: tuple[str, int],
    secret: bytes | None,
    timeout: float,
    track: Any,
    untrack: Any = None,
) -> tuple[socket.socket, Session | None]:
    """A new authenticated data connection to ``address``, and its session.

    ``track(sock)`` is called before connecting (so the caller can shut it
    down to abort); if it returns False the transfer is over: ``Closed``.
    A connection the owner closes unserved (all its data threads busy) is
    tried again, backing off up to 0.2 s at a time, within ``timeout``
    (``untrack(sock)`` is called for each given up); then ``Unserved``.
    """
    deadline = time.monotonic() + timeout
    backoff = 0.0
    tries = 0
    unserved: Unserved | None = None  # the last try's refusal, if every try was refused
    while True:
        tries += 1
        try:
            return _connect_once(address, secret, deadline - time.monotonic(), track, untrack)
        except Unserved as e:
            unserved = e
            left = deadline - time.monotonic()
            if left <= 0.001:
                raise _busy(unserved, tries) from None
        except TimeoutError as e:
            # The time ran out inside a try (a loaded owner closes a refused connection
            # late): after refusals, that is the same busy server, not a lost owner.
            if unserved is None or deadline - time.monotonic() > 0.01:
                raise
            raise _busy(unserved, tries - 1) from e
        backoff = min(0.2, max(0.002, 2 * backoff))
        time.sleep(min(left, backoff * random.uniform(0.5, 1.5)))  # jitter: not in step


def _busy(refusal: Unserved, tries: int) -> Unserved:
    return Unserved(
        f"{refusal} {tries} times in a row: all its rdma_max_data_threads data threads "
        "stayed busy (too many transfers from that one owner at once)"
    )


def _connect_once(
    address: tuple[str, int], secret: bytes | None, timeout: float, track: Any, untrack: Any
) -> tuple[socket.socket, Session | None]:
    host, port = address
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    if not track(sock):
        _close(sock)
        raise Closed("the transfer is over")
    tracked = [sock]
    ctx = tls.client_context()
    try:
        _tune(sock)
        sock.settimeout(max(0.001, min(timeout, config.get("rdma_connect_timeout"))))
        sock.connect((host, port))
        limit = max(0.001, min(timeout, config.get("handshake_timeout")))
        deadline = time.monotonic() + limit
        if ctx is not None:
            sock.settimeout(limit)
            tls_sock = ctx.wrap_socket(sock)
            if not track(tls_sock):
                _close(tls_sock)
                raise Closed("the transfer is over")
            sock = tls_sock
            tracked.append(sock)
        session = _handshake(sock, secret, "client", deadline)
        if ctx is not None:
            session = None  # TLS protects every byte
        sock.settimeout(None)
    except BaseException as e:
        _close(sock)
        if untrack is not None:
            for t in tracked:
                untrack(t)
        if isinstance(e, (ssl.SSLEOFError, ConnectionResetError)) and ctx is not None:
            # Closed before the TLS handshake: unserved, as above (with TLS, the first
            # bytes a busy server would have sent are TLS's, not the challenge).
            raise Unserved(f"the owner's data server closed the connection unserved ({e})") from e
        raise
    return sock, session
