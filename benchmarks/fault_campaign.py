"""A fault campaign and a soak on the host lab (issue 44, parts 3 and 4). Needs root.

::

    .venv/bin/python benchmarks/fault_campaign.py campaign [--reps 3] [--kinds a,b] [--short]
    .venv/bin/python benchmarks/fault_campaign.py campaign --short --reps 1 --mixed  # CI's
    .venv/bin/python benchmarks/fault_campaign.py soak --minutes 30 [--short]

Both make a lab of 5 hosts (``danaus._netlab``: network namespaces on a bridge, a
``danaus worker`` in each whose job state and logs live on a 64 MiB tmpfs) and
run, on it, a real workload:

- **training**: ``examples/elastic_ddp.py``'s ``Trainer`` in an
  ``ElasticMesh(replicas=4, spares=1, hosts=<hosts 0-3>)`` (``add_hosts`` gives
  it host 4 for replacements), stepping without pause;
- **calls**: a ``Calc`` actor on 2 procs of each of hosts 0-3 under a
  ``Supervisor("one_for_one", spare_hosts=<host 4>)``, called in a loop with
  arguments whose answers are known (each rank returns a function of the
  argument and its rank, checked at the client).

``campaign`` injects each fault kind (``KINDS``), one kind at a time, ``--reps``
times, each at a random moment of a round of its own (fresh meshes, the same
workers; workers a fault killed are started again), and reports per kind: time
to notice (the fault to the supervisor's or coordinator's first sight of it),
time to recover (to full size again: every rank restarted, 4 members
training), steps lost, wrong answers, calls left hanging, and the processes,
threads and descriptors left behind once the round's meshes are stopped.

``soak`` runs mixed traffic (calls, streams through ports, RDMA transfers,
spawns and stops of meshes, training) for ``--minutes`` with a fault every 30 s
(the kinds in turn), checks sequence numbers at every receiver, and samples
RSS, threads and descriptors of every process each minute.

``--short``: faults a few seconds long (liveness limit 5 s, as in full);
``campaign --short --reps 1 --mixed`` (each kind once, with the soak's traffic)
is what ``tests/multihost/test_fault_campaign.py`` runs in the default suite.
The workers' zygotes preload torch (``zygote_preload``): replacements are forks.
Leftovers are counted against a baseline taken after a warm-up (the traffic
without training, a killed proc, an unhandled failure, a printed line: what
the client makes once per session) and named: thread names, ``ss`` lines of
leftover sockets, leftover procs with their state and open files.
Output: a table on stdout; ``--json PATH`` writes the raw rows.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))
os.environ.setdefault("OMP_NUM_THREADS", "1")


import numpy as np  # noqa: E402

import danaus.actor  # noqa: E402
import danaus.config  # noqa: E402
from danaus import _netlab, _netlab_workers  # noqa: E402
from danaus.actor import (  # noqa: E402
    Actor,
    Channel,
    SupervisionError,
    attach_to_workers,
    current_rank,
    endpoint,
    this_host,
)
from danaus.supervisor import Supervisor  # noqa: E402

HOSTS = 4  # the workload's hosts; one more is the spare
PROCS_PER_HOST = 2
STATE_SIZE = "64m"
PRELOAD = "torch"  # what every proc of the lab starts with (zygote_preload)


@dataclass(frozen=True)
class Timing:
    """The liveness limit and how long each fault lasts (the full and the short form)."""

    interval: float  # heartbeat_interval
    limit: float  # heartbeat_timeout: the liveness limit
    stop_short: float
    stop_long: float
    cut_short: float
    cut_long: float
    loss_for: float
    latency_for: float
    disk_for: float
    settle: float  # how long to wait for full size after a fault ends
    call_bound: float  # a call not answered within this is hanging


FULL = Timing(0.5, 5.0, 3.0, 12.0, 2.0, 30.0, 20.0, 10.0, 10.0, 150.0, 120.0)
SHORT = Timing(0.5, 5.0, 2.0, 8.0, 1.0, 8.0, 5.0, 3.0, 4.0, 120.0, 90.0)

KINDS = (
    "kill_proc",
    "kill_host",
    "kill_two_hosts",
    "kill_during_restart",
    "stop_short",
    "stop_long",
    "partition_short",
    "partition_long",
    "loss_5pct",
    "latency_200ms",
    "disk_full",
)

DESCRIBE = {
    "kill_proc": "SIGKILL of one proc (a Calc proc and a training replica)",
    "kill_host": "SIGKILL of one host's worker and all its procs",
    "kill_two_hosts": "SIGKILL of two hosts at once",
    "kill_during_restart": "SIGKILL of a proc, and of another 20 ms later (restart under way)",
    "stop_short": "SIGSTOP of a host's processes, shorter than the liveness limit",
    "stop_long": "SIGSTOP of a host's processes, longer than the liveness limit",
    "partition_short": "network partition of one host (link down), short",
    "partition_long": "network partition of one host, longer than the liveness limit",
    "loss_5pct": "5% packet loss on one host's link",
    "latency_200ms": "200 ms latency spike on one host's link",
    "disk_full": "the disk under one host's job state and logs fills up",
}


# -- the workload's actors -----------------------------------------------------------


def answer(x: int, rank: int) -> int:
    """What rank ``rank`` must answer to ``x``."""
    return (x * 7919 + rank * 104729) % 1_000_003


class Calc(Actor):
    """Answers known functions of its argument; takes and sends numbered streams."""

    def __init__(self) -> None:
        self.calls = 0
        self.rank = current_rank().rank

    @endpoint
    def answer(self, x: int) -> tuple[int, int]:
        self.calls += 1
        if self.calls % 2000 == 0:
            print(f"calc rank {self.rank}: {self.calls} calls", flush=True)  # log traffic
        return self.rank, answer(x, self.rank)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def say(self, line: str) -> None:
        print(line, flush=True)

    @endpoint
    def stream(self, port: Any, start: int, n: int) -> int:
        """Send ``(rank, seq)`` for seq in start..start+n-1 through ``port``, in order."""
        for seq in range(start, start + n):
            port.send((self.rank, seq))
        return start + n

    @endpoint
    def rdma_source(self, n: int, seed: int) -> Any:
        from danaus.rdma import RDMABuffer

        self._buf = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
        return RDMABuffer(self._buf)

    @endpoint
    def rdma_read(self, buf: Any, seed: int) -> bool:
        """Read ``buf`` (made by ``rdma_source(n, seed)``) and check every byte."""
        dst = np.empty(buf.size(), dtype=np.uint8)
        buf.read_into(dst, timeout=30).get(timeout=30)
        want = np.random.default_rng(seed).integers(0, 256, buf.size(), dtype=np.uint8)
        return bool(np.array_equal(dst, want))


# -- the lab -------------------------------------------------------------------------


class Lab:
    """5 hosts with a worker each; workers a fault killed are started again."""

    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.secret = secrets.token_hex(32)
        self.settings = {
            "DANAUS_HEARTBEAT_INTERVAL": str(timing.interval),
            "DANAUS_HEARTBEAT_TIMEOUT": str(timing.limit),
            # Each worker's zygote imports torch once: a replacement replica is a fork
            # with torch loaded, not a process importing it (seconds, under load tens).
            "DANAUS_ZYGOTE_PRELOAD": PRELOAD,
        }
        self.net = _netlab.Network.make()
        self.workers: list[_netlab_workers.Worker] = []
        try:
            self.hosts = [self.net.add_host() for _ in range(HOSTS + 1)]
            # All at once: each worker's start (its imports) waits for no other's.
            self.workers = _netlab_workers.start_workers(
                self.hosts, self.secret, self.settings, state_size=STATE_SIZE
            )
        except BaseException:
            self.close()
            raise

    def _start(self, host: _netlab.Host) -> _netlab_workers.Worker:
        return _netlab_workers.start_worker(host, self.secret, self.settings, state_size=STATE_SIZE)

    def mend(self) -> None:
        """Every link up and clean, every disk free, a live worker on every host."""
        for i, host in enumerate(self.hosts):
            host.heal()
            if host.link.loss_pct:
                host.set_link(loss_pct=0.0)
            w = self.workers[i]
            for pid in _netlab_workers.host_pids(host):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            if w.proc.poll() is None:
                _netlab_workers.free_state(w)
            else:
                _netlab_workers.reap(w)
                self.workers[i] = self._start(host)

    def attach(self, indices: list[int]) -> Any:
        hm = attach_to_workers(
            workers=[self.workers[i].address for i in indices], secret=self.secret
        )
        hm.initialized.get(timeout=60)
        return hm

    def stray_pids(self) -> list[int]:
        """Processes in the lab's namespaces other than the workers and their zygotes."""
        keep: set[int] = set()
        for w in self.workers:
            if w.proc.poll() is None:
                keep.add(w.proc.pid)
                keep.update(_children(w.proc.pid))
        out = []
        for host in self.hosts:
            out += [p for p in _netlab_workers.host_pids(host) if p not in keep]
        return out

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                _netlab_workers.reap(w)
        self.net.destroy()


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _count(pid: int | str, what: str) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/{what}"))
    except OSError:
        return 0


