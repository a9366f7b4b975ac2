"""The NIXL backend: buffers whose bytes NVIDIA NIXL moves (UCX underneath), CPU or CUDA memory.

Control and data stay apart, as everywhere in danaus:

    owner                                          holder of the handle
    RDMABuffer(data): agent.register_memory         (no NIXL call until a transfer)
      handle = (ids..., Desc(agent, partial metadata, DRAM|VRAM, device))
                 ──── any actor message (the control plane) ────►
                                                    read_into / write_from:
      I/O thread: check and pin the buffer  ◄── RDMA_CHECK ──  (deadline: seconds left)
                 ─── answers, lease ──►             NIXL thread: load the owner's
                                                    metadata once, register the local
                                                    memory, initialize_xfer(READ|WRITE),
      NIXL/UCX moves the bytes  ◄═══ UCX (shm, cma, TCP, CUDA IPC, IB) ═══►
                                                    poll check_xfer_state: DONE
                 ◄── RDMA_RELEASE (the pin ends) ──

- The owner's agent metadata travels in the handle: the *partial* metadata of the
  one registered region plus the agent's connection info (a few hundred bytes over
  UCX), loaded by the reader with ``add_remote_agent`` on first use.
- The owner's check and pin are the built-in plane's (``RDMA_CHECK`` /
  ``RDMA_RELEASE``, answered on the owner's I/O thread), so ``drop()`` means the
  same on either backend: later transfers fail, transfers under way finish first.
  NIXL itself would go on serving a region the owner has deregistered to a reader
  that loaded its metadata before.
- The owner is watched for the whole transfer: its loss fails the future at once
  with ``RDMAOwnerLostError``; the NIXL request is then released (cancelled), and
  only once NIXL let go of it are the local memory and the owner's pin released.
- One thread per process (``danaus-nixl``) makes every NIXL call: it starts
  requests handed to it and polls those in flight, so any number of transfers run
  on one agent at once without NIXL's own thread-safety modes being relied on.
- UCX opens sockets of its own (the TCP transport listens on every interface it
  is allowed). Unless ``UCX_NET_DEVICES`` is set, it is restricted to the
  interface danaus's own connections use (loopback for a proc reached only on its
  host) plus the host's InfiniBand/RoCE ports, which are not IP sockets.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from .._actor.core.collect import decode_reply
from .._runtime.node import Node
from .._wire.protocol import Message, RdmaCheck, RdmaRelease
from . import vm
from .backend import Group, device_of
from .errors import RDMAError
from .memory import LocalMemory
from .nixl_setup import _import_api, ucx_devices
from .registry import BufferRegistry

__all__ = ["Desc", "NixlBackend", "ucx_devices"]

log = logging.getLogger("danaus.rdma")

_POLL_MIN = 20e-6  # seconds between polls of requests in flight, at first ...
_POLL_MAX = 1e-3  # ... backing off to this while none completes


class Desc(NamedTuple):
    """What a handle carries for a NIXL buffer: enough for any process to reach it."""

    agent: str  # the owner's NIXL agent
    metadata: bytes  # its partial metadata: connection info and this region's keys
    mem: str  # "DRAM" or "VRAM"
    device: int  # the CUDA device index (0 for DRAM)
    key: int  # the owner's number for the registration


class _Request:
    """One NIXL request of a group: its handle and what to release after it."""

    __slots__ = ("handle", "state")

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.state = "PROC"


class _Run:
    """A group on the NIXL thread: its requests, local registrations and the owner's pin."""

    def __init__(
        self, group: Group, agent: str, release: Callable[[], None], waits: list[Any]
    ) -> None:
        self.group = group
        self.waits = waits  # CUDA events: the work queued on the callers' streams
        self.agent = agent  # the owner's agent (our own for our own buffers)
        self.release = release  # ends the owner's pin
        self.requests: list[_Request] = []
        self.regs: list[Any] = []  # local registrations, deregistered at the end
        self.failed = False


