"""The CUDA data plane's logic that needs no GPU: the staging pipelines, routes, errors.

The pipelines (``cuda.staged_in`` / ``staged_out``) are driven here with host
memory standing in for the GPU and *deferred* copies standing in for
asynchronous device copies: a copy happens only when its event is waited
for. A pipeline that reused a slot before waiting for its copy, or moved a
slot before its download had ended, would deliver wrong bytes here, just as
it would on a GPU.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from danaus._rdma import cuda

CHUNK = 1000


class Deferred:
    """An asynchronous copy: ``fn`` runs when the event is first waited for."""

    def __init__(self, log: list[str], name: str, fn: Callable[[], None]) -> None:
        self.log, self.name, self.fn, self.done = log, name, fn, False

    def wait(self) -> None:
        if not self.done:
            self.done = True
            self.fn()
            self.log.append(f"wait {self.name}")


def wait(ev: Any) -> None:
    ev.wait()


def _data(n: int) -> bytes:
    return os.urandom(n)


def _read(total: int, slots: int = 2, stop_at: int | None = None) -> tuple[bytes, list[str], bool]:
    """Remote ``src`` -> "device" ``dev`` through host slots, with a log of the steps."""
    src = _data(total)
    dev = bytearray(total)
    host = [bytearray(CHUNK) for _ in range(slots)]
    log: list[str] = []
    moved = [0]

    def move(slot: int, off: int, n: int) -> bool:
        host[slot][:n] = src[off : off + n]
        log.append(f"move {off // CHUNK} slot {slot}")
        moved[0] += 1
        return True

    def upload(slot: int, off: int, n: int) -> Deferred:
        log.append(f"upload {off // CHUNK}")

        def copy() -> None:
            dev[off : off + n] = host[slot][:n]

        return Deferred(log, f"upload {off // CHUNK}", copy)

    def stop() -> bool:
        return stop_at is not None and moved[0] >= stop_at

    ok = cuda.staged_in(total, CHUNK, move, upload, wait, stop, slots)
    assert ok or stop_at is not None
    return bytes(dev), log, ok and bytes(dev) == src


def _write(total: int, slots: int = 2, fail_at: int | None = None) -> tuple[list[str], bool]:
    """ "Device" ``dev`` -> remote ``dst`` through host slots, with a log of the steps."""
    dev = _data(total)
    dst = bytearray(total)
    host = [bytearray(CHUNK) for _ in range(slots)]
    log: list[str] = []

    def download(slot: int, off: int, n: int) -> Deferred:
        log.append(f"download {off // CHUNK}")

        def copy() -> None:
            host[slot][:n] = dev[off : off + n]

        return Deferred(log, f"download {off // CHUNK}", copy)

    def move(slot: int, off: int, n: int) -> bool:
        if fail_at is not None and off // CHUNK == fail_at:
            return False
        dst[off : off + n] = host[slot][:n]
        log.append(f"move {off // CHUNK}")
        return True

    ok = cuda.staged_out(total, CHUNK, download, move, wait, lambda: False, slots)
    return log, ok and bytes(dst) == dev


@pytest.mark.parametrize("total", [1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK, 7 * CHUNK + 13])
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_staged_reads_deliver_every_byte_whatever_the_sizes(total: int, slots: int) -> None:
    _, log, same = _read(total, slots)
    assert same
    assert sum(e.startswith("move") for e in log) == -(-total // CHUNK)


@pytest.mark.parametrize("total", [1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK, 7 * CHUNK + 13])
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_staged_writes_deliver_every_byte_whatever_the_sizes(total: int, slots: int) -> None:
    log, same = _write(total, slots)
    assert same
    assert sum(e.startswith("move") for e in log) == -(-total // CHUNK)


def test_a_staged_read_moves_the_next_chunk_while_the_previous_one_uploads() -> None:
    _, log, same = _read(4 * CHUNK)
    assert same
    # chunk 1 arrives in the other slot before the upload of chunk 0 is waited for
    assert log.index("move 1 slot 1") < log.index("wait upload 0")
    # a slot is reused only after its upload has ended
    assert log.index("wait upload 0") < log.index("move 2 slot 0")
    assert log.index("wait upload 1") < log.index("move 3 slot 1")


def test_a_staged_write_downloads_the_next_chunk_while_this_one_moves() -> None:
    log, same = _write(4 * CHUNK)
    assert same
    # the download of chunk 1 is under way when chunk 0 is moved
    assert log.index("download 1") < log.index("move 0")
    # a slot is downloaded into again only after it was moved on
    assert log.index("move 0") < log.index("download 2")
    assert log.index("wait download 0") < log.index("move 0")


def test_a_stopped_read_returns_false_with_every_started_upload_ended() -> None:
    _, log, ok = _read(6 * CHUNK, stop_at=3)
    assert not ok
    started = [e.split()[1] for e in log if e.startswith("upload")]
    ended = [e.split()[2] for e in log if e.startswith("wait upload")]
    assert started and sorted(started) == sorted(ended)
    assert not any(e.startswith("move 4") for e in log)


def test_a_write_whose_move_stops_returns_false_with_every_started_download_ended() -> None:
    log, ok = _write(6 * CHUNK, fail_at=2)
    assert not ok
    started = [e.split()[1] for e in log if e.startswith("download")]
    ended = [e.split()[2] for e in log if e.startswith("wait download")]
    assert sorted(started) == sorted(ended)
    assert "move 3" not in log


def test_a_move_that_raises_still_ends_the_started_copies() -> None:
    log: list[str] = []
    evs: list[Deferred] = []

    def download(slot: int, off: int, n: int) -> Deferred:
        ev = Deferred(log, f"download {off}", lambda: None)
        evs.append(ev)
        return ev

    def move(slot: int, off: int, n: int) -> bool:
        raise ConnectionResetError("the peer went away")

    with pytest.raises(ConnectionResetError):
        cuda.staged_out(5 * CHUNK, CHUNK, download, move, wait, lambda: False)
    assert evs and all(ev.done for ev in evs)


def test_the_staging_chunk_is_a_whole_number_of_tag_chunks(settings: Any) -> None:
    from danaus._rdma.net import CHUNK as TAG_CHUNK

    settings(rdma_cuda_chunk=TAG_CHUNK * 3 + 1)
    assert cuda.chunk_size(TAG_CHUNK) == TAG_CHUNK * 4
    settings(rdma_cuda_chunk=1)
    assert cuda.chunk_size(TAG_CHUNK) == TAG_CHUNK
    settings(rdma_cuda_chunk="8MiB")
    assert cuda.chunk_size(4096) == 8 << 20


def _info(**kw: Any) -> cuda.CudaInfo:
    base = {
        "uuid": "GPU-0000",
        "device": 0,
        "kind": "tensor((4,), torch.float32) on cuda:0 of 16 bytes",
        "ipc": (0, b"h" * 64, 16, 0, b"ref", 0, b"e" * 64, True),
        "start": 0,
        "why_no_ipc": None,
    }
    return cuda.CudaInfo(**{**base, **kw})


def test_a_cuda_handle_travels_by_pickle() -> None:
    info = _info()
    assert pickle.loads(pickle.dumps(info)) == info


def test_cuda_ipc_is_not_offered_across_hosts_or_without_a_handle() -> None:
    assert "another host" in (cuda.reachable(_info(), same_host=False) or "")
    why = cuda.reachable(_info(ipc=None, why_no_ipc="CUDA IPC export failed: x"), True)
    assert why == "CUDA IPC export failed: x"


def test_cuda_ipc_is_not_offered_where_this_process_has_no_cuda() -> None:
    if cuda._usable():
        pytest.skip("this process has CUDA; the test is for a process without it")
    why = cuda.reachable(_info(), same_host=True)
    assert why is not None and "cannot use CUDA" in why


def test_a_tensor_on_an_unsupported_device_is_refused_naming_device_and_dtype() -> None:
    torch = pytest.importorskip("torch")
    from danaus._rdma.memory import local_memory

    t = torch.empty(8, dtype=torch.float16, device="meta")
    with pytest.raises(NotImplementedError, match=r"meta.*CPU and CUDA|CPU and CUDA.*") as e:
        local_memory(t, "dst")
    assert "torch.float16" in str(e.value) and "'meta'" in str(e.value)


def test_the_gpu_direct_answer_is_false_for_the_built_in_data_plane() -> None:
    from danaus.rdma import gpu_direct_rdma_supported

    assert gpu_direct_rdma_supported() is False


def test_a_host_tensor_aliases_the_memory_it_describes() -> None:
    torch = pytest.importorskip("torch")
    data = bytearray(b"abcdef")
    from danaus._rdma import vm

    t = cuda.host_tensor(vm.address(memoryview(data)), len(data))
    t[0] = ord("z")
    assert data == bytearray(b"zbcdef")
    assert cuda.host_tensor(0, 0).numel() == 0 and t.dtype == torch.uint8


# -- the staged copy and the owner's serving, with a CPU tensor playing the GPU -------------


class HostSlots:
    """``cuda._Slots`` with a CPU tensor as the GPU: copies are deferred until waited for."""

    def __init__(self, dev: Any, chunk: int) -> None:
        torch = pytest.importorskip("torch")
        self.view = dev
        self.host = [torch.zeros(chunk, dtype=torch.uint8) for _ in range(cuda.SLOTS)]
        self.log: list[str] = []
        self.finished = False

    def addr(self, slot: int) -> int:
        return int(self.host[slot].data_ptr())

    def upload(self, slot: int, off: int, n: int) -> Deferred:
        return Deferred(self.log, f"up {off}", lambda: self.view[off : off + n].copy_(
            self.host[slot][:n]))  # fmt: skip

    def download(self, slot: int, off: int, n: int) -> Deferred:
        return Deferred(self.log, f"down {off}", lambda: self.host[slot][:n].copy_(
            self.view[off : off + n]))  # fmt: skip

    @staticmethod
    def wait(event: Any) -> None:
        event.wait()

    def finish(self) -> None:
        self.finished = True


def _slots(made: list[HostSlots]) -> Callable[[Any, int], HostSlots]:
    def make(mem: Any, chunk: int) -> HostSlots:
        made.append(HostSlots(mem, chunk))
        return made[-1]

    return make


@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize(("off", "n"), [(0, 10_000), (1234, 5000), (777, 1), (0, 999)])
def test_a_staged_copy_moves_exactly_its_range_between_device_and_peer(
    settings: Any, write: bool, off: int, n: int
) -> None:
    torch = pytest.importorskip("torch")
    import ctypes

    settings(rdma_cuda_chunk=1000)
    size = 10_000
    dev = torch.frombuffer(bytearray(_data(size)), dtype=torch.uint8)
    dev_before = dev.clone()
    peer = bytearray(_data(size))
    peer_before = bytes(peer)
    peer_addr = ctypes.addressof((ctypes.c_char * size).from_buffer(peer))

    def move(addr: int, o: int, k: int) -> bool:
        if write:
            ctypes.memmove(peer_addr + o, addr, k)
        else:
            ctypes.memmove(addr, peer_addr + o, k)
        return True

    made: list[HostSlots] = []
    assert cuda.staged_copy(write, dev, off, n, move, lambda: False, 1, _slots(made))
    assert made and made[0].finished
    end = off + n
    if write:
        assert peer[off:end] == bytes(dev[off:end].numpy())
        assert peer[:off] == peer_before[:off] and peer[end:] == peer_before[end:]
        assert torch.equal(dev, dev_before)
    else:
        assert bytes(dev[off:end].numpy()) == peer_before[off:end]
        assert torch.equal(dev[:off], dev_before[:off]) and torch.equal(dev[end:], dev_before[end:])


def test_the_owner_serves_a_fetch_of_its_gpu_memory_chunk_by_chunk(settings: Any) -> None:
    torch = pytest.importorskip("torch")
    settings(rdma_cuda_chunk=1000)
    dev = torch.randint(0, 256, (8000,), dtype=torch.uint8)
    sent: list[bytes] = []
    made: list[HostSlots] = []
    cuda.serve_fetch(dev, 1500, 4321, lambda v: sent.append(bytes(v)), 1, _slots(made))
    assert b"".join(sent) == bytes(dev[1500 : 1500 + 4321].numpy())
    assert [len(c) for c in sent] == [1000] * 4 + [321]
    assert made[0].finished


def test_the_owner_serves_a_store_into_its_gpu_memory_and_stops_at_a_bad_chunk(
    settings: Any,
) -> None:
    torch = pytest.importorskip("torch")
    settings(rdma_cuda_chunk=1000)
    dev = torch.zeros(8000, dtype=torch.uint8)
    data = _data(4500)
    offsets: list[int] = []

    def recv(view: memoryview, at: int) -> None:
        offsets.append(at)
        view[:] = data[at : at + len(view)]

    made: list[HostSlots] = []
    cuda.serve_store(dev, 2000, 4500, recv, 1, _slots(made))
    assert bytes(dev[2000:6500].numpy()) == data
    assert not dev[:2000].any() and not dev[6500:].any()
    assert offsets == [0, 1000, 2000, 3000, 4000]

    dev.zero_()

    def recv_bad(view: memoryview, at: int) -> None:
        if at == 2000:
            raise ConnectionResetError("the requester went away")
        view[:] = data[at : at + len(view)]

    with pytest.raises(ConnectionResetError):
        cuda.serve_store(dev, 0, 4500, recv_bad, 1, _slots(made))
    assert bytes(dev[:2000].numpy()) == data[:2000]  # the chunks before it landed
    assert not dev[2000:].any()
    assert made[-1].finished


# -- the export's reference count (torch's CUDA IPC "limbo") ------------------------------


class FakeTorch:
    """The few torch entry points the IPC reference handling calls, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        fake = self

        class UntypedStorage:
            @staticmethod
            def _new_shared_cuda(*args: Any) -> str:
                fake.calls.append(("open", *args))
                return f"storage{len(fake.calls)}"

            @staticmethod
            def _release_ipc_counter_cuda(*args: Any) -> None:
                fake.calls.append(("release", *args))

        class _Cuda:
            @staticmethod
            def device(index: int) -> Any:
                import contextlib

                return contextlib.nullcontext()

            @staticmethod
            def ipc_collect() -> None:
                fake.calls.append(("collect",))

        self.UntypedStorage = UntypedStorage
        self.cuda = _Cuda


