"""The NIXL backend across real processes: CPU memory, over NIXL's UCX transport.

The procs of this module set ``rdma_backend="nixl"`` in their ``__init__``, so
every buffer they register is moved by NIXL; the test process sets it with
``configured`` where it registers buffers of its own. NIXL (``danaus[nixl]``)
is part of the ``dev`` extra, so these run in CI.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from danaus._rdma.backend import device_of
from danaus._rdma.memory import local_memory
from danaus._runtime.node import this_node
from danaus.actor import Actor, ActorMesh, ProcMesh, SupervisionError, endpoint, this_host
from danaus.config import configure, configured
from danaus.rdma import (
    RDMAAction,
    RDMABuffer,
    RDMAError,
    RDMAOwnerLostError,
    get_rdma_backend,
)
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT, Holder, random_bytes, started

MiB = 1 << 20


def _name() -> str:
    return uuid.uuid4().hex[:8]


class NixlHolder(Holder):
    """A ``Holder`` whose proc registers its buffers with NIXL."""

    def __init__(self) -> None:
        configure(rdma_backend="nixl")
        super().__init__()

    @endpoint
    def set_env(self, key: str, value: str) -> None:
        os.environ[key] = value

    @endpoint
    def backend_of(self, buf: RDMABuffer) -> str:
        return buf.backend

    @endpoint
    def read_many(self, bufs: list[RDMABuffer]) -> list[str]:
        """Start a read of every buffer at once, then wait for all: many in flight."""
        dsts = [np.zeros(b.size(), np.uint8) for b in bufs]
        futs = [
            started(b.read_into(d, timeout=REPLY_TIMEOUT)) for b, d in zip(bufs, dsts, strict=True)
        ]
        for f in futs:
            f.get(timeout=REPLY_TIMEOUT)
        return [hashlib.sha256(d.tobytes()).hexdigest() for d in dsts]


class NixlParent(Actor):
    """Spawns child procs holding one NIXL buffer each and absorbs their failures."""

    def __init__(self) -> None:
        self.children: list[Any] = []

    @endpoint
    def spawn_child(self, n: int, value: int, ucx_tls: str | None = None) -> tuple[RDMABuffer, int]:
        pm = this_host().spawn_procs(per_host={"c": 1})
        holder = pm.spawn("child", NixlHolder)
        if ucx_tls is not None:  # before its NIXL agent starts (at its first buffer)
            holder.set_env.call_one("UCX_TLS", ucx_tls).get(timeout=REPLY_TIMEOUT)
        buf = holder.fill.call_one("big", n, value).get(timeout=60)
        pid = holder.pid.call_one().get(timeout=REPLY_TIMEOUT)
        self.children.append((pm, holder))
        return buf, pid

    def __supervise__(self, failure: Any) -> bool:
        return True


class Fallback(Actor):
    """In a fresh proc: NIXL made unimportable, then buffers registered; the log kept."""

    @endpoint
    def register_without_nixl(self, setting: str) -> tuple[list[str], list[tuple[int, str]]]:
        for name in [m for m in sys.modules if m == "nixl" or m.startswith("nixl.")]:
            del sys.modules[name]
        sys.modules["nixl"] = None  # type: ignore[assignment]  # as if not installed
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger = logging.getLogger("danaus.rdma")
        logger.addHandler(handler)
        try:
            configure(rdma_backend=setting)
            self.keep = [np.ones(64, np.uint8), np.ones(64, np.uint8)]
            bufs = [RDMABuffer(a) for a in self.keep]
        finally:
            logger.removeHandler(handler)
        return [b.backend for b in bufs], [(r.levelno, r.getMessage()) for r in records]

    @endpoint
    def read_without_nixl(self, buf: RDMABuffer) -> str:
        """Read a NIXL buffer here, where NIXL cannot start: the error's text."""
        sys.modules["nixl"] = None  # type: ignore[assignment]
        try:
            buf.read_into(bytearray(buf.size())).get(timeout=REPLY_TIMEOUT)
        except RDMAError as e:
            return str(e)
        return "no error"


@pytest.fixture(scope="module")
def nprocs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"x": 2})
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def nholders(nprocs: ProcMesh) -> ActorMesh[NixlHolder]:
    mesh = nprocs.spawn("nholders", NixlHolder)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    return mesh


@pytest.fixture(scope="module")
def nparent(nprocs: ProcMesh) -> ActorMesh[NixlParent]:
    mesh = nprocs.spawn("nparents", NixlParent)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    return mesh.slice(x=0)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- what a buffer says about its backend ----------------------------------------------