def _rss_kib(pid: int | str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def wait_for(check: Callable[[], Any], timeout: float, step: float = 0.2) -> Any:
    """Poll ``check`` until it returns something true or ``timeout`` passes; its last value."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > end:
            return value
        time.sleep(step)


# -- the workload ----------------------------------------------------------------------


@dataclass
class Counters:
    """What the traffic saw; a fault's record holds the change during its window."""

    calls: int = 0
    calls_failed: int = 0  # SupervisionError: a rank lost to the fault (not wrong, not hanging)
    wrong: int = 0
    hanging: int = 0
    stream_msgs: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    rdma: int = 0
    rdma_bad: int = 0
    spawns: int = 0
    spawn_refused: int = 0
    errors: int = 0

    def minus(self, other: Counters) -> Counters:
        return Counters(**{k: v - getattr(other, k) for k, v in asdict(self).items()})


class Workload:
    """Calls with known answers, training, and (``mixed``) streams through ports, RDMA
    transfers and spawns and stops of meshes; each loop in a thread of its own."""

    def __init__(self, lab: Lab, mixed: bool, rng: random.Random, elastic: bool = True) -> None:
        """``elastic=False`` (the warm-up): no training, a proc on this host instead (where
        the elastic coordinator would run)."""
        from elastic_ddp import Trainer

        from danaus.elastic import ElasticMesh

        self.lab, self.rng = lab, rng
        self.c = Counters()
        self.notes: list[str] = []
        self.train_errors: list[str] = []
        self.stop_flag = threading.Event()
        self.hosts = lab.attach(list(range(HOSTS)))
        self.spare = lab.attach([HOSTS])
        self.procs = self.hosts.spawn_procs(per_host={"gpus": PROCS_PER_HOST})
        self.sup = Supervisor(
            "one_for_one", max_restarts=200, period=60.0, spare_hosts=self.spare,
            name="campaign",
        )  # fmt: skip
        self.calc: Any = self.sup.spawn(self.procs, "calc", Calc)
        self.calc.pid.call().get(timeout=120)
        self.mesh: Any = None
        self.local: Any = None
        if elastic:
            self.mesh = ElasticMesh(
                Trainer, replicas=HOSTS, spares=1, hosts=self.hosts, timeout=60.0
            )
            self.mesh.add_hosts(self.spare)  # replacements may go to the spare host
        else:
            self.local = this_host().spawn_procs(per_host={"procs": 1})
            self.local.spawn("local", Calc).pid.call_one().get(timeout=120)
        self.worlds: list[tuple[float, int]] = []
        self.lock = threading.Lock()
        # Where new meshes go, by host: a host the client lost is attached again when back.
        self.meshes: dict[int, Any] = {h: self.hosts.slice(hosts=h) for h in range(HOSTS)}
        self.rejoined: list[Any] = []
        loops: list[Callable[[], None]] = [self._calls]
        if elastic:
            loops.append(self._train)
        if mixed:
            loops += [self._streams, self._rdma, self._spawns]
        self.threads = [
            threading.Thread(target=self._loop, args=(f,), daemon=True, name=f.__name__)
            for f in loops
        ]
        for t in self.threads:
            t.start()

    def _loop(self, body: Callable[[], None]) -> None:
        while not self.stop_flag.is_set():
            try:
                body()
            except SupervisionError:
                self.c.calls_failed += 1
                time.sleep(0.2)  # a rank lost to a fault: its restart is under way
            except TimeoutError:
                self.c.hanging += 1
                self.notes.append(f"{body.__name__}: a call hung")
            except _Stop:
                return
            except Exception as e:
                self.c.errors += 1
                self.notes.append(f"{body.__name__}: {e!r:.300}")
                time.sleep(0.5)

    def _calls(self) -> None:
        x = self.rng.randrange(1 << 40)
        got = self.calc.answer.call(x).get(timeout=self.lab.timing.call_bound)
        self.c.calls += 1
        values = list(got.values())
        ranks = [r for r, _ in values]
        if ranks != list(range(HOSTS * PROCS_PER_HOST)) or any(
            v != answer(x, r) for r, v in values
        ):
            self.c.wrong += 1
            self.notes.append(f"wrong answer to {x}: {values}")
        time.sleep(0.01)

    def _train(self) -> None:
        k = len(self.worlds)
        try:
            world, _ = self.mesh.step(k)
        except Exception as e:  # training must never fail because of a fault
            self.train_errors.append(f"step {k}: {e!r:.300}")
            raise _Stop from e
        with self.lock:
            self.worlds.append((time.time(), world))

    def _streams(self) -> None:
        """Each rank sends 100 numbered messages through one port: checked in order."""
        port, receiver = Channel.open()
        n, start = 100, self.rng.randrange(1_000_000)
        done = self.calc.stream.call(port, start, n)
        bound = self.lab.timing.call_bound
        try:
            done.get(timeout=bound)
        except SupervisionError:  # a rank lost while sending: what came is not checked
            self.c.calls_failed += 1
            time.sleep(0.2)  # its restart is under way
            return
        got: dict[int, list[int]] = {}
        for _ in range(n * HOSTS * PROCS_PER_HOST):
            try:
                rank, seq = receiver.recv().get(timeout=bound)
            except TimeoutError:
                break  # the rest counts as lost
            got.setdefault(rank, []).append(seq)
        with contextlib.suppress(TimeoutError):  # nothing more may come
            extra = receiver.recv().get(timeout=0.2)
            self.c.duplicated += 1
            self.notes.append(f"stream: an extra message {extra}")
        want = set(range(start, start + n))
        for rank in range(HOSTS * PROCS_PER_HOST):
            seqs = got.get(rank, [])
            self.c.lost += len(want - set(seqs))
            self.c.duplicated += len(seqs) - len(set(seqs))
            self.c.reordered += sum(1 for a, b in itertools.pairwise(seqs) if b < a)
            self.c.stream_msgs += len(seqs)

    def _rdma(self) -> None:
        """A 1 MiB buffer of one rank read by a rank of another host, every byte checked."""
        a, b = self.rng.sample(range(HOSTS), 2)
        seed = self.rng.randrange(1 << 30)
        src = self.calc.slice(hosts=a, gpus=0)
        dst = self.calc.slice(hosts=b, gpus=1)
        bound = self.lab.timing.call_bound
        buf = src.rdma_source.call_one(1 << 20, seed).get(timeout=bound)
        try:
            ok = dst.rdma_read.call_one(buf, seed).get(timeout=bound)
        finally:
            # A registration holds its memory until drop() (as Monarch's): without it
            # each source rank kept every 1 MiB it ever lent (1.5 GiB in 30 minutes).
            buf.drop().get(timeout=bound)  # harmless once its owner is gone
        self.c.rdma += 1
        if not ok:
            self.c.rdma_bad += 1
            self.notes.append("rdma: bytes differ")
        time.sleep(0.2)

    def _spawns(self) -> None:
        """A mesh spawned on a host, called with a known answer and stopped."""
        h = self.rng.randrange(HOSTS)
        bound = self.lab.timing.call_bound
        pm = self.host_mesh(h).spawn_procs(per_host={"gpus": 1})
        try:
            probe: Any = pm.spawn("spawned", Calc)
            x = self.rng.randrange(1000)
            if probe.answer.call_one(x).get(timeout=bound) != (0, answer(x, 0)):
                self.c.wrong += 1
            self.c.spawns += 1
        except SupervisionError:
            self.c.spawn_refused += 1  # its host is down just now
        finally:
            try:
                pm.stop().get(timeout=bound)
            except TimeoutError:
                self.c.hanging += 1
                self.notes.append("spawns: a stop hung")
            except Exception:
                pass  # a proc lost to a fault is stopped already
        time.sleep(1.0)

    def host_mesh(self, h: int) -> Any:
        with self.lock:
            return self.meshes[h]

    def rejoin(self, h: int) -> None:
        """Host ``h``, lost and back, is attached again: new meshes may go there, the
        supervisor and the elastic mesh take it as a spare; nothing old resumes."""
        hm = self.lab.attach([h])
        with self.lock:
            self.meshes[h] = hm
            self.rejoined.append(hm)
        self.sup.spare_hosts = self.lab.attach([HOSTS, h])  # the spare host first
        self.rejoined.append(self.sup.spare_hosts)
        self.mesh.add_hosts(hm)

    def steps(self) -> int:
        with self.lock:
            return len(self.worlds)

    def calc_pids(self) -> list[int]:
        return list(self.calc.pid.call().get(timeout=self.lab.timing.call_bound).values())

    def at_full_size(self) -> bool:
        """Every rank answers, 4 members train, every loss so far was followed by full size."""
        stats = self.mesh.stats()
        if not (stats.recovered and self.worlds and self.worlds[-1][1] == HOSTS):
            return False
        try:
            n = len(self.calc.answer.call(0).get(timeout=self.lab.timing.call_bound))
        except SupervisionError:  # sent before the supervisor saw the failure
            return False
        return n == HOSTS * PROCS_PER_HOST

    def close(self) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=self.lab.timing.call_bound + 90)
            if t.is_alive():
                self.c.hanging += 1
                self.notes.append(f"{t.name} did not end")
        if self.mesh is not None:
            try:
                digests = self.mesh.call("digest")
                if len(set(digests)) != 1:
                    self.c.wrong += 1
                    self.notes.append("replicas differ")
            except Exception as e:
                self.train_errors.append(f"digest: {e!r:.300}")
            with contextlib.suppress(Exception):
                self.mesh.stop()
        if self.local is not None:
            with contextlib.suppress(Exception):
                self.local.stop().get(timeout=60)
        with contextlib.suppress(Exception):
            self.sup.stop()
        for hm in (self.hosts, self.spare, *self.rejoined):
            with contextlib.suppress(Exception):
                hm.stop().get(timeout=60)


