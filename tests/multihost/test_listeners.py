"""Every TCP listener a job opens, attacked from outside: none runs a pickle, none holds a crowd.

A client attached to workers on other hosts opens TCP listeners in four kinds
of process: the client itself, each worker (host agent), each proc spawned
on a worker, and, once RDMA is used, each process's data server. Each one is
found here from the live job (not from a bare runtime) and attacked as
someone on the network without the secret would: a pickle that would create
a directory is sent straight away (it must never run anywhere), then a
slowloris crowd of connections that never answer their challenge (at most
the listener's bound is held; a legitimate peer still authenticates). The
client's listener is also checked to be bound to the address the workers
reach, not to every interface, and the frames of a remote spawn are scanned
for the secret.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import struct
from typing import Any

import pytest

from danaus import _config as danaus_config
from danaus._rdma import net as rdma_net
from danaus._rdma.net_frames import _REFUSAL
from danaus._runtime.node import this_node
from danaus._transport.auth import MAGIC, Handshake, load_secret
from danaus._wire.frame import encode_frame
from danaus._wire.protocol import Kind, SpawnProcs, wire
from danaus.actor import Actor, endpoint
from wire_bytes import recv_exactly

from .conftest import TIMEOUT, recv_until_closed

CHALLENGE = len(MAGIC) + 32
pytestmark = pytest.mark.timeout(180)


class _Boom:
    """Unpickling it creates ``path``: stands in for any code an attacker would run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.mkdir, (self.path,))


class Listeners(Actor):
    """Reports the TCP listeners of its proc: the message listener and the data server."""

    @endpoint
    def addresses(self) -> tuple[str, str]:
        rt = this_node().runtime
        tcp = next(e for e in rt.proc_id.addr.split(";") if e.startswith("tcp://"))
        got: queue.Queue[Any] = queue.Queue()
        node = this_node()
        rt.call_soon(lambda: got.put(rdma_net._server_address(node)))  # on the I/O thread
        host, port = got.get(timeout=TIMEOUT)
        return tcp, f"tcp://{host}:{port}"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address[len("tcp://") :].rpartition(":")
    return host, int(port)


def _dial(address: str) -> socket.socket:
    s = socket.create_connection(_split(address), timeout=TIMEOUT)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
    return s


def _handshake(address: str, secret: bytes) -> None:
    """A legitimate peer authenticates (and leaves)."""
    with _dial(address) as s:
        hs = Handshake(secret, "client")
        s.sendall(hs.feed(recv_exactly(s, hs.want())))
        assert hs.feed(recv_exactly(s, hs.want())) == b""
        assert hs.done


@pytest.fixture(scope="module")
def listeners(procs, workers) -> dict[str, str]:
    """name -> address of every TCP listener of the job (client, workers, procs, data servers)."""
    rt = this_node().runtime
    found = {"client": next(e for e in rt.proc_id.addr.split(";") if e.startswith("tcp://"))}
    got: queue.Queue[Any] = queue.Queue()
    node = this_node()
    rt.call_soon(lambda: got.put(rdma_net._server_address(node)))
    host, port = got.get(timeout=TIMEOUT)
    found["client data server"] = f"tcp://{host}:{port}"
    for i, w in enumerate(workers):
        found[f"worker {i}"] = w.address
    mesh = procs.spawn("listeners", Listeners)
    for i, (tcp, data) in enumerate(mesh.addresses.call().get(timeout=TIMEOUT).values()):
        found[f"proc {i}"] = tcp
        found[f"proc {i} data server"] = data
    return found


def test_the_clients_listener_is_bound_to_the_address_the_workers_reach(listeners, net) -> None:
    rt = this_node().runtime
    bound = rt.tcp_bind
    assert bound is not None
    assert bound not in ("0.0.0.0", "::"), "the client listens on every interface"
    assert _split(listeners["client"])[0] == bound
    # The workers' subnet (the bridge's address), not loopback.
    assert bound.rsplit(".", 1)[0] == net[0].ip.rsplit(".", 1)[0]


def test_an_unauthenticated_pickle_runs_on_no_listener_of_the_job(listeners, tmp_path) -> None:
    assert len(listeners) >= 2 + 2 * 3 + 3  # client and its data server, 3 workers, 3 procs
    for name, address in listeners.items():
        target = tmp_path / name.replace(" ", "-")
        bomb = _Boom(str(target))
        frame = b"".join(map(bytes, encode_frame((int(Kind.REFUSED), bomb))))
        with _dial(address) as s:
            assert recv_exactly(s, CHALLENGE).startswith(MAGIC), name
            s.sendall(frame + pickle.dumps(bomb))
            rest, _ = recv_until_closed(s, timeout=TIMEOUT)
            # Nothing but, from a data server, its refusal marker (in place of a MAC).
            allowed = {b"", _REFUSAL} if "data server" in name else {b""}
            assert rest in allowed, f"{name} answered an unauthenticated peer: {rest!r}"
        assert not target.exists(), f"a pickle sent to {name} ran"
    # Nothing ran anywhere, and every listener still lets its own in.
    assert not any(tmp_path.iterdir())


