"""The API within one process: buffers the client owns, handles, batches and bad arguments."""

from __future__ import annotations

import asyncio
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from danaus._rdma import vm
from danaus._wire.ids import ProcId
from danaus.actor import SupervisionError
from danaus.rdma import (
    RDMAAction,
    RDMABuffer,
    RDMAError,
    RDMAOwnerLostError,
    get_rdma_backend,
    get_rdma_local_path,
    is_ibverbs_available,
    is_rdma_available,
)

from .conftest import REPLY_TIMEOUT, random_bytes


def test_the_backend_is_one_of_monarchs_and_the_local_path_is_process_vm() -> None:
    assert is_rdma_available() is True
    assert get_rdma_backend() == "tcp"  # Monarch's values: "ibverbs", "tcp", "none"
    assert get_rdma_local_path() == "process_vm"
    assert is_ibverbs_available() is False


def test_public_classes_show_their_public_module() -> None:
    assert RDMABuffer.__module__ == "danaus.rdma"
    assert RDMAAction.__module__ == "danaus.rdma"
    assert RDMAError.__module__ == "danaus.rdma"


def test_a_buffer_the_client_owns_round_trips_in_the_client() -> None:
    data = random_bytes(10_000, 1)
    buf = RDMABuffer(data)
    assert buf.size() == 10_000
    assert buf.owner.endswith("/root[0]")
    dst = bytearray(10_000)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert bytes(dst) == data.tobytes()
    src = random_bytes(4000, 2)
    buf.write_from(src).get(timeout=REPLY_TIMEOUT)
    assert data[:4000].tobytes() == src.tobytes()
    assert data[4000:].tobytes() == random_bytes(10_000, 1).tobytes()[4000:]
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_registration_does_not_copy_the_memory() -> None:
    data = bytearray(100)
    buf = RDMABuffer(data)
    data[:5] = b"later"  # changed after registration: the buffer sees it
    dst = bytearray(100)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert dst[:5] == b"later"
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_handle_pickles_small_and_compares_equal() -> None:
    buf = RDMABuffer(bytearray(1 << 20))
    blob = pickle.dumps(buf)
    assert len(blob) < 512
    copy = pickle.loads(blob)
    assert copy == buf and hash(copy) == hash(buf)
    assert (copy.size(), copy.owner, str(copy)) == (buf.size(), buf.owner, str(buf))
    assert copy != RDMABuffer(bytearray(1))
    dst = bytearray(1 << 20)
    copy.read_into(dst).get(timeout=REPLY_TIMEOUT)  # the copy reaches the same memory
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_handle_from_an_unreachable_host_fails_with_owner_lost_not_a_hang() -> None:
    buf = RDMABuffer(bytearray(10))
    key = vm.host_key().encode()
    elsewhere = pickle.loads(pickle.dumps(buf).replace(key, b"x" * len(key)))
    # Another host, and an owner proc this process cannot reach: no address but a
    # Unix socket that does not exist. (Reachable owners: test_cross_host.py.)
    name = "p" + "0" * 8
    elsewhere._owner_proc = ProcId(name, "unix:/nonexistent/danaus.sock;host:elsewhere")
    assert elsewhere.backend == "tcp"
    for fut in (
        elsewhere.read_into(bytearray(10)),
        RDMAAction().write_remote(elsewhere, b"a").submit(),
    ):
        with pytest.raises(RDMAOwnerLostError, match="cannot connect"):
            fut.get(timeout=REPLY_TIMEOUT)
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_dropped_buffer_fails_later_transfers_naming_the_buffer() -> None:
    buf = RDMABuffer(bytearray(64))
    copy = pickle.loads(pickle.dumps(buf))
    assert buf.drop().get(timeout=REPLY_TIMEOUT) is None
    for fut in (buf.read_into(bytearray(64)), copy.write_from(b"x")):
        with pytest.raises(RDMAError, match="dropped") as info:
            fut.get(timeout=REPLY_TIMEOUT)
        assert isinstance(info.value, RuntimeError)
        assert str(buf) in str(info.value)
    buf.drop().get(timeout=REPLY_TIMEOUT)  # twice is harmless


def test_a_tensor_buffer_round_trips() -> None:
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(random_bytes(4096, 3).copy()).view(torch.float32)
    buf = RDMABuffer(t)
    assert buf.size() == 4096
    dst = torch.zeros(1024, dtype=torch.float32)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert torch.equal(dst.view(torch.uint8), t.view(torch.uint8))
    buf.write_from(torch.ones(1024)).get(timeout=REPLY_TIMEOUT)
    assert torch.equal(t, torch.ones(1024))
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_transfer_can_be_awaited() -> None:
    buf = RDMABuffer(random_bytes(100, 4))
    dst = bytearray(100)

    async def main() -> None:
        await buf.read_into(dst)

    asyncio.run(main())
    assert bytes(dst) == random_bytes(100, 4).tobytes()
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_bad_buffers_are_refused_with_what_to_pass_instead() -> None:
    with pytest.raises(ValueError, match="empty"):
        RDMABuffer(bytearray())
    with pytest.raises(ValueError, match="ascontiguousarray"):
        RDMABuffer(np.arange(10)[::2])
    with pytest.raises(TypeError, match="must be"):
        RDMABuffer("not memory")


