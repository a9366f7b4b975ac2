"""Autograd, modules, no_grad, grad_generator and remote functions on the mesh."""

from __future__ import annotations

import pytest

import danaus
from danaus.actor import ProcMesh

from . import helpers
from .conftest import COORDS, base, local_base, torch

pytestmark = pytest.mark.torch


def test_backward_gives_each_shard_the_gradient_of_its_own_loss(mesh: ProcMesh) -> None:
    with mesh.activate():
        w = torch.ones(6, requires_grad=True)
        x = base(mesh)
        loss = (w * x * x).sum()
        loss.backward()
        grad = w.grad
    assert isinstance(grad, danaus.Tensor)
    for h, g in COORDS:
        lw = torch.ones(6, requires_grad=True)
        lx = local_base(h, g)
        (lw * lx * lx).sum().backward()
        assert torch.equal(danaus.inspect(grad, host=h, gpu=g), lw.grad)


def test_a_module_created_under_the_mesh_trains_like_a_local_one(mesh: ProcMesh) -> None:
    torch.manual_seed(0)
    local = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    state = {k: v.clone() for k, v in local.state_dict().items()}
    with mesh.activate():
        model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        model.load_state_dict(danaus.to_mesh(state, mesh))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = base(mesh).reshape(1, 6) / 10
        for _ in range(3):
            opt.zero_grad()
            loss = model(x).pow(2).sum()
            loss.backward()
            opt.step()
        with torch.no_grad():
            frozen = model(x)
        assert not frozen.requires_grad
    lopt = torch.optim.SGD(local.parameters(), lr=0.1)
    lx = local_base(1, 1).reshape(1, 6) / 10
    for _ in range(3):
        lopt.zero_grad()
        local(lx).pow(2).sum().backward()
        lopt.step()
    got = danaus.inspect(dict(model.named_parameters()), host=1, gpu=1)
    for name, p in local.named_parameters():
        assert torch.allclose(got[name], p.detach(), atol=1e-6), name


def test_grad_generator_yields_each_gradient_in_the_order_asked(mesh: ProcMesh) -> None:
    with mesh.activate():
        a = torch.ones(6, requires_grad=True)
        b = torch.full((6,), 2.0, requires_grad=True)
        loss = (a * b * base(mesh)).sum()
        grads = list(danaus.grad_generator(loss, [b, a]))
        for gr in grads:
            gr.reduce_("gpu", "sum")
    for h, g in COORDS:
        both = local_base(h, 0) + local_base(h, 1)
        gb, ga = danaus.inspect(grads, host=h, gpu=g)
        assert torch.equal(gb, both)
        assert torch.equal(ga, 2 * both)


def test_remote_with_and_without_propagate(mesh: ProcMesh) -> None:
    scaled = danaus.remote(helpers.add_and_scale, propagate=lambda x, k: x)
    by_running_it = danaus.remote(helpers.split_halves)
    by_name = danaus.remote("tests.tensor.helpers.add_and_scale", propagate=lambda x, k: x)
    with mesh.activate():
        x = base(mesh)
        y = scaled(x, 3.0)
        lo, hi = by_running_it(x)
        z = by_name(x, -1.0)
        assert (lo.shape, hi.shape) == ((3,), (3,))
    for h, g in COORDS:
        lx = local_base(h, g)
        assert torch.equal(danaus.inspect(y, host=h, gpu=g), (lx + 1) * 3)
        assert torch.equal(danaus.inspect(hi, host=h, gpu=g), lx[3:])
        assert torch.equal(danaus.inspect(z, host=h, gpu=g), -(lx + 1))


def test_remote_in_place_and_its_adverbs_return_values_to_the_client(mesh: ProcMesh) -> None:
    doubler = danaus.remote(helpers.double_in_place)
    describe = danaus.remote(helpers.describe, propagate=lambda x: None)
    with mesh.activate():
        x = base(mesh)
        doubler(x)
        values = describe.call(x).get(timeout=30)
        one = danaus.call_on_shard_and_fetch(describe, x, shard={"host": 1, "gpu": 1})
    assert one.get(timeout=30) == {"sum": float((local_base(1, 1) * 2).sum()), "shape": [6]}
    for point, v in values.items():
        expect = float((local_base(point["host"], point["gpu"]) * 2).sum())
        assert v == {"sum": expect, "shape": [6]}


def test_send_takes_a_remote_function_and_each_procs_result_reaches_the_port(
    mesh: ProcMesh,
) -> None:
    # Monarch's getting-started: send(check_memory, args=(), kwargs={}, port=port).
    from danaus.actor import Channel, send

    describe = danaus.remote(helpers.describe, propagate=lambda x: None)
    port, receiver = Channel.open()
    with mesh.activate():
        x = base(mesh)
        send(describe, args=(x,), kwargs={}, port=port)
    got = sorted(receiver.recv().get(timeout=30)["sum"] for _ in COORDS)
    assert got == sorted(float(local_base(h, g).sum()) for h, g in COORDS)
    with pytest.raises(TypeError, match=r"endpoint of an actor mesh .* or a remote function"):
        send(helpers.describe, args=(), kwargs={}, port=port)  # a plain function


def test_a_remote_function_that_raises_fails_its_results_only(mesh: ProcMesh) -> None:
    fails = danaus.remote(helpers.fails, propagate=lambda x: x)
    with mesh.activate():
        x = base(mesh)
        bad = fails(x)
        fine = x + 1
    with pytest.raises(danaus.RemoteTensorError, match="boom from a remote function"):
        danaus.inspect(bad)
    assert torch.equal(danaus.inspect(fine), local_base(0, 0) + 1)


def test_a_remote_function_that_raises_system_exit_fails_its_results_and_the_stream_goes_on(
    mesh: ProcMesh,
) -> None:
    exits = danaus.remote(helpers.exits, propagate=lambda x: x)
    with mesh.activate():
        x = base(mesh)
        bad = exits(x)
        after = x + 1  # the same stream, after the exit: it still runs
    with pytest.raises(danaus.RemoteTensorError, match="SystemExit"):
        danaus.inspect(bad)
    assert torch.equal(danaus.inspect(after), local_base(0, 0) + 1)


def test_remote_needs_an_active_mesh() -> None:
    with pytest.raises(ValueError, match="active mesh"):
        danaus.remote(helpers.add_and_scale)(torch.ones(2), 1.0)
