"""The settings of messages."""

from __future__ import annotations

from ..setting import Setting, _default_max_frame, _MiB

MESSAGES: tuple[Setting, ...] = (
    Setting(
        "codec_max_frame_length",
        "size",
        _default_max_frame(),
        "Largest frame a connection accepts; a frame announcing more is refused "
        "before anything is allocated and its connection closed.",
        "4 GiB, or a quarter of the machine's memory if less",
    ),
    Setting(
        "offload_min",
        "size",
        _MiB,
        "Message buffers at least this large travel between procs of one host as "
        "a one-sided process_vm copy instead of through the socket (0 disables), "
        "unless their frame fits one write to the Unix socket (about 2 MiB where "
        "net.core.wmem_max allows a 2 MiB send buffer).",
    ),
    Setting(
        "snapshot_pool",
        "size",
        512 * _MiB,
        "Bytes of shared snapshot slots (copies of large buffers sent to a proc of "
        "this host, which maps them), free or still mapped there, and separately of "
        "released private snapshot mappings, kept for reuse: faulting in fresh pages "
        "costs more than the copy itself.",
    ),
    Setting(
        "recv_pool",
        "size",
        512 * _MiB,
        "Bytes of receive memory (large frames and offloaded buffers, 1 MiB and up) "
        "kept mapped for reuse once nothing refers to it any more: faulting in fresh "
        "pages costs more than the copy into them (0 keeps none).",
    ),
    Setting(
        "recv_thread_min",
        "size",
        4 * _MiB,
        "A frame at least this large arriving on a socket (not TLS) is received by a "
        "thread of its own while the I/O loop goes on serving heartbeats and other "
        "connections (0: the I/O loop reads every frame).",
    ),
    Setting(
        "send_high_water",
        "size",
        64 * _MiB,
        "A thread sending to a proc for which this process already holds more than "
        "this many bytes (queued for a proc still starting, not yet written to its "
        "connection, or offloaded and not yet read) blocks until they fall to "
        "send_low_water, or the proc is lost. The I/O thread never blocks (0: never block).",
    ),
    Setting(
        "send_low_water",
        "size",
        16 * _MiB,
        "A sender held back by send_high_water goes on once the bytes held for its "
        "peer are down to this.",
    ),
    Setting(
        "send_snapshot_max",
        "size",
        64 * _MiB,
        "A message (call arguments or a result) whose out-of-band buffers (arrays, "
        "tensors) add up to more than this is not copied: the sending thread waits until "
        "its bytes have left this process's memory (read by the receiver on this host, "
        "or handed to the kernel's socket), so the receiver still gets what was passed. "
        "Smaller ones are copied (a snapshot) when they cannot leave at once, and the "
        "send returns at once. 64 MiB: a copy that size takes ~10 ms, and a sender "
        "holding that much for a peer waits anyway (send_high_water).",
    ),
    Setting(
        "staging_max",
        "size",
        256 * _MiB,
        "Bytes of snapshots of large messages (1 MiB and up) this process holds at once, "
        "for every peer together: a message whose snapshot would not fit is sent as one "
        "above send_snapshot_max is (its sender waits until its bytes have left). The "
        "I/O thread, which never waits, may go beyond it.",
    ),
    Setting(
        "inbox_high_water",
        "size",
        64 * _MiB,
        "When more than this many bytes wait in an actor's inbox or a port receiver, "
        "the connections bringing more are not read until they are down to "
        "inbox_low_water (TCP backpressure on their senders; 0: unbounded).",
    ),
    Setting(
        "inbox_low_water",
        "size",
        16 * _MiB,
        "Connections paused by inbox_high_water are read again once the inbox holds "
        "no more than this.",
    ),
    Setting(
        "coalesce_window",
        "duration",
        0.0,
        "Sends closer together than this are coalesced into one write by the I/O "
        "thread (0 writes at once).",
    ),
    Setting(
        "send_batch",
        "int",
        64,
        "Small frames one thread sends back to back, with no wait in between, are "
        "written together, up to this many in one system call (0 or 1: each at once).",
    ),
    Setting(
        "direct_read",
        "bool",
        True,
        "A thread that waits for a reply, or an idle actor waiting for its next call, "
        "reads the socket it will come on itself while the I/O thread is not reading "
        "it: two thread wake-ups fewer per round trip (not with TLS or uvloop).",
    ),
    Setting(
        "spin_wait",
        "duration",
        0.0002,
        "A direct read (direct_read) polls without sleeping for up to this long before "
        "it blocks: an answer that comes sooner is read without a thread wake-up. After a "
        "wait of more than 3 spins, the next waits on that connection skip it (1, 2, 4 ... "
        "up to 64). 0: never.",
    ),
    Setting(
        "send_batch_delay",
        "duration",
        0.001,
        "Sends closer together than this count as back to back for send_batch; held "
        "frames are written at the latest this long after the first (any wait in the "
        "process writes them at once).",
    ),
    Setting(
        "tree_min_ranks",
        "int",
        64,
        "Actor meshes of at least this many ranks are messaged through the cast tree "
        "(each proc forwards to its subtree); smaller ones get one frame per actor "
        "from the sender.",
    ),
    Setting(
        "tree_fanout",
        "int",
        16,
        "How many subtrees the sender and each proc of the cast tree forward to.",
    ),
    Setting(
        "tree_route_meshes",
        "int",
        4096,
        "How many actor meshes a proc keeps cast-tree routes for (least recently "
        "used are dropped; a cast through a dropped route fails that subtree).",
    ),
    Setting(
        "early_call_hold",
        "duration",
        1.0,
        "A call that reaches a proc before the SPAWN of its actor waits this long "
        "for it before it is answered as undeliverable.",
    ),
    Setting(
        "gc_freeze",
        "bool",
        True,
        "When the client's runtime starts, collect garbage once and then move every "
        "object alive at that moment (imported modules: torch's hundreds of thousands) "
        "into the garbage collector's permanent generation (gc.freeze), so its full "
        "collections stop traversing them; a spawned proc does the same (without the "
        "collection) once booted. Cycles among those objects are never collected "
        "afterwards. Skipped while the program has the collector disabled.",
    ),
)
