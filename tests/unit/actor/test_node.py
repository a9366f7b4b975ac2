"""The client's node, in the client: one node owns the runtime, and the actor layer's
registry of owned meshes is one of its parts. Nodes that end and start again, and what
they leave behind: ``tests/integration/test_node.py``."""

from __future__ import annotations

from danaus._runtime.node import this_node
from danaus.actor import Actor, endpoint, this_proc


class Probe(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def test_this_process_has_one_node_owning_the_runtime() -> None:
    mesh = this_proc().spawn("node_probe", Probe)  # owned by the client's node
    try:
        node = this_node(start=False)
        assert node is not None and node.client
        assert this_node() is node  # the one lookup finds it, and starts no other
        # The owned-mesh registry is a part of the node, not a module global.
        assert "Registry" in node.parts()
    finally:
        mesh.stop().get(timeout=30)
