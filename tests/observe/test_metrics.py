"""Built-in metrics: per endpoint (calls, errors, latency) and per connection (bytes, frames)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import danaus
from danaus._runtime.messaging.metrics import BOUNDS, EndpointStats, percentile
from danaus._runtime.node import this_node
from danaus.actor import ActorError, ProcMesh, this_host
from danaus.testing import FaultRecorder, client_env

from .conftest import REPLY_TIMEOUT, Worker


def test_a_histogram_puts_each_latency_in_its_fixed_bucket_and_reads_percentiles_back() -> None:
    st = EndpointStats()
    for _ in range(90):
        st.record(100e-6, True)
    for _ in range(10):
        st.record(10e-3, False)
    snap = st.snapshot()
    assert (snap["calls"], snap["errors"]) == (100, 10)
    p50, p99 = percentile(snap["buckets"], 50), percentile(snap["buckets"], 99)
    assert p50 is not None and p99 is not None
    # Within one bucket (about 33 % wide) of the true values.
    assert 100e-6 / 1.34 <= p50 <= 100e-6 * 1.34
    assert 10e-3 / 1.34 <= p99 <= 10e-3 * 1.34
    assert percentile({}, 50) is None
    st.record(1e6, True)  # slower than the last bound: the overflow bucket
    assert st.counts[len(BOUNDS)] == 1


def test_endpoint_metrics_count_calls_errors_and_latency_per_actor(procs: ProcMesh) -> None:
    mesh = procs.spawn("metered", Worker)
    for i in range(20):
        mesh.ping.call(i).get(timeout=REPLY_TIMEOUT)
    for _ in range(3):
        with pytest.raises(ActorError):
            mesh.boom.call().get(timeout=REPLY_TIMEOUT)
    mesh.nap.call(0.02).get(timeout=REPLY_TIMEOUT)

    stats = danaus.stats(mesh).get(timeout=REPLY_TIMEOUT)
    ping, boom, nap = stats.endpoints["ping"], stats.endpoints["boom"], stats.endpoints["nap"]
    assert (ping.calls, ping.errors) == (40, 0)  # 20 calls x 2 actors
    assert (boom.calls, boom.errors) == (6, 6)
    assert nap.calls == 2 and nap.p50_s is not None and nap.p50_s >= 0.02 / 1.34
    assert ping.p50_s is not None and ping.p99_s is not None and ping.mean_s is not None
    assert ping.p50_s <= ping.p99_s <= ping.max_s
    assert sorted(stats.actors) == ["metered[0]", "metered[1]"]
    assert stats.actors["metered[1]"]["ping"].calls == 20
    # The proc mesh's view keys each endpoint by its actor mesh.
    whole = procs.stats().get(timeout=REPLY_TIMEOUT)
    assert whole.endpoints["metered.ping"].calls == 40
    one = danaus.stats(mesh.slice(gpus=1)).get(timeout=REPLY_TIMEOUT)
    assert list(one.actors) == ["metered[1]"] and one.endpoints["ping"].calls == 20


def test_connection_metrics_count_the_bytes_and_frames_a_proc_receives(procs: ProcMesh) -> None:
    mesh = procs.spawn("bytes", Worker).slice(gpus=0)
    client = this_node().runtime.proc_id.name

    def received() -> tuple[int, int]:
        [proc] = [p for p in procs.stats().get(timeout=REPLY_TIMEOUT).procs if p.pid is not None][
            :1
        ]
        # One connection with the client, both ways (the proc dialled it: "out").
        conns = [c for c in proc.connections if c.peer == client]
        return sum(c.bytes_recv for c in conns), sum(c.frames_recv for c in conns)

    bytes0, frames0 = received()
    mesh.ping.call_one(b"x" * 200_000).get(timeout=REPLY_TIMEOUT)
    bytes1, frames1 = received()
    assert bytes1 - bytes0 >= 200_000
    assert frames1 - frames0 >= 2  # the call, and the stats question itself


def test_stats_name_a_dead_proc_instead_of_waiting_for_it(faults: FaultRecorder) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn("doomed", Worker)
    pids = mesh.pid.call().get(timeout=REPLY_TIMEOUT)
    os.kill(pids.item(gpus=1), signal.SIGKILL)
    faults.crashed("doomed", {1})
    stats = pm.stats().get(timeout=REPLY_TIMEOUT)
    answered = [p for p in stats.procs if p.error is None]
    dead = [p for p in stats.procs if p.error is not None]
    assert len(answered) == 1 and len(dead) == 1
    assert "SIGKILL" in dead[0].error or "lost" in dead[0].error or "gone" in dead[0].error
    pm.stop().get(timeout=REPLY_TIMEOUT)


def test_stats_refuses_what_is_not_a_mesh() -> None:
    with pytest.raises(TypeError, match="ActorMesh or a ProcMesh"):
        danaus.stats("trainer")


def test_metrics_can_be_switched_off_and_then_count_nothing() -> None:
    code = (
        "import danaus\n"
        "from danaus.actor import Actor, endpoint, this_host\n"
        "class Worker(Actor):\n"
        "    @endpoint\n"
        "    def ping(self, x):\n"
        "        return x\n"
        "pm = this_host().spawn_procs(per_host={'gpus': 1})\n"
        "m = pm.spawn('quiet', Worker)\n"
        "m.ping.call_one(1).get(timeout=30)\n"
        "s = danaus.stats(m).get(timeout=30)\n"
        "print('ENDPOINTS', dict(s.endpoints), s.procs[0].snapshot['metrics'])\n"
    )
    env = {**client_env(), "DANAUS_METRICS": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "ENDPOINTS {} False" in out.stdout
