"""The large-value workloads (``large_<mode>_<size>``) on danaus: bandwidth and peak memory.

Each sample moves one value of ``p.size`` bytes between the client and one
proc of this host: as a call's argument (``arg``), as an endpoint's result
(``result``), or with ``RDMABuffer.read_into`` (``rdma``). Besides the rate,
``extra`` reports how far each side's peak resident size (``VmHWM``, reset
before the timed samples) rose above what it held before them
(``client_rise_mib``, ``proc_rise_mib``): at most the value on the side that
receives a new one each time (less when it lands in warm receive memory), and
nothing where the memory exists already (the sender's; both sides of an RDMA
copy). A rise beyond that is what moving the value cost in extra memory.

The actor class must have, besides ``_mesh_bench``'s endpoints::

    reset_peak() -> int     # forget the proc's VmHWM; its VmRSS now
    peak() -> int           # its VmHWM
    keep(n)                 # hold a resident n-byte array (returned by get)
    get() -> the array kept
    register(n) -> RDMABuffer of the array kept
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from _common import MiB, Params, Workload, measure

CALL_TIMEOUT = 300.0


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def reset_peak() -> int:
    """Forget this process's peak resident size; its resident size now.

    Once it has settled: the kernel takes a while (~0.1 s) to unmap a GiB that was
    just freed, and a peak reset meanwhile would count those pages as still held."""
    gc.collect()
    before = status("VmRSS")
    for _ in range(200):  # 2 s at most
        time.sleep(0.01)
        now = status("VmRSS")
        if abs(now - before) < (1 << 20):
            break
        before = now
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status("VmRSS")


def run(
    procs_of: Callable[[int], Any], cls: type, wl: Workload, p: Params, extra: dict[str, Any]
) -> tuple[list[float], float]:
    """One large-value workload with actors of ``cls`` on ``procs_of(1)``."""
    import numpy as np

    mode = wl.name.split("_")[1]
    n = p.size
    procs = procs_of(1)
    try:
        a = procs.spawn("large", cls)
        a.ping.call_one().get(timeout=CALL_TIMEOUT)
        if mode == "arg":
            arr = np.full(n, 7, dtype=np.uint8)

            def once() -> None:
                assert a.nbytes.call_one(arr).get(timeout=CALL_TIMEOUT) == n

        elif mode == "result":
            a.keep.call_one(n).get(timeout=CALL_TIMEOUT)

            def once() -> None:
                assert len(a.get.call_one().get(timeout=CALL_TIMEOUT)) == n

        else:
            buf = a.register.call_one(n).get(timeout=CALL_TIMEOUT)
            dst = np.full(n, 1, dtype=np.uint8)  # resident before, as a registered buffer is

            def once() -> None:
                buf.read_into(dst, timeout=CALL_TIMEOUT).get(timeout=CALL_TIMEOUT)

        once()  # warm: connections, pools, the first page faults
        client0 = reset_peak()
        proc0 = a.reset_peak.call_one().get(timeout=CALL_TIMEOUT)
        out = measure(once, p, warmup=0)
        client_rise = status("VmHWM") - client0
        proc_rise = a.peak.call_one().get(timeout=CALL_TIMEOUT) - proc0
        extra["client_rise_mib"] = round(client_rise / MiB, 1)
        extra["proc_rise_mib"] = round(proc_rise / MiB, 1)
        extra["bytes"] = n
        return out, n / MiB
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)