class NixlBackend:
    """This process's NIXL agent and the thread that makes its calls (one per node).

    Raises ``ImportError`` if ``nixl`` is not installed and ``RuntimeError`` (or
    NIXL's own error) if its agent or UCX backend cannot start.
    """

    name = "nixl"

    def __init__(self, node: Node) -> None:
        api = _import_api()  # ImportError: not installed
        nixl_agent, nixl_agent_config = api.nixl_agent, api.nixl_agent_config

        if "NIXL_LOG_LEVEL" not in os.environ:
            logging.getLogger("nixl").setLevel(logging.WARNING)  # its INFO lines are noise
        rt = node.runtime
        self._rt = rt
        self._node = node
        self.agent_name = f"danaus/{rt.proc_id.name}/{os.getpid()}/{secrets.token_hex(4)}"
        conf = nixl_agent_config(enable_prog_thread=True, backends=["UCX"])
        devices = None if "UCX_NET_DEVICES" in os.environ else ucx_devices(rt.tcp_advertise)
        if devices is not None:
            # Read by UCX when the agent starts; not left for the processes we spawn.
            os.environ["UCX_NET_DEVICES"] = devices
        try:
            self._agent = nixl_agent(self.agent_name, conf)
        finally:
            if devices is not None:
                os.environ.pop("UCX_NET_DEVICES", None)
        self.ucx_net_devices = devices or os.environ.get("UCX_NET_DEVICES")
        if "UCX" not in self._agent.backends:
            raise RuntimeError(
                "NIXL started without its UCX backend (plugins found: "
                f"{self._agent.plugin_list}); set NIXL_PLUGIN_DIR to where libplugin_UCX.so is"
            )
        # Guards the agent and everything below; reentrant: a registration may be dropped
        # (and so deregistered) from a callback of the NIXL thread itself.
        self._lock = threading.Condition(threading.RLock())
        self._jobs: list[Callable[[], None]] = []  # to run on the NIXL thread
        self._after: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []  # see _later
        self._runs: list[_Run] = []  # groups with requests in flight
        self._regs: dict[int, Any] = {}  # our registrations, by Desc.key
        self._keys = itertools.count(1)
        self._loaded: dict[str, dict[int, tuple[int, int]]] = {}  # agent -> key -> region
        self._lost_agents: set[str] = set()  # of lost procs: removed once nothing uses them
        self._closed = False
        rt.peers.lost_callbacks.append(self._proc_lost)
        self._thread = threading.Thread(target=self._loop, name="danaus-nixl", daemon=True)
        self._thread.start()

    # -- the owner's side -----------------------------------------------------------

    def register(self, memory: LocalMemory) -> Desc:
        """Register ``memory`` with the agent; its descriptor, with the partial metadata."""
        kind, device = device_of(memory)
        mem = "VRAM" if kind == "cuda" else "DRAM"
        with self._lock:
            reg = self._agent.register_memory([(memory.addr, memory.nbytes, device, "")], mem)
            metadata = self._agent.get_partial_agent_metadata(reg, True)
            key = next(self._keys)
            self._regs[key] = reg
        return Desc(self.agent_name, bytes(metadata), mem, device, key)

    def unregister(self, desc: Desc) -> None:
        """Deregister (the buffer was dropped and no transfer of the owner's pins uses it)."""
        with self._lock:
            reg = self._regs.pop(desc.key, None)
            if reg is not None and not self._closed:
                self._agent.deregister_memory(reg)

    # -- the holder's side ----------------------------------------------------------

    def run(self, group: Group, node: Node) -> None:
        """Pin the buffers with their owner, then move the bytes on the NIXL thread."""
        ops = group.ops
        desc: Desc = ops[0].buf._desc
        waits = _stream_waits(ops)
        entries = [(op.buf._id, op.buf._addr, op.buf._size) for op in ops]
        if group.owner_is_me:
            memory = node.part(BufferRegistry)
            answers, lease_id, regs = memory.lease(entries)

            def release_local() -> None:
                memory.release(lease_id)
                regs.clear()  # held until now: the memory stays alive under the copy

            self._checked(group, answers, self.agent_name, release_local, waits)
            return
        _Check(self, group, desc.agent, waits).send()

    def _checked(
        self,
        group: Group,
        answers: list[str | None],
        agent: str,
        release: Callable[[], None],
        waits: list[Any],
    ) -> None:
        for op, why in zip(group.ops, answers, strict=True):
            if why is not None:
                release()
                group.fail(group.unusable(op, why))
                return
        run = _Run(group, agent, _once(release), waits)
        self._submit(lambda: self._start(run))

    def _submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the NIXL backend of this process has ended")
            self._jobs.append(job)
            self._lock.notify()

    # -- the NIXL thread --------------------------------------------------------------

    def _loop(self) -> None:
        delay = _POLL_MIN
        while True:
            with self._lock:
                while not self._jobs and not self._runs and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                jobs, self._jobs = self._jobs, []
                for job in jobs:
                    job()
                progressed = self._poll() or bool(jobs)
                self._forget_lost()
                after, self._after = self._after, []
            for fn, args in after:
                try:
                    fn(*args)
                except Exception:  # pragma: no cover - a bug in a completion
                    log.exception("completing a NIXL transfer failed")
            with self._lock:
                if self._runs and not self._jobs and not self._closed:
                    # Back off while nothing completes; a new job wakes the wait at once.
                    delay = _POLL_MIN if progressed else min(_POLL_MAX, delay * 2)
                    self._lock.wait(delay)

    def _start(self, run: _Run) -> None:
        """Load the owner's metadata, register the local memory, post the requests."""
        group = run.group
        if group.over():
            self._later(run.release)
            return
        try:
            for event in run.waits:  # CUDA: what the caller queued before the transfer
                event.synchronize()
            if not group.owner_is_me:
                self._load(group)
            # One request per direction and pair of memory kinds: a NIXL list is of one kind.
            batches: dict[tuple[bool, str, str], tuple[list[Any], list[Any]]] = {}
            for op in group.ops:
                if op.nbytes == 0:
                    continue
                desc: Desc = op.buf._desc
                kind, device = device_of(op.local)
                mem = "VRAM" if kind == "cuda" else "DRAM"
                run.regs.append(
                    self._agent.register_memory([(op.local.addr, op.nbytes, device, "")], mem)
                )
                local, remote = batches.setdefault((op.write, mem, desc.mem), ([], []))
                local.append((op.local.addr, op.nbytes, device))
                remote.append((op.buf._addr, op.nbytes, desc.device))
            for (write, mem, remote_mem), (local, remote) in batches.items():
                handle = self._agent.initialize_xfer(
                    "WRITE" if write else "READ",
                    self._agent.get_xfer_descs(local, mem),
                    self._agent.get_xfer_descs(remote, remote_mem),
                    run.agent,
                )
                request = _Request(handle)
                run.requests.append(request)
                request.state = self._agent.transfer(handle)
                if request.state == "ERR":
                    raise RDMAError("NIXL could not post the transfer (state ERR)")
        except Exception as e:
            run.failed = True
            self._later(group.fail, self._error(group, e))
        done = run.failed or all(r.state == "DONE" for r in run.requests)
        if done and self._cancel(run):
            self._end(run, finished=not run.failed)
            return
        self._runs.append(run)

    def _load(self, group: Group) -> None:
        """Load the owners' partial metadata for the buffers of ``group`` (once each)."""
        for op in group.ops:
            desc: Desc = op.buf._desc
            loaded = self._loaded.setdefault(desc.agent, {})
            if desc.key in loaded:
                continue
            region = (op.buf._addr, op.buf._size)
            stale = any(_overlap(region, r) for r in loaded.values())
            if stale and not any(r.agent == desc.agent for r in self._runs):
                # A region of a dropped buffer of that owner, reused by this one: start
                # that agent afresh rather than risk NIXL matching the stale keys.
                self._agent.remove_remote_agent(desc.agent)
                loaded.clear()
            self._agent.add_remote_agent(desc.metadata)
            loaded[desc.key] = region

    def _poll(self) -> bool:
        """Check every request in flight; end the groups that are done. True if any ended."""
        progressed = False
        for run in list(self._runs):
            group = run.group
            if group.over() or run.failed:
                if self._cancel(run):  # NIXL has let go: the memory may be released
                    self._runs.remove(run)
                    self._end(run)
                    progressed = True
                continue
            try:
                for request in run.requests:
                    if request.state == "PROC":
                        request.state = self._agent.check_xfer_state(request.handle)
                        if request.state == "ERR":
                            raise RDMAError("NIXL reported the transfer failed (state ERR)")
            except Exception as e:
                run.failed = True
                self._later(group.fail, self._error(group, e))
                continue
            if all(r.state == "DONE" for r in run.requests) and self._cancel(run):
                self._runs.remove(run)
                buf = group.ops[0].buf
                if not group.owner_is_me and not _alive(buf._pid, buf._host):
                    # The owner died while its memory was read or written: the kernel may
                    # have finished a copy already under way (cma), but as on the built-in
                    # plane a transfer that outlives its owner fails.
                    why = "its process exited during the transfer"
                    self._later(group.fail, group.owner_lost(group.ops[0], why, None))
                    self._end(run)
                else:
                    self._end(run, finished=True)
                progressed = True
        return progressed

    def _cancel(self, run: _Run) -> bool:
        """Release every request of ``run`` (NIXL cancels those in flight); True when all are."""
        ok = True
        for request in run.requests:
            if request.handle is None:
                continue
            try:
                self._agent.release_xfer_handle(request.handle)
                request.handle = None
            except Exception:  # NIXL could not cancel it yet: try again on the next poll
                ok = False
        return ok

    def _end(self, run: _Run, *, finished: bool = False) -> None:
        """NIXL has let go of ``run``: release the local memory, the pin; finish."""
        for reg in run.regs:
            try:
                self._agent.deregister_memory(reg)
            except Exception as e:  # pragma: no cover - NIXL refused a registration it made
                log.warning("NIXL could not deregister local memory after a transfer: %s", e)
        run.regs = []
        self._later(run.release)
        if finished:
            self._later(run.group.finish)

    def _later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the NIXL thread once it has let go of the lock: what
        completes a future may run a user's callbacks, which may start transfers."""
        self._after.append((fn, args))

    def _error(self, group: Group, e: BaseException) -> BaseException:
        """The error a failed NIXL call or request means for ``group``."""
        op = group.ops[0]
        buf = op.buf
        if not group.owner_is_me and not _alive(buf._pid, buf._host):
            return group.owner_lost(op, f"its process exited during the transfer ({e})", e)
        if isinstance(e, RDMAError):
            msg = f"{group.label(op)} failed: {e}"
        else:
            msg = f"{group.label(op)} failed in NIXL: {type(e).__name__}: {e}"
        err = RDMAError(msg, buffer=str(buf), owner=buf.owner)
        err.__cause__ = e
        return err

    # -- lost procs and the end -------------------------------------------------------

    def _proc_lost(self, name: str, reason: str) -> None:
        """A proc is lost (I/O thread): forget its agents once no request uses them."""
        with self._lock:
            for agent in self._loaded:
                if agent.startswith(f"danaus/{name}/"):
                    self._lost_agents.add(agent)
            self._lock.notify()

    def _forget_lost(self) -> None:
        for agent in list(self._lost_agents):
            if any(r.agent == agent for r in self._runs):
                continue
            self._lost_agents.discard(agent)
            self._loaded.pop(agent, None)
            try:
                self._agent.remove_remote_agent(agent)
            except Exception:  # already gone from NIXL's side
                pass

    def close(self) -> None:
        """End the thread (the node ends); requests in flight are released first."""
        with self._lock:
            for run in self._runs:
                run.failed = True
                op = run.group.ops[0]
                err = RDMAError(
                    f"{run.group.label(op)} failed: this process's danaus session ended "
                    "(shutdown_context) during the transfer",
                    buffer=str(op.buf),
                    owner=op.buf.owner,
                )
                self._later(run.group.fail, err)
            deadline = time.monotonic() + 5
            while self._runs and time.monotonic() < deadline:
                self._poll()
                if self._runs:
                    self._lock.wait(_POLL_MAX)
            self._closed = True
            self._lock.notify_all()
            after, self._after = self._after, []
        for fn, args in after:
            fn(*args)
        try:
            self._rt.peers.lost_callbacks.remove(self._proc_lost)
        except ValueError:
            pass


