"""The workloads written once against Monarch's actor API (``monarch.actor``).

danaus mirrors that API, so ``danaus_bench.py`` and ``monarch_bench.py`` both
run these same functions; each passes its own ``this_host`` and its own actor
class (defined in the worker script, so both systems ship it by value).

The actor class must have these endpoints::

    ping() -> int            # 0
    echo(x) -> x
    nbytes(a) -> len(a)      # a 1-D uint8 numpy array
    boom() -> raises ValueError
    die() -> os._exit(1)     # mid-call
    info() -> (pid, "torch" in sys.modules)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from _common import MiB, Params, Workload, measure, measure_each, proc_memory

STOP_TIMEOUT = 30.0
CALL_TIMEOUT = 60.0


class MeshSystem:
    def __init__(self, name: str, this_host: Callable[[], Any], bench_cls: type) -> None:
        self.name = name
        self.this_host = this_host
        self.cls = bench_cls

    def procs(self, n: int) -> Any:
        return self.this_host().spawn_procs(per_host={"gpus": n})

    def actors(self, procs: Any) -> Any:
        mesh = procs.spawn("bench", self.cls)
        mesh.ping.call().get(timeout=CALL_TIMEOUT)  # every actor up and answering
        return mesh

    def stop(self, procs: Any, extra: dict[str, Any] | None = None) -> None:
        try:
            procs.stop().get(timeout=STOP_TIMEOUT)
        except Exception as e:  # reported, not fatal
            if extra is not None:
                extra.setdefault("stop_errors", []).append(f"{type(e).__name__}: {e}"[:300])

    # ---------------------------------------------------------------- workloads

    def spawn(self, wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
        def once() -> float:
            t0 = time.perf_counter()
            procs = self.procs(p.size)
            self.actors(procs)
            dt = time.perf_counter() - t0
            self.stop(procs, extra)
            return dt

        return measure_each(once, p), None

    def _one(self, n: int = 1) -> tuple[Any, Any]:
        procs = self.procs(n)
        return procs, self.actors(procs)

    def call_one(self, wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
        procs, a = self._one()
        out = measure(lambda: a.echo.call_one(7).get(timeout=CALL_TIMEOUT), p)
        self.stop(procs, extra)
        return out, None

    def throughput(
        self, wl: Workload, p: Params, extra: dict[str, Any]
    ) -> tuple[list[float], float]:
        procs, a = self._one()
        n = p.size

        def batch() -> None:
            futs = [a.echo.call_one(i) for i in range(n)]
            for f in futs:
                f.get(timeout=CALL_TIMEOUT)

        # warm-up: one smaller batch, then the timed full batches
        for _ in range(p.warmup):
            futs = [a.echo.call_one(i) for i in range(max(n // 10, 1))]
            for f in futs:
                f.get(timeout=CALL_TIMEOUT)
        out = measure(batch, p, warmup=0)
        self.stop(procs, extra)
        return out, float(n)

    def plain_throughput(
        self, wl: Workload, p: Params, extra: dict[str, Any]
    ) -> tuple[list[float], float]:
        """What a user writes: issue every call on a one-actor slice of a 4-proc mesh,
        then get() each (the worker imported torch first when the workload says so)."""
        procs = self.procs(4)
        mesh = self.actors(procs)
        one = mesh.slice(gpus=0)
        n = p.size

        def batch() -> None:
            futs = [one.echo.call_one(i) for i in range(n)]
            for f in futs:
                f.get()

        out = measure(batch, p)
        self.stop(procs, extra)
        return out, float(n)

    def gather(self, wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
        procs = self.procs(p.size)
        m = self.actors(procs)

        def g() -> None:
            vals = list(m.echo.call(7).get(timeout=CALL_TIMEOUT).values())
            assert len(vals) == p.size

        out = measure(g, p)
        self.stop(procs, extra)
        return out, None

    def payload(self, wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], float]:
        import numpy as np

        procs, a = self._one()
        arr = np.full(p.size, 7, dtype=np.uint8)

        def send() -> None:
            n = a.nbytes.call_one(arr).get(timeout=CALL_TIMEOUT)
            assert n == p.size, n

        out = measure(send, p)
        self.stop(procs, extra)
        extra["bytes"] = p.size
        return out, p.size / MiB

    def error(self, wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
        procs, a = self._one()
        types: set[str] = set()

        def err() -> None:
            try:
                a.boom.call_one().get(timeout=CALL_TIMEOUT)
            except TimeoutError:
                raise
            except Exception as e:  # the error under test
                types.add(type(e).__name__)
            else:
                raise AssertionError("boom() did not raise")

        out = measure(err, p)
        extra["error_types"] = sorted(types)
        self.stop(procs, extra)
        return out, None

    def crash(self, wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
        limit = float(p.size)
        witness_procs, witness = self._one()
        types: list[str] = []
        not_noticed = 0
        survived: list[bool] = []
        witness_errors: list[str] = []

        def once() -> float:
            nonlocal not_noticed
            procs, a = self._one()
            a.ping.call_one().get(timeout=CALL_TIMEOUT)
            t0 = time.perf_counter()
            fut = a.die.call_one()
            try:
                fut.get(timeout=limit)
            except TimeoutError:
                not_noticed += 1
                dt = float("nan")
            except Exception as e:  # the failure under test
                dt = time.perf_counter() - t0
                types.append(f"{type(e).__name__}: {e}"[:200])
            else:
                raise AssertionError("die() returned a value")
            self.stop(procs, extra)
            # The client must still work after an actor's process died.
            try:
                witness.ping.call_one().get(timeout=10)
                survived.append(True)
            except Exception as e:
                survived.append(False)
                witness_errors.append(f"{type(e).__name__}: {e}"[:300])
            return dt

        raw = measure_each(once, p)
        self.stop(witness_procs, extra)
        extra["errors_seen"] = sorted(set(types))
        extra["not_noticed_within_s"] = limit if not_noticed else None
        extra["not_noticed"] = not_noticed
        extra["client_survived"] = all(survived) if survived else None
        if witness_errors:
            extra["client_errors_after_crash"] = sorted(set(witness_errors))
        out = [x for x in raw if x == x]  # drop NaN (not noticed)
        if not out:
            raise TimeoutError(f"no crash was noticed by the caller within {limit} s")
        return out, None

    def memory(self, wl: Workload, p: Params, extra: dict[str, Any]) -> tuple[list[float], None]:
        procs = self.procs(p.size)
        m = self.actors(procs)
        infos = list(m.info.call().get(timeout=CALL_TIMEOUT).values())
        time.sleep(p.budget_s)  # let it settle, idle
        mems = [proc_memory(pid) for pid, _ in infos]
        extra["pids"] = [pid for pid, _ in infos]
        extra["torch_loaded"] = any(t for _, t in infos)
        extra["pss"] = [m_.get("Pss") for m_ in mems]
        extra["what"] = "VmRSS of each proc hosting one idle actor"
        self.stop(procs, extra)
        return [float(m_["VmRSS"]) for m_ in mems], None

    def impls(self) -> dict[str, Callable[..., Any]]:
        return {
            "spawn": self.spawn,
            "call_one": self.call_one,
            "throughput": self.throughput,
            "plain_throughput": self.plain_throughput,
            "plain_throughput_notorch": self.plain_throughput,
            "gather": self.gather,
            "gather64": self.gather,
            "spawn64": self.spawn,
            "payload_1MiB": self.payload,
            "payload_16MiB": self.payload,
            "payload_128MiB": self.payload,
            "error": self.error,
            "crash": self.crash,
            "memory": self.memory,
        }