class _Stop(Exception):
    pass


# -- the faults ----------------------------------------------------------------------


class Faults:
    """Each kind: inject, wait for its end; returns a line of what it did."""

    def __init__(self, lab: Lab, work: Workload, rng: random.Random) -> None:
        self.lab, self.work, self.rng, self.t = lab, work, rng, lab.timing
        self.hosts: list[int] = []  # the hosts hit
        self.victims: list[int] = []  # the procs running there when it was hit
        self.calc_hit = 0  # of them, calc ranks
        self.replicas_hit = 0  # and training members

    def _hit(self, h: int) -> None:
        keep = {self.lab.workers[h].proc.pid, *_children(self.lab.workers[h].proc.pid)}
        self.hosts.append(h)
        here = [p for p in _netlab_workers.host_pids(self.lab.hosts[h]) if p not in keep]
        self.victims += here
        # Which workloads the fault hits: what must then be restarted or replaced.
        with contextlib.suppress(Exception):
            self.calc_hit += len(set(here) & set(self.work.calc_pids()))
        with contextlib.suppress(Exception):
            self.replicas_hit += len(set(here) & {p for _, p in self.work.mesh.members()})

    def _busy_hosts(self) -> list[int]:
        """Hosts where both a rank and a replica run now, so a fault there is a fault to
        both: the workload's hosts first, else the spare host (restarts and
        replacements move there); else those with a replica; else all of them."""
        with contextlib.suppress(Exception):
            calc = {self._host_of(p) for p in self.work.calc_pids()}
            train = {self._host_of(p) for _, p in self.work.mesh.members()}
            for group in (range(HOSTS), range(HOSTS + 1)):
                busy = [h for h in group if h in calc and h in train]
                if busy:
                    return busy
            if train - {-1}:
                return sorted(train - {-1})
        return list(range(HOSTS))

    def member_hosts(self) -> list[int]:
        """The host of each training member, in rank order (-1: not found)."""
        with contextlib.suppress(Exception):
            return [self._host_of(p) for _, p in self.work.mesh.members()]
        return []

    def _host_of(self, pid: int) -> int:
        try:
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            return -1
        return next((i for i, h in enumerate(self.lab.hosts) if h.netns_inode == inode), -1)

    def _victim_host(self) -> int:
        busy = self._busy_hosts()
        # Not a host that holds every replica: losing every copy of the model's state
        # is a loss no elastic mesh survives (it needs a checkpoint).
        with contextlib.suppress(Exception):
            homes = {self._host_of(p) for _, p in self.work.mesh.members()}
            if len(homes) == 1:
                busy = [h for h in busy if h not in homes] or busy
        h = self.rng.choice(busy)
        self._hit(h)
        return h

    def none(self) -> str:
        return "no fault"

    def kill_proc(self) -> str:
        calc = self.rng.choice(self.work.calc_pids())
        member = self.rng.choice(self.work.mesh.members())[1]
        self.calc_hit, self.replicas_hit = 1, 1
        os.kill(calc, signal.SIGKILL)
        os.kill(member, signal.SIGKILL)
        return f"killed calc pid {calc} and replica pid {member}"

    def kill_during_restart(self) -> str:
        calcs = self.rng.sample(self.work.calc_pids(), 2)
        pids = [pid for _, pid in self.work.mesh.members()]
        if len(pids) < 2:
            raise NotRunnable(f"the training has {len(pids)} member(s) now, not 2 to kill")
        members = self.rng.sample(pids, 2)
        self.calc_hit, self.replicas_hit = 2, 2
        os.kill(calcs[0], signal.SIGKILL)
        os.kill(members[0], signal.SIGKILL)
        time.sleep(0.02)
        os.kill(calcs[1], signal.SIGKILL)
        os.kill(members[1], signal.SIGKILL)
        return f"killed calc {calcs} and replicas {members}, 20 ms apart"

    def kill_host(self) -> str:
        h = self._victim_host()
        self.lab.workers[h].kill()
        return f"killed host {h}'s worker and procs"

    def kill_two_hosts(self) -> str:
        busy = self._busy_hosts()
        pairs = [(a, b) for a in busy for b in busy if a < b]
        # Two hosts that do not hold every replica: losing every copy of the model's
        # state is a loss no elastic mesh survives (it needs a checkpoint).
        with contextlib.suppress(Exception):
            homes = [self._host_of(p) for _, p in self.work.mesh.members()]
            pairs = [(a, b) for a, b in pairs if any(h not in (a, b) for h in homes)] or pairs
        a, b = self.rng.choice(pairs) if pairs else self.rng.sample(range(HOSTS), 2)
        self._hit(a)
        self._hit(b)
        self.lab.workers[a].kill()
        self.lab.workers[b].kill()
        return f"killed hosts {a} and {b}"

    def _stop(self, seconds: float) -> str:
        h = self._victim_host()
        pids = _netlab_workers.host_pids(self.lab.hosts[h])  # the worker and zygote too
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return f"stopped host {h}'s {len(pids)} processes for {seconds} s"

    def stop_short(self) -> str:
        return self._stop(self.t.stop_short)

    def stop_long(self) -> str:
        return self._stop(self.t.stop_long)

    def _cut(self, seconds: float) -> str:
        h = self._victim_host()
        self.lab.hosts[h].partition()
        time.sleep(seconds)
        self.lab.hosts[h].heal()
        return f"host {h}'s link down for {seconds} s"

    def partition_short(self) -> str:
        return self._cut(self.t.cut_short)

    def partition_long(self) -> str:
        return self._cut(self.t.cut_long)

    def loss_5pct(self) -> str:
        h = self._victim_host()
        self.lab.hosts[h].set_link(loss_pct=5.0)
        time.sleep(self.t.loss_for)
        self.lab.hosts[h].set_link(loss_pct=0.0)
        return f"5% loss on host {h}'s link for {self.t.loss_for} s"

    def latency_200ms(self) -> str:
        h = self._victim_host()
        self.lab.hosts[h].set_link(delay_us=200_000)  # NetemUnavailable without netem
        time.sleep(self.t.latency_for)
        self.lab.hosts[h].set_link(delay_us=_netlab.DATACENTER.delay_us)
        return f"200 ms one way on host {h}'s link for {self.t.latency_for} s"

    def disk_full(self) -> str:
        h = self._victim_host()
        w = self.lab.workers[h]
        df = _netlab_workers.fill_state(w)
        # New procs on the full host, while it is full: they must start or fail, not hang.
        spawn = "spawn ok"
        try:
            pm = self.work.host_mesh(h).spawn_procs(per_host={"gpus": 1})
            probe: Any = pm.spawn("diskfull", Calc)
            if probe.answer.call_one(3).get(timeout=60) != (0, answer(3, 0)):
                self.work.c.wrong += 1
            pm.stop().get(timeout=60)
        except TimeoutError:
            self.work.c.hanging += 1
            spawn = "spawn hung"
        except Exception as e:
            spawn = f"spawn refused: {e!r:.120}"
        time.sleep(self.t.disk_for)
        _netlab_workers.free_state(w)
        return f"host {h}'s state tmpfs full ({df}) for {self.t.disk_for} s; {spawn}"


