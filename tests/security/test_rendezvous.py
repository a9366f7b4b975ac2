"""Issue 40, N1: another user of the host cannot reach the rendezvous of the job's
process groups.

The tensor engine's and the elastic coordinator's rendezvous were ``TCPStore``s,
listening on every interface with no secret: a process of another uid joined,
set and read their keys. Now both are actors (``_tensor/rendezvous.py``), reached
by the job's own authenticated connections. With both in use, uid ``nobody``
(``setpriv``) tries a ``TCPStore`` client on every TCP port the job listens on;
a ``TCPStore`` such as the old code made (the control) shows that the attack
works where there is a store to reach.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator

import pytest

from store_attack import Rendezvous, attack, job_listeners, live_rendezvous

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
TIMEOUT = 60.0
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}


@pytest.fixture(scope="module")
def rendezvous() -> Iterator[Rendezvous]:
    with live_rendezvous(TIMEOUT) as r:
        yield r


@pytest.mark.timeout(300)
def test_another_user_can_set_or_read_no_key_of_the_jobs_rendezvous(rendezvous) -> None:
    import torch.distributed as dist

    control = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True
    )  # what the engine used to start
    control.set("job-key", "secret-ish")
    mine = ("127.0.0.1", int(control.port))
    job = [
        (_LOOPBACK.get(addr, addr), port)
        for addr, port in job_listeners(os.getpid())
        if port != mine[1] and addr != "ipv6"
    ]
    results = attack([*job, mine], NOBODY)

    assert results.pop(f"{mine[0]}:{mine[1]}").startswith("in:"), results  # the attack works
    assert control.get("danaus-attack") == b"planted"
    got_in = {target: r for target, r in results.items() if r.startswith("in:")}
    assert not got_in, f"another user reached a store of the job: {got_in}"
    assert len(results) == len(job)
    # The job's stores are untouched, and still serve the job.
    store = rendezvous.engine_store
    assert store.store_check.call_one(["danaus-attack"]).get(timeout=TIMEOUT) is False
    assert store.store_num_keys.call_one().get(timeout=TIMEOUT) > 0  # the group's keys
    world, values = rendezvous.elastic.step(1)
    assert (world, values) == (2, [2.0, 2.0])


def test_the_actor_store_behaves_as_a_tcp_store_for_each_operation(rendezvous) -> None:
    """The member's side (``actor_store``) against the engine's store: what torch's
    ``TCPStore`` does, so gloo and NCCL find what they expect."""
    import torch.distributed as dist

    from danaus._tensor.rendezvous import actor_store

    member = actor_store(rendezvous.engine_store, 5.0)  # referenced: torch holds only C++'s side
    store = dist.PrefixStore("semantics/", member)
    store.set("a", "1")
    assert store.get("a") == b"1"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("c", "", "x") == b"x"  # missing and expected empty: set
    assert store.compare_set("c", "y", "z") == b"x"  # mismatch: the current value
    assert store.compare_set("missing", "y", "z") == b"y"  # missing: expected back
    store.append("a", b"2")
    assert store.multi_get(["a", "c"]) == [b"12", b"x"]
    store.multi_set(["m1", "m2"], [b"p", b"q"])
    assert store.check(["m1", "m2"]) and not store.check(["nope"])
    store.wait(["m1"], datetime.timedelta(seconds=1))
    with pytest.raises(dist.DistStoreError, match=r"were not set within 0\.2 s"):
        store.wait(["never"], datetime.timedelta(seconds=0.2))
    impatient = actor_store(rendezvous.engine_store, 0.2)
    quick = dist.PrefixStore("semantics/", impatient)
    with pytest.raises(dist.DistStoreError, match="'semantics//never'"):
        quick.get("never")


@pytest.mark.timeout(300)
def test_a_closed_actor_store_fails_a_waiting_get_and_every_later_operation_at_once(
    rendezvous,
) -> None:
    """``close()``: what an elastic replica does to the rendezvous of a membership that
    ended, so that a group build waiting there for a lost member fails now, not after
    its timeout (inside torch's C++, as the process may be ending)."""
    import threading

    import torch.distributed as dist

    from danaus._tensor.rendezvous import actor_store
    from danaus.testing import wait_until

    member = actor_store(rendezvous.engine_store, 3600.0)  # a get waits an hour for its key
    store = dist.PrefixStore("closing/", member)
    errors: list[BaseException] = []

    def get() -> None:
        try:
            store.get("never")
        except Exception as e:
            errors.append(e)

    waiting = threading.Thread(target=get)
    waiting.start()
    wait_until(lambda: member._waiting, TIMEOUT, "the get in flight")
    member.close("membership 3 ended")
    waiting.join(TIMEOUT)  # far less than the hour
    assert not waiting.is_alive()
    assert len(errors) == 1 and "rendezvous store closed: membership 3 ended" in str(errors[0])
    with pytest.raises(dist.DistStoreError, match="rendezvous store closed"):
        member.set("later", b"x")
    assert rendezvous.engine_store.store_check.call_one(["later"]).get(timeout=TIMEOUT) is False
