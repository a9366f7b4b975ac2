"""Addresses and the private socket directory.

A proc's address is a ``;``-separated list of entries:

    unix:/tmp/danaus-0/ab12cd34/p1.sock      Unix socket (same host only)
    inproc:p1                                a proc in this very process (inproc.py)
    tcp://10.0.0.2:41234                     TCP (any host; authenticated)
    via:tcp://10.0.0.2:41235                 a gateway's relay port (a client that
                                             attached through it, and its local procs)
    host:3f9a1c                              the token of the host it runs on

A connecting proc uses the Unix socket when the peer runs on its own host
(same host token) and TCP otherwise; a peer with no TCP entry but a ``via:``
one is reached through that gateway (the dialler's first frame says whom it
wants: ``danaus._runtime.messaging.relay``).
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import stat
import tempfile

from .. import _config as config
from . import inproc

__all__ = [
    "choose",
    "connect_socket",
    "host_token",
    "join",
    "listen",
    "make_job_dir",
    "parse",
    "socket_base",
    "split_tcp",
]


def parse(entry: str) -> tuple[str, str]:
    """Split one address entry into ``(scheme, rest)``; ``ValueError`` for unknown schemes."""
    if entry.startswith("tcp://"):
        return "tcp", entry[len("tcp://") :]
    scheme, sep, rest = entry.partition(":")
    if not sep or scheme not in ("unix", "host", "inproc"):
        raise ValueError(
            f"unsupported address {entry!r}; expected 'unix:/path/to/socket' or 'tcp://HOST:PORT'"
        )
    return scheme, rest


def split_tcp(rest: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"[v6]:PORT"``) -> ``(host, port)``; ``ValueError`` if malformed."""
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"malformed TCP address 'tcp://{rest}'; expected 'tcp://HOST:PORT'")
    return host.strip("[]"), int(port)


def join(*entries: str) -> str:
    return ";".join(e for e in entries if e)


def choose(addr: str, my_host: str, network: inproc.Network | None = None) -> str:
    """The entry of ``addr`` to connect to from a proc on host ``my_host`` whose
    in-process network (if any) is ``network``."""
    entries = [e for e in addr.split(";") if e]
    local = next((e for e in entries if e.startswith("inproc:")), None)
    if local is not None and network is not None and network.is_listening(local[len("inproc:") :]):
        return local  # that proc lives in this very process
    host = next((e[5:] for e in entries if e.startswith("host:")), None)
    unix = next((e for e in entries if e.startswith("unix:")), None)
    tcp = next((e for e in entries if e.startswith("tcp://")), None)
    if tcp is None:  # reached through a gateway only
        tcp = next((e for e in entries if e.startswith("via:tcp://")), None)
    if unix is not None and (tcp is None or host is None or host == my_host):
        return unix
    if tcp is not None:
        return tcp
    raise ValueError(f"no usable entry in address {addr!r}")


_host_token = os.environ.get("DANAUS_HOST_TOKEN") or secrets.token_hex(3)


def host_token() -> str:
    """This host's token (inherited by the procs a host agent spawns)."""
    return _host_token


def _private_dir(path: str) -> str:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RuntimeError(
            f"socket directory {path!r} must be a directory owned by uid {os.getuid()} with "
            f"mode 0700 (found mode {oct(st.st_mode & 0o777)}, uid {st.st_uid}); remove it or "
            "set DANAUS_SOCKET_DIR to another directory"
        )
    return path


def socket_base() -> str:
    """The per-user directory that holds every job directory of this user (not created)."""
    return str(
        config.get("socket_dir") or os.path.join(tempfile.gettempdir(), f"danaus-{os.getuid()}")
    )


def make_job_dir() -> str:
    """Create a fresh directory, readable by this user only, for one job's sockets."""
    base = socket_base()
    _private_dir(base)
    return _private_dir(os.path.join(base, secrets.token_hex(4)))


def listen(entry: str) -> socket.socket:
    """Bind and listen on one entry (``unix:PATH`` or ``tcp://HOST:PORT``, port 0 = any)."""
    scheme, rest = parse(entry)
    if scheme == "tcp":
        host, port = split_tcp(rest)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(rest)
        except FileNotFoundError:
            pass
        s.bind(rest)
    s.listen(512)
    s.setblocking(False)
    return s


def connect_socket(entry: str) -> socket.socket:
    """A non-blocking socket, connected (Unix) or connecting (TCP) to ``entry``.

    Raises ``OSError`` when a Unix peer is not there.
    """
    scheme, rest = parse(entry)
    if scheme == "tcp":
        host, port = split_tcp(rest)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        s.setblocking(False)
        err = s.connect_ex((host, port))
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
            s.close()
            raise OSError(err, os.strerror(err))
        return s
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(rest)  # Unix sockets connect at once or fail at once
    except BaseException:
        s.close()
        raise
    s.setblocking(False)
    return s
