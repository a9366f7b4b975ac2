"""Monarch's ``monarch.tools`` data types on danaus's jobs: ``MeshSpec``, ``ServerSpec``,
``AppState``, ``Config``, address lookup (``network``) and ``DANAUS_HOME`` (``utils``).

In Monarch a *server* is a TorchX job whose handle is ``SCHEDULER:///NAME``. In
danaus a server is a job saved in a context (``current.py``): its handle is
``danaus:///CONTEXT``, and ``info(handle)`` describes that saved job.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import os
import pathlib
import socket
import warnings
from dataclasses import dataclass, field
from typing import Any

from .._actor.api.code_sync import Workspace
from .._transport.owned import private_dir

__all__ = [
    "DEFAULT_REMOTE_ALLOCATOR_PORT",
    "AddrType",
    "AppState",
    "Config",
    "MeshSpec",
    "ServerSpec",
    "get_ipaddr",
    "get_sockaddr",
    "home",
]

log = logging.getLogger("danaus.tools")

DEFAULT_REMOTE_ALLOCATOR_PORT = 26600  # danaus's worker_port default, as Monarch's
_UNSET_INT = -1
_UNSET_STR = "__UNSET__"
NOT_SET = "__NOT_SET__"


class AppState(enum.IntEnum):
    """A job's state, with TorchX's values and order (Monarch compares them)."""

    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7


@dataclass
class MeshSpec:
    """One mesh of a server: how many hosts, and (when running) their names."""

    name: str
    num_hosts: int
    host_type: str = _UNSET_STR
    gpus: int = _UNSET_INT
    transport: str = "tcp"
    port: int = DEFAULT_REMOTE_ALLOCATOR_PORT
    hostnames: list[str] = field(default_factory=list)
    state: AppState = AppState.UNSUBMITTED
    image: str = _UNSET_STR

    def server_addrs(self, transport: str | None = None, port: int | None = None) -> list[str]:
        """The hosts as danaus worker addresses (``tcp://IP:PORT``), resolving names."""
        transport = transport or self.transport
        port = port or self.port
        if transport != "tcp":
            raise ValueError(f"Unsupported transport: {transport!r}; danaus workers use 'tcp'")
        return [f"tcp://{get_sockaddr(h, port)}" for h in self.hostnames]


@dataclass
class ServerSpec:
    """A server (a saved job) as ``info()`` describes it."""

    name: str
    state: AppState
    meshes: list[MeshSpec]
    scheduler: str
    namespace: str = ""
    ui_url: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def server_handle(self) -> str:
        return f"{self.scheduler}://{self.namespace}/{self.name}"

    @property
    def is_running(self) -> bool:
        return self.state == AppState.RUNNING

    def host0(self, mesh_name: str) -> str:
        """The first host of ``mesh_name`` (for ``MASTER_ADDR``); ``RuntimeError`` unless
        the server is running."""
        mesh = self.get_mesh_spec(mesh_name)
        if not self.is_running:
            raise RuntimeError(
                f"{self.server_handle} is {self.state.name}; hosts are known only while it "
                "runs (danaus.tools.commands.get_or_create starts it)"
            )
        if not mesh.hostnames:
            raise RuntimeError(f"{self.server_handle} does not have any hosts")
        return mesh.hostnames[0]

    def get_mesh_spec(self, mesh_name: str) -> MeshSpec:
        for mesh in self.meshes:
            if mesh.name == mesh_name:
                return mesh
        raise ValueError(
            f"Mesh: '{mesh_name}' not found in job: {self.name}. Try one of: "
            f"{self.get_mesh_names()}"
        )

    def get_mesh_names(self) -> list[str]:
        return [m.name for m in self.meshes]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "server_handle": self.server_handle,
            **({"ui_url": self.ui_url} if self.ui_url else {}),
            "state": self.state.name,
            "meshes": {
                m.name: {
                    "host_type": m.host_type,
                    "hosts": m.num_hosts,
                    "gpus": m.gpus,
                    "hostnames": m.hostnames,
                }
                for m in self.meshes
            },
        }


