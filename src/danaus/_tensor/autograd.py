"""``grad_generator``: the gradients of a loss, one tensor at a time, as Monarch's."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = ["grad_generator"]


def grad_generator(
    roots: Any = (),
    with_respect_to: Sequence[torch.Tensor] = (),
    grad_roots: Any = (),
) -> Iterator[torch.Tensor]:
    """Yield the gradient of ``roots`` with respect to each of ``with_respect_to``, in order.

    Pass the parameters last-layer first (``reversed(list(model.parameters()))``)
    and reduce each gradient as it comes. The backward ops are all issued at
    the first ``next()``; the client does not wait for them (nor does
    anything here block), and the gradients' reductions follow them on the
    workers. Raises what ``torch.autograd.grad`` raises (for example for a
    tensor the roots do not depend on).
    """
    roots_list = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    wrt = list(with_respect_to)
    grads_in = [grad_roots] if isinstance(grad_roots, torch.Tensor) else list(grad_roots)
    if not wrt:
        return iter(())

    def gen() -> Iterator[torch.Tensor]:
        grads = torch.autograd.grad(roots_list, wrt, grad_outputs=grads_in or None)
        yield from grads

    return gen()
