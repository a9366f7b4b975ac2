"""Data-parallel training that keeps going when a replica's process is killed.

Run it with ``python examples/elastic_ddp.py [--steps N]``; kill one of the
pids it prints on its first line (``kill -9 <pid>``) while it runs.

::

    client ──step(k)──▶ coordinator (its own proc; owns the replicas)
                          ├─ replica 0 ┐ train_step(k): loss and gradients of its
                          ├─ replica 1 │ share of step k's batch, all_reduce over
                          ├─ replica 2 │ gloo (one group per membership), then
                          ├─ replica 3 ┘ commit(k): optimizer.step()
                          └─ spare       a replacement, ready to join

Four replicas train a small model on synthetic data (a fixed seed, one global
batch of 64 samples per step, each member taking ``membership.shard(64)``).
When a replica's process dies mid-step, the step is abandoned on the others
and run again at world size 3 from the same state, the spare copies a healthy
replica's state over ``RDMABuffer`` and joins at the next step boundary, and
training goes on at world size 4. No step is redone from a checkpoint.

It prints ``PIDS`` (the replicas' processes) once, ``STEP <k> world=<n>
loss=<x>`` after every step, ``REPLICAS_EQUAL`` (parameters compared across
the replicas) and last ``DONE steps=<N> lost=<n> restarts=<r> lost_steps=<l>
recovery_s=<t>`` (``lost``: replicas lost; ``restarts``: spares and
replacements that joined; ``recovery_s``: from the coordinator seeing the last
loss to the next step committed at full size, ``none`` without a loss and
``not-recovered`` when the run ended below full size).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from typing import Any

# One thread per replica: four replicas share two cores here, and OpenMP's idle
# threads spinning between steps would take their CPU (set before torch loads;
# the replicas' processes inherit it).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from danaus.elastic import ElasticMesh, ElasticReplica

REPLICAS = 4
BATCH = 64  # samples per step, shared among the members
SEED = 0


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: the same on every replica."""
    g = torch.Generator().manual_seed(SEED * 100_003 + step)
    x = torch.randn(BATCH, 8, generator=g)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.5 * x[:, 4:5]
    return x, y


class Trainer(ElasticReplica):
    def __init__(self) -> None:
        torch.manual_seed(SEED)  # the same initial weights on every replica
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )
        self.params = list(self.model.parameters())
        self.opt = torch.optim.SGD(self.params, lr=0.05, momentum=0.9)
        for p in self.params:  # momentum buffers exist from the start: they are state too
            self.opt.state[p]["momentum_buffer"] = torch.zeros_like(p)

    def train_step(self, step: int) -> float:
        x, y = batch(step)
        mine = list(self.membership.shard(BATCH))
        self.opt.zero_grad()
        out = self.model(x[mine])
        # The sum over this member's samples / the global batch: summed over the
        # members, the mean over the batch, whatever the world size.
        loss = torch.nn.functional.mse_loss(out, y[mine], reduction="sum") / BATCH
        loss.backward()
        self.all_reduce([p.grad for p in self.params])
        return float(loss.detach())

    def commit(self, step: int) -> None:
        self.opt.step()

    def state(self) -> list[torch.Tensor]:
        return [*self.params, *(self.opt.state[p]["momentum_buffer"] for p in self.params)]

    def digest(self) -> str:
        h = hashlib.sha256()
        for t in self.state():
            h.update(t.detach().numpy().tobytes())
        return h.hexdigest()


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--spares", type=int, default=1)
    args = parser.parse_args(argv)

    mesh = ElasticMesh(Trainer, replicas=REPLICAS, spares=args.spares, timeout=60.0)
    try:
        print("PIDS " + " ".join(str(p) for p in mesh.pids), flush=True)
        for k in range(args.steps):
            world, losses = mesh.step(k)
            print(f"STEP {k} world={world} loss={sum(losses):.6f}", flush=True)
        digests = mesh.call("digest")
        stats = mesh.stats()
    finally:
        mesh.stop()
    print(f"REPLICAS_EQUAL {len(set(digests)) == 1}", flush=True)
    if not stats.lost:
        recovery = "none"
    elif stats.recovery_s is None:  # never back at full size since the last loss
        recovery = "not-recovered"
    else:
        recovery = f"{stats.recovery_s:.3f}"
    print(
        f"DONE steps={stats.steps} lost={stats.lost} restarts={stats.restarts} "
        f"lost_steps={stats.lost_steps} recovery_s={recovery}",
        flush=True,
    )


if __name__ == "__main__":
    main()
