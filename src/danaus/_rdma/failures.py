"""The errors a transfer reports, built from what went wrong: the owner gone, the
kernel refusing a copy, CUDA refusing one."""

from __future__ import annotations

import errno
import os

from . import vm
from .errors import RDMAError, RDMAOwnerLostError
from .op import BufferRef, Op


def cuda_error(label: str, op: Op, e: RuntimeError) -> RDMAError:
    where = op.buf._cuda.kind if op.buf._cuda is not None else str(op.buf)
    err = RDMAError(
        f"{label} failed in CUDA ({where} <-> {op.local.kind}): {e}",
        buffer=str(op.buf),
        owner=op.buf.owner,
    )
    err.__cause__ = e
    return err


def owner_lost(
    label: str, buf: BufferRef, reason: str, cause: BaseException | None = None
) -> RDMAOwnerLostError:
    err = RDMAOwnerLostError(
        f"{label} failed: the owner {buf.owner} (proc {buf._owner_proc.name}, pid "
        f"{buf._pid}) is gone: {reason}",
        buffer=str(buf),
        owner=buf.owner,
    )
    err.__cause__ = cause
    return err


def os_error(label: str, buf: BufferRef, e: OSError) -> RDMAError:
    if e.errno == errno.ESRCH:
        return owner_lost(label, buf, "its process exited during the transfer", e)
    if e.errno in (errno.EPERM, errno.EACCES):
        scope = vm.ptrace_scope()
        hint = (
            f" Yama's kernel.yama.ptrace_scope is {scope}: at 2 or 3 only privileged "
            "processes may do this; at 1 the owner must have declared us, which danaus does "
            "for the procs of one job (set DANAUS_RDMA_PTRACER=any in the owner's environment "
            "to allow any process of this user)."
            if scope
            else " Both processes must run as the same user, and the owner must be dumpable."
        )
        msg = (
            f"{label} failed: the kernel refused this process (pid {os.getpid()}) "
            f"access to the memory of the owner (pid {buf._pid}): {e.strerror}.{hint}"
        )
    elif e.errno == errno.EFAULT:
        msg = (
            f"{label} failed: part of the memory is not mapped ({e.strerror}): the "
            "owner's data was probably freed while still registered, or the local memory "
            "was released during the transfer"
        )
    else:
        msg = f"{label} failed: {e.strerror} (errno {e.errno})"
    err = RDMAError(msg, buffer=str(buf), owner=buf.owner)
    err.__cause__ = e
    return err