# -- the run: a workload, faults one at a time, the accounting --------------------------

#: Kinds after which the client has lost the host: it is attached again when back.
HOST_LOST = {"kill_host", "kill_two_hosts", "stop_long", "partition_long"}
#: Kinds that lose procs of both workloads (a calc rank and a training replica at least).
LOSES_PROCS = HOST_LOST | {"kill_proc", "kill_during_restart"}


@dataclass
class FaultRecord:
    kind: str
    n: int
    at_s: float  # since the run started
    detail: str = ""
    runnable: bool = True
    notice_calls_s: float | None = None  # the fault to the supervisor seeing it
    notice_train_s: float | None = None  # the fault to the coordinator seeing it
    recover_calls_s: float | None = None  # to the last rank restarted
    recover_train_s: float | None = None  # to a step committed at full size again
    full_size: bool = False  # everything back at full size before the next fault
    full_size_s: float | None = None  # the fault to that
    restarts: int = 0  # ranks restarted by the supervisor
    replicas_lost: int = 0
    steps_lost: int = 0
    victims: int = 0  # procs on the host(s) the client lost
    victims_left: int = 0  # of those, still running once the host was back
    calc_hit: int = 0  # calc ranks among the procs the fault hit
    replicas_hit: int = 0  # training members among them
    during: Counters = field(default_factory=Counters)
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    mode: str
    timing: dict[str, float]
    minutes: float = 0.0
    faults: list[FaultRecord] = field(default_factory=list)
    totals: Counters = field(default_factory=Counters)
    steps: int = 0
    steps_lost: int = 0
    train_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    slopes: dict[str, float] = field(default_factory=dict)
    left_procs: int = 0
    left_threads: int = 0
    left_fds: int = 0
    left_detail: str = ""
    client_faults: list[str] = field(default_factory=list)


