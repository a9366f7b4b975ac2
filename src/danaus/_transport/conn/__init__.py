"""A framed, ordered, thread-safe connection on a non-blocking stream socket.

Reading happens on the I/O thread's event loop (``loop.add_reader``); frames
go to ``on_frame(conn, frame)`` in arrival order. A thread about to block for
a frame that comes on this connection may read it itself instead
(``read_directly``: a caller waiting for its reply, an idle actor for its next
call) while the I/O thread is not reading; what it does not take goes to the
I/O thread, in order. Writing may happen from any
thread: ``send(parts)`` writes straight to the socket while nothing is queued
(no thread hop on the hot path) and otherwise appends a snapshot of what is
left to a backlog that the I/O thread drains, so the bytes of one connection
are never interleaved, frames keep their order, and what is sent is what the
caller passed, even if it changes its arrays after ``send()`` returns. When
the peer breaks (EOF, reset, a bad frame) ``on_close(conn, exc)`` runs once on
the I/O thread.

Write batching: small frames that one thread sends back to back (the
previous send on the connection less than ``send_batch_delay`` ago, and no
thread of this process has started waiting since) are held and written
together, up to ``send_batch`` frames in one ``sendmsg``. What is held goes
out when the batch is full, when any thread of the process starts to wait
(`Batching.flush_held()`, called by the runtime's ``begin_wait`` and by an
actor about to wait for its next message), when a frame that cannot be held
follows, or at the latest ``send_batch_delay`` later from the I/O thread. A
single call and its reply are never held (a wait came between them), and
nothing takes a thread hop.

Flow control: ``backlog_bytes`` counts what waits to be written (the runtime
blocks senders on other threads above a high-water mark; the I/O thread
itself never blocks), and ``on_drained`` runs on the I/O thread once the
backlog falls to ``drain_below`` after someone asked (``want_drain``). A
receiver that cannot take more pauses reading (``pause``/``resume``): the
peer's writes then back up in the kernel and, beyond it, in the peer's own
backlog, which blocks the peer's senders in turn.

A TCP connection with a job secret runs the handshake (``auth.py``) before
anything else, allocates its decode buffer only once it succeeded, and then
seals every frame it sends and checks every frame it receives with the
session's per-direction keys (a 32-byte tag after each frame), unless the
connection is TLS, which protects every byte already. With TLS only the I/O
thread touches the SSL object: other threads queue and wake it.

The `Connection` (``connection.py``) coordinates one part per concern, each owning its
state: `WriteBatcher` (the backlog, the held batch, flushing),
`FrameReader` (the decoder, frames not yet delivered, pauses, large
frames), `DirectReader` (the read role and a waiting thread's reads)
and `ConnStats` (the counters).
"""

from __future__ import annotations

from .batching import Batching
from .connection import Connection
from .direct import DirectReader
from .reader import FrameReader
from .stats import ConnStats
from .writer import WriteBatcher

__all__ = ["Batching", "ConnStats", "Connection", "DirectReader", "FrameReader", "WriteBatcher"]
