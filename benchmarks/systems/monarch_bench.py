"""PyTorch Monarch worker (torchmonarch 0.7): the workloads of ``_mesh_bench`` on ``monarch.actor``.

Runs under ``benchmarks/.envs/monarch/bin/python`` (see ``setup_comparators.sh``).
Monarch's default ``unhandled_fault_hook`` exits the client when an actor's
proc dies; the crash workload needs the client to survive and see the error on
its future, so this worker replaces the hook with one that drops the fault.
"""

from __future__ import annotations

import os
import sys

import _torch_first  # noqa: F401  (first: torch before monarch, for the workloads that ask)
import monarch.actor
from _common import run_worker
from _mesh_bench import MeshSystem
from monarch.actor import Actor, endpoint, shutdown_context, this_host

faults: list[str] = []


def _keep_running(failure) -> None:  # MeshFailure
    faults.append(str(failure)[:200])


monarch.actor.unhandled_fault_hook = _keep_running


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


def _teardown() -> None:
    r = shutdown_context()
    if hasattr(r, "get"):
        r.get(timeout=30)


if __name__ == "__main__":
    run_worker("monarch", MeshSystem("monarch", this_host, Bench).impls(), teardown=_teardown)
