"""The agent's requests to its zygote never block the agent's event loop.

A request for many procs fills the zygote's 64 KiB pipe long before the
zygote has forked them all; a blocking write held the agent's loop (and its
heartbeats) until the zygote caught up.
"""

from __future__ import annotations

import asyncio
import os
import threading

from danaus._runtime.hosting.zygote import Fork, PipeWriter, read_msg


def test_requests_beyond_the_pipe_s_capacity_wait_in_order_without_blocking() -> None:
    loop = asyncio.new_event_loop()
    r, w = os.pipe()
    try:
        broken: list[bool] = []
        writer = PipeWriter(loop, w, lambda: broken.append(True))
        boot = {"pad": "x" * 4096}
        for i in range(200):  # ~800 KiB: the pipe takes 64 KiB, the rest must wait
            writer.send(Fork(f"p{i}", boot))
        assert writer.pending, "everything fit in the pipe: the test proves nothing"

        got: list[str] = []

        def read_all() -> None:  # the zygote, slow to start
            for _ in range(200):
                msg = read_msg(r)
                assert msg is not None
                got.append(msg.name)

        reader = threading.Thread(target=read_all)
        reader.start()
        loop.run_until_complete(_until(lambda: not reader.is_alive(), loop))
        reader.join()
        assert got == [f"p{i}" for i in range(200)]
        assert not writer.pending and not broken
    finally:
        os.close(r)
        os.close(w)
        loop.close()


async def _until(done, loop) -> None:  # type: ignore[no-untyped-def]
    for _ in range(60_000):  # bounded: at most ~60 s of 1 ms polls
        if done():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the reader never got every request")
