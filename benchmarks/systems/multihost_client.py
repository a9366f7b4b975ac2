"""The client of ``benchmarks/multihost_bench.py``: one system, attached to workers on lab hosts.

Runs under the system's interpreter (this project's for danaus,
``benchmarks/.envs/monarch/bin/python`` for Monarch). The workers are already
running, one per host (network namespace) of the lab, started by the driver;
this script attaches to them exactly as a user's program does without a
scheduler (``attach_to_workers(ca="trust_all_connections", workers=[...])``,
the job secret from ``DANAUS_SECRET`` for danaus), then times the workloads.
Everything below the import of the system is the same code for both.

Each workload prints one ``MH_RESULT {json}`` line::

    {"workload", "samples": [s, ...], "ops": operations per sample,
     "cpu_s": CPU seconds of the system's processes (client, workers, procs)
              during the workload, from the run's cgroup (null without one),
     "machine_cpu_s", "machine_steal_s": the whole machine's busy and stolen
              CPU seconds meanwhile (/proc/stat; other work on it included),
     "wall_s", "extra": {...}, "error": null | text}

Usage (the driver passes these)::

    python multihost_client.py --system danaus --workers tcp://A:P,tcp://B:P \\
        --client-ip 10.231.R.1 --procs 4 --workloads call_one,gather [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
CALL_TIMEOUT = 120.0
MARK = "MH_RESULT "

# (samples, warm-up, time budget in s) per workload, full and smoke.
SIZES: dict[str, dict[str, Any]] = {
    "spawn": {"full": (3, 1, 60.0), "smoke": (1, 0, 30.0)},
    "call_one": {"full": (400, 50, 8.0), "smoke": (20, 5, 5.0)},
    "throughput": {"full": (4, 1, 20.0), "smoke": (1, 0, 10.0), "n": (10_000, 200)},
    "gather": {"full": (200, 20, 8.0), "smoke": (10, 2, 5.0)},
    "broadcast": {"full": (8, 1, 15.0), "smoke": (1, 1, 5.0), "n": (200, 10)},
    "bulk": {"full": (4, 1, 40.0), "smoke": (1, 1, 20.0), "n": (256 * MiB, 4 * MiB)},
    "correct": {"full": (1, 0, 120.0), "smoke": (1, 0, 120.0)},
}
MESH_WORKLOADS = {"call_one", "throughput", "gather", "broadcast", "bulk"}
ORDER = ["spawn", "call_one", "throughput", "gather", "broadcast", "bulk", "correct"]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", required=True, choices=["danaus", "monarch"])
    ap.add_argument("--workers", required=True, help="comma-separated tcp://HOST:PORT")
    ap.add_argument("--client-ip", required=True, help="this client's address on the lab")
    ap.add_argument("--procs", type=int, default=4, help="procs per host")
    ap.add_argument("--workloads", default=",".join(ORDER[:-1]))
    ap.add_argument("--smoke", action="store_true")
    return ap.parse_args()


# -- CPU accounting --------------------------------------------------------------------


def cgroup_cpu_s() -> float | None:
    """CPU seconds used so far by every process of the run's cgroup (``DNBENCH_CPU_FILE``)."""
    path = os.environ.get("DNBENCH_CPU_FILE")
    if not path:
        return None
    with open(path) as f:
        text = f.read()
    if path.endswith("cpuacct.usage"):  # cgroup v1: nanoseconds
        return int(text) / 1e9
    for line in text.splitlines():  # cgroup v2 cpu.stat
        if line.startswith("usage_usec "):
            return int(line.split()[1]) / 1e6
    return None


