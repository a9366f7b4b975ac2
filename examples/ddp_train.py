"""A plain ``torch.distributed`` DDP training script (gloo, CPU): nothing danaus in it.

Run it with torchrun::

    torchrun --standalone --nproc-per-node 4 examples/ddp_train.py weights.pt

or on a danaus mesh with the same environment (``examples/spmd_ddp.py``).
Every rank trains on its own data (seeded by ``RANK``); rank 0 saves the
final weights to the path given as the first argument.
"""

from __future__ import annotations

import gc
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 20


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights everywhere
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)
    for _ in range(STEPS):
        x = torch.randn(32, 8, generator=data)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients of all ranks
        opt.step()
    if rank == 0:
        torch.save(model.state_dict(), out)
        print(f"rank 0 of {dist.get_world_size()}: final loss {loss.item():.4f}, saved {out}")
    dist.barrier()  # nobody tears gloo down while another rank still talks to it
    # End the process group before the interpreter does: left to finalization, gloo's
    # threads can outlive the objects they use and abort the rank ("terminate called
    # without an active exception"; 1 run in 20 of torchrun here with torch 2.13).
    # DDP's reducer holds the group too: drop it first, so the group's last reference
    # goes (and its threads are joined) here, not in the interpreter's finalization.
    del ddp, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
