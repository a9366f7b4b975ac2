"""Monarch's ``monarch.common.fake``: ``fake_call`` runs a function under torch's
``FakeTensorMode`` (tensors with sizes, dtypes and devices but no data).

As Monarch's, it runs ``fn`` on one worker thread of its own, so that a mesh's
dispatch mode active on the caller's thread does not apply. danaus itself
propagates shapes with meta tensors (``docs/tensor.md``); this is for code that
builds fake tensors as Monarch's tools do. Needs torch.

A torch built without CUDA cannot hold a CUDA tensor, not even a fake one
(moving one raises "PyTorch is not linked with support for cuda devices"). With
such a torch, ``t.cuda()`` and ``t.to("cuda")`` inside ``fn`` give a fake copy on
the host instead: sizes, dtypes and storages (what the simulator counts) are
as they would be; the device says ``cpu``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode

__all__ = ["fake_call"]


@cache
def _fake_mode_worker() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="danaus-fake")


@cache
def _fake_mode() -> FakeTensorMode:
    return FakeTensorMode()


class _CudaStaysOnHost(TorchFunctionMode):
    """``Tensor.cuda``/``Tensor.to(<cuda>)`` as a copy on the host (a torch without CUDA)."""

    def __torch_function__(
        self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            fmt = kwargs.get("memory_format", torch.preserve_format)
            return args[0].clone(memory_format=fmt)
        if func is torch.Tensor.to:
            parsed = torch._C._nn._parse_to(*args[1:], **kwargs)
            device, dtype, _non_blocking, fmt = parsed
            if device is not None and device.type == "cuda":
                return args[0].to(
                    dtype=dtype or args[0].dtype,
                    copy=True,
                    memory_format=fmt or torch.preserve_format,
                )
        return func(*args, **kwargs)


@cache
def _cuda_built() -> bool:
    return bool(torch.backends.cuda.is_built())  # type: ignore[no-untyped-call]


def fake_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` under ``FakeTensorMode``, on the fake-mode thread; its
    result (fake tensors for the tensors it made). Blocks until it returns; raises what
    ``fn`` raises."""

    def work() -> Any:
        with _fake_mode():  # entered on the worker thread: no mode of the caller's applies
            if _cuda_built():
                return fn(*args, **kwargs)
            with _CudaStaysOnHost():
                return fn(*args, **kwargs)

    return _fake_mode_worker().submit(work).result()
