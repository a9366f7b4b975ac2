"""The owner's side of the data plane: the data server that answers FETCH and STORE
requests on the memory registered here (a node part, ``DataServer``)."""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from typing import Any

from .. import _config as config
from .._runtime import node as _node
from .._runtime.messaging.runtime import STATUS_OK, Runtime
from .._transport import tls
from .._transport.auth import AuthError, Session
from .._wire.protocol import Message
from . import cuda
from .net_frames import (
    _DRAIN,
    _OK,
    _REFUSED,
    _REQ,
    _RESP,
    _TAMPERED,
    CHUNK,
    FETCH,
    MAX_MESSAGE,
    STORE,
    Closed,
    Tampered,
    _check,
    _chunks,
    _close,
    _handshake,
    _recv_into,
    _recv_payload,
    _seal,
    _send_all,
    _send_payload,
    _tune,
    _view,
    payload_size,
)
from .registry import BufferRegistry, Registration

log = logging.getLogger("danaus.rdma")


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
            return _refuse_tampered(sock, session, nbytes, e)
        _send_all(sock, _seal(session, [_RESP.pack(_OK, 0)]))
        return True
    finally:
        del view, reg


def _refuse_tampered(
    sock: socket.socket, session: Session | None, nbytes: int, e: Tampered
) -> bool:
    """A stored payload failed its tag check at ``e.at``: read the rest (its length is
    authentic) so that the requester, still sending, hears why instead of a reset, then
    answer TAMPERED. Returns False: the connection closes, the path is hostile."""
    end = min(nbytes, (e.at or 0) + CHUNK)
    _drain(sock, payload_size(nbytes, session) - payload_size(end, session))
    msg = f"the owner's {e}".encode()[:MAX_MESSAGE]
    _send_all(sock, _seal(session, [_RESP.pack(_TAMPERED, len(msg)) + msg]))
    return False


def _answer_device(
    sock: socket.socket,
    session: Session | None,
    op: int,
    reg: Registration,
    offset: int,
    nbytes: int,
) -> bool:
    """`_answer()` for a CUDA registration: the same bytes on the wire, the payload
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
        return _refuse_tampered(sock, session, nbytes, e)
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


def _server_address(node: _node.Node) -> tuple[str, int]:
    """Start ``node``'s data server on first use (I/O thread); its ``(host, port)``.
    ``RuntimeError`` once the node has ended (its session is over: nothing to serve)."""
    if node.closed:
        raise RuntimeError(
            f"proc {node.runtime.proc_id.name} has no running node to serve data from"
        )
    return node.part(DataServer).address(node.runtime, node.part(BufferRegistry))


def _on_data_address(node: _node.Node, frame: Message) -> None:
    # answered with REPLY((host, port, None) | (None, None, why))
    rt = node.runtime
    port, index = frame.header
    try:
        host, tcp_port = _server_address(node)
        answer: tuple[Any, ...] = (host, tcp_port, None)
    except (OSError, RuntimeError) as e:
        answer = (None, None, f"its data server could not start: {e}")
    rt.reply(port, index, STATUS_OK, answer)
