"""The counters of one connection."""

from __future__ import annotations


class ConnStats:
    """The counters of one connection, for the metrics: frames and bytes each way,
    bytes of large frames received off the loop, frames read by a waiting thread,
    and its spins. Plain ints: the GIL keeps each ``+=`` whole."""

    __slots__ = (
        "bytes_recv",
        "bytes_sent",
        "frames_direct",
        "frames_recv",
        "frames_sent",
        "recv_off_loop",
        "spins_hit",
        "spins_missed",
    )

    def __init__(self) -> None:
        self.frames_sent = 0
        self.bytes_sent = 0
        self.frames_recv = 0
        self.bytes_recv = 0
        self.recv_off_loop = 0  # bytes of large frames received by a reader thread
        self.frames_direct = 0  # frames a waiting thread read and handled itself
        self.spins_hit = 0  # direct reads whose wait ended while they spun (frame or bell)
        self.spins_missed = 0  # ... and those that spun for nothing, then slept
