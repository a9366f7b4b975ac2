"""Finding NIXL (without importing torch where it need not) and the UCX devices it may
use."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from .._transport.ifaces import mesh_interface

__all__ = ["ucx_devices"]


def ucx_devices(advertised: str | None) -> str | None:
    """The ``UCX_NET_DEVICES`` value that keeps UCX's TCP on the mesh's interface.

    The interface of ``advertised`` (loopback when None), loopback too (UCX needs a
    TCP device for its active messages between processes of one host, and it refuses
    some interfaces, bridges among them: without one it cannot start at all), and
    every InfiniBand/RoCE port of this host (``mlx5_0:1``): restricting UCX to one IP
    interface must not take the RDMA fabric away from it. None when the interface is
    unknown.
    """
    iface = mesh_interface(advertised)
    if iface is None:
        return None
    devices = [iface] if iface == "lo" else [iface, "lo"]
    ports = []
    root = Path("/sys/class/infiniband")
    try:
        for dev in sorted(root.iterdir()):
            for port in sorted((dev / "ports").iterdir()):
                ports.append(f"{dev.name}:{port.name}")
    except OSError:
        pass
    return ",".join([*devices, *ports])


def _import_api() -> Any:
    """NIXL's Python API (``nixl._api``); ``ImportError`` if NIXL is not installed.

    ``import nixl`` picks its CUDA variant by importing torch whenever torch was built
    without CUDA (2-4 s here, in a process that may never use torch). Where torch is
    not imported yet and its build on disk has no CUDA, no memory of this process can
    be CUDA memory, so any installed variant serves: it is imported directly. A module
    set to None in ``sys.modules`` counts as missing, as for any import.
    """
    if sys.modules.get("nixl", False) is None or "torch" in sys.modules:
        return importlib.import_module("nixl._api")
    nixl_meta_utils = importlib.import_module("nixl_meta_utils")  # part of nixl

    on_disk = getattr(nixl_meta_utils, "_torch_cuda_version_from_disk", None)
    if on_disk is not None and on_disk() is None:
        for variant in ("nixl_cu13", "nixl_cu12"):
            try:
                return importlib.import_module(f"{variant}._api")
            except ModuleNotFoundError as e:
                if e.name != variant:
                    raise
    return importlib.import_module("nixl._api")
