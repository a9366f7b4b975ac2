"""The process group a tensor worker runs a collective on, for its device.

CPU shards use gloo. CUDA shards use NCCL when every member has a GPU of its
own; NCCL refuses a communicator in which two ranks share a device ("invalid
usage"), which is what several procs on one GPU give (a test mesh on a
one-GPU machine, or procs packed onto fewer GPUs). Those members get a gloo
group instead, wrapped by `StagedGroup`, which stages CUDA tensors
through host memory: correct everywhere, slower than NCCL.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

import torch
import torch.distributed as dist

from .._runtime.node import this_node
from .._transport.ifaces import mesh_interface

__all__ = ["StagedGroup", "new_group"]


def _device_id(device: torch.device) -> str:
    """This host and GPU, the same text in every proc that uses that GPU."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)  # torch >= 2.1; before, the index this proc sees
    return f"{socket.gethostname()}/{uuid if uuid is not None else device.index}"


def new_group(
    store: Any, index: int, size: int, device: torch.device, timeout: datetime.timedelta
) -> Any:
    """Member ``index`` of a new ``size``-member group over ``store`` for ``device``.

    On CUDA the members first swap their GPU's identity through the store (one
    round, at the group's creation): NCCL when all differ, a `StagedGroup`
    otherwise.
    """
    _bind_sockets()
    if device.type != "cuda":
        return dist.ProcessGroupGloo(store, index, size, timeout)
    mine = _device_id(device)
    store.set(f"device/{index}", mine)
    ids = [mine if i == index else store.get(f"device/{i}").decode() for i in range(size)]
    if len(set(ids)) == size:
        return dist.ProcessGroupNCCL(store, index, size)  # type: ignore[call-arg]
    return StagedGroup(dist.ProcessGroupGloo(store, index, size, timeout))


def _bind_sockets() -> None:
    """Keep gloo's and NCCL's own sockets on the interface this proc's mesh uses.

    Left alone, gloo listens on the address the hostname resolves to and NCCL on the
    first interface it likes, often one the mesh never uses (reachable from the
    network for a job that runs on one host). An explicit ``GLOO_SOCKET_IFNAME`` /
    ``NCCL_SOCKET_IFNAME`` wins.
    """
    node = this_node(start=False)
    rt = None if node is None else node.runtime
    iface = mesh_interface(rt.tcp_advertise if rt is not None else None)
    if iface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)


class _CopyBack:
    """The work of a staged collective: waiting also copies the host results back."""

    def __init__(
        self, work: Any, host: list[torch.Tensor], dest: list[torch.Tensor], keep: Any = None
    ) -> None:
        self._work = work
        self._host = host
        self._dest = dest
        self._keep = keep  # host copies a send reads until it is done

    def wait(self) -> bool:
        self._work.wait()
        for h, d in zip(self._host, self._dest, strict=True):
            if h is not d:
                d.copy_(h)
        return True


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu") if t.device.type != "cpu" else t


class StagedGroup:
    """A gloo group whose members' CUDA tensors travel through host copies.

    Has the methods of a ``ProcessGroup`` the worker calls (``allreduce``,
    ``allgather``, ``send``, ``recv``, ``shutdown``); each returns a work whose
    ``wait()`` also writes the results into the CUDA tensors given. ``group`` is
    the gloo group itself, for code that needs a real ``ProcessGroup`` (gloo
    takes CUDA tensors for all-reduce and broadcast).
    """

    def __init__(self, group: Any) -> None:
        self.group = group

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> _CopyBack:
        host = [_host(t) for t in tensors]
        return _CopyBack(self.group.allreduce(host, opts), host, tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> _CopyBack:
        host_out = [[torch.empty_like(t, device="cpu") for t in row] for row in outputs]
        work = self.group.allgather(host_out, [_host(t) for t in inputs])
        flat_host = [t for row in host_out for t in row]
        return _CopyBack(work, flat_host, [t for row in outputs for t in row])

    def send(self, tensors: list[torch.Tensor], peer: int, tag: int) -> _CopyBack:
        host = [_host(t) for t in tensors]
        return _CopyBack(self.group.send(host, peer, tag), [], [], keep=host)

    def recv(self, tensors: list[torch.Tensor], peer: int, tag: int) -> _CopyBack:
        host = [torch.empty_like(t, device="cpu") for t in tensors]
        return _CopyBack(self.group.recv(host, peer, tag), host, tensors)

    def shutdown(self) -> None:
        self.group.shutdown()
