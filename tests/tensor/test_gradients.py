"""danaus.gradient, danaus.gradient_generator and danaus.grad_function: gradients one at a
time and hand-written backwards, checked against torch.autograd on local and mesh tensors.
The first tests are Monarch's python/tests/test_grad_generator.py, rewritten."""

from __future__ import annotations

from typing import Any

import pytest

import danaus
from danaus.actor import ProcMesh

from .conftest import COORDS, base, local_base, torch

pytestmark = pytest.mark.torch

from danaus.gradient import GradientGenerator  # noqa: E402
from danaus.gradient_generator import (  # noqa: E402
    GradGenerator,
    grad_function,
    grad_generator,
    gradient_execution_order,
)


def same(got: list[Any], expected: Any) -> bool:
    return len(got) == len(expected) and all(
        (a is None and b is None) or (a is not None and b is not None and torch.allclose(a, b))
        for a, b in zip(got, expected, strict=True)
    )


def test_simple() -> None:
    t = torch.rand(2, requires_grad=True)
    t2 = torch.rand(2, requires_grad=True)
    a, b = torch.std_mean(t + t2)
    expected = torch.autograd.grad([a, b], [t2, t], retain_graph=True)
    assert same(list(GradientGenerator([a, b], [t2, t])), expected)


def test_pipeline_like_with_an_unused_tensor() -> None:
    t = torch.rand(3, 3, requires_grad=True)
    w1, w2, w3 = (torch.rand(3, 2, requires_grad=True) for _ in range(3))
    w4, w5, w6 = (torch.rand(2, 3, requires_grad=True) for _ in range(3))
    u = torch.rand(3, 2, requires_grad=True)
    _ = u * u
    relu = torch.nn.functional.relu
    a = relu(t @ (w1 @ w4))
    a = relu(a @ (w2 @ w5))
    a = relu(a @ (w3 @ w6))
    std, _mean = torch.std_mean(a)
    loss = std + std
    wrt = [t, w3, w6, u, w2, w5]
    expected = torch.autograd.grad([loss], wrt, allow_unused=True, retain_graph=True)
    got = list(GradientGenerator([loss], wrt))
    assert got[3] is None  # the loss does not depend on u
    assert same(got, expected)


def test_tree_and_broadcast() -> None:
    t = torch.rand(3, 3, requires_grad=True)
    t2, t3, t4, t5 = t + t, t * t, t / t, t - t
    t11 = (t2 * t3 + t4 * t5 + t2 * t4 + t3 * t5).sum()
    expected = torch.autograd.grad([t11], [t2, t], retain_graph=True)
    assert same(list(GradientGenerator([t11], [t2, t])), expected)
    v = torch.rand(3, requires_grad=True)
    r = (t * (v / v)).sum()
    expected = torch.autograd.grad([r], [t, v], retain_graph=True)
    assert same(list(GradientGenerator([r], [t, v])), expected)


def test_grad_order() -> None:
    t = torch.rand(3, 3, requires_grad=True)
    w1, w2, w3 = (torch.rand(3, 3, requires_grad=True) for _ in range(3))
    relu = torch.nn.functional.relu
    a = relu(t @ w1)
    a = relu(a @ w2)
    a = relu(a @ w3)
    std, _mean = torch.std_mean(a)
    assert gradient_execution_order([std + std], [w2, w3, w1, a]) == [3, 1, 0, 2]


def test_grad_roots_edges_and_non_scalar_roots() -> None:
    x = torch.rand(3, requires_grad=True)
    y = x * x
    g = torch.tensor([1.0, 2.0, 3.0])
    # a root without an incoming gradient gets ones of its shape, scalar or not (Monarch's)
    (ones,) = GradientGenerator([y], [x])
    assert torch.allclose(ones, 2 * x)
    (weighted,) = GradientGenerator([x * x], [x], [g])
    assert torch.allclose(weighted, 2 * x * g)
    h = x * 2
    edge = torch.autograd.graph.get_gradient_edge(h * h)
    assert h.grad_fn is not None
    by_node, by_tensor = GradientGenerator([edge], [(h.grad_fn, 0), x])  # a (Node, int) pair
    assert torch.allclose(by_node, 2 * h) and torch.allclose(by_tensor, 8 * x)


def test_the_backward_runs_at_the_first_next_and_the_generator_then_ends() -> None:
    x = torch.rand(3, requires_grad=True)
    h = x * 2
    ran: list[int] = []
    h.register_hook(lambda g: ran.append(1))
    gen = GradientGenerator([(h * h).sum()], [x, h])
    assert ran == []  # nothing computed yet
    gx = next(gen)
    assert ran == [1]
    gh = next(gen)
    assert torch.allclose(gx, 8 * x) and torch.allclose(gh, 2 * h)
    with pytest.raises(StopIteration):
        next(gen)
    assert ran == [1]


