"""The cost of the data connection's tags: FETCH and STORE throughput, this ``net.py``
against another one (e.g. the one before a change), in one process, alternating.

Each version runs its own data server (on a runtime of this process, 127.0.0.1,
with a job secret: the tagged path, no TLS) and one requester connection;
rounds alternate between the versions, so load from elsewhere slows both
alike. One part per request (one stream): the per-byte cost of the protocol,
not the parallel-stream speed-up ``rdma_bench.py`` measures.

Usage::

    git show HEAD~1:src/danaus/_rdma/net.py > /tmp/net_before.py
    python benchmarks/rdma_tag_cost.py --before /tmp/net_before.py
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import queue
import statistics
import sys
import time
from types import ModuleType
from typing import Any

from danaus._rdma import net, registry
from danaus._rdma.memory import LocalMemory
from danaus._runtime.messaging.runtime import Runtime
from danaus._transport.address import make_job_dir

MiB = 1 << 20
SECRET = b"0123456789abcdef" * 4


def load(path: str) -> ModuleType:
    """``path`` (a ``net.py``) as a module of the ``danaus._rdma`` package."""
    spec = importlib.util.spec_from_file_location("danaus._rdma._net_before", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def server(mod: ModuleType, rt: Runtime) -> Any:
    done: queue.Queue[Any] = queue.Queue()
    rt.call_soon(lambda: done.put(mod._Server(rt)))
    return done.get(timeout=30)


def addr_of(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the other net.py")
    ap.add_argument("--sizes", default="1,16,128", help="MiB, comma-separated")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    versions = {"before": load(args.before), "after": net}
    rt = Runtime("owner", make_job_dir(), secret=SECRET)
    rt.start(in_thread=True)
    rt.listen_tcp("127.0.0.1", "127.0.0.1")
    servers = {name: server(mod, rt) for name, mod in versions.items()}
    print("MiB/s, median of rounds (before -> after, ratio)")
    for size in (int(s) * MiB for s in args.sizes.split(",")):
        owned = bytearray(b"\x07" * size)
        bid = registry.register(LocalMemory(addr_of(owned), size, False, owned, "bytearray"))
        local = bytearray(b"\x09" * size)
        entry = (bid, addr_of(owned), size)
        times: dict[tuple[str, int], list[float]] = {}
        for r in range(args.rounds + 1):  # round 0 warms up (connections, pages)
            for name, mod in versions.items():
                key = (name, size)
                mod.remember_address(key, servers[name].address)
                for op in (mod.FETCH, mod.STORE):
                    t = time.perf_counter()
                    mod.request(
                        key, SECRET, time.monotonic() + 120, lambda s: True, lambda s: True,
                        op, entry, 0, addr_of(local), size,
                    )  # fmt: skip
                    if r:
                        times.setdefault((name, op), []).append(time.perf_counter() - t)
        registry.drop([bid])
        rates = {k: size / statistics.median(v) / MiB for k, v in times.items()}
        for op, label in ((net.FETCH, "FETCH"), (net.STORE, "STORE")):
            b, a = rates[("before", op)], rates[("after", op)]
            print(f"{size // MiB:5d} MiB {label}: {b:7.0f} -> {a:7.0f}  ({a / b:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
