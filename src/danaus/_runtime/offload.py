"""Large message buffers between procs of one host skip the socket: the receiver copies
them straight out of the sender's memory (one copy instead of two).

::

    A --HELLO(pid, host key, probe)--> B      B tries to read A's probe bytes with
    A <--OFFLOAD_OK-------------------- B      process_vm_readv; if it can, A may offload
    A --OFFLOAD(token, [(i, addr, n)], inner header) + small buffers--> B
                                               B reads each big buffer from A's memory
    A <--RELEASE(token)---------------- B      ... and A lets go of them

The wrapped frame travels on the same connection as every other frame, so
order is kept. The sender holds the buffers until RELEASE (or until the
receiver is lost), so a caller must not modify an array it passed to a call
until the call's future completes (the same holds for frames still queued
on a socket).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from .. import _config as config
from .._transport import vm
from .._wire.frame import Frame, alloc, flat
from .._wire.protocol import (
    Kind,
    Message,
    Offload,
    OffloadOk,
    ProtocolError,
    Release,
    Reply,
    decode_header,
    wire,
)

if TYPE_CHECKING:
    from .._transport.conn import Connection
    from .runtime import Runtime

__all__ = ["Offloader"]

log = logging.getLogger("danaus.runtime")


_PROBE = bytearray(b"danaus offload probe \x01\x02\x03")
_probe_addr: int | None = None


def _probe() -> tuple[int, int]:
    global _probe_addr
    if _probe_addr is None:
        _probe_addr = vm.address(memoryview(_PROBE))
    return _probe_addr, len(_PROBE)


class Offloader:
    """The offload state of one runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.min = config.get("offload_min")  # bytes; 0 disables
        self.enabled = self.min > 0 and vm.available()
        self.ok_peers: set[str] = set()  # peers that can read our memory
        self._held: dict[int, tuple[str, list[Any]]] = {}
        self._next = 0
        self._lock = threading.Lock()
        rt.register(Kind.OFFLOAD, self._on_offload)
        rt.register(Kind.OFFLOAD_OK, self._on_ok)
        rt.register(Kind.RELEASE, self._on_release)
        rt.lost_callbacks.append(self._on_lost)

    def hello_extra(self) -> tuple[Any, ...]:
        if not self.enabled:
            return ()
        addr, n = _probe()
        return (os.getpid(), vm.host_key(), addr, n)

    def on_hello(self, conn: Connection, extra: tuple[Any, ...]) -> None:
        """A proc introduced itself: tell it whether we can read its memory."""
        if not self.enabled or len(extra) < 4:
            return
        pid, key, addr, n = extra[:4]
        conn.peer_pid = pid
        if key != vm.host_key():
            return
        buf = bytearray(n)
        try:
            vm.copy(pid, vm.address(memoryview(buf)), addr, n, write=False)
        except OSError:
            return  # not allowed (ptrace rules): the socket carries everything
        if buf == _PROBE:
            self.rt.send(conn.peer, OffloadOk(self.rt.proc_id.name), on_fail=lambda r: None)

    def _on_ok(self, conn: Connection, msg: Message) -> None:
        self.ok_peers.add(msg.header.name)

    def wrap(self, peer: str, header: tuple[Any, ...], buffers: Any) -> tuple[tuple[Any, ...], Any]:
        """Replace the big buffers of a frame to ``peer`` by descriptors, if worthwhile.

        ``header`` is a wire tuple; so is the ``OFFLOAD`` header returned."""
        if peer not in self.ok_peers:
            return header, buffers
        raws = [flat(b) for b in buffers]
        big = [i for i, r in enumerate(raws) if len(r) >= self.min]
        if not big:
            return header, buffers
        descs = [(i, vm.address(memoryview(raws[i])), len(raws[i])) for i in big]
        with self._lock:
            if peer not in self.ok_peers:  # lost meanwhile: send the bytes instead
                return header, buffers
            self._next += 1
            token = self._next
            self._held[token] = (peer, [raws[i] for i in big])
        small = [b"" if i in set(big) else r for i, r in enumerate(raws)]
        return wire(Offload(token, tuple(descs), header)), small

    def _on_release(self, conn: Connection, msg: Message) -> None:
        with self._lock:
            self._held.pop(msg.header.token, None)

    def _on_lost(self, name: str, reason: str) -> None:
        with self._lock:
            self.ok_peers.discard(name)
            for token in [t for t, (p, _) in self._held.items() if p == name]:
                del self._held[token]

    def _on_offload(self, conn: Connection, msg: Message) -> None:
        token, descs, inner = msg.header
        buffers = list(msg.buffers)
        pid = getattr(conn, "peer_pid", None)
        try:
            if pid is None:
                raise OSError("the sender did not say its pid")
            for i, addr, n in descs:
                # An anonymous mapping, not a bytearray: no zero-fill pass over memory
                # the copy is about to overwrite.
                buf = memoryview(alloc(n))
                vm.copy(pid, vm.address(buf), addr, n, write=False)
                buffers[i] = buf
        except (OSError, MemoryError, ValueError) as e:
            self._undelivered(conn, inner, f"reading a large buffer from the sender failed: {e}")
            return
        finally:
            if conn.peer is not None:
                self.rt.send(conn.peer, Release(token), on_fail=lambda r: None)
        self.rt._dispatch(conn, Frame(inner, msg.body, buffers))

    def _undelivered(self, conn: Connection, inner: tuple[Any, ...], reason: str) -> None:
        """The frame cannot be rebuilt: whoever waits for it hears why (never silence)."""
        from .._errors import SupervisionError
        from .._wire import codec
        from .runtime import STATUS_ERROR

        log.error("a message from %s could not be received: %s", conn.peer, reason)
        try:
            kind, header = decode_header(inner)
        except ProtocolError:
            return
        if kind == Kind.CALL and header.port is not None:
            self.rt.undeliverable(header.port, header.slot, reason)
        elif kind == Kind.REPLY:
            handler = self.rt.ports.get(header.port)
            if handler is not None:
                body, _ = codec.dumps(
                    SupervisionError(f"a reply was lost: {reason}", reason=reason)
                )
                lost = Reply(header.port, header.slot, STATUS_ERROR)
                handler.deliver(Message(Kind.REPLY, lost, memoryview(body), []))
            elif header.sender is not None:
                self.rt.bounce(header.sender, f"port {header.port}", reason)