@dataclass
class Config:
    """What ``create()`` needs: in danaus, a job object (``job``) rather than a TorchX
    ``appdef``; ``scheduler`` is informational, ``workspace`` is synced to every mesh
    once the job runs, ``dryrun`` returns the job's JSON state without applying it.

    ``scheduler_args`` and ``appdef`` are Monarch's TorchX settings: ``create()``
    refuses a config that sets them, since danaus submits no TorchX job.
    """

    scheduler: str = NOT_SET
    scheduler_args: dict[str, Any] = field(default_factory=dict)
    workspace: Any = field(default_factory=lambda: Workspace.null())
    dryrun: bool = False
    appdef: Any = None
    job: Any = None

    def __post_init__(self) -> None:
        if self.workspace is None or self.workspace == "":
            warnings.warn(
                f"Setting `workspace={self.workspace!r}` is deprecated; use "
                "Workspace(env=None) (or leave workspace out)",
                FutureWarning,
                stacklevel=2,
            )
            self.workspace = Workspace.null()
        elif isinstance(self.workspace, str):
            warnings.warn(
                f"Setting `workspace={self.workspace!r}` is deprecated; use "
                f"Workspace(dirs=[{self.workspace!r}])",
                FutureWarning,
                stacklevel=2,
            )
            self.workspace = Workspace(dirs={self.workspace: ""})


class AddrType(enum.Enum):
    """Which address family ``get_ipaddr`` resolves: IPv6 then IPv4 by default."""

    Default = enum.auto()
    IPv4 = enum.auto()
    IPv6 = enum.auto()


def _resolve(hostname: str, port: int, family: socket.AddressFamily) -> str | None:
    try:
        addrs = socket.getaddrinfo(hostname, port, family, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        log.info("no %s address for %s:%d (%s)", family.name, hostname, port, e)
        return None
    for *_, sockaddr in addrs:
        addr = str(sockaddr[0])
        if not ipaddress.ip_address(addr.split("%")[0]).is_link_local:  # not routable
            return addr
    return None


def _families(addr_type: AddrType) -> list[socket.AddressFamily]:
    if addr_type is AddrType.IPv4:
        return [socket.AF_INET]
    if addr_type is AddrType.IPv6:
        return [socket.AF_INET6]
    if addr_type is AddrType.Default:
        return [socket.AF_INET6, socket.AF_INET]
    raise ValueError(f"Unknown AddrType: {addr_type!r}")


def get_ipaddr(hostname: str, port: int, addr_type: AddrType = AddrType.Default) -> str:
    """``hostname``'s first non-link-local address of ``addr_type`` that takes TCP;
    ``RuntimeError`` if there is none."""
    for family in _families(addr_type):
        addr = _resolve(hostname, port, family)
        if addr is not None:
            return addr
    raise RuntimeError(
        f"Unable to resolve `{hostname}` to an ipv6 or ipv4 address that can bind TCP "
        "sockets. Check the network configuration on the host."
    )


def get_sockaddr(hostname: str, port: int) -> str:
    """``IP:PORT`` (``[IPv6]:PORT``) of ``hostname``, IPv6 first as Monarch's."""
    addr = get_ipaddr(hostname, port)
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def home(*subdirs: str) -> pathlib.Path:
    """danaus's per-user directory (``~/.danaus``, or ``$DANAUS_HOME``, or Monarch's
    ``$MONARCH_HOME`` when that alone is set), or a subdirectory of it, created (mode
    700) if missing. Monarch's default is ``~/.monarch``."""
    chosen = os.environ.get("DANAUS_HOME") or os.environ.get("MONARCH_HOME")
    root = pathlib.Path(chosen) if chosen else pathlib.Path.home() / ".danaus"
    private_dir(str(root), "danaus's per-user directory")
    path = root.joinpath(*subdirs)
    private_dir(str(path), "danaus's per-user directory")
    return path