IPC = (1, b"mem-handle", 4096, 512, b"/torch_counter", 7, b"event-handle", True)


def test_a_peer_opens_the_handle_on_its_own_index_without_the_owners_counter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeTorch()
    monkeypatch.setattr(cuda, "_torch", lambda: fake)
    monkeypatch.setattr(cuda, "local_index", lambda uuid: 3)
    handles = cuda.CudaHandles()
    info = _info(ipc=IPC)
    first = handles.storage(("p", 1, 2), info)
    assert handles.storage(("p", 1, 2), info) == first  # opened once
    # torch counts one reference per export for exactly one opener; any number of peers
    # open a buffer's one export, so none of them may decrement the owner's counter.
    assert fake.calls == [
        ("open", 3, b"mem-handle", 4096, 512, cuda.NO_COUNTER, 0, b"event-handle", True)
    ]


def test_the_owner_returns_the_exports_reference_when_the_buffer_is_freed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeTorch()
    monkeypatch.setattr(cuda, "_torch", lambda: fake)
    cuda.release(_info(ipc=IPC))
    assert fake.calls == [("release", b"/torch_counter", 7), ("collect",)]
    fake.calls.clear()
    cuda.release(_info(ipc=None, why_no_ipc="no export"))  # nothing was taken
    assert fake.calls == []