class Baseline:
    """The client's threads and descriptors, and each live worker's: counts, and what
    each is (thread names, descriptor targets), so a leftover can be named."""

    def __init__(self, lab: Lab) -> None:
        self.client = _what("self")
        self.workers = {w.proc.pid: _what(w.proc.pid) for w in lab.workers if w.proc.poll() is None}

    def excess(self, lab: Lab) -> tuple[int, int, str]:
        now = _what("self")
        threads = len(now[0]) - len(self.client[0])
        fds = len(now[1]) - len(self.client[1])
        notes = []
        if threads > 0 or fds > 0:
            notes.append(
                f"client +{threads} threads +{fds} fds{_diff(self.client, now)}"
                f"{_sockets(self.client, now, None)}"
            )
        for w in lab.workers:
            was = self.workers.get(w.proc.pid)
            if was is None or w.proc.poll() is not None:
                continue
            cur = _what(w.proc.pid)
            dt, df = len(cur[0]) - len(was[0]), len(cur[1]) - len(was[1])
            if dt > 0 or df > 0:
                notes.append(
                    f"worker {w.host.index} +{dt} threads +{df} fds{_diff(was, cur)}"
                    f"{_sockets(was, cur, w.host)}"
                )
            threads += max(0, dt)
            fds += max(0, df)
        return max(0, threads), max(0, fds), "; ".join(notes)


