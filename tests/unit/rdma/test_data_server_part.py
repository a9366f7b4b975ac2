"""The data server belongs to the node: one per session, closed when the session ends."""

from __future__ import annotations

import socket
import types

import pytest

from danaus._rdma import net
from danaus._rdma.registry import BufferRegistry
from danaus._runtime import node as node_mod


def _stub_runtime(tmp_path) -> types.SimpleNamespace:
    listener = socket.create_server(("127.0.0.1", 0))
    return types.SimpleNamespace(
        listener=listener,  # the test's own, closed at its end
        tcp_bind="127.0.0.1",
        tcp_advertise="127.0.0.1",
        secret=b"s" * 32,
        proc_id=types.SimpleNamespace(name="stub"),
        thread=None,
        job_dir=str(tmp_path / "job"),
    )


def test_the_data_server_is_made_once_and_stops_listening_when_its_node_ends(tmp_path) -> None:
    rt = _stub_runtime(tmp_path)
    node = node_mod.Node(rt, client=True)  # type: ignore[arg-type]
    part = node.part(net.DataServer)
    memory = node.part(BufferRegistry)
    address = part.address(rt, memory)  # type: ignore[arg-type]
    socket.create_connection(address, timeout=5).close()  # it listens
    assert part.address(rt, memory) == address  # type: ignore[arg-type]  # the same server
    node_mod.end(node)
    assert part.server is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5)
    rt.listener.close()


def test_a_node_that_has_ended_serves_no_data_address(tmp_path) -> None:
    rt = _stub_runtime(tmp_path)
    node = node_mod.Node(rt, client=True)  # type: ignore[arg-type]
    node.closed = True  # its session ended (node_mod.end): a late RDMA_DATA is refused
    try:
        with pytest.raises(RuntimeError, match="no running node"):
            net._server_address(node)
        assert node.part(net.DataServer).server is None  # and no server was started
    finally:
        rt.listener.close()
