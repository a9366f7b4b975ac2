"""``danaus.gradient_generator``: Monarch's ``monarch.gradient_generator`` module path.

``grad_generator`` and ``GradGenerator`` (gradients one tensor, or one tree
of tensors, at a time), ``grad_function``/``GradFunction`` (an autograd
function from a function returning ``(result, backward)``) and
``gradient_execution_order``. They work on local and mesh tensors. Importing
this module imports torch.
"""

from __future__ import annotations

from ._tensor.autograd import (
    GradFunction,
    GradGenerator,
    TensorOrEdge,
    grad_function,
    grad_generator,
    gradient_execution_order,
)

__all__ = [
    "GradFunction",
    "GradGenerator",
    "TensorOrEdge",
    "grad_function",
    "grad_generator",
    "gradient_execution_order",
]

for _name in ("GradFunction", "GradGenerator", "gradient_execution_order"):
    globals()[_name].__module__ = __name__
del _name
