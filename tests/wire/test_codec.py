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
