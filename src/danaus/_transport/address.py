"""Addresses (``unix:/path``) and the private socket directory they live in."""

from __future__ import annotations

import os
import secrets
import socket
import stat
import tempfile

__all__ = ["connect_socket", "listen", "make_job_dir", "parse"]


def parse(addr: str) -> tuple[str, str]:
    """Split ``addr`` into ``(scheme, rest)``; raises ``ValueError`` for unknown schemes."""
    scheme, sep, rest = addr.partition(":")
    if not sep or scheme not in ("unix",):
        raise ValueError(f"unsupported address {addr!r}; expected 'unix:/path/to/socket'")
    return scheme, rest


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


def make_job_dir() -> str:
    """Create a fresh directory, readable by this user only, for one job's sockets."""
    base = os.environ.get("DANAUS_SOCKET_DIR") or os.path.join(
        tempfile.gettempdir(), f"danaus-{os.getuid()}"
    )
    _private_dir(base)
    return _private_dir(os.path.join(base, secrets.token_hex(4)))


def listen(addr: str) -> socket.socket:
    """Bind and listen on ``addr``."""
    _, path = parse(addr)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    s.bind(path)
    s.listen(512)
    s.setblocking(False)
    return s


def connect_socket(addr: str) -> socket.socket:
    """A non-blocking socket, connected or connecting to ``addr``. Raises ``OSError``."""
    _, path = parse(addr)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)  # Unix sockets connect at once or fail at once
    except BaseException:
        s.close()
        raise
    s.setblocking(False)
    return s