class _Check:
    """The owner's check and pin of a group's buffers, and the owner's watch until the end."""

    def __init__(self, backend: NixlBackend, group: Group, agent: str, waits: list[Any]) -> None:
        self.backend = backend
        self.waits = waits
        self.group = group
        self.agent = agent
        self.rt = backend._rt
        self.owner = self.rt.peers.resolve(group.ops[0].buf._owner_proc)
        self.answered = False
        self.port = self.rt.router.open_port(self)

    def send(self) -> None:
        group, rt = self.group, self.rt
        group.on_end(self.close)
        reason = rt.peers.watch(self.owner, self.port.port)
        if reason is not None:
            self.peer_lost(self.owner.name, reason)
            return
        entries = tuple((op.buf._id, op.buf._addr, op.buf._size) for op in group.ops)
        # Seconds left, negative: the owner may be on another host, with another clock.
        left = -max(1e-3, group.deadline - time.monotonic())
        rt.send(
            self.owner,
            RdmaCheck(entries, self.port, 0, left),
            on_fail=lambda reason: self.peer_lost(self.owner.name, reason),
        )

    def deliver(self, frame: Message) -> None:  # I/O thread: the answer to RDMA_CHECK
        if self.answered:
            return
        self.answered = True
        ok, value = decode_reply(frame, f"the RDMA check of {self.group.ops[0].buf}")
        if not ok:
            self.group.fail(value)
            return
        answers, lease_id = value
        rt, owner = self.rt, self.owner

        def release() -> None:
            if lease_id is not None:
                rt.send(owner, RdmaRelease((lease_id,)), on_fail=_ignore)

        try:
            self.backend._checked(self.group, list(answers), self.agent, release, self.waits)
        except RuntimeError as e:  # the backend ended meanwhile
            release()
            self.group.fail(RDMAError(str(e)))

    def peer_lost(self, proc: str, reason: str) -> None:
        group = self.group
        group.fail(group.owner_lost(group.ops[0], reason, None))

    def close(self) -> None:
        self.rt.router.close_port(self.port.port)
        self.rt.peers.unwatch([self.owner.name], self.port.port)


