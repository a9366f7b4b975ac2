"""Ray worker: the workloads on Ray actors (one worker process per actor).

Runs under ``benchmarks/.envs/ray/bin/python`` (see ``setup_comparators.sh``).
A local Ray instance per worker run: actors with ``num_cpus=0``, everything
bound to 127.0.0.1 (``_node_ip_address`` plus ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
which makes Ray use the loopback address instead of the machine's), no dashboard,
no usage stats. "A proc with one actor" is a Ray actor: Ray gives each actor its
own worker process.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")

import _torch_first  # noqa: F401  (first: torch before ray, for the workloads that ask)
import ray
from _common import MiB, Params, Workload, measure, measure_each, proc_memory, run_worker

CALL_TIMEOUT = 60.0


@ray.remote(num_cpus=0, max_restarts=0)
class Bench:
    def ping(self) -> int:
        return 0

    def echo(self, x: Any) -> Any:
        return x

    def nbytes(self, a: Any) -> int:
        return len(a)

    def boom(self) -> None:
        raise ValueError("boom")

    def die(self) -> None:
        os._exit(1)

    def info(self) -> tuple[int, bool]:
        return os.getpid(), "torch" in sys.modules


def _actors(n: int) -> list[Any]:
    acts = [Bench.remote() for _ in range(n)]
    ray.get([a.ping.remote() for a in acts], timeout=CALL_TIMEOUT)
    return acts


def _kill(acts: list[Any]) -> None:
    for a in acts:
        ray.kill(a)


def spawn(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    def once() -> float:
        t0 = time.perf_counter()
        acts = _actors(p.size)
        dt = time.perf_counter() - t0
        _kill(acts)
        return dt

    extra["what"] = f"{p.size} Ray actors (one worker process each), until each answered"
    return measure_each(once, p), None


def call_one(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    (a,) = _actors(1)
    out = measure(lambda: ray.get(a.echo.remote(7), timeout=CALL_TIMEOUT), p)
    return out, None


def throughput(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], float]:
    (a,) = _actors(1)
    n = p.size
    for _ in range(p.warmup):
        ray.get([a.echo.remote(i) for i in range(max(n // 10, 1))], timeout=CALL_TIMEOUT)

    def batch() -> None:
        refs = [a.echo.remote(i) for i in range(n)]
        ray.get(refs, timeout=CALL_TIMEOUT)

    return measure(batch, p, warmup=0), float(n)


def gather(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    acts = _actors(p.size)

    def g() -> None:
        vals = ray.get([a.echo.remote(7) for a in acts], timeout=CALL_TIMEOUT)
        assert len(vals) == p.size

    return measure(g, p), None


def payload(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], float]:
    import numpy as np

    (a,) = _actors(1)
    arr = np.full(p.size, 7, dtype=np.uint8)

    def send() -> None:
        n = ray.get(a.nbytes.remote(arr), timeout=CALL_TIMEOUT)
        assert n == p.size, n

    out = measure(send, p)
    extra["bytes"] = p.size
    return out, p.size / MiB


def error(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    (a,) = _actors(1)
    types: set[str] = set()

    def err() -> None:
        try:
            ray.get(a.boom.remote(), timeout=CALL_TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            raise
        except Exception as e:  # the error under test
            types.add(type(e).__name__)
        else:
            raise AssertionError("boom() did not raise")

    out = measure(err, p)
    extra["error_types"] = sorted(types)
    return out, None


def crash(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    limit = float(p.size)
    (witness,) = _actors(1)
    seen: set[str] = set()
    survived: list[bool] = []
    not_noticed = 0

    def once() -> float:
        nonlocal not_noticed
        (a,) = _actors(1)
        t0 = time.perf_counter()
        ref = a.die.remote()
        try:
            ray.get(ref, timeout=limit)
        except ray.exceptions.GetTimeoutError:
            not_noticed += 1
            dt = float("nan")
        except Exception as e:  # the failure under test
            dt = time.perf_counter() - t0
            seen.add(type(e).__name__)
        else:
            raise AssertionError("die() returned a value")
        try:
            ray.get(witness.ping.remote(), timeout=10)
            survived.append(True)
        except Exception:
            survived.append(False)
        return dt

    raw = measure_each(once, p)
    extra["errors_seen"] = sorted(seen)
    extra["not_noticed"] = not_noticed
    extra["client_survived"] = all(survived) if survived else None
    out = [x for x in raw if x == x]
    if not out:
        raise TimeoutError(f"no crash was noticed by the caller within {limit} s")
    return out, None


def memory(wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
    acts = _actors(p.size)
    infos = ray.get([a.info.remote() for a in acts], timeout=CALL_TIMEOUT)
    time.sleep(p.budget_s)
    mems = [proc_memory(pid) for pid, _ in infos]
    extra["pids"] = [pid for pid, _ in infos]
    extra["torch_loaded"] = any(t for _, t in infos)
    extra["pss"] = [m.get("Pss") for m in mems]
    extra["what"] = "VmRSS of each Ray actor's worker process, idle"
    return [float(m["VmRSS"]) for m in mems], None


IMPLS = {
    "spawn": spawn,
    "call_one": call_one,
    "throughput": throughput,
    "plain_throughput": throughput,
    "plain_throughput_notorch": throughput,
    "gather": gather,
    "payload_1MiB": payload,
    "payload_16MiB": payload,
    "payload_128MiB": payload,
    "error": error,
    "crash": crash,
    "memory": memory,
}


def _setup() -> None:
    ray.init(
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )


def _teardown() -> None:
    ray.shutdown()


if __name__ == "__main__":
    run_worker("ray", IMPLS, setup=_setup, teardown=_teardown)
