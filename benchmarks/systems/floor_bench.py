"""The physical floor: what the workloads cost with no framework at all.

* round trips: raw 8-byte messages over a Unix socket pair between this
  process and a forked child that echoes them;
* throughput: 10,000 such messages written back to back, then all echoes read;
* gather: one message to each of 4 echo children, then the 4 replies;
* payload: a raw numpy copy (``np.copyto`` into a preallocated array) of each size;
* error: the child pickles a ValueError, the parent unpickles it;
* crash: the child ``os._exit(1)``s on a message, the parent reads EOF;
* spawn: 4 bare ``python -c`` processes, until each has written a byte back;
* memory: VmRSS of an idle bare ``python -c`` process.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from _common import MiB, Params, Workload, measure, measure_each, proc_memory, run_worker
from workloads import LARGE

MSG = b"12345678"
_children: list[int] = []


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("peer closed")
        buf += chunk
    return bytes(buf)


def _child_loop(s: socket.socket, mode: str) -> None:
    while True:
        data = s.recv(65536)
        if not data:
            os._exit(0)
        if mode == "echo":
            s.sendall(data)
        elif mode == "error":
            try:
                raise ValueError("boom")
            except ValueError as e:
                body = pickle.dumps(e)
            s.sendall(struct.pack("<I", len(body)) + body)
        elif mode == "crash":
            if data.startswith(b"D"):
                os._exit(1)
            s.sendall(data)


def _fork(mode: str) -> socket.socket:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # child
        parent.close()
        try:
            _child_loop(child, mode)
        finally:
            os._exit(0)
    child.close()
    _children.append(pid)
    return parent


def _reap() -> None:
    for pid in _children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    _children.clear()


def call_one(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    s = _fork("echo")

    def rt() -> None:
        s.sendall(MSG)
        _recv_exact(s, len(MSG))

    out = measure(rt, p)
    s.close()
    _reap()
    extra["what"] = "8-byte echo over socket.socketpair(AF_UNIX) to a forked child"
    return out, None


FLOOR_BATCH = 50_000  # messages per timed batch at least: a shorter one times the scheduler


def throughput(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], float]:
    s = _fork("echo")
    # The floor moves ~10x more messages per second than a framework: a batch of the
    # workload's size would last a few milliseconds, and its rate would swing with
    # each scheduling hiccup. The rate is what is compared, so batches are longer.
    n = max(p.size, FLOOR_BATCH)

    def batch() -> None:
        # A reader thread drains the echoes while this thread writes: with both
        # sides blocking on full socket buffers a single thread would deadlock.
        reader = threading.Thread(target=_recv_exact, args=(s, n * len(MSG)))
        reader.start()
        for _ in range(n):
            s.sendall(MSG)
        reader.join()

    out = measure(batch, p)
    s.close()
    _reap()
    extra["what"] = f"{n} 8-byte messages written back to back, then every echo read"
    return out, float(n)


def gather(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    socks = [_fork("echo") for _ in range(p.size)]

    def g() -> None:
        for s in socks:
            s.sendall(MSG)
        for s in socks:
            _recv_exact(s, len(MSG))

    out = measure(g, p)
    for s in socks:
        s.close()
    _reap()
    extra["what"] = f"8 bytes to each of {p.size} echo children, then all replies"
    return out, None


def payload(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], float]:
    import numpy as np

    src = np.full(p.size, 7, dtype=np.uint8)
    dst = np.ones(p.size, dtype=np.uint8)
    out = measure(lambda: np.copyto(dst, src), p)
    extra["bytes"] = p.size
    extra["what"] = "np.copyto into a preallocated array"
    extra["socket_mib_s"] = _socket_transfer(src, p)
    return out, p.size / MiB


def _socket_transfer(src: Any, p: Params) -> float:
    """Not the floor of the table, a reference: MiB/s of sending the array's bytes over a
    socket pair to a forked child that reads them into a preallocated buffer and acks."""
    size = len(src)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # child
        a.close()
        buf = bytearray(size)
        mv = memoryview(buf)
        try:
            while True:
                n = 0
                while n < size:
                    k = b.recv_into(mv[n:])
                    if not k:
                        os._exit(0)
                    n += k
                b.sendall(b"k")
        finally:
            os._exit(0)
    b.close()

    def send() -> None:
        a.sendall(memoryview(src))
        if a.recv(1) != b"k":
            raise RuntimeError("no ack")

    times = measure(send, p)
    a.close()
    os.waitpid(pid, 0)
    times.sort()
    return round(size / MiB / times[len(times) // 2], 1)


def error(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    s = _fork("error")

    def rt() -> None:
        s.sendall(MSG)
        (n,) = struct.unpack("<I", _recv_exact(s, 4))
        exc = pickle.loads(_recv_exact(s, n))
        assert isinstance(exc, ValueError)

    out = measure(rt, p)
    s.close()
    _reap()
    extra["what"] = "child pickles a ValueError back over a socket pair"
    return out, None


def crash(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    def one() -> float:
        s = _fork("crash")
        for _ in range(3):  # warm the path
            s.sendall(MSG)
            _recv_exact(s, len(MSG))
        t0 = time.perf_counter()
        s.sendall(b"D" + MSG[1:])
        if s.recv(1) != b"":
            raise RuntimeError("expected EOF")
        dt = time.perf_counter() - t0
        s.close()
        _reap()
        return dt

    out = measure_each(one, p, min_samples=10)
    extra["what"] = "forked child os._exit(1)s on a message; parent reads EOF"
    return out, None


_SPAWN_CHILD = (
    "import socket,sys;s=socket.socket(fileno=int(sys.argv[1]));s.sendall(b'x');s.recv(1)"
)


def spawn(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    def once() -> None:
        pairs = [socket.socketpair() for _ in range(p.size)]
        procs = []
        for _a, b in pairs:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _SPAWN_CHILD, str(b.fileno())], pass_fds=(b.fileno(),)
                )
            )
            b.close()
        for a, _ in pairs:
            if _recv_exact(a, 1) != b"x":
                raise RuntimeError("bad hello")
        for a, _ in pairs:
            a.close()
        for pr in procs:
            pr.wait(10)

    out = measure(once, p)
    extra["what"] = f"{p.size} bare `python -c` processes, until each wrote a byte back"
    return out, None


def memory(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    pairs = [socket.socketpair() for _ in range(p.size)]
    procs = []
    for _a, b in pairs:
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _SPAWN_CHILD, str(b.fileno())], pass_fds=(b.fileno(),)
            )
        )
        b.close()
    for a, _ in pairs:
        _recv_exact(a, 1)
    time.sleep(p.budget_s)
    mems = [proc_memory(pr.pid) for pr in procs]
    for a, _ in pairs:
        a.close()
    for pr in procs:
        pr.wait(10)
    extra["what"] = "VmRSS of an idle bare `python -c` process"
    extra["pss"] = [m.get("Pss") for m in mems]
    extra["torch_loaded"] = False
    return [float(m["VmRSS"]) for m in mems], None


def large(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], float]:
    """The floor of the large-value workloads: a memcpy of the same size in one process
    (``np.copyto`` between two resident arrays)."""
    import numpy as np

    src = np.full(p.size, 7, dtype=np.uint8)
    dst = np.full(p.size, 1, dtype=np.uint8)
    out = measure(lambda: np.copyto(dst, src), p)
    extra["what"] = "np.copyto between two resident arrays of the same size"
    extra["bytes"] = p.size
    return out, p.size / MiB


IMPLS = {
    "spawn": spawn,
    "call_one": call_one,
    "throughput": throughput,
    "plain_throughput": throughput,
    "plain_throughput_notorch": throughput,
    "gather": gather,
    "gather64": gather,
    "spawn64": spawn,
    "payload_1MiB": payload,
    "payload_16MiB": payload,
    "payload_128MiB": payload,
    "error": error,
    "crash": crash,
    "memory": memory,
    **{name: large for name in LARGE},
}

if __name__ == "__main__":
    run_worker("floor", IMPLS)
