"""A first training job: data-parallel training driven from one client script.

Run it with ``python examples/first_training_job.py`` (CPU is enough; it
takes a few seconds), or ``python examples/first_training_job.py process`` to
run the same trainers on a ``ProcessJob``'s worker instead of this process's
host. ``docs/tutorial-training.md`` walks through it section by section, and
``tests/integration/test_first_training_job.py`` runs it.

The client spawns two procs, gives them torchrun's environment, and spawns a
``Trainer`` on each under a supervisor. Each trainer joins a torch.distributed
process group, picks its device from its local rank, and wraps its model in
``DistributedDataParallel``. The client drives ``train_step`` and prints the
loss, checkpoints every few steps, makes one trainer fail, and resumes from
the checkpoint once the supervisor has restarted it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from danaus.actor import Actor, endpoint, this_host
from danaus.job import ProcessJob
from danaus.spmd import setup_torch_elastic_env
from danaus.supervisor import Supervisor
from danaus.testing import wait_until

STEPS = 12
CHECKPOINT_EVERY = 4
FAIL_AFTER = 6  # after this many steps, one trainer fails
TIMEOUT = 60.0


class Trainer(Actor):
    """One data-parallel replica: a model, an optimizer, and its share of the data."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.model: Any = None

    @endpoint
    def join(self, checkpoint: str) -> int:
        """Join the process group, build the model, resume from ``checkpoint`` if it exists."""
        if dist.is_initialized():  # a group from before a failure: leave it first
            dist.destroy_process_group()
        # setup_torch_elastic_env gave this proc torchrun's variables.
        self.rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)  # danaus binds no device: pick yours
            self.device = torch.device("cuda", local_rank)
            backend = "nccl"
        else:
            self.device = torch.device("cpu")
            backend = "gloo"
        dist.init_process_group(backend)  # reads RANK, WORLD_SIZE, MASTER_ADDR/PORT

        torch.manual_seed(0)  # the same initial weights on every rank
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        ).to(self.device)
        self.opt = torch.optim.SGD(model.parameters(), lr=self.lr)
        self.step = 0
        if os.path.exists(checkpoint):
            state = torch.load(checkpoint, map_location=self.device)
            model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["opt"])
            self.step = state["step"]
        self.model = DistributedDataParallel(model)
        return self.step

    @endpoint
    def train_step(self) -> float:
        """One step on this rank's batch; DDP averages the gradients of all ranks."""
        data = torch.Generator().manual_seed(self.step * 1000 + self.rank)
        x = torch.randn(64, 8, generator=data).to(self.device)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.step += 1
        return loss.item()

    @endpoint
    def save(self, checkpoint: str) -> None:
        """Rank 0 writes the checkpoint; every rank waits until it is there."""
        if self.rank == 0:
            state = {
                "model": self.model.module.state_dict(),
                "opt": self.opt.state_dict(),
                "step": self.step,
            }
            torch.save(state, checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)  # never a half-written file
        dist.barrier()

    @endpoint
    def fail(self) -> None:
        raise RuntimeError("a simulated fault")

    def __cleanup__(self, exc: BaseException | None) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def get_hosts(where: str) -> tuple[Any, ProcessJob | None]:
    """The hosts to train on: this machine, or a ProcessJob's worker."""
    if where == "local":
        hosts = this_host()
        return hosts, None
    if where == "process":
        job = ProcessJob({"hosts": 1})
        return job.state(cached_path=None).hosts, job
    raise SystemExit(f"usage: first_training_job.py [local|process], not {where!r}")


def main(where: str = "local") -> list[float]:
    hosts, job = get_hosts(where)
    tmp = tempfile.TemporaryDirectory()
    checkpoint = os.path.join(tmp.name, "checkpoint.pt")
    try:
        procs = hosts.spawn_procs(per_host={"gpus": 2})  # a dimension: binds no device
        setup_torch_elastic_env(procs)  # RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT
        sup = Supervisor(strategy="one_for_one", max_restarts=3)
        trainers = sup.spawn(procs, "trainers", Trainer, 0.05)
        trainers.join.call(checkpoint).get(timeout=TIMEOUT)

        losses = []
        step = 0
        while step < STEPS:
            per_rank = trainers.train_step.call().get(timeout=TIMEOUT)  # a ValueMesh
            loss = sum(per_rank.values()) / len(per_rank)
            losses.append(loss)
            step += 1
            print(f"step {step}: loss {loss:.4f}")
            if step % CHECKPOINT_EVERY == 0:
                trainers.save.call(checkpoint).get(timeout=TIMEOUT)
            if step == FAIL_AFTER and not sup.restarts:
                trainers.slice(gpus=1).fail.broadcast()  # no caller to raise to: it fails
                wait_until(lambda: sup.restarts, timeout=TIMEOUT, what="a restart")
                print(f"restarted: {sup.restarts[0].reason.splitlines()[0]}")
                setup_torch_elastic_env(procs)  # a fresh MASTER_PORT for the new group
                resumed = trainers.join.call(checkpoint).get(timeout=TIMEOUT)
                step = min(resumed.values())  # every rank resumed at the same step
                print(f"resumed from the checkpoint of step {step}")
        procs.stop().get(timeout=TIMEOUT)
        return losses
    finally:
        if job is not None:
            job.kill()
        tmp.cleanup()


if __name__ == "__main__":
    main(*sys.argv[1:2])