def _what(pid: int | str) -> tuple[list[str], list[str]]:
    """The names of ``pid``'s threads and the targets of its descriptors."""
    names: list[str] = []
    targets: list[str] = []
    if pid == "self":  # this process: its threads by their Python names
        names = [t.name.rstrip("0123456789-") for t in threading.enumerate()]
        names += ["(not Python)"] * max(0, _count("self", "task") - len(names))
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task") if pid != "self" else ():
            with contextlib.suppress(OSError):
                names.append(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                # A worker's log of this client's job (logs/<job>/danaus.log) opens at
                # the job's first warning there (a fault may be the first) and is
                # closed when the worker takes its next job: the job's, not a leftover.
                if pid != "self" and target.endswith("/danaus.log") and "/logs/" in target:
                    continue
                targets.append(target)
    return names, targets


def _sockets(was: tuple[list[str], list[str]], now: tuple[list[str], list[str]], host: Any) -> str:
    """The sockets ``now`` has and ``was`` had not, as ``ss`` shows them (their peers)."""
    inodes = {t[len("socket:[") : -1] for t in now[1] if t.startswith("socket:[")}
    inodes -= {t[len("socket:[") : -1] for t in was[1] if t.startswith("socket:[")}
    if not inodes:
        return ""
    argv = ["ss", "-tanxe"] if host is None else host.exec_argv("ss", "-tanxe")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [
        " ".join(ln.split()[:6])
        for ln in out.splitlines()
        if any(f"ino:{i} " in ln + " " for i in inodes)
    ]
    return f" [{'; '.join(lines)}]" if lines else f" [sockets {sorted(inodes)} not in ss]"


def _diff(was: tuple[list[str], list[str]], now: tuple[list[str], list[str]]) -> str:
    """What ``now`` has more of than ``was``: thread names, descriptor kinds."""

    def kind(t: str) -> str:
        return t.split(":", 1)[0] if ":[" in t else t

    more = []
    for a, b in ((was[0], now[0]), ([kind(t) for t in was[1]], [kind(t) for t in now[1]])):
        c = collections.Counter(b)
        c.subtract(collections.Counter(a))
        more += [f"{k} x{n}" for k, n in c.items() if n > 0]
    return f" ({', '.join(more)})" if more else ""


class NotRunnable(Exception):
    """A fault that cannot be injected in the workload's present state."""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def inject(lab: Lab, w: Workload, kind: str, n: int, t0: float, rng: random.Random) -> FaultRecord:
    """One fault, then wait for full size; what it cost."""
    rec = FaultRecord(kind, n, time.monotonic() - t0)
    before = Counters(**asdict(w.c))
    stats0 = w.mesh.stats()
    restarts0 = len(w.sup.restarts)
    faults = Faults(lab, w, rng)
    injected_at = time.time()
    try:
        homes = faults.member_hosts()  # before: where the copies of the state were
        rec.detail = getattr(faults, kind)() + f" (training members on hosts {homes})"
    except (_netlab.NetemUnavailable, NotRunnable) as e:
        rec.runnable, rec.detail = False, str(e)
        return rec
    rec.victims = len(faults.victims)
    rec.calc_hit, rec.replicas_hit = faults.calc_hit, faults.replicas_hit
    _revive(lab)
    if kind in HOST_LOST:
        # Cut off or frozen longer than the liveness limit: the worker stops the procs
        # it ran for this client (fenced) once it judges the client lost.
        fence = 2 * lab.timing.limit + 10
        wait_for(lambda: not any(_alive(p) for p in faults.victims), fence)
        rec.victims_left = sum(_alive(p) for p in faults.victims)
        for h in faults.hosts:  # the host comes back as a spare, never with old actors
            with contextlib.suppress(Exception):
                w.rejoin(h)
    if kind in LOSES_PROCS:
        # Full size counts once the loss was seen: before, it is still the old size.
        def seen() -> bool:  # by each workload the fault hit
            calc = not faults.calc_hit or len(w.sup.restarts) > restarts0
            return calc and (not faults.replicas_hit or w.mesh.stats().lost > stats0.lost)

        if not wait_for(seen, 3 * lab.timing.limit + 10):
            rec.notes.append("the loss was not seen by both the supervisor and the mesh")
    try:
        rec.full_size = bool(wait_for(w.at_full_size, lab.timing.settle, step=0.5))
    except Exception as e:
        rec.notes.append(f"full size not reached: {e!r:.200}")
    if rec.full_size:
        rec.full_size_s = time.time() - injected_at
    else:
        with contextlib.suppress(Exception):
            st = w.mesh.stats()
            rec.notes.append(
                f"at the settle deadline: training world {w.worlds[-1][1] if w.worlds else 0}, "
                f"members {w.mesh.members()}, spares {st.spares}, lost {st.lost}, restarts "
                f"{st.restarts}, recoveries {st.recoveries}"
            )
    restarts = w.sup.restarts[restarts0:]
    rec.restarts = sum(len(r.ranks) for r in restarts)
    if restarts:
        rec.notice_calls_s = min(r.failed_at for r in restarts) - injected_at
        rec.recover_calls_s = max(r.time for r in restarts) - injected_at
    stats = w.mesh.stats()
    new = stats.recoveries[len(stats0.recoveries) :]
    rec.replicas_lost = stats.lost - stats0.lost
    rec.steps_lost = stats.lost_steps - stats0.lost_steps
    if new:
        rec.notice_train_s = min(lost for lost, _ in new) - injected_at
        fulls = [full for _, full in new]
        if all(f is not None for f in fulls):
            rec.recover_train_s = max(f for f in fulls if f is not None) - injected_at
    rec.during = w.c.minus(before)
    rec.notes += w.notes
    w.notes.clear()
    return rec


def run(
    mode: str,
    timing: Timing,
    schedule: list[str] | None,
    minutes: float,
    every: float,
    seed: int,
    save: Callable[[Report], None],
    each_kind: bool = False,
    soak_kinds: list[str] | None = None,
    mixed: bool | None = None,
) -> Report:
    """``schedule``: the faults, in order, each once full size is back (the campaign);
    ``None``: the kinds in turn, one every ``every`` s (and once full size is back) for
    ``minutes`` (the soak), and on until each kind ran once if ``each_kind``."""
    rng = random.Random(seed)
    report = Report(mode, asdict(timing))
    if mixed is None:
        mixed = mode == "soak"
    kinds = list(soak_kinds or SOAK_FAULTS)
    started = time.monotonic()
    with client(timing) as client_faults:
        lab = Lab(timing)
        try:
            # Once before counting: the client's threads and pools are made on first use.
            print(f"lab up in {time.monotonic() - started:.0f} s", flush=True)
            # The traffic without training (fast to start): what it makes once in the
            # client lasts the session (connections, the local host agent, pools).
            warm = Workload(lab, mixed, rng, elastic=False)
            wait_for(lambda: warm.c.calls >= 2, 300)
            # A fault too: what the client makes at its first failure (its log file and
            # the thread that writes it) lasts the session.
            os.kill(rng.choice(warm.calc_pids()), signal.SIGKILL)
            wait_for(lambda: warm.sup.restarts and warm.c.calls_failed + warm.c.calls > 4, 60)
            # And what it makes at the first failure nobody handles (the hook's thread)
            # and at the first line a proc prints (the thread that prints it here).
            pm = warm.hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1})
            probe: Any = pm.spawn("warmup", Calc)
            probe.say.call_one("warm-up").get(timeout=lab.timing.call_bound)
            os.kill(probe.pid.call_one().get(timeout=lab.timing.call_bound), signal.SIGKILL)
            wait_for(lambda: client_faults and _thread_named("danaus-logs"), 60)
            client_faults.clear()
            with contextlib.suppress(Exception):
                pm.stop().get(timeout=lab.timing.call_bound)
            warm.close()
            wait_for(lambda: not lab.stray_pids(), 60)
            base = Baseline(lab)
            w = Workload(lab, mixed, rng)
            wait_for(lambda: w.steps() >= 2 and w.c.calls >= 2, 300)
            t0 = time.monotonic()
            print(f"workload up in {t0 - started:.0f} s", flush=True)
            next_sample = t0
            last_fault = t0
            n = 0
            while True:
                if schedule is not None:
                    if n >= len(schedule):
                        break
                    kind = schedule[n]
                    time.sleep(rng.uniform(1.0, 3.0))  # a random moment of the traffic
                else:

                    def over(n: int = n) -> bool:
                        more = each_kind and n < len(kinds)
                        return time.monotonic() - t0 >= minutes * 60 and not more

                    if over():
                        break
                    kind = kinds[n % len(kinds)]
                    while time.monotonic() < last_fault + every:
                        if time.monotonic() >= next_sample:
                            report.samples.append(_sample(lab))
                            next_sample += 60.0
                        time.sleep(0.2)
                    if over():
                        break
                last_fault = time.monotonic()
                rec = inject(lab, w, kind, n, t0, rng)
                report.faults.append(rec)
                n += 1
                print(f"{rec.at_s:6.0f}s {kind}: {_brief(rec)}", flush=True)
                if time.monotonic() >= next_sample and schedule is None:
                    report.samples.append(_sample(lab))
                    next_sample += 60.0
                save(report)
            report.minutes = (time.monotonic() - t0) / 60
            if schedule is None:
                report.samples.append(_sample(lab))
            w.close()
            report.totals = w.c
            report.train_errors = w.train_errors
            report.notes = w.notes
            report.steps = len(w.worlds)
            with contextlib.suppress(Exception):
                report.steps_lost = w.mesh.stats().lost_steps
            lab.mend()
            # What is left once the meshes are stopped: nothing.
            wait_for(lambda: not lab.stray_pids(), 60)
            strays = lab.stray_pids()
            report.left_procs = len(strays)
            if strays:
                report.left_detail = "procs " + ", ".join(_describe(p) for p in strays[:6])

            def settled() -> bool:
                t, f, _ = base.excess(lab)
                return t == 0 and f == 0

            wait_for(settled, 30, step=0.5)
            report.left_threads, report.left_fds, note = base.excess(lab)
            if note:
                report.left_detail = "; ".join(filter(None, [report.left_detail, note]))
        finally:
            lab.close()
        report.client_faults = [str(f)[:300] for f in client_faults]
    after = min(5.0, report.minutes / 3)
    for key in SAMPLED:
        report.slopes[key] = _slope_per_min(report.samples, key, after)
    save(report)
    return report


