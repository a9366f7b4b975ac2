"""Gradients one tensor at a time, and custom backward functions, as Monarch's.

``GradientGenerator`` (Monarch's ``monarch.gradient``, a C++ extension there)
is written here on ``torch.autograd``: it yields the gradient of the roots
with respect to each of ``with_respect_to`` in order. ``grad_generator`` (the
top-level name) and ``GradGenerator`` build one. ``grad_function`` and
``GradFunction`` turn a function returning ``(result, backward)`` into an
autograd function; ``gradient_execution_order`` says in which order autograd
would produce gradients. All of them work on local tensors and on mesh tensors
alike (the backward of a mesh tensor runs on its workers).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from types import CellType, FunctionType
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.utils import _pytree as pytree

__all__ = [
    "GradFunction",
    "GradGenerator",
    "GradientGenerator",
    "TensorOrEdge",
    "grad_function",
    "grad_generator",
    "gradient_execution_order",
]

TensorOrEdge = torch.Tensor | GradientEdge


def _edge(x: Any, what: str) -> GradientEdge:
    """``x`` (a tensor, a ``GradientEdge`` or a ``(node, input_nr)`` pair) as a gradient edge."""
    if isinstance(x, GradientEdge):
        return x
    if isinstance(x, torch.Tensor):
        if not x.requires_grad:
            raise ValueError(
                f"{what}: a tensor of shape {list(x.shape)} does not require grad; "
                "create it with requires_grad=True or compute it from one that does"
            )
        return get_gradient_edge(x)
    if (
        isinstance(x, tuple)
        and len(x) == 2
        and hasattr(x[0], "next_functions")
        and isinstance(x[1], int)
    ):
        return GradientEdge(x[0], x[1])
    raise TypeError(
        f"{what}: each item must be a tensor or a (Node, int) pair (a GradientEdge), got {x!r}"
    )


def _as_list(x: Any, what: str) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return list(x)
    raise TypeError(f"{what} must be a list, got {type(x).__name__}: {x!r}")


class GradientGenerator:
    """An iterator over the gradients of ``roots`` with respect to each of
    ``with_respect_to``, in that order (Monarch's ``monarch.gradient.GradientGenerator``).

    ``roots`` and ``with_respect_to`` are lists of tensors or gradient edges;
    ``grad_roots`` (at most as long as ``roots``) gives each root's incoming
    gradient, ``None`` (or a missing entry) meaning ones of the root's shape.
    A gradient the roots do not depend on comes out as ``None``.
    ``context_restorer``, Monarch's hook, is called as ``context_restorer(example,
    None, True)`` and must return a generator; its first step runs before the
    backward pass and its second after it.

    Unlike Monarch's, which runs the backward graph node by node and stops as soon
    as the next gradient is ready, this one runs the whole backward pass (one
    ``torch.autograd.grad``) at the first ``next()``: on a mesh that only issues
    the backward ops to the workers and does not wait for them, so reductions
    issued per gradient still overlap with the backward. The graph is freed
    afterwards, as after ``backward()``. Raises ``TypeError``/``ValueError`` for
    bad arguments at construction, and what ``torch.autograd.grad`` raises at
    the first ``next()``.
    """

    def __init__(
        self,
        roots: Any,
        with_respect_to: Any,
        grad_roots: Any = (),
        context_restorer: Callable[..., Any] | None = None,
    ) -> None:
        roots_in = _as_list(roots, "roots")
        self._roots: list[Any] = [
            r if isinstance(r, torch.Tensor) else _edge(r, "roots") for r in roots_in
        ]
        for r in self._roots:
            if isinstance(r, torch.Tensor):
                _edge(r, "roots")  # checks it requires grad
        self._wrt = [
            _edge(w, "with_respect_to") for w in _as_list(with_respect_to, "with_respect_to")
        ]
        grads = _as_list(grad_roots if grad_roots is not None else [], "grad_roots")
        if len(grads) > len(self._roots):
            raise TypeError(
                f"grad_roots has {len(grads)} entries but there are {len(self._roots)} roots; "
                "give at most one incoming gradient per root"
            )
        for g in grads:
            if g is not None and not isinstance(g, torch.Tensor):
                raise TypeError(f"each item of grad_roots must be a tensor or None, got {g!r}")
        self._grad_roots: list[torch.Tensor | None] = grads + [None] * (
            len(self._roots) - len(grads)
        )
        if context_restorer is not None and not callable(context_restorer):
            raise TypeError(f"context_restorer must be callable, got {context_restorer!r}")
        self._restorer = context_restorer
        self._results: tuple[torch.Tensor | None, ...] | None = None
        self._next = 0

    def __iter__(self) -> GradientGenerator:
        return self

    def __next__(self) -> torch.Tensor | None:
        if self._next >= len(self._wrt):
            self._drop()
            raise StopIteration
        if self._results is None:
            self._results = self._compute()
            self._roots, self._grad_roots = [], []  # autograd freed their graph
        value = self._results[self._next]
        self._next += 1
        return value

    def _drop(self) -> None:
        """Forget the graph and the gradients once all are yielded."""
        self._roots, self._grad_roots, self._wrt, self._results = [], [], [], ()
        self._next = 0

    def _compute(self) -> tuple[torch.Tensor | None, ...]:
        outputs: list[Any] = []
        grad_outputs: list[Any] = []
        for r, g in zip(self._roots, self._grad_roots, strict=True):
            if g is None:  # Monarch's: ones of the root's shape, not only for scalars
                if isinstance(r, torch.Tensor):
                    g = torch.ones_like(r)
                else:
                    md = r.node._input_metadata[r.output_nr]
                    g = torch.ones(md.shape, dtype=md.dtype, device=md.device)
            outputs.append(r)
            grad_outputs.append(g)
        restore = None
        if self._restorer is not None:
            example = next((r for r in self._roots if isinstance(r, torch.Tensor)), None)
            restore = iter(self._restorer(example, None, True))
            next(restore, None)
        try:
            return torch.autograd.grad(
                outputs, self._wrt, grad_outputs=grad_outputs, allow_unused=True
            )
        finally:
            if restore is not None:
                next(restore, None)


def grad_generator(
    roots: Any = (),
    with_respect_to: Sequence[TensorOrEdge] = (),
    grad_roots: Any = (),
) -> Iterator[torch.Tensor | None]:
    """Yield the gradient of ``roots`` with respect to each of ``with_respect_to``, in order.

    Pass the parameters last-layer first (``reversed(list(model.parameters()))``)
    and reduce each gradient as it comes. A root without an incoming gradient
    gets ones of its shape; a tensor the roots do not depend on gets ``None``.
    The backward ops are all issued at the first ``next()`` (see
    `GradientGenerator`, which this builds); the client does not wait
    for them, and the gradients' reductions follow them on the workers.
    """
    roots_list = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    grads_in = [grad_roots] if isinstance(grad_roots, torch.Tensor) else list(grad_roots)
    return GradientGenerator(roots_list, list(with_respect_to), grads_in)


def _split(tree: Any) -> tuple[list[torch.Tensor], Callable[[list[Any]], Any]]:
    """The tensors among ``tree``'s leaves, and a function putting new values in their
    places (the other leaves kept)."""
    leaves, spec = pytree.tree_flatten(tree)
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def unflatten(values: list[Any]) -> Any:
        out = list(leaves)
        for i, v in zip(where, values, strict=True):
            out[i] = v
        return pytree.tree_unflatten(out, spec)

    return [leaves[i] for i in where], unflatten


class GradGenerator:
    """Collect roots and trees of tensors, then iterate over the trees' gradients.

    ``root(r, grad=None)`` adds a root; ``grad(tree)`` asks for the gradients of
    the tensors in ``tree``. Iterating yields, for each ``grad`` call in reverse
    order (the last layer first), ``tree`` with each tensor replaced by its
    gradient (``None`` where the roots do not depend on it).
    """

    def __init__(self) -> None:
        self.roots: list[TensorOrEdge] = []
        self.with_respect_to: list[GradientEdge] = []
        self.grad_roots: list[torch.Tensor | None] = []
        self.unflattens: list[tuple[int, Callable[[list[Any]], Any]]] = []

    def grad(self, tree: Any) -> None:
        tensors, unflatten = _split(tree)
        self.with_respect_to.extend(_edge(t, "GradGenerator.grad") for t in tensors)
        self.unflattens.append((len(tensors), unflatten))

    def root(self, r: TensorOrEdge, grad: torch.Tensor | None = None) -> None:
        _edge(r, "GradGenerator.root")
        self.roots.append(r)
        self.grad_roots.append(grad)

    def __iter__(self) -> Iterator[Any]:
        gi = GradientGenerator(
            list(self.roots), list(reversed(self.with_respect_to)), list(self.grad_roots)
        )
        for n, unflatten in reversed(self.unflattens):
            yield unflatten(list(reversed([next(gi) for _ in range(n)])))


def _rebuild(parts: tuple[Any, ...], values: list[Any]) -> Any:
    """The function of ``parts`` (code, globals, name, defaults), its closure holding ``values``."""
    closure = tuple(CellType(v) for v in values)
    code, glob, name, defaults = parts
    return FunctionType(code, glob, name, defaults, closure)


class GradFunction(torch.autograd.Function):
    """The autograd function behind `grad_function()`.

    ``forward(ctx, fn, *args)`` runs ``fn(*args)``, which returns ``(result,
    backward)``; the values ``backward``'s closure holds are kept (its tensors
    saved as autograd saves tensors) and ``backward`` itself is dropped, so
    only autograd keeps them alive; ``backward(*grads)``, rebuilt over them, is
    called with the result's gradients. It returns one gradient per argument of
    ``fn`` (a tuple for several). The closure's cells are left as they are:
    one may be shared with ``fn`` or an enclosing function.
    """

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if not (isinstance(out, tuple) and len(out) == 2 and callable(out[1])):
            raise TypeError(
                f"a grad_function's function must return (result, backward_function), "
                f"got {type(out).__name__}"
            )
        result, backward = out
        if not isinstance(backward, FunctionType):
            raise TypeError(
                f"a grad_function's backward must be a plain function (a def or lambda), "
                f"got {backward!r}"
            )
        ctx.backward_parts = (
            backward.__code__,
            backward.__globals__,
            backward.__name__,
            backward.__defaults__,
        )
        values: list[Any] = []
        for cell in backward.__closure__ or ():
            try:
                values.append(cell.cell_contents)
            except ValueError:  # an empty cell
                raise TypeError(
                    f"the backward function {backward.__qualname__} refers to a variable "
                    "that has no value yet"
                ) from None
        tensors, ctx.unflatten = _split(values)
        ctx.save_for_backward(*tensors)
        return result

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        fn = _rebuild(ctx.backward_parts, ctx.unflatten(list(ctx.saved_tensors)))
        out = fn(*grads)
        return (None, *out) if isinstance(out, tuple) else (None, out)


def grad_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``fn`` an autograd function with a hand-written backward.

    ``fn(*args)`` returns ``(result, backward)``; ``backward(*grads_of_result)``
    returns the gradient of each tensor argument (a tuple when there are
    several, ``None`` for one that needs none). The tensors ``backward`` refers
    to are saved as autograd saves tensors. Keyword arguments are passed to
    ``fn`` as they are; tensors that need gradients go positionally:

        @grad_function
        def scaled_square(x):
            def backward(g):
                return 2 * x * g
            return x * x, backward
    """
    if not callable(fn):
        raise TypeError(f"grad_function needs a function returning (result, backward), got {fn!r}")

    def apply(*args: Any, **kwargs: Any) -> Any:
        # autograd.Function.apply takes no keywords: bind them to fn
        bound = functools.partial(fn, **kwargs) if kwargs else fn
        return GradFunction.apply(bound, *args)  # type: ignore[no-untyped-call]

    return functools.wraps(fn)(apply)


def gradient_execution_order(
    roots: Sequence[TensorOrEdge], with_respect_to: Sequence[Any]
) -> list[int]:
    """The indices of ``with_respect_to`` in the order autograd run on ``roots`` would
    produce their gradients: the reverse order of each one's first use in the forward
    pass. A tensor the roots do not use comes first."""
    keys = [
        (e.node, e.output_nr)
        for e in (_edge(w, "with_respect_to") for w in _as_list(with_respect_to, "with_respect_to"))
    ]
    first_use: dict[Any, float] = dict.fromkeys(keys, math.inf)
    to_scan = [_edge(r, "roots").node for r in _as_list(roots, "roots")]
    scanned = set()
    while to_scan:
        node = to_scan.pop()
        if node in scanned:
            continue
        scanned.add(node)
        for key in node.next_functions:
            if key[0] is None:
                continue
            to_scan.append(key[0])
            if key in first_use:
                first_use[key] = min(node._sequence_nr(), first_use[key])
    return sorted(range(len(keys)), key=lambda i: first_use[keys[i]], reverse=True)
