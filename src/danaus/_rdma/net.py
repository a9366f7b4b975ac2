"""The data plane across hosts: registered bytes over a dedicated, authenticated TCP connection.

When a buffer's owner runs on another host, ``process_vm_readv`` cannot reach
it, so its bytes travel over TCP. Not over the message connection: over a
*data connection* of their own, served by threads of the data plane (never
an actor thread, never the I/O thread), that sends straight from the
registered memory and receives straight into the destination:

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
  the transfer. A failed check fails the transfer with `Tampered`
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

Wire format (little-endian), after the handshake:

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

import logging
import os
import queue
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _config as config
from .._runtime.node import Node
from .._transport import tls
from .._transport.auth import Session
from .._wire.protocol import Kind
from . import registry
from .net_frames import (
    _OK,
    _REQ,
    _RESP,
    _TAMPERED,
    CHUNK,
    FETCH,
    MAX_MESSAGE,
    POOL_MAX,
    STORE,
    Closed,
    Refused,
    Tampered,
    Unserved,
    _check,
    _close,
    _handshake,
    _recv_exact,
    _recv_payload,
    _seal,
    _send_all,
    _send_payload,
    _tune,
    _view,
    split,
)
from .net_server import DataServer, _on_data_address
from .net_server import _Server as _Server
from .net_server import _server_address as _server_address

__all__ = [
    "CHUNK",
    "FETCH",
    "STORE",
    "Closed",
    "DataClient",
    "DataServer",
    "Refused",
    "Tampered",
    "Unserved",
    "connect",
    "install",
    "split",
]

log = logging.getLogger("danaus.rdma")


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


def install(node: Node, boot: dict[str, Any] | None = None) -> None:
    """The RDMA installer (idempotent): the registry's frame handlers, then ``RDMA_DATA``
    on ``node``'s runtime, and pooled connections to the procs it loses forgotten."""
    registry.install(node, boot)
    rt = node.runtime
    if rt.handlers.get(Kind.RDMA_DATA) is None:
        client = node.part(DataClient)
        rt.register(Kind.RDMA_DATA, lambda conn, msg: _on_data_address(node, msg))
        rt.peers.lost_callbacks.append(lambda name, reason: client.forget(name))
