"""danaus worker: the workloads of ``_mesh_bench`` on ``danaus.actor``.

Like Monarch, danaus ends the client when an actor's proc dies and no one
handles the failure (``danaus.actor.unhandled_fault_hook``); the crash workload
needs the client to survive and see the error on its future, so this worker
replaces the hook with one that drops the fault, as ``monarch_bench`` does.
"""

from __future__ import annotations

import functools
import os
import sys

import _large_bench
import _torch_first  # noqa: F401  (first: torch before danaus, for the workloads that ask)
from _common import run_worker
from _mesh_bench import MeshSystem
from workloads import LARGE

import danaus.actor
from danaus.actor import Actor, endpoint, shutdown_context, this_host

faults: list[str] = []


def _keep_running(failure) -> None:  # MeshFailure
    faults.append(str(failure)[:200])


# Set by attribute even where the installed danaus predates the hook.
danaus.actor.unhandled_fault_hook = _keep_running  # type: ignore[attr-defined]


class Bench(Actor):
    @endpoint
    def ping(self) -> int:
        return 0

    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def nbytes(self, a) -> int:
        return len(a)

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom")

    @endpoint
    def die(self) -> None:
        os._exit(1)

    @endpoint
    def info(self):
        return os.getpid(), "torch" in sys.modules

    # -- the large-value workloads (_large_bench) --

    @endpoint
    def reset_peak(self) -> int:
        return _large_bench.reset_peak()

    @endpoint
    def peak(self) -> int:
        return _large_bench.status("VmHWM")

    @endpoint
    def keep(self, n: int) -> None:
        import numpy as np

        self.kept = np.full(n, 7, dtype=np.uint8)

    @endpoint
    def get(self):
        return self.kept

    @endpoint
    def register(self, n: int):
        import numpy as np

        from danaus.rdma import RDMABuffer

        self.kept = np.full(n, 7, dtype=np.uint8)
        self.buf = RDMABuffer(self.kept)
        return self.buf


def _teardown() -> None:
    shutdown_context()


def _traced(impls: dict) -> dict:
    """Each workload inside ``danaus.trace`` (the ``danaus_traced`` system of run.py)."""
    import tempfile

    import danaus

    def wrap(fn):
        def run(wl, p, extra):
            with tempfile.TemporaryDirectory() as d, danaus.trace(os.path.join(d, "t.json")) as t:
                out = fn(wl, p, extra)
            extra["trace_events"] = t.summary.get("events")
            return out

        return run

    return {name: wrap(fn) for name, fn in impls.items()}


if __name__ == "__main__":
    system = MeshSystem("danaus", this_host, Bench)
    impls = system.impls()
    for name in LARGE:
        impls[name] = functools.partial(_large_bench.run, system.procs, Bench)
    # run.py's variants: danaus_nometrics sets DANAUS_METRICS=0, danaus_traced this.
    if os.environ.get("DANAUS_BENCH_TRACE") == "1":
        impls = _traced(impls)
    run_worker("danaus", impls, teardown=_teardown)