def test_bad_transfer_arguments_are_refused_at_the_call() -> None:
    buf = RDMABuffer(bytearray(100))
    with pytest.raises(ValueError, match="at least 100 bytes"):
        buf.read_into(bytearray(99))
    with pytest.raises(ValueError, match="at most 100 bytes"):
        buf.write_from(bytearray(101))
    with pytest.raises(ValueError, match="read-only"):
        buf.read_into(b"\0" * 100)
    with pytest.raises(ValueError, match="non-contiguous"):
        buf.read_into(np.zeros(400, np.uint8)[::2])
    with pytest.raises(TypeError, match="must be"):
        buf.write_from(12)
    buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_batch_runs_every_operation() -> None:
    a, b = random_bytes(1000, 5), random_bytes(2000, 6)
    ba, bb = RDMABuffer(a), RDMABuffer(b)
    da, db = bytearray(1000), bytearray(2000)
    src = random_bytes(500, 7)
    w = RDMABuffer(bytearray(500))
    RDMAAction().read_remote(da, ba).read_remote(db, bb).write_remote(w, src).submit().get(
        timeout=REPLY_TIMEOUT
    )
    assert (bytes(da), bytes(db)) == (a.tobytes(), b.tobytes())
    back = bytearray(500)
    w.read_into(back).get(timeout=REPLY_TIMEOUT)
    assert bytes(back) == src.tobytes()
    assert RDMAAction().submit().get(timeout=REPLY_TIMEOUT) is None  # an empty batch
    # Monarch's spellings: read_into(buffer, local), write_from(buffer, local)
    da2 = bytearray(1000)
    RDMAAction().read_into(ba, da2).write_from(w, b"z" * 10).submit().get(timeout=REPLY_TIMEOUT)
    assert da2 == da
    for buf in (ba, bb, w):
        buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_batch_refuses_operations_that_would_race() -> None:
    b1, b2 = RDMABuffer(bytearray(100)), RDMABuffer(bytearray(100))
    dst = bytearray(300)
    view = memoryview(dst)
    action = RDMAAction().read_remote(view[0:100], b1)
    with pytest.raises(ValueError, match="overlaps"):
        action.read_remote(view[50:150], b2)  # two reads into the same bytes
    with pytest.raises(ValueError, match="overlaps"):
        action.write_remote(b2, view[90:100])  # a write from bytes a read fills
    action.read_remote(view[100:200], b2)  # adjacent is fine
    with pytest.raises(ValueError, match="one of them writes"):
        action.write_remote(b1, b"abc")  # a write to a buffer the batch also reads
    src = bytearray(10)
    ok = RDMAAction().write_remote(b1, src).write_remote(b2, src)  # one source, two writes
    assert len(ok) == 2
    with pytest.raises(ValueError, match="one of them writes"):
        ok.write_remote(b1, b"other")
    with pytest.raises(ValueError, match="at least 100 bytes"):
        RDMAAction().read_remote(bytearray(10), b1)
    with pytest.raises(ValueError, match="at most 100 bytes"):
        RDMAAction().write_remote(b1, bytearray(101))
    with pytest.raises(TypeError, match="RDMABuffer"):
        RDMAAction().read_remote(bytearray(10), bytearray(10))  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError):
        RDMAAction().fetch_add(b1, bytearray(8), 1)
    with pytest.raises(NotImplementedError):
        RDMAAction().compare_and_swap(b1, bytearray(8), 1, 2)
    for buf in (b1, b2):
        buf.drop().get(timeout=REPLY_TIMEOUT)


def test_rdma_errors_pickle_with_their_fields() -> None:
    e = RDMAOwnerLostError("owner gone", buffer="RDMABuffer #1", owner="p1/m[0]")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is RDMAOwnerLostError
    assert isinstance(back, SupervisionError) and isinstance(back, RDMAError)
    assert (str(back), back.buffer, back.owner, back.actor) == (
        "owner gone",
        "RDMABuffer #1",
        "p1/m[0]",
        "p1/m[0]",
    )
    plain = pickle.loads(pickle.dumps(RDMAError("x", buffer="b")))
    assert type(plain) is RDMAError and plain.buffer == "b"


def test_plain_buffers_never_import_torch(tmp_path) -> None:
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        from danaus.actor import this_host, Actor, endpoint
        from danaus.rdma import RDMABuffer

        class Reader(Actor):
            @endpoint
            def read(self, buf):
                dst = bytearray(buf.size())
                buf.read_into(dst).get(timeout=30)
                return bytes(dst), "torch" in sys.modules

        data = bytearray(b"plain bytes, no torch")
        buf = RDMABuffer(data)
        dst = np.zeros(buf.size(), np.uint8)
        buf.read_into(dst).get(timeout=30)
        procs = this_host().spawn_procs(per_host={"x": 1})
        got, proc_has_torch = procs.spawn("r", Reader).read.call_one(buf).get(timeout=30)
        procs.stop().get(timeout=30)
        assert got == bytes(data) == dst.tobytes(), got
        print("torch" in sys.modules, proc_has_torch)
        """
    )
    path = tmp_path / "no_torch.py"
    path.write_text(script)
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
