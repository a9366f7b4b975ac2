"""Distributed tensors, on CPU: Monarch's tour of its tensor engine, run with danaus.

Run it with ``python examples/distributed_tensors.py``; it takes several seconds.

It follows Monarch's ``docs/source/examples/distributed_tensors.py`` with
``monarch`` replaced by ``danaus`` and CPU tensors instead of CUDA ones (with
``tensor_device="cuda"`` it runs on the GPUs, a failing allocation instead of
an index out of range as its failing command):
activate a mesh, inspect shards, compute, reduce over each dimension and
both, rename and split the mesh, run a two-stage pipeline with ``to_mesh``,
train data-parallel with ``grad_generator`` and ``reduce_`` on a ``comms``
stream, and recover from an op that fails on the workers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import danaus
from danaus.actor import this_host


def tour(mesh: Any) -> None:
    print(mesh.to_table())

    # Without an active mesh, torch runs locally; once active, on every proc of the mesh.
    with mesh.activate():
        t = torch.rand(3, 4)
    print("t is", t)

    # inspect brings one proc's shard (coordinates default to 0) to the client.
    print("t on (host=0, gpu=0):\n", danaus.inspect(t))
    danaus.show(t, gpu=1)

    with mesh.activate():
        obj = t @ t.T
        danaus.show(obj)

    # A failing command leaves the workers alive for the next ones.
    try:
        with mesh.activate():
            if t.device.type == "cuda":  # as Monarch's tour: too big for the GPU (an
                v = t @ torch.rand(4, 1 << 43)  # index out of range would be fatal on CUDA)
            else:
                bad = t[torch.tensor([100])]  # index out of range on every worker
                v = bad @ t.T
        danaus.inspect(v)
    except danaus.RemoteTensorError as e:
        print(f"recovered from a remote failure of {e.op} on rank {e.ranks[0]}")
    with mesh.activate():
        print("still working:", danaus.inspect((t * 0 + 1).sum()))

    # Collectives: each proc has its own shard; reduce over named dimensions.
    with mesh.activate():
        a = torch.ones(2) * (mesh.rank("host") * 2 + mesh.rank("gpu"))
        rgpu = a.reduce("gpu", "sum")
        rhost = a.reduce("host", "sum")
        rall = a.reduce(("host", "gpu"), "sum")
    for h in range(2):
        for g in range(2):
            print(
                f"(host={h}, gpu={g}): a={danaus.inspect(a, host=h, gpu=g).tolist()} "
                f"sum over gpu={danaus.inspect(rgpu, host=h, gpu=g).tolist()} "
                f"over host={danaus.inspect(rhost, host=h, gpu=g).tolist()} "
                f"over both={danaus.inspect(rall, host=h, gpu=g).tolist()}"
            )

    # Meshes can be renamed and reshaped to fit the parallelism wanted.
    print(mesh.rename(host="dp", gpu="tp").to_table())
    print(mesh.split(host=("dp", "pp"), gpu=("tp",), pp=2).to_table())

    pipeline(mesh)
    data_parallel(mesh)


def pipeline(mesh: Any) -> None:
    """Two pipeline stages: each is a slice of the mesh; activations move with to_mesh."""
    pipeline_mesh = mesh.rename(host="pp")
    meshes = [pipeline_mesh.slice(pp=i) for i in range(pipeline_mesh.size("pp"))]
    stages = []
    for stage_mesh in meshes:
        with stage_mesh.activate():
            stages.append(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU()))

    def forward_pipeline(x: Any) -> Any:
        with torch.no_grad():
            for stage_mesh, stage in zip(meshes, stages, strict=True):
                x = x.to_mesh(stage_mesh)
                with stage_mesh.activate():
                    x = stage(x)
            return x

    with meshes[0].activate():
        inp = torch.rand(3, 4)
    output = forward_pipeline(inp)
    print("pipeline output on the last stage:")
    danaus.show(output)
    print(output.mesh.to_table())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(4):
            layers.extend([nn.Linear(4, 4), nn.ReLU()])
        self.layers = nn.Sequential(*layers)

    def forward(self, inp: Any, target: Any) -> Any:
        return torch.nn.functional.cross_entropy(self.layers(inp), target)


def data_parallel(mesh: Any) -> None:
    """Monarch's DDP loop: gradients reduced over ``dp`` on a comms stream as they come."""
    dp_mesh = mesh.rename(gpu="dp")
    comms = danaus.Stream("comms")

    def train(model: Any, inp: Any, target: Any) -> Any:
        loss = model(inp, target)
        rparameters = list(reversed(list(model.parameters())))
        grads = danaus.grad_generator(loss, rparameters)
        with torch.no_grad():
            it = iter(
                (param, grad, *comms.borrow(grad, mutable=True))
                for param, grad in zip(rparameters, grads, strict=True)
            )
            todo = next(it, None)
            while todo is not None:
                param, grad, comm_grad, borrow = todo
                with comms.activate():
                    comm_grad.reduce_("dp", "sum")
                todo = next(it, None)
                borrow.drop()
                param -= 0.01 * grad
        return loss

    with dp_mesh.activate():
        model = Net()
        inp = torch.rand(3, 4)
        target = torch.full((3,), 1, dtype=torch.int64)
        for step in range(3):
            loss = train(model, inp, target)
            value = float(danaus.inspect(loss))
            print(f"data-parallel step {step}: loss on (host=0, dp=0) {value:.4f}")


def main(mesh: Any = None) -> None:
    procs = None
    if mesh is None:
        procs = mesh = this_host().spawn_procs(per_host={"host": 2, "gpu": 2})
    try:
        tour(mesh)
    finally:
        if procs is not None:
            procs.stop().get()
    print("done")


if __name__ == "__main__":
    main()