def test_a_buffer_registered_under_nixl_says_nixl_wherever_it_is_asked(
    nholders: ActorMesh[NixlHolder],
) -> None:
    buf = nholders.slice(x=0).make.call_one(_name(), 1000).get(timeout=REPLY_TIMEOUT)
    assert buf.backend == "nixl"
    assert get_rdma_backend() == "tcp"  # Monarch's values, whatever moves a given buffer
    assert nholders.slice(x=1).backend_of.call_one(buf).get(timeout=REPLY_TIMEOUT) == "nixl"
    with configured(rdma_backend="builtin"):
        mine = RDMABuffer(bytearray(100))
    assert mine.backend == "process_vm"  # the built-in plane: one kernel copy on this host
    assert nholders.slice(x=0).backend_of.call_one(mine).get(timeout=REPLY_TIMEOUT) == (
        "process_vm"
    )
    mine.drop().get(timeout=REPLY_TIMEOUT)


def test_the_default_and_auto_keep_cpu_memory_on_the_builtin_plane_with_nixl_installed() -> None:
    default = RDMABuffer(bytearray(100))  # rdma_backend's default: "builtin"
    with configured(rdma_backend="auto"):
        auto = RDMABuffer(bytearray(100))
    assert default.backend == "process_vm"
    assert auto.backend == "process_vm"
    default.drop().get(timeout=REPLY_TIMEOUT)
    auto.drop().get(timeout=REPLY_TIMEOUT)


def test_a_setting_that_names_no_backend_is_refused_naming_the_choices() -> None:
    with configured(rdma_backend="ibverbs"), pytest.raises(ValueError) as info:
        RDMABuffer(bytearray(10))
    assert "'ibverbs'" in str(info.value)
    assert "'nixl'" in str(info.value) and "'builtin'" in str(info.value)


# -- moving bytes --------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4097, MiB + 3, 64 * MiB])
def test_client_reads_and_writes_a_nixl_buffer_of_a_proc(
    nholders: ActorMesh[NixlHolder], n: int
) -> None:
    name = _name()
    owner = nholders.slice(x=0)
    buf = owner.make.call_one(name, n, "numpy", n % 251).get(timeout=REPLY_TIMEOUT)
    dst = np.zeros(n + 16, np.uint8)
    dst[n:] = 0xEE
    buf.read_into(dst, timeout=REPLY_TIMEOUT).get(timeout=REPLY_TIMEOUT)
    assert dst[:n].tobytes() == random_bytes(n, n % 251).tobytes()
    assert (dst[n:] == 0xEE).all()  # past the buffer: untouched
    src = random_bytes(n, 1000 + n % 7)
    buf.write_from(src, timeout=REPLY_TIMEOUT).get(timeout=REPLY_TIMEOUT)
    digest = owner.digest.call_one(name).get(timeout=REPLY_TIMEOUT)
    assert digest == hashlib.sha256(src.tobytes()).hexdigest()


def test_a_smaller_src_overwrites_only_the_leading_bytes_of_a_nixl_buffer(
    nholders: ActorMesh[NixlHolder],
) -> None:
    name = _name()
    owner = nholders.slice(x=1)
    buf = owner.make.call_one(name, 10_000, "bytearray", 8).get(timeout=REPLY_TIMEOUT)
    src = random_bytes(3000, 9).tobytes()
    buf.write_from(src).get(timeout=REPLY_TIMEOUT)
    after = owner.contents.call_one(name).get(timeout=REPLY_TIMEOUT)
    assert after[:3000] == src
    assert after[3000:] == random_bytes(10_000, 8).tobytes()[3000:]


def test_a_proc_reads_and_writes_another_procs_nixl_buffer(
    nholders: ActorMesh[NixlHolder],
) -> None:
    name = _name()
    owner, other = nholders.slice(x=0), nholders.slice(x=1)
    buf = owner.make.call_one(name, 3 * MiB, "torch", 11).get(timeout=REPLY_TIMEOUT)
    assert (
        other.read.call_one(buf).get(timeout=REPLY_TIMEOUT) == random_bytes(3 * MiB, 11).tobytes()
    )
    src = random_bytes(3 * MiB, 12).tobytes()
    other.write.call_one(buf, src).get(timeout=REPLY_TIMEOUT)
    assert owner.contents.call_one(name).get(timeout=REPLY_TIMEOUT) == src


