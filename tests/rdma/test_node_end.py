"""The RDMA layer's state belongs to the node: a client that ends its session and starts
again in the same process sees none of the old session's registrations, leases,
pooled connections or threads.

The scenario runs in a client process of its own: ending the node of the test
process would end it under every other test's meshes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, socket
    from danaus._rdma import net, transfer
    from danaus._rdma.registry import BufferRegistry
    from danaus._runtime.node import this_node
    from danaus.actor import shutdown_context
    from danaus.rdma import RDMABuffer, RDMAError

    out = {}
    first = this_node()
    data = bytearray(range(256)) * 16
    buf = RDMABuffer(data)
    dst = bytearray(len(data))
    buf.read_into(dst).get(timeout=30)  # a transfer: a lease, the copy threads
    out["copied"] = dst == data
    memory = first.part(BufferRegistry)
    out["registered_before"] = [b["id"] for b in memory.registered_buffers()]
    # A pooled data connection (one end of a socket pair stands in for an owner's).
    client = first.part(net.DataClient)
    pooled, other_end = socket.socketpair()
    client.remember_address(("owner", 1), ("127.0.0.1", 1))
    client._give_back(("owner", 1), (pooled, None))
    out["idle_before"] = client.idle_connections()
    net_threads = client.executor()
    copies = first.part(transfer.CopyThreads)

    shutdown_context().get(timeout=30)

    # The first node's parts have let go of everything.
    out["registered_after"] = memory.registered_buffers()
    out["leases_after"] = memory.leases()
    out["idle_after"] = client.idle_connections()
    out["pooled_closed"] = pooled.fileno() == -1
    out["address_after"] = client.known_address(("owner", 1))
    try:
        copies.pool.submit(print)
        out["copy_threads_after"] = "open"
    except RuntimeError:
        out["copy_threads_after"] = "shut down"
    try:
        net_threads.submit(print)
        out["net_threads_after"] = "open"
    except RuntimeError:
        out["net_threads_after"] = "shut down"

    # A new node in the same process starts with none of it.
    second = this_node()
    out["new_node"] = second is not first
    out["registered_new"] = second.part(BufferRegistry).registered_buffers()
    out["idle_new"] = second.part(net.DataClient).idle_connections()
    out["address_new"] = second.part(net.DataClient).known_address(("owner", 1))
    out["copies_new"] = second.part(transfer.CopyThreads) is not copies
    # The old handle fails, saying why, instead of reading memory no longer held.
    try:
        buf.read_into(bytearray(len(data)), timeout=30).get(timeout=30)
        out["old_handle"] = "read"
    except RDMAError as e:
        out["old_handle"] = f"{type(e).__name__}: {e}"
    # The new node's buffers work.
    fresh = RDMABuffer(bytearray(b"z" * 64))
    got = bytearray(64)
    fresh.read_into(got).get(timeout=30)
    out["fresh"] = bytes(got) == b"z" * 64
    shutdown_context().get(timeout=30)
    print(json.dumps(out))
    """
)


def test_a_new_node_sees_none_of_the_ended_nodes_rdma_state() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=50,
        env=os.environ.copy(),
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["copied"] is True
    assert out["registered_before"] == [1]
    assert out["idle_before"] == 1
    assert out["registered_after"] == []
    assert out["leases_after"] == 0
    assert out["idle_after"] == 0
    assert out["pooled_closed"] is True
    assert out["address_after"] is None
    assert out["copy_threads_after"] == "shut down"
    assert out["net_threads_after"] == "shut down"
    assert out["new_node"] is True
    assert out["registered_new"] == []
    assert out["idle_new"] == 0
    assert out["address_new"] is None
    assert out["copies_new"] is True
    assert out["old_handle"].startswith("RDMAOwnerLostError: read_into of 4096 bytes"), out
    assert "is gone" in out["old_handle"]
    assert out["fresh"] is True
