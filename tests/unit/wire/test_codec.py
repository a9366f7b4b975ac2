"""Bodies pickle with out-of-band buffers and carry __main__-style definitions by value."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from danaus._wire import codec


def test_a_numpy_array_travels_as_one_out_of_band_buffer_without_a_copy() -> None:
    arr = np.random.default_rng(0).random(100_000)
    body, bufs = codec.dumps(arr)
    assert len(bufs) == 1 and len(body) < 1000
    assert memoryview(bufs[0]).obj is arr or np.shares_memory(np.asarray(memoryview(bufs[0])), arr)
    assert np.array_equal(codec.loads(body, [memoryview(b) for b in bufs]), arr)


def test_a_locally_defined_function_travels_by_value() -> None:
    def scale(x: int) -> int:
        return 3 * x

    body, bufs = codec.dumps(scale)
    assert codec.loads(body, bufs)(5) == 15


def test_an_unpicklable_value_raises_type_error_naming_what() -> None:
    with pytest.raises(TypeError, match="the thing cannot be pickled"):
        codec.dumps_checked(threading.Lock(), "the thing")


def test_torch_tensors_travel_out_of_band() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(10_000, dtype=torch.float32)
    body, bufs = codec.dumps(t)
    assert len(bufs) == 1
    out = codec.loads(body, [bytearray(memoryview(b)) for b in bufs])
    assert torch.equal(out, t)
    b = torch.arange(4096, dtype=torch.float32).to(torch.bfloat16)
    body, bufs = codec.dumps(b)
    out = codec.loads(body, [bytearray(memoryview(x)) for x in bufs])
    assert out.dtype == torch.bfloat16 and torch.equal(out, b)


def test_plain_data_pickles_as_the_general_path_would_and_round_trips() -> None:
    import pickle

    values = [
        7,
        "text",
        b"bytes",
        None,
        ((7,), {}),
        ((1, "a", 2.5, None, True), {}),
        ([1, 2, {"a": (1, 2.0)}], {"k": {3, 4}}),
        {"nested": [[1, 2], (3, frozenset({4}))]},
        list(range(10_000)),
    ]
    for v in values:
        body, bufs = codec.dumps(v)
        assert bufs == [] and codec.loads(body) == v
        # The same pickle stream the C pickler writes (no cloudpickle machinery needed).
        assert pickle.loads(body) == pickle.loads(pickle.dumps(v, protocol=5))


def test_a_value_that_is_not_plain_data_falls_back_to_cloudpickle() -> None:
    class Local:  # not importable by name: must travel by value
        def __init__(self, x: int) -> None:
            self.x = x

    for v in ([1, Local(2)], ((Local(3),), {}), {"k": lambda: 4}, (np.int64(5),)):
        body, bufs = codec.dumps(v)
        out = codec.loads(body, bufs)
        assert type(out) is type(v)
    assert codec.loads(*codec.dumps([1, Local(2)]))[1].x == 2
    assert codec.loads(*codec.dumps({"k": lambda: 4}))["k"]() == 4
    with pytest.raises(TypeError, match="cannot be pickled"):
        codec.dumps_checked([1, threading.Lock()], "the list")


def test_the_pooled_plain_picklers_give_each_thread_its_own_stream() -> None:
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(2_000):
                v = [k, i, {"s": str(i) * (i % 7)}]
                assert codec.loads(codec.dumps(v)[0]) == v
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_arrays_and_tensors_take_the_c_pickler_and_round_trip_exactly(monkeypatch) -> None:
    """Contiguous arrays of plain dtypes (either order, any byte order) and CPU tensors
    pickle without cloudpickle, one out-of-band buffer each (an array passed twice
    once), and come back equal, of the same dtype, shape and order, and writable."""
    monkeypatch.setattr(codec, "_dumps_general", lambda obj: pytest.fail(f"general: {obj!r:.60}"))
    arrays = [
        np.arange(100_000, dtype=np.float32),
        np.asfortranarray(np.arange(120_000, dtype=np.int64).reshape(300, 400)),
        np.arange(5000, dtype=">i4"),
        np.zeros(5000, dtype="<U5"),
        np.ones((2, 3, 1000), dtype=complex),
    ]
    for arr in arrays:
        body, bufs = codec.dumps(((arr,), {"again": arr}))
        assert len(bufs) == 1 and len(body) < 400
        (out,), kw = codec.loads(body, [bytearray(b.raw()) for b in bufs])
        assert out.dtype == arr.dtype and out.shape == arr.shape
        assert out.flags.f_contiguous == arr.flags.f_contiguous and out.flags.writeable
        assert np.array_equal(out, arr) and kw["again"] is out  # one object, as sent
    torch = pytest.importorskip("torch")
    t = torch.arange(10_000, dtype=torch.float32)
    body, bufs = codec.dumps(((t,), {}))
    assert len(bufs) == 1
    assert torch.equal(codec.loads(body, [bytearray(b.raw()) for b in bufs])[0][0], t)


def test_arrays_the_c_pickler_does_not_know_fall_back_whole() -> None:
    """An array of objects, a non-contiguous one, one whose dtype has fields or
    metadata: pickled as numpy itself does (the general path), and round trip."""
    arrays = [
        np.array([1, "x", None] * 2000, dtype=object),
        np.arange(240_000, dtype=np.float64).reshape(400, 600)[:, ::2],
        np.zeros(5000, dtype=[("a", "<f4"), ("b", "u1")]),
        np.frombuffer(bytes(40_000), dtype=np.dtype("f8", metadata={"unit": "m"})),
    ]
    for arr in arrays:
        out = codec.loads(*codec.dumps(arr))
        assert out.dtype == arr.dtype and out.dtype.metadata == arr.dtype.metadata
        assert out.shape == arr.shape and np.array_equal(out, arr)


def test_a_pooled_pickler_keeps_no_reference_to_what_it_pickled() -> None:
    import gc
    import weakref

    arr = np.arange(100_000, dtype=np.float64)
    ref = weakref.ref(arr)
    _body, bufs = codec.dumps(((arr,), {}))
    del arr, bufs
    gc.collect()
    assert ref() is None  # not kept alive by the pool's memo or buffer list


def test_large_bytes_travel_out_of_band_and_arrive_as_bytes_and_bytearrays() -> None:
    """A large bytes or bytearray among a call's arguments (or the whole value) is
    written from its own memory, not copied into the stream; the receiver gets the same
    type and content, and an object passed twice arrives as one."""
    data = bytes(range(256)) * 1024
    arr = bytearray(data)
    body, bufs = codec.dumps(((data, arr, arr), {"k": data, "small": b"x" * 100}))
    assert len(body) < 400 and len(bufs) == 2  # each object once, wherever it is
    assert any(b.raw().obj is data for b in bufs)  # no copy of the sender's bytes
    (a, b, c), kw = codec.loads(body, [memoryview(x) for x in bufs])
    assert type(a) is bytes and a == data and kw["k"] is a and kw["small"] == b"x" * 100
    assert type(b) is bytearray and b == arr and b is c
    body, bufs = codec.dumps(data)
    assert len(bufs) == 1 and codec.loads(body, bufs) == data
    # Within a value the fast pickler does not take, the general path sends it so too.
    body, bufs = codec.dumps(((data, lambda: 3), {}))
    (got, fn), _ = codec.loads(body, bufs)
    assert len(bufs) == 1 and got == data and fn() == 3