def test_grad_generator_builds_a_gradient_generator() -> None:
    assert danaus.grad_generator is grad_generator
    x = torch.rand(2, requires_grad=True)
    gen = grad_generator((x * 3).sum(), [x])
    assert isinstance(gen, GradientGenerator)
    assert torch.equal(next(gen), torch.full((2,), 3.0))
    assert list(grad_generator(torch.ones(1, requires_grad=True) * 2, [])) == []


def test_bad_arguments_are_clear_errors() -> None:
    x = torch.rand(2, requires_grad=True)
    loss = (x * x).sum()
    with pytest.raises(TypeError, match="roots must be a list"):
        GradientGenerator(loss, [x])
    with pytest.raises(TypeError, match=r"with_respect_to: each item must be a tensor or a \(Node"):
        GradientGenerator([loss], ["x"])
    with pytest.raises(ValueError, match="does not require grad"):
        GradientGenerator([loss], [torch.ones(2)])
    with pytest.raises(TypeError, match="2 entries but there are 1 roots"):
        GradientGenerator([loss], [x], [None, None])
    with pytest.raises(TypeError, match="grad_roots must be a tensor or None"):
        GradientGenerator([loss], [x], [1.0])
    with pytest.raises(TypeError, match="grad_function needs a function"):
        grad_function(3)  # type: ignore[arg-type]


def test_grad_generator_class_yields_trees_last_first() -> None:
    w1 = torch.rand(2, requires_grad=True)
    w2 = torch.rand(2, requires_grad=True)
    loss = (w1 * w2 * 3).sum()
    gg = GradGenerator()
    gg.grad({"w": w1, "step": 7})
    gg.grad([w2])
    gg.root(loss)
    second, first = list(gg)
    assert torch.allclose(second[0], w1 * 3)
    assert first["step"] == 7 and torch.allclose(first["w"], w2 * 3)


@grad_function
def _square(x: torch.Tensor) -> Any:
    """x * x whose backward is 3 * x * g on purpose, so a test can tell which backward ran."""

    def backward(g: torch.Tensor) -> torch.Tensor:
        return 3 * x * g

    return x * x, backward


@grad_function
def _mul(x: torch.Tensor, y: torch.Tensor) -> Any:
    def backward(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return g * y, g * x

    return x * y, backward


def test_grad_function_runs_its_own_backward() -> None:
    assert danaus.grad_function is grad_function
    x = torch.rand(3, requires_grad=True)
    y = torch.rand(3, requires_grad=True)
    (gx,) = torch.autograd.grad(_square(x).sum(), x)
    assert torch.allclose(gx, 3 * x)
    out = _mul(x, y)
    assert torch.allclose(out, x * y)
    gx, gy = torch.autograd.grad((out * out).sum(), [x, y])
    lx, ly = x.detach().requires_grad_(), y.detach().requires_grad_()
    ex, ey = torch.autograd.grad(((lx * ly) ** 2).sum(), [lx, ly])
    assert torch.allclose(gx, ex) and torch.allclose(gy, ey)


def test_grad_function_leaves_shared_closure_cells_and_takes_keywords() -> None:
    def make(scale: torch.Tensor) -> Any:
        @grad_function
        def scaled(x: torch.Tensor, *, shift: float = 0.0) -> Any:
            def backward(g: torch.Tensor) -> torch.Tensor:
                return g * scale  # ``scale`` is a cell shared with ``scaled`` itself

            return x * scale + shift, backward

        return scaled

    f = make(torch.tensor(2.0))
    x = torch.rand(3, requires_grad=True)
    for _ in range(2):  # the second call still sees ``scale``
        out = f(x, shift=1.0)
        assert torch.allclose(out, x * 2 + 1)
        (gx,) = torch.autograd.grad(out.sum(), x)
        assert torch.allclose(gx, torch.full((3,), 2.0))


def test_grad_function_checks_what_the_function_returns() -> None:
    with pytest.raises(TypeError, match=r"must return \(result, backward_function\)"):
        grad_function(lambda x: x * 2)(torch.ones(2, requires_grad=True))


# -- on the mesh: the same functions over mesh tensors ---------------------------------------


def test_on_a_mesh_gradients_and_a_custom_backward_match_local_torch(mesh: ProcMesh) -> None:
    with mesh.activate():
        w = torch.ones(6, requires_grad=True)
        x = base(mesh)
        loss = (_square(w * x) + w).sum()
        gen = GradientGenerator([loss], [w])
        (grad,) = list(gen)
        w2 = torch.ones(6, requires_grad=True)
        order = gradient_execution_order([(w2 * 2 * x).sum()], [w2])
    assert isinstance(grad, danaus.Tensor)
    assert order == [0]
    for h, g in COORDS:
        lx = local_base(h, g)
        lw = torch.ones(6, requires_grad=True)
        # the hand-written backward of _square (3 u g for u = w x) times x, plus 1 for + w
        expected = 3 * (lw * lx) * lx + 1
        assert torch.allclose(danaus.inspect(grad, host=h, gpu=g), expected.detach())
