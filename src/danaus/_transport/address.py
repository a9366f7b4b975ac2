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
import glob
import logging
import math
import os
import secrets
import socket
import stat
import tempfile
import threading

from .. import _config as config
from . import inproc

log = logging.getLogger("danaus.transport")

__all__ = [
    "base_env",
    "choose",
    "connect_socket",
    "host_token",
    "join",
    "listen",
    "make_job_dir",
    "parse",
    "private_base",
    "socket_base",
    "socket_bases",
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


def _base_problem(path: str) -> str:
    """Why ``path`` cannot be this user's private base directory ("" if it can: created
    mode 700 if missing; this user's own one that no one else may write is made 700)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        return f"the directory {path!r} cannot be made ({e.strerror})"
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"{path!r} is not a directory (a link or a file)"
    if st.st_uid != os.getuid():
        return (
            f"the directory {path!r} belongs to uid {st.st_uid}, not to this user (uid "
            f"{os.getuid()}): another user made it first"
        )
    if st.st_mode & 0o022:
        return f"the directory {path!r} may be written by others (mode {oct(st.st_mode & 0o777)})"
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, and nobody else could change it: make it private
    return ""


class _Chosen:
    """The base directory this process settled on, per default path (chosen once, so that
    one process warns once and keeps every job directory in one place)."""

    lock = threading.Lock()
    by_default: dict[str, str] = {}


def _default_base() -> str:
    return os.path.join(tempfile.gettempdir(), f"danaus-{os.getuid()}")


def private_base() -> str:
    """This user's private directory for job directories (sockets) and logs, created.

    ``socket_dir`` when configured (which must be a directory of this user, mode
    700: ``RuntimeError`` otherwise); else ``/tmp/danaus-<uid>``. If that one is not
    this user's private directory (another user made it before this user's first
    job), it is never used: a fresh private one is, ``$XDG_RUNTIME_DIR/danaus`` or a
    new ``/tmp/danaus-<uid>-XXXXXXXX``, and one warning says so (issue 40, N8).
    """
    configured = config.get("socket_dir")
    if configured:
        return _private_dir(configured)
    default = _default_base()
    with _Chosen.lock:
        chosen = _Chosen.by_default.get(default)
        if chosen is None:
            chosen = _Chosen.by_default[default] = _choose_base(default)
        return chosen


def _choose_base(default: str) -> str:
    problem = _base_problem(default)
    if not problem:
        return default
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    fallback = os.path.join(runtime, "danaus") if os.path.isabs(runtime) else ""
    if not fallback or _base_problem(fallback):
        fallback = tempfile.mkdtemp(prefix=f"danaus-{os.getuid()}-")  # 0700, ours, new
    log.warning(
        "not using %s: %s. Using the private directory %s instead (set DANAUS_SOCKET_DIR "
        "to choose one; `danaus debug` and `danaus top` find clients there too)",
        default,
        problem,
        fallback,
    )
    return fallback


def socket_base() -> str:
    """The per-user directory that holds every job directory of this user (created)."""
    return private_base()


def base_env() -> dict[str, str]:
    """What the environment of a process danaus starts on this host needs so that it uses
    the same base directory (empty unless this process fell back from the default)."""
    if config.get("socket_dir"):
        return {}
    chosen = private_base()
    return {} if chosen == _default_base() else {"DANAUS_SOCKET_DIR": chosen}


def socket_bases() -> list[str]:
    """Every private base directory of this user a client of this host may use, for the
    tools that look for running clients (``danaus debug``, ``danaus top``): only
    directories of this user that no one else may write; nothing is created."""
    configured = config.get("socket_dir")
    candidates = [configured] if configured else [_default_base()]
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if not configured and os.path.isabs(runtime):
        candidates.append(os.path.join(runtime, "danaus"))
    if not configured:
        candidates += sorted(glob.glob(f"{_default_base()}-*"))
    found = []
    for path in candidates:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
            found.append(path)
    return found


def make_job_dir() -> str:
    """Create a fresh directory, readable by this user only, for one job's sockets."""
    return _private_dir(os.path.join(private_base(), secrets.token_hex(4)))


def _tcp_socket(rest: str) -> tuple[socket.socket, tuple[str, int]]:
    """A TCP socket for ``HOST:PORT`` (``rest`` of a ``tcp://`` entry; IPv6 when the host
    is an IPv6 address), and that address."""
    host, port = split_tcp(rest)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.socket(family, socket.SOCK_STREAM), (host, port)


def listen(entry: str) -> socket.socket:
    """Bind and listen on one entry (``unix:PATH`` or ``tcp://HOST:PORT``, port 0 = any)."""
    scheme, rest = parse(entry)
    if scheme == "tcp":
        s, addr = _tcp_socket(rest)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
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
        s, addr = _tcp_socket(rest)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; Monarch's channel_tcp_keepalive_idle
            idle = min(32767, max(1, math.ceil(config.get("tcp_keepalive_idle"))))  # Linux bounds
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        s.setblocking(False)
        err = s.connect_ex(addr)
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
