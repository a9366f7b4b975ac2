"""Remote functions for the tensor engine's GPU tests (imported by name on the workers)."""

from __future__ import annotations

from typing import Any

import torch


def device_facts(x: torch.Tensor) -> dict[str, Any]:
    """Where a worker keeps ``x`` and which GPUs it sees."""
    return {
        "device": str(x.device),
        "index": x.device.index,
        "visible": torch.cuda.device_count(),
        "current": torch.cuda.current_device(),
    }


def backend_of(pg: Any) -> str:
    """The backend of a worker's process group that CUDA tensors use: nccl or gloo."""
    return str(pg._get_backend(torch.device("cuda")).name()).lower()


def send_recv(x: torch.Tensor, pg: Any) -> torch.Tensor:
    """Pipeline stages: rank 0 of ``pg`` sends ``x`` to rank 1, which returns what it got
    (rank 0 returns its own ``x``)."""
    import torch.distributed as dist

    if pg.rank() == 0:
        dist.send(x, group_dst=1, group=pg)
        return x.clone()
    out = torch.empty_like(x)
    dist.recv(out, group_src=0, group=pg)
    return out


def reduce_scatter_in(x: torch.Tensor, pg: Any) -> torch.Tensor:
    """``dist.reduce_scatter_tensor`` (sum) of ``x`` over ``pg``: this rank's row."""
    import torch.distributed as dist

    out = torch.empty(x.shape[1:], dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x, group=pg)
    return out