def machine_cpu() -> tuple[float, float]:
    """(busy, stolen) CPU seconds of the whole machine so far, from ``/proc/stat``."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / hz, steal / hz


# -- the workloads (the same code on both systems) ---------------------------------------


class Run:
    def __init__(self, api: Any, bench_cls: type, args: argparse.Namespace) -> None:
        self.api = api
        self.cls = bench_cls
        self.args = args
        self.mode = "smoke" if args.smoke else "full"
        self.workers = args.workers.split(",")
        self.hosts: Any = None
        self.procs: Any = None
        self.mesh: Any = None
        self.done = 0  # operations run by the current workload, warm-up included

    def size(self, wl: str) -> tuple[int, int, float]:
        s: tuple[int, int, float] = SIZES[wl][self.mode]
        return s

    def n(self, wl: str) -> int:
        full, smoke = SIZES[wl]["n"]
        return int(smoke if self.args.smoke else full)

    def attach(self) -> float:
        t = time.perf_counter()
        kw: dict[str, Any] = {"ca": "trust_all_connections", "workers": self.workers}
        self.hosts = self.api.attach_to_workers(**kw)
        self.hosts.initialized.get(timeout=CALL_TIMEOUT)
        return time.perf_counter() - t

    def spawn_mesh(self) -> tuple[Any, Any]:
        procs = self.hosts.spawn_procs(per_host={"gpus": self.args.procs})
        mesh = procs.spawn("bench", self.cls)
        mesh.ping.call().get(timeout=CALL_TIMEOUT)
        return procs, mesh

    def main_mesh(self) -> Any:
        if self.mesh is None:
            self.procs, self.mesh = self.spawn_mesh()
        return self.mesh

    def remote_one(self) -> Any:
        """One actor on a host other than the first (every call crosses the network)."""
        return self.main_mesh().slice(hosts=len(self.workers) - 1, gpus=0)

    # Each returns (samples in s, operations per sample, extra).

    def w_spawn(self, extra: dict[str, Any]) -> tuple[list[float], int]:
        samples, warmup, budget = self.size("spawn")
        out: list[float] = []
        start = time.perf_counter()
        for i in range(warmup + samples):
            t = time.perf_counter()
            procs, _ = self.spawn_mesh()
            dt = time.perf_counter() - t
            procs.stop().get(timeout=CALL_TIMEOUT)
            self.done += 1
            if i >= warmup:
                out.append(dt)
            if out and time.perf_counter() - start > budget:
                break
        return out, 1

    def timed(self, fn: Callable[[], Any], wl: str, ops: int = 1) -> list[float]:
        samples, warmup, budget = self.size(wl)
        for _ in range(warmup):
            fn()
            self.done += ops
        out: list[float] = []
        start = time.perf_counter()
        for _ in range(samples):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
            self.done += ops
            if time.perf_counter() - start > budget:
                break
        return out

    def w_call_one(self, extra: dict[str, Any]) -> tuple[list[float], int]:
        a = self.remote_one()

        def once() -> None:
            assert a.echo.call_one(7).get(timeout=CALL_TIMEOUT) == 7

        return self.timed(once, "call_one"), 1

    def w_throughput(self, extra: dict[str, Any]) -> tuple[list[float], int]:
        a = self.remote_one()
        n = self.n("throughput")

        def batch() -> None:
            futs = [a.echo.call_one(i) for i in range(n)]
            for i, f in enumerate(futs):
                if f.get(timeout=CALL_TIMEOUT) != i:
                    raise AssertionError(f"call {i} got a wrong answer")

        return self.timed(batch, "throughput", n), n

    def w_gather(self, extra: dict[str, Any]) -> tuple[list[float], int]:
        m = self.main_mesh()
        want = len(self.workers) * self.args.procs

        def once() -> None:
            vals = list(m.echo.call(7).get(timeout=CALL_TIMEOUT).values())
            assert len(vals) == want and all(v == 7 for v in vals), vals

        return self.timed(once, "gather"), 1

    def w_broadcast(self, extra: dict[str, Any]) -> tuple[list[float], int]:
        """``n`` broadcasts to every actor, then one gather that proves all arrived."""
        m = self.main_mesh()
        n = self.n("broadcast")
        base = list(m.count.call().get(timeout=CALL_TIMEOUT).values())
        done = [0]

        def batch() -> None:
            for _ in range(n):
                m.bump.broadcast()
            done[0] += n
            counts = list(m.count.call().get(timeout=CALL_TIMEOUT).values())
            expect = [b + done[0] for b in base]
            if counts != expect:
                raise AssertionError(f"broadcasts lost or doubled: {counts} != {expect}")

        return self.timed(batch, "broadcast", n), n

    def w_bulk(self, extra: dict[str, Any]) -> tuple[list[float], int]:
        """``n`` bytes from a proc on host 0 to a proc on host 1 over the data plane.

        The reader times ``read_into`` of the holder's ``RDMABuffer`` (the transfer
        alone); the client's wall time of the whole call is in ``extra``.
        """
        m = self.main_mesh()
        n = self.n("bulk")
        holder = m.slice(hosts=0, gpus=0)
        reader = m.slice(hosts=1, gpus=0)
        buf = holder.hold.call_one(n).get(timeout=CALL_TIMEOUT)
        walls: list[float] = []

        def once() -> float:
            t = time.perf_counter()
            dt, ok = reader.pull.call_one(buf, n).get(timeout=CALL_TIMEOUT)
            walls.append(time.perf_counter() - t)
            self.done += n
            if not ok:
                raise AssertionError("the bytes read did not match the holder's")
            return float(dt)

        samples, warmup, budget = self.size("bulk")
        for _ in range(warmup):
            once()
        walls.clear()
        out: list[float] = []
        start = time.perf_counter()
        for _ in range(samples):
            out.append(once())
            if time.perf_counter() - start > budget:
                break
        holder.drop.call_one().get(timeout=CALL_TIMEOUT)
        extra["bytes"] = n
        extra["client_wall_s"] = walls
        return out, n

    def w_correct(self, extra: dict[str, Any]) -> tuple[list[float], int]:
        """Every proc on its own host: spawn all, gather who is where, broadcast, stop."""
        t = time.perf_counter()
        procs, m = self.spawn_mesh()
        spawn_s = time.perf_counter() - t
        hosts, per = len(self.workers), self.args.procs
        where = m.where.call().get(timeout=CALL_TIMEOUT)
        items = list(where.items())
        pids = {pid for _, (pid, _) in items}
        nets = {net for _, (_, net) in items}
        by_host: dict[int, set[str]] = {}
        for point, (_, net) in items:
            by_host.setdefault(int(point["hosts"]), set()).add(net)
        problems = []
        if len(items) != hosts * per or len(pids) != hosts * per:
            problems.append(f"{len(items)} answers from {len(pids)} pids, want {hosts * per}")
        if len(nets) != hosts or any(len(v) != 1 for v in by_host.values()):
            problems.append(f"procs in {len(nets)} network namespaces, want one per host")
        if os.readlink("/proc/self/ns/net") in nets:
            problems.append("a proc runs in the client's network namespace")
        for _ in range(10):
            m.bump.broadcast()
        counts = list(m.count.call().get(timeout=CALL_TIMEOUT).values())
        if counts != [10] * (hosts * per):
            problems.append(f"broadcast counts {sorted(set(counts))}, want all 10")
        for h in range(hosts):
            if m.slice(hosts=h, gpus=per - 1).echo.call_one(h).get(timeout=CALL_TIMEOUT) != h:
                problems.append(f"call_one to host {h} got a wrong answer")
        procs.stop().get(timeout=CALL_TIMEOUT)
        extra.update(problems=problems, procs=hosts * per, hosts=hosts, spawn_s=spawn_s)
        if problems:
            raise AssertionError("; ".join(problems))
        return [time.perf_counter() - t], hosts * per

    def stop(self) -> None:
        if self.procs is not None:
            self.procs.stop().get(timeout=CALL_TIMEOUT)
            self.procs = self.mesh = None


def describe(e: BaseException) -> str:
    """An exception, shortened: its start and its end (where a remote error says why)."""
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 1200 else text[:300] + " ... " + text[-900:]


def emit(**kw: Any) -> None:
    print(MARK + json.dumps(kw), flush=True)


def run(run_: Run, workloads: list[str]) -> int:
    failed = 0
    try:
        attach_s = run_.attach()
        emit(workload="attach", samples=[attach_s], ops=1, cpu_s=None, wall_s=attach_s, extra={})
    except Exception as e:
        emit(workload="attach", samples=[], error=describe(e))
        traceback.print_exc()
        return 1
    for wl in workloads:
        extra: dict[str, Any] = {}
        if wl in MESH_WORKLOADS:
            try:  # the shared mesh is spawned outside the workload's time and CPU
                run_.main_mesh()
            except Exception as e:
                emit(workload=wl, samples=[], error=f"spawning the mesh: {describe(e)}")
                failed += 1
                continue
        run_.done = 0
        cpu0, (busy0, steal0), t0 = cgroup_cpu_s(), machine_cpu(), time.perf_counter()
        try:
            samples, ops = getattr(run_, f"w_{wl}")(extra)
            error = None
        except Exception as e:
            samples, ops, error = [], 0, describe(e)
            traceback.print_exc()
            failed += 1
        wall = time.perf_counter() - t0
        cpu1, (busy1, steal1) = cgroup_cpu_s(), machine_cpu()
        cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        emit(
            workload=wl,
            samples=samples,
            ops=ops,
            ops_done=run_.done,
            median=statistics.median(samples) if samples else None,
            cpu_s=cpu,
            machine_cpu_s=busy1 - busy0,
            machine_steal_s=steal1 - steal0,
            wall_s=wall,
            extra=extra,
            error=error,
        )
    try:
        run_.stop()
    except Exception as e:
        print(f"stop failed: {type(e).__name__}: {e}", file=sys.stderr)
    return 1 if failed else 0


def _system() -> str:
    """The ``--system`` argument, read before the system is imported (the actor class
    below is defined at module level, against that system's API)."""
    for i, a in enumerate(sys.argv):
        if a == "--system" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--system="):
            return a.split("=", 1)[1]
    return "danaus"


SYSTEM = _system()
warnings.simplefilter("ignore")
if SYSTEM == "monarch":
    import monarch

    # The client's own channels must be reachable from the hosts: by default Monarch
    # serves them on a Unix socket, and its "hostname" transport would resolve this
    # machine's name to loopback. Name the lab address (--client-ip) explicitly.
    _ip = sys.argv[sys.argv.index("--client-ip") + 1] if "--client-ip" in sys.argv else "127.0.0.1"
    monarch.configure(default_transport=f"tcp://{_ip}:0", rdma_allow_tcp_fallback=True)
    import monarch.actor as api
    from monarch.rdma import RDMABuffer
else:
    import danaus.actor as api
    from danaus.rdma import RDMABuffer

api.unhandled_fault_hook = lambda failure: print(f"fault: {failure}", file=sys.stderr)


def pattern(n: int) -> Any:
    """``n`` bytes that differ from place to place (a misplaced chunk shows)."""
    import numpy as np

    return np.arange(n // 8, dtype=np.uint64).view(np.uint8)


class Bench(api.Actor):  # type: ignore[name-defined,misc]
    def __init__(self) -> None:
        self.n = 0
        self.kept: Any = None

    @api.endpoint
    def ping(self) -> int:
        return 0

    @api.endpoint
    def echo(self, x: Any) -> Any:
        return x

    @api.endpoint
    def bump(self) -> None:
        self.n += 1

    @api.endpoint
    def count(self) -> int:
        return self.n

    @api.endpoint
    def where(self) -> tuple[int, str]:
        return os.getpid(), os.readlink("/proc/self/ns/net")

    @api.endpoint
    def hold(self, n: int) -> Any:
        warnings.simplefilter("ignore")
        data = pattern(n)
        self.kept = (data, RDMABuffer(memoryview(data)))
        return self.kept[1]

    @api.endpoint
    def drop(self) -> None:
        self.kept = None

    @api.endpoint
    def pull(self, buf: Any, n: int) -> tuple[float, bool]:
        import numpy as np

        warnings.simplefilter("ignore")
        out = np.ones(n, dtype=np.uint8)  # touched: the transfer alone is timed
        t = time.perf_counter()
        buf.read_into(memoryview(out), timeout=int(CALL_TIMEOUT)).get(timeout=CALL_TIMEOUT)
        dt = time.perf_counter() - t
        return dt, bool(np.array_equal(out, pattern(n)))


def main() -> int:
    args = parse()
    rc = run(Run(api, Bench, args), [w for w in args.workloads.split(",") if w])
    if args.system == "monarch":
        try:
            r = api.shutdown_context()
            if hasattr(r, "get"):
                r.get(timeout=30)
        except Exception as e:
            print(f"shutdown_context failed: {e}", file=sys.stderr)
    sys.stdout.flush()
    os._exit(rc)  # no interpreter teardown races with the systems' threads


if __name__ == "__main__":
    sys.exit(main())
