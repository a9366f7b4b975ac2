"""Data-parallel training of a small MLP on 4 CPU procs, checked against one process.

Run it with ``python examples/ddp_cpu.py``; it takes a few seconds.

Each proc of a ``{"dp": 4}`` mesh holds a copy of the model and its own
quarter of a synthetic batch. Every step it computes its local loss and
gradients, averages the gradients over ``dp`` with ``reduce_`` (an
all-reduce through torch.distributed/gloo), and takes an SGD step. Since the
quarters are equal, the averaged gradient is the gradient of the whole
batch, so after 50 steps the model and its loss match plain training in one
process on the concatenated batch; the script prints both losses.
"""

from __future__ import annotations

from typing import Any

import torch

import danaus
from danaus.actor import this_host

STEPS = 50
PER_RANK = 8
LR = 0.1


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def make_data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(world * PER_RANK, 16, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x, y


def train_distributed(mesh: Any, steps: int = STEPS) -> tuple[float, dict[str, torch.Tensor]]:
    """Train on ``mesh`` (one dimension, ``dp``); return the whole batch's loss and the weights."""
    torch.manual_seed(0)
    init = make_model().state_dict()
    world = mesh.size("dp")
    x_all, y_all = make_data(world)
    on_mesh = danaus.to_mesh({"x": x_all, "y": y_all, "init": init}, mesh)
    with mesh.activate():
        model = make_model()
        model.load_state_dict(on_mesh["init"])
        # each proc keeps its own rows of the batch
        rows = torch.arange(PER_RANK) + mesh.rank("dp") * PER_RANK
        x, y = on_mesh["x"][rows], on_mesh["y"][rows]
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            params = list(model.parameters())
            grads = danaus.grad_generator(loss, list(reversed(params)))
            with torch.no_grad():
                for p, g in zip(reversed(params), grads, strict=True):
                    g.reduce_("dp", "avg")
                    p -= LR * g
        with torch.no_grad():
            final = torch.nn.functional.mse_loss(model(x), y).reduce("dp", "avg")
        weights = dict(model.state_dict())
    loss_value, weights = danaus.inspect((final, weights))
    return float(loss_value), weights


def train_local(world: int, steps: int = STEPS) -> tuple[float, dict[str, torch.Tensor]]:
    """The same training in this process, on the concatenated batch."""
    torch.manual_seed(0)
    model = make_model()
    x, y = make_data(world)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x), y)
    return float(final), {k: v.clone() for k, v in model.state_dict().items()}


def main(mesh: Any = None) -> tuple[float, float]:
    procs = None
    if mesh is None:
        procs = mesh = this_host().spawn_procs(per_host={"dp": 4})
    try:
        dist_loss, dist_w = train_distributed(mesh)
        local_loss, local_w = train_local(mesh.size("dp"))
        diff = max(float((dist_w[k] - local_w[k]).abs().max()) for k in local_w)
        print(f"data-parallel loss after {STEPS} steps: {dist_loss:.6f}")
        print(f"one-process loss after {STEPS} steps:  {local_loss:.6f}")
        print(f"largest weight difference: {diff:.2e}")
        return dist_loss, local_loss
    finally:
        if procs is not None:
            procs.stop().get()


if __name__ == "__main__":
    main()
