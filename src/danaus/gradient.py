"""``danaus.gradient``: Monarch's ``monarch.gradient`` module path, ``GradientGenerator``.

Monarch's is a C++ extension; danaus's is written on ``torch.autograd`` and
issues the whole backward pass at the first ``next()`` (see
``docs/tensor.md``). ``danaus.grad_generator`` builds one. Importing this
module imports torch.
"""

from __future__ import annotations

from ._tensor.autograd import GradientGenerator

__all__ = ["GradientGenerator"]

GradientGenerator.__module__ = __name__