def test_a_slowloris_on_each_message_listener_is_bounded(listeners, secret) -> None:
    key = load_secret(secret)
    assert key is not None
    cap = danaus_config.get("max_pending_handshakes")  # the same default in every process
    deadline = danaus_config.get("handshake_timeout")
    extra = 4
    for name, address in listeners.items():
        if "data server" in name:
            continue
        crowd = [_dial(address) for _ in range(cap + extra)]
        try:
            for s in crowd:
                assert recv_exactly(s, CHALLENGE).startswith(MAGIC), name
            # The oldest were shed at once, long before the handshake deadline (which
            # would close them all) ...
            for s in crowd[:extra]:
                rest, _ = recv_until_closed(s, timeout=deadline / 2)
                assert rest == b"", name
            newest = crowd[-1]
            newest.setblocking(False)
            with pytest.raises(BlockingIOError):
                newest.recv(1)  # still open: shed oldest first, and only beyond the bound
            # ... and a legitimate peer gets in while the rest of the crowd waits.
            _handshake(address, key)
        finally:
            for s in crowd:
                s.close()


def test_a_slowloris_on_each_data_server_is_bounded(listeners, secret) -> None:
    key = load_secret(secret)
    assert key is not None
    bound = danaus_config.get("rdma_max_data_threads")
    servers = [(n, a) for n, a in listeners.items() if "data server" in n]
    crowds = {name: [_dial(address) for _ in range(bound)] for name, address in servers}
    try:
        for name, address in servers:  # all at once: their deadlines run together
            for s in crowds[name]:
                assert recv_exactly(s, CHALLENGE).startswith(MAGIC), name
            # Every thread is taken: one more connection is closed at once, unserved.
            with _dial(address) as more:
                rest, _ = recv_until_closed(more, timeout=TIMEOUT)
                assert rest == b"", name
        # The crowds are closed by the handshake deadline, not held forever ...
        for name, crowd in crowds.items():
            for s in crowd:
                rest, _ = recv_until_closed(s, timeout=TIMEOUT)
                assert rest in (b"", _REFUSAL), name
    finally:
        for crowd in crowds.values():
            for s in crowd:
                s.close()
    # ... and then a legitimate requester is served.
    for name, address in servers:
        for _ in range(100):
            try:
                sock, _session = rdma_net.connect(_split(address), key, TIMEOUT, lambda s: True)
            except (EOFError, OSError):
                continue  # a thread of the crowd had not ended yet
            sock.close()
            break
        else:
            pytest.fail(f"{name} never served a legitimate requester again")


def test_the_secret_is_in_no_frame_a_remote_spawn_sends(hosts, secret) -> None:
    rt = this_node().runtime
    sent: list[tuple[type, bytes]] = []
    plain = rt.send

    def spy(proc, header, body=b"", buffers=(), on_fail=None, **kw):  # type: ignore[no-untyped-def]
        raw = encode_frame(wire(header), body, buffers)
        sent.append((type(header), b"".join(map(bytes, raw))))
        return plain(proc, header, body, buffers, on_fail, **kw)

    rt.send = spy  # type: ignore[method-assign]
    try:
        pm = hosts.spawn_procs(per_host={"gpus": 1})
        assert pm.initialized.get(timeout=TIMEOUT) is True
    finally:
        rt.send = plain  # type: ignore[method-assign]
    try:
        assert any(kind is SpawnProcs for kind, _ in sent)
        key = load_secret(secret)
        assert key is not None
        for needle in (secret.encode(), key, key.hex().encode()):
            assert not any(needle in frame for _, frame in sent)
    finally:
        pm.stop().get(timeout=TIMEOUT)


class SysPath(Actor):
    @endpoint
    def entries(self) -> list[str]:
        import sys

        return list(sys.path)


def test_a_remote_proc_takes_only_the_clients_safe_sys_path_entries(hosts, tmp_path) -> None:
    import sys

    safe, shared = tmp_path / "safe", tmp_path / "shared"
    safe.mkdir()
    safe.chmod(0o755)
    shared.mkdir()
    shared.chmod(0o777)  # anyone on that host could plant a module here
    sys.path.extend([str(safe), str(shared)])
    try:
        pm = hosts.spawn_procs(per_host={"gpus": 1})
    finally:
        sys.path.remove(str(safe))
        sys.path.remove(str(shared))
    try:
        seen = pm.spawn("syspath", SysPath).entries.call().get(timeout=TIMEOUT).values()
        assert seen
        for entries in seen:
            assert str(safe) in entries
            assert str(shared) not in entries
    finally:
        pm.stop().get(timeout=TIMEOUT)
