"""The danaus demo: a mesh of real processes on this machine, messaged with a few verbs.

Run it with ``./scripts/demo``. It spawns 4 procs, an actor on each, then
broadcasts, slices, calls and gathers, and stops everything cleanly.
"""

from __future__ import annotations

import os

from danaus.actor import Actor, ActorError, context, current_rank, endpoint, this_host


class Counter(Actor):
    """Counts; each instance lives in its own process."""

    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.value += by

    @endpoint
    def get(self) -> int:
        return self.value

    @endpoint
    def whoami(self) -> str:
        me = context().actor_instance
        return f"pid {os.getpid()} rank {me.rank} (this message: {current_rank()})"

    @endpoint
    def divide(self, x: int) -> float:
        return self.value / x


def main() -> None:
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    print("A proc mesh of 2 x 2 processes:")
    print(procs.to_table())

    counters = procs.spawn("counters", Counter, 0)
    counters.initialized.get(timeout=30)

    counters.incr.broadcast()  # fire and forget, to every actor
    counters.slice(gpus=1).incr.broadcast(10)  # only the actors with gpus == 1
    print("\nAfter a broadcast and a sliced broadcast:")
    print(counters.get.call().get(timeout=30))

    one = counters.slice(hosts=1, gpus=1)
    print("\ncall_one on one actor:", one.get.call_one().get(timeout=30))
    print("\nWho is who:")
    for point, text in counters.whoami.call().get(timeout=30).items():
        print(f"  {point}: {text}")

    try:
        counters.slice(hosts=0, gpus=0).divide.call_one(0).get(timeout=30)
    except ActorError as e:
        # The error carries the remote exception and its traceback; the actor lives on.
        print(f"\nThe remote exception came back: {type(e.exception).__name__}: {e.exception}")
    print("still answering:", counters.slice(hosts=0, gpus=0).get.call_one().get(timeout=30))

    procs.stop().get(timeout=30)
    print("\nAll procs stopped. Bye.")


if __name__ == "__main__":
    main()