def test_a_proc_reads_and_writes_a_nixl_buffer_of_the_client(
    nholders: ActorMesh[NixlHolder],
) -> None:
    data = random_bytes(2 * MiB, 13)
    with configured(rdma_backend="nixl"):
        buf = RDMABuffer(data)
    assert buf.backend == "nixl"
    reader = nholders.slice(x=1)
    assert reader.read.call_one(buf).get(timeout=REPLY_TIMEOUT) == data.tobytes()
    src = random_bytes(MiB, 14).tobytes()
    reader.write.call_one(buf, src).get(timeout=REPLY_TIMEOUT)
    assert data[:MiB].tobytes() == src
    assert data[MiB:].tobytes() == random_bytes(2 * MiB, 13)[MiB:].tobytes()
    # The client moves bytes of its own NIXL buffer too (NIXL's loopback).
    mine = np.zeros(2 * MiB, np.uint8)
    buf.read_into(mine).get(timeout=REPLY_TIMEOUT)
    assert mine.tobytes() == data.tobytes()
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_batch_reads_and_writes_nixl_buffers_of_two_owners_at_once(
    nholders: ActorMesh[NixlHolder],
) -> None:
    names = [_name() for _ in range(4)]
    a0 = nholders.slice(x=0).make.call_one(names[0], MiB, "numpy", 21).get(timeout=REPLY_TIMEOUT)
    a1 = nholders.slice(x=0).make.call_one(names[1], 5000, "numpy", 22).get(timeout=REPLY_TIMEOUT)
    b0 = (
        nholders.slice(x=1).make.call_one(names[2], 2 * MiB, "numpy", 23).get(timeout=REPLY_TIMEOUT)
    )
    b1 = nholders.slice(x=1).make.call_one(names[3], 7000, "numpy", 24).get(timeout=REPLY_TIMEOUT)
    d0, d1 = np.zeros(MiB, np.uint8), np.zeros(2 * MiB, np.uint8)
    s0, s1 = random_bytes(5000, 25), random_bytes(7000, 26)
    action = RDMAAction().read_remote(d0, a0).read_remote(d1, b0)
    action.write_remote(a1, s0).write_remote(b1, s1)
    action.submit(timeout=REPLY_TIMEOUT).get(timeout=REPLY_TIMEOUT)
    assert d0.tobytes() == random_bytes(MiB, 21).tobytes()
    assert d1.tobytes() == random_bytes(2 * MiB, 23).tobytes()
    after_a1 = nholders.slice(x=0).contents.call_one(names[1]).get(timeout=REPLY_TIMEOUT)
    after_b1 = nholders.slice(x=1).contents.call_one(names[3]).get(timeout=REPLY_TIMEOUT)
    assert after_a1 == s0.tobytes()
    assert after_b1 == s1.tobytes()


def test_many_transfers_in_flight_on_one_agent_each_get_their_own_bytes(
    nholders: ActorMesh[NixlHolder],
) -> None:
    sizes = [MiB + 17 * i for i in range(12)]
    bufs = [
        nholders.slice(x=0).make.call_one(_name(), n, "numpy", 100 + i).get(timeout=REPLY_TIMEOUT)
        for i, n in enumerate(sizes)
    ]
    # From the client: all started before any is waited for.
    dsts = [np.zeros(n, np.uint8) for n in sizes]
    futs = [started(b.read_into(d, timeout=REPLY_TIMEOUT)) for b, d in zip(bufs, dsts, strict=True)]
    for f in futs:
        f.get(timeout=REPLY_TIMEOUT)
    for i, (n, d) in enumerate(zip(sizes, dsts, strict=True)):
        assert d.tobytes() == random_bytes(n, 100 + i).tobytes(), f"buffer {i}"
    # And from another proc, whose agent holds them all in flight at once.
    digests = nholders.slice(x=1).read_many.call_one(bufs).get(timeout=REPLY_TIMEOUT)
    for i, (n, got) in enumerate(zip(sizes, digests, strict=True)):
        assert got == hashlib.sha256(random_bytes(n, 100 + i).tobytes()).hexdigest()


def test_concurrent_writes_from_many_threads_land_in_their_own_buffers(
    nholders: ActorMesh[NixlHolder],
) -> None:
    names = [_name() for _ in range(8)]
    owner = nholders.slice(x=1)
    bufs = [owner.fill.call_one(nm, 512 * 1024, 0).get(timeout=REPLY_TIMEOUT) for nm in names]
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            bufs[i].write_from(random_bytes(512 * 1024, 200 + i)).get(timeout=REPLY_TIMEOUT)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REPLY_TIMEOUT)
    assert not errors
    for i, nm in enumerate(names):
        digest = owner.digest.call_one(nm).get(timeout=REPLY_TIMEOUT)
        assert digest == hashlib.sha256(random_bytes(512 * 1024, 200 + i).tobytes()).hexdigest()