def _stream_waits(ops: list[Any]) -> list[Any]:
    """An event recorded now on the calling thread's current stream of each CUDA device the
    local memory of ``ops`` is on: the transfer starts after the work queued there.

    Its completion is ordered before the caller's next work by the future itself: the
    caller waits for it before queuing more.
    """
    streams: dict[Any, Any] = {}
    for op in ops:
        kind, index = device_of(op.local)
        if kind == "cuda":
            # The stream the memory record took at the call, else the current one now.
            stream = getattr(op.local, "stream", None)
            if stream is None:
                stream = sys.modules["torch"].cuda.current_stream(index)
            streams[id(stream)] = stream
    events = []
    for stream in streams.values():
        event = sys.modules["torch"].cuda.Event()
        event.record(stream)
        events.append(event)
    return events


def _ignore(reason: str) -> None:
    pass


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    lock = threading.Lock()
    left = [fn]

    def call() -> None:
        with lock:
            todo = left[:]
            left.clear()
        for f in todo:
            f()

    return call


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def _alive(pid: int, host: str) -> bool:
    """False if ``pid`` (of host key ``host``) is known to be gone; True if unsure."""
    if host != vm.host_key():
        return True  # another host: its loss is the runtime's to tell
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError as e:
            return e.errno != errno.ESRCH
        return True
    return state not in ("Z", "X")  # a zombie is dead: its memory is gone