def _thread_named(name: str) -> bool:
    return any(t.name == name for t in threading.enumerate())


def _describe(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        ppid = next(x.split()[1] for x in status.splitlines() if x.startswith("PPid:"))
        state = next(x.split()[1] for x in status.splitlines() if x.startswith("State:"))
    except (OSError, StopIteration):
        return f"{pid} (gone)"
    wchan = ""
    with contextlib.suppress(OSError):
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    files = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
                if not t.startswith(("socket:", "pipe:", "anon_inode:", "/dev/")):
                    files.add(t)
    return (
        f"{pid} (ppid {ppid}, state {state}, {_count(pid, 'task')} threads, wchan {wchan}, "
        f"files {sorted(files)[:4]})"
    )


@contextlib.contextmanager
def client(timing: Timing) -> Iterator[list[Any]]:
    """This process as a client with the lab's liveness limit; failures recorded."""
    faults: list[Any] = []
    old = danaus.actor.unhandled_fault_hook
    danaus.actor.unhandled_fault_hook = faults.append
    try:
        with danaus.config.configured(
            heartbeat_interval=timing.interval,
            heartbeat_timeout=timing.limit,
            zygote_preload=PRELOAD,
        ):
            yield faults
    finally:
        danaus.actor.unhandled_fault_hook = old


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _brief(r: FaultRecord) -> str:
    if not r.runnable:
        return f"not runnable: {r.detail}"
    d = r.during
    return (
        f"notice {_s(r.notice_calls_s)}/{_s(r.notice_train_s)} s, recover "
        f"{_s(r.recover_calls_s)}/{_s(r.recover_train_s)} s, full size "
        f"{_s(r.full_size_s) if r.full_size else 'NOT REACHED'}, restarts {r.restarts}, "
        f"replicas lost {r.replicas_lost}, steps lost {r.steps_lost}, calls {d.calls} "
        f"(failed {d.calls_failed}), wrong {d.wrong}, hanging {d.hanging}, stream lost/dup/"
        f"reord {d.lost}/{d.duplicated}/{d.reordered}, victims left {r.victims_left}/"
        f"{r.victims}; {r.detail}; {' | '.join(r.notes)[:600]}"
    )


def table(records: list[FaultRecord]) -> str:
    """The per-kind summary (medians over the injections; counts summed)."""

    def med(vals: list[float | None]) -> str:
        xs = [v for v in vals if v is not None]
        return "-" if not xs else f"{statistics.median(xs):.2f}"

    lines = [
        "| fault | runs | notice s (calls / training) | full size again s (calls / training) "
        "| steps lost | wrong | hanging | old procs left |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in dict.fromkeys(r.kind for r in records):
        rs = [r for r in records if r.kind == kind]
        if not all(r.runnable for r in rs):
            lines.append(f"| {DESCRIBE[kind]} | not runnable here: {rs[0].detail} |||||||")
            continue
        short = sum(not r.full_size for r in rs)
        lines.append(
            f"| {DESCRIBE[kind]} | {len(rs)} "
            f"| {med([r.notice_calls_s for r in rs])} / {med([r.notice_train_s for r in rs])} "
            f"| {med([r.recover_calls_s for r in rs])} / {med([r.recover_train_s for r in rs])}"
            f"{f' ({short} not back)' if short else ''} "
            f"| {sum(r.steps_lost for r in rs)} | {sum(r.during.wrong for r in rs)} "
            f"| {sum(r.during.hanging for r in rs)} "
            f"| {sum(r.victims_left for r in rs)} of {sum(r.victims for r in rs)} |"
        )
    return "\n".join(lines)


def render(raw: dict[str, Any]) -> str:
    """A saved report (``--json``) as markdown: the table, each fault, what was left."""
    records = []
    for f in raw["faults"]:
        f = dict(f)
        f["during"] = Counters(**f["during"])
        records.append(FaultRecord(**f))
    out = [table(records), ""]
    for rec in records:
        out.append(f"- `{rec.at_s:5.0f} s` **{rec.kind}**: {_brief(rec)}")
    t = raw["totals"]
    out += [
        "",
        f"Run: {raw['minutes']:.1f} min, {raw['steps']} training steps (lost {raw['steps_lost']}), "
        f"{t['calls']} calls ({t['calls_failed']} failed with SupervisionError, {t['wrong']} "
        f"wrong, {t['hanging']} hanging), {t['stream_msgs']} stream messages (lost "
        f"{t['lost']}, duplicated {t['duplicated']}, reordered {t['reordered']}), {t['rdma']} "
        f"RDMA reads ({t['rdma_bad']} bad), {t['spawns']} spawns ({t['spawn_refused']} "
        f"refused), {t['errors']} other errors; training errors: {raw['train_errors'] or 'none'}.",
        f"Left behind: {raw['left_procs']} procs, {raw['left_threads']} threads, "
        f"{raw['left_fds']} fds {raw['left_detail']}; failures that reached the client: "
        f"{len(raw['client_faults'])}.",
    ]
    if raw["samples"]:
        out.append(
            "Slopes per minute after minute 5: "
            + ", ".join(f"{k} {v:+.2f}" for k, v in raw["slopes"].items())
            + " (RSS in KiB)."
        )
        first, last = raw["samples"][0], raw["samples"][-1]
        out.append(
            "First and last sample: "
            + ", ".join(f"{k} {first[k]} -> {last[k]}" for k in SAMPLED)
            + f"; {len(raw['samples'])} samples."
        )
    return "\n".join(out)


# -- sampling ------------------------------------------------------------------------

SAMPLED = (
    "client_rss", "client_threads", "client_fds",
    "workers_rss", "workers_threads", "workers_fds",
)  # fmt: skip


def _sample(lab: Lab) -> dict[str, Any]:
    """RSS (KiB), threads and fds of the client and the workers, and of every proc."""
    workers = [w.proc.pid for w in lab.workers if w.proc.poll() is None]
    procs = lab.stray_pids()  # every proc of the lab's hosts but the workers and zygotes
    return {
        "t": time.time(),
        "client_rss": _rss_kib("self"),
        "client_threads": _count("self", "task"),
        "client_fds": _count("self", "fd"),
        "workers_rss": sum(_rss_kib(p) for p in workers),
        "workers_threads": sum(_count(p, "task") for p in workers),
        "workers_fds": sum(_count(p, "fd") for p in workers),
        "procs": {str(p): [_rss_kib(p), _count(p, "task"), _count(p, "fd")] for p in procs},
    }


def _slope_per_min(samples: list[dict[str, Any]], key: str, after_min: float) -> float:
    """Least-squares slope of ``key`` per minute over the samples after ``after_min``."""
    if not samples:
        return 0.0
    t0 = samples[0]["t"]
    pts = [((s["t"] - t0) / 60, s[key]) for s in samples if (s["t"] - t0) / 60 >= after_min]
    if len(pts) < 2:
        return 0.0
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in pts) / den


SOAK_FAULTS = (
    "kill_proc",
    "stop_short",
    "partition_short",
    "kill_host",
    "loss_5pct",
    "kill_during_restart",
    "disk_full",
    "stop_long",
    "partition_long",
    "kill_two_hosts",
    "latency_200ms",
)


def _revive(lab: Lab) -> None:
    """A worker a fault killed is started again on its host."""
    for i, host in enumerate(lab.hosts):
        if lab.workers[i].proc.poll() is not None:
            _netlab_workers.reap(lab.workers[i])
            lab.workers[i] = lab._start(host)


# -- the command -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("campaign", help="each fault kind, --reps times, one at a time")
    c.add_argument("--reps", type=int, default=3)
    c.add_argument("--kinds", default=",".join(KINDS))
    c.add_argument(
        "--mixed", action="store_true",
        help="the soak's traffic too (streams, RDMA, spawns), not only calls and training",
    )  # fmt: skip
    s = sub.add_parser("soak", help="mixed traffic with a fault every 30 s")
    s.add_argument("--minutes", type=float, default=30.0)
    s.add_argument("--every", type=float, default=30.0, help="seconds between faults")
    s.add_argument("--each-kind", action="store_true", help="go on until each kind ran once")
    s.add_argument("--kinds", default=",".join(SOAK_FAULTS), help="the faults, in turn")
    for p in (c, s):
        p.add_argument("--short", action="store_true", help="the test suite's form")
        p.add_argument("--seed", type=int, default=44)
        p.add_argument("--json", help="write the raw results here")
    r = sub.add_parser("render", help="the table and each fault of a --json file")
    r.add_argument("file")
    args = parser.parse_args(argv)
    if args.cmd == "render":
        print(render(json.loads(Path(args.file).read_text())))
        return 0
    timing = SHORT if args.short else FULL

    def save(report: Report) -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(asdict(report), indent=1))

    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; the kinds are {', '.join(KINDS)}")
    if args.cmd == "campaign":
        schedule = [k for k in kinds for _ in range(args.reps)]
        report = run(
            "campaign", timing, schedule, 0.0, 0.0, args.seed, save, mixed=args.mixed
        )  # fmt: skip
    else:
        report = run(
            "soak", timing, None, args.minutes, args.every, args.seed, save, args.each_kind,
            kinds,
        )  # fmt: skip
    print(table(report.faults))
    summary = {k: v for k, v in asdict(report).items() if k not in ("faults", "samples")}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