def test_a_dropped_nixl_buffer_refuses_later_transfers(
    nholders: ActorMesh[NixlHolder],
) -> None:
    name = _name()
    owner = nholders.slice(x=0)
    buf = owner.make.call_one(name, 4096).get(timeout=REPLY_TIMEOUT)
    dst = bytearray(4096)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)  # NIXL has the owner's keys now
    owner.drop.call_one(buf).get(timeout=REPLY_TIMEOUT)
    with pytest.raises(RDMAError) as info:
        buf.read_into(bytearray(4096)).get(timeout=REPLY_TIMEOUT)
    assert "dropped" in str(info.value)
    with pytest.raises(RDMAError):
        buf.write_from(b"x").get(timeout=REPLY_TIMEOUT)


# -- falling back ----------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "level"), [("nixl", logging.WARNING), ("auto", None)])
def test_a_nixl_that_cannot_start_falls_back_to_the_builtin_plane_with_one_log_line(
    setting: str, level: int | None
) -> None:
    pm = this_host().spawn_procs(per_host={"f": 1})  # a fresh proc: NIXL never tried there
    try:
        actor = pm.spawn("fallback", Fallback)
        backends, records = actor.register_without_nixl.call_one(setting).get(timeout=REPLY_TIMEOUT)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)
    assert backends == ["process_vm", "process_vm"]
    if level is None:  # auto: CPU memory never asks for NIXL, so nothing to say
        assert records == []
        return
    assert len(records) == 1, records  # one line, not one per buffer
    got_level, message = records[0]
    assert got_level == level
    assert "'nixl'" in message and "built-in" in message
    assert "nixl" in message.split("(", 1)[1]  # why: the import that failed
    assert "danaus[nixl]" in message


def test_a_holder_where_nixl_cannot_start_gets_an_error_saying_so(
    nholders: ActorMesh[NixlHolder],
) -> None:
    buf = nholders.slice(x=0).make.call_one(_name(), 100).get(timeout=REPLY_TIMEOUT)
    pm = this_host().spawn_procs(per_host={"f": 1})
    try:
        actor = pm.spawn("fallback", Fallback)
        text = actor.read_without_nixl.call_one(buf).get(timeout=REPLY_TIMEOUT)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)
    assert str(buf) in text
    assert "'nixl'" in text and "cannot start in this process" in text
    assert "danaus[nixl]" in text  # what to do about it


# -- an owner that dies ----------------------------------------------------------------


def test_a_transfer_from_a_dead_nixl_owner_fails_with_owner_lost(
    nparent: ActorMesh[NixlParent],
) -> None:
    buf, pid = nparent.spawn_child.call_one(MiB, 7).get(timeout=60)
    dst = bytearray(MiB)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)  # metadata loaded, connection made
    assert dst == b"\x07" * MiB
    _kill(pid)
    with pytest.raises(RDMAOwnerLostError) as info:
        buf.read_into(bytearray(MiB)).get(timeout=REPLY_TIMEOUT)
    assert isinstance(info.value, SupervisionError)
    assert info.value.buffer == str(buf)
    with pytest.raises(RDMAOwnerLostError):
        buf.write_from(b"abc").get(timeout=REPLY_TIMEOUT)


