"""The one-sided copy: ``process_vm_readv`` / ``process_vm_writev`` between two processes.

Used by the transport to move large message buffers between procs of one
host, and by the data plane (``danaus.rdma``).

The kernel copies straight between the two address spaces (one copy, no
socket, nothing runs in the other process). A call moves at most about
2 GiB and may stop short (a fault part-way), so `copy()` moves a range
in chunks and loops on partial transfers; between chunks it asks ``stop()``
so an abandoned transfer (timed out, or its batch failed) ends soon.

Permission: the kernel allows it when the caller may ptrace the other
process (same user and dumpable, or ``CAP_SYS_PTRACE``), and under Yama's
``ptrace_scope=1`` only towards descendants or processes that declared the
caller (or one of its ancestors) with ``PR_SET_PTRACER``;
`allow_peers()` makes that declaration in a buffer's owner.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import _config as config

__all__ = [
    "CHUNK",
    "address",
    "allow_peers",
    "available",
    "copy",
    "host_key",
    "memmove",
    "ptrace_scope",
]

CHUNK = 64 << 20  # bytes per system call: large enough to be fast, small enough to stop soon

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # This process's own libc: find_library("c") runs ldconfig in a subprocess,
        # milliseconds in every proc (each builds a Runtime, which asks available()).
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - a Linux without a loadable libc
        return None


@functools.lru_cache(maxsize=1)
def _functions() -> tuple[Any, Any] | None:
    libc = _libc()
    if libc is None:
        return None
    try:
        fns = (libc.process_vm_readv, libc.process_vm_writev)
    except AttributeError:  # pragma: no cover - glibc < 2.15
        return None
    iov = ctypes.POINTER(_IOVec)
    for fn in fns:
        fn.argtypes = [ctypes.c_int, iov, ctypes.c_ulong, iov, ctypes.c_ulong, ctypes.c_ulong]
        fn.restype = ctypes.c_ssize_t
    return fns


def available() -> bool:
    """True if this platform has ``process_vm_readv`` (Linux 3.2+)."""
    return _functions() is not None


def copy(
    pid: int,
    local: int,
    remote: int,
    nbytes: int,
    *,
    write: bool,
    stop: Callable[[], bool] = lambda: False,
    chunk: int = CHUNK,
) -> bool:
    """Copy ``nbytes`` between ``local`` (ours) and ``remote`` (in process ``pid``).

    ``write=False`` reads remote into local; ``write=True`` writes local into
    remote. Blocks the calling thread (the GIL is released during each call).
    Returns False if ``stop()`` asked it to give up between chunks, True when
    every byte moved. Raises ``OSError`` with the kernel's errno (``ESRCH``:
    the process is gone; ``EPERM``: not allowed; ``EFAULT``: a range is not
    mapped).
    """
    fns = _functions()
    if fns is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available on this platform")
    fn = fns[1] if write else fns[0]
    liov, riov = _IOVec(), _IOVec()
    lref, rref = ctypes.byref(liov), ctypes.byref(riov)
    done = 0
    while done < nbytes:
        if stop():
            return False
        n = min(chunk, nbytes - done)
        liov.iov_base, liov.iov_len = local + done, n
        riov.iov_base, riov.iov_len = remote + done, n
        got = fn(pid, lref, 1, rref, 1, 0)
        if got < 0:
            e = ctypes.get_errno()
            if e == errno.EINTR:
                continue
            raise OSError(e, os.strerror(e))
        if got == 0:  # no progress and no error: treat as a fault rather than spin
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
        done += got
    return True


def memmove(dst: int, src: int, nbytes: int, *, stop: Callable[[], bool] = lambda: False) -> bool:
    """Copy within this process, in chunks (the GIL is released during each)."""
    done = 0
    while done < nbytes:
        if stop():
            return False
        n = min(CHUNK, nbytes - done)
        ctypes.memmove(dst + done, src + done, n)
        done += n
    return True


# Per process, not a node part: the ptracer declaration (prctl) is the process's, made once.
_ptracer_lock = threading.Lock()  # guards _ptracer_done
_ptracer_done = False


def allow_peers(is_proc: bool) -> None:
    """Let the other processes of this job read and write our memory (once per process).

    Under Yama ``ptrace_scope=1`` a process may only be accessed by its
    ancestors and by whoever it declares. We declare the narrowest process
    whose descendants are every proc of this host: in a spawned proc its
    parent (the host's zygote, which forked all of them), in the client the
    client itself (its host agent, zygote and procs descend from it).
    ``DANAUS_RDMA_PTRACER=any`` declares any process of this user instead.
    Without Yama the call fails harmlessly and ordinary ptrace rules apply.
    """
    global _ptracer_done
    with _ptracer_lock:
        if _ptracer_done:
            return
        _ptracer_done = True
        libc = _libc()
        if libc is None:
            return
        if config.get("rdma_ptracer").lower() == "any":
            who = _PR_SET_PTRACER_ANY
        else:
            who = os.getppid() if is_proc else os.getpid()
        libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(who), 0, 0, 0)


def ptrace_scope() -> int | None:
    """Yama's ``kernel.yama.ptrace_scope``, or None without Yama."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=1)
def host_key() -> str:
    """Names this kernel and pid namespace: two processes with equal keys can use `copy()`.

    Computed before any fork that matters (the zygote's children inherit the cache,
    which is right: they share its kernel and pid namespace).
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:  # pragma: no cover - no procfs
        boot = os.uname().nodename
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # pragma: no cover
        ns = 0
    return f"{boot}/{ns}"


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (stable layout since 3.3; part of the limited API in 3.11)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def address(view: memoryview) -> int:
    """The address of a C-contiguous, non-empty memoryview's first byte.

    ``ctypes.c_char.from_buffer`` refuses read-only memory, so ask CPython
    for the buffer directly; ``view`` (which the caller keeps) holds the
    export that keeps the address valid.
    """
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view.cast("B")))
    pb = _PyBuffer()
    _get_buffer(view, ctypes.byref(pb), 0)  # PyBUF_SIMPLE: contiguous bytes
    try:
        return int(pb.buf or 0)
    finally:
        _release_buffer(ctypes.byref(pb))
