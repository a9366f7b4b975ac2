"""SPMD: run torchrun-style scripts on a proc mesh (``danaus.spmd``).

torchrun gives every process a handful of environment variables (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ... ``MASTER_ADDR``/``MASTER_PORT``);
``SPMDActor`` derives the same from the proc's mesh coordinates, the last
dimension being the local one (``{"hosts": 2, "gpus": 4}``: 4 local ranks per
host), so an unmodified ``torch.distributed`` script runs on a mesh.
"""

from __future__ import annotations

import math
import os
import runpy
import socket
import sys
from typing import Any

from .._actor.api.actor import Actor
from .._actor.api.endpoint import endpoint
from .._actor.api.procs import ProcMesh
from .._actor.core.context import current_rank, current_size
from .._runtime.node import this_node
from .._transport.ifaces import interface_of

__all__ = ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async", "torch_env"]


def torch_env(coords: dict[str, int], sizes: dict[str, int]) -> dict[str, str]:
    """torchrun's variables (master aside) for the proc at ``coords`` of a mesh of ``sizes``.

    Ranks are row major over the mesh's dimensions; the last dimension is the
    local one (a host's processes), the others together number the groups (hosts).
    """
    if not sizes:
        raise ValueError("an SPMD mesh needs at least one dimension (the local one)")
    labels = list(sizes)
    rank = 0
    for label in labels:
        rank = rank * sizes[label] + coords[label]
    local = labels[-1]
    world = math.prod(sizes.values())
    local_world = sizes[local]
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(coords[local]),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // local_world),
        "GROUP_WORLD_SIZE": str(world // local_world),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default",
    }


def _reachable_address() -> str:
    """The address other hosts reach this proc at (its advertised TCP address), else loopback."""
    node = this_node(start=False)
    rt = None if node is None else node.runtime
    advertised = getattr(rt, "tcp_advertise", None) if rt is not None else None
    return advertised or "127.0.0.1"


def _network_env() -> dict[str, str]:
    """Point gloo at the interface danaus reaches this proc through.

    Left alone, gloo binds the address this machine's hostname resolves to,
    which is loopback on many machines (and on namespace hosts): ranks on other
    hosts then cannot connect. An explicit ``GLOO_SOCKET_IFNAME`` wins.
    """
    addr = _reachable_address()
    if "GLOO_SOCKET_IFNAME" in os.environ or addr.startswith("127.") or ":" in addr:
        return {}
    iface = interface_of(addr)
    return {"GLOO_SOCKET_IFNAME": iface} if iface else {}


class SPMDActor(Actor):
    """Sets torchrun's environment in its proc and runs training scripts there.

    Spawn it on a proc mesh whose last dimension is the local one, ask the
    first actor for a master address (``get_host_port``), then call ``main``
    on all of them:

        actors = procs.spawn("spmd", SPMDActor)
        addr, port = actors.slice(hosts=0, gpus=0).get_host_port.call_one(None).get()
        actors.main.call(addr, port, ["train.py", "--epochs", "3"]).get()
    """

    def __init__(self) -> None:
        point = current_rank()
        sizes = current_size()
        self.env = {**torch_env({label: point[label] for label in sizes}, sizes), **_network_env()}

    @endpoint
    def get_host_port(self, use_ipaddr: Any = None) -> tuple[str, int]:
        """An address of this proc's host that the others reach, and a free port there."""
        addr = _reachable_address()
        with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
            s.bind((addr, 0))
            return addr, int(s.getsockname()[1])

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set torchrun's variables in this proc's environment."""
        os.environ.update(self.env, MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set the environment and run a script as ``__main__`` (as torchrun would).

        ``script_args`` is ``["train.py", *args]`` or ``["-m", "module", *args]``.
        Returns True once the script returns; its exception fails the call.
        """
        if not script_args or (script_args[0] == "-m" and len(script_args) < 2):
            raise ValueError(
                f"script_args must be ['script.py', *args] or ['-m', 'module', *args], "
                f"got {script_args!r}"
            )
        os.environ.update(self.env, MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        saved = list(sys.argv)
        try:
            if script_args[0] == "-m":
                sys.argv = [script_args[1], *script_args[2:]]
                runpy.run_module(script_args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(script_args)
                runpy.run_path(script_args[0], run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise RuntimeError(f"{script_args[0]} exited with {e.code!r}") from None
        finally:
            sys.argv = saved
        return True


def _first(proc_mesh: ProcMesh) -> dict[str, int]:
    return dict.fromkeys(proc_mesh.sizes, 0)


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> None:
    """Give every proc of ``proc_mesh`` torchrun's environment (blocks until done).

    Without ``master_addr``/``master_port`` the first proc's host and a free
    port there are used. Then ``torch.distributed.init_process_group()`` in
    an actor on the mesh works as under torchrun.
    """
    if (master_addr is None) != (master_port is None):
        raise ValueError("give both master_addr and master_port, or neither")
    actors: Any = proc_mesh.spawn("_spmd_env", SPMDActor)
    if master_addr is None:
        master_addr, master_port = (
            actors.slice(**_first(proc_mesh)).get_host_port.call_one(use_ipaddr).get()
        )
    actors.setup_env.call(master_addr, master_port).get()


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> None:
    """``setup_torch_elastic_env`` for async code."""
    if (master_addr is None) != (master_port is None):
        raise ValueError("give both master_addr and master_port, or neither")
    actors: Any = proc_mesh.spawn("_spmd_env", SPMDActor)
    if master_addr is None:
        first = actors.slice(**_first(proc_mesh))
        master_addr, master_port = await first.get_host_port.call_one(use_ipaddr)
    await actors.setup_env.call(master_addr, master_port)