def test_a_nixl_owner_killed_while_the_transfer_waits_fails_it(
    nparent: ActorMesh[NixlParent],
) -> None:
    buf, pid = nparent.spawn_child.call_one(MiB, 7).get(timeout=60)
    os.kill(pid, signal.SIGSTOP)  # it cannot answer the check: the transfer waits
    try:
        fut = started(buf.read_into(bytearray(MiB)))
        assert not fut.done()
    finally:
        _kill(pid)
    with pytest.raises(RDMAOwnerLostError):
        fut.get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "ucx_tls",
    [
        None,  # UCX's choice on one host: cma (the reader's kernel copies; danaus sees the death)
        "tcp,self",  # the owner's UCX sends the bytes: its death stops them (NIXL sees it too)
    ],
)
def test_a_nixl_owner_killed_mid_transfer_fails_it_and_spares_the_rest_of_dst(
    nparent: ActorMesh[NixlParent], ucx_tls: str | None
) -> None:
    n = 512 * MiB
    buf, pid = nparent.spawn_child.call_one(n, 7, ucx_tls).get(timeout=60)
    dst = np.zeros(n + MiB, np.uint8)  # fresh pages: the copy takes far longer than a kill
    dst[n:] = 0xEE  # past the buffer: must stay as it is
    fut = started(buf.read_into(dst, timeout=60))
    wait_until(lambda: dst[0] != 0 or fut.done(), 30, "the copy starts", interval=0)
    assert dst[0] == 7, "the copy never started"
    assert dst[n - 1] == 0, "the copy finished before the owner could be killed"
    _kill(pid)
    with pytest.raises(RDMAOwnerLostError) as info:
        fut.get(timeout=REPLY_TIMEOUT)
    assert info.value.buffer == str(buf)
    assert (dst[n:] == 0xEE).all()
    # The agent goes on serving others after the loss.
    other, _ = nparent.spawn_child.call_one(MiB, 9).get(timeout=60)
    small = bytearray(MiB)
    other.read_into(small).get(timeout=REPLY_TIMEOUT)
    assert small == b"\x09" * MiB


def test_a_nixl_transfer_past_its_timeout_fails_with_timeout_error(
    nparent: ActorMesh[NixlParent],
) -> None:
    buf, pid = nparent.spawn_child.call_one(MiB, 7).get(timeout=60)
    os.kill(pid, signal.SIGSTOP)
    try:
        fut = buf.read_into(bytearray(MiB), timeout=0.2)
        done = threading.Event()
        fut.add_done_callback(lambda _: done.set())
        started(fut)
        assert done.wait(REPLY_TIMEOUT)
        err = fut.exception(timeout=0)
        assert isinstance(err, TimeoutError)
        assert str(buf) in str(err)
    finally:
        os.kill(pid, signal.SIGCONT)
    dst = bytearray(MiB)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert dst == b"\x07" * MiB


# -- NIXL's own sockets ------------------------------------------------------------------


def _listening_addresses() -> list[str]:
    """The local addresses of this process's listening TCP sockets (Linux ``/proc``)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        for row in rows:
            if row[3] == "0A" and row[9] in inodes:  # LISTEN
                found.append(row[1].split(":")[0])
    return found


class SocketReporter(NixlHolder):
    @endpoint
    def listening(self) -> tuple[str | None, list[str]]:
        """The address this proc advertises to other hosts (None: none), and where it
        listens."""
        rt = this_node(start=False).runtime
        return (rt.tcp_advertise if rt is not None else None), _listening_addresses()


def test_ucx_under_nixl_listens_only_on_the_interfaces_the_mesh_uses(
    nprocs: ProcMesh,
) -> None:
    mesh = nprocs.spawn("sockets", SocketReporter)
    owner = mesh.slice(x=0)
    buf = owner.make.call_one(_name(), 4096).get(timeout=REPLY_TIMEOUT)  # its agent is up
    dst = bytearray(4096)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    advertised, addresses = owner.listening.call_one().get(timeout=REPLY_TIMEOUT)
    assert addresses, "UCX's TCP transport listens somewhere"
    # /proc/net/tcp writes IPv4 127.0.0.1 as 0100007F; IPv6 ::1 as 0...01000000.
    allowed = {"0100007F", "00000000000000000000000001000000"}
    if advertised is not None and not advertised.startswith("127."):
        # a job reachable from other hosts (the whole suite, after tests/multihost):
        # also the address it advertises, and still not every interface
        allowed.add(socket.inet_aton(advertised)[::-1].hex().upper())
    assert set(addresses) <= allowed, addresses


# -- where memory lives (pure) -------------------------------------------------------


class _GpuRecord:
    """A record of GPU memory as the CUDA path describes it: ``host`` False, an index."""

    host = False
    keepalive = None

    def __init__(self, device: object) -> None:
        self.device = device


def test_the_seam_tells_cpu_memory_from_each_form_of_a_cuda_record() -> None:
    assert device_of(local_memory(bytearray(8), "x")) == ("cpu", 0)
    assert device_of(local_memory(np.zeros(8, np.uint8), "x")) == ("cpu", 0)
    assert device_of(_GpuRecord(2)) == ("cuda", 2)  # type: ignore[arg-type]
    assert device_of(_GpuRecord("cuda:3")) == ("cuda", 3)  # type: ignore[arg-type]
