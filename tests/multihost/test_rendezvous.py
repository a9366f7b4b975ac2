"""Issue 40, N1: another host cannot reach the rendezvous of the job's process groups.

The elastic coordinator's ``TCPStore`` listened on every interface (and the
tensor engine's too, though it was given 127.0.0.1): a process on another
host joined it and set its keys. With both rendezvous in use (now actors), a
process in another network namespace of the lab tries a ``TCPStore`` client on
every TCP port the job listens on, through the bridge; a ``TCPStore`` like the
old ones (the control) shows the attack gets through where a store listens.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from store_attack import Rendezvous, attack, job_listeners, live_rendezvous

from .conftest import IP, Network

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def rendezvous(client) -> Iterator[Rendezvous]:
    with live_rendezvous(TIMEOUT) as r:
        yield r


@pytest.mark.timeout(300)
def test_another_host_can_set_or_read_no_key_of_the_jobs_rendezvous(
    rendezvous, network: Network
) -> None:
    import torch.distributed as dist

    stranger = network.add_host()
    try:
        control = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False)
        mine = (network.gateway, int(control.port))
        job = [(network.gateway, p) for _, p in job_listeners(os.getpid()) if p != mine[1]]
        results = attack([*job, mine], [IP, "netns", "exec", stranger.netns])
    finally:
        network.remove_host(stranger)

    assert results.pop(f"{mine[0]}:{mine[1]}").startswith("in:"), results  # it reaches a store
    got_in = {target: r for target, r in results.items() if r.startswith("in:")}
    assert not got_in, f"another host reached a store of the job: {got_in}"
    store = rendezvous.engine_store
    assert store.store_check.call_one(["danaus-attack"]).get(timeout=TIMEOUT) is False
    world, values = rendezvous.elastic.step(1)
    assert (world, values) == (2, [2.0, 2.0])
