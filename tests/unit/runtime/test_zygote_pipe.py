"""The agent's pipe to its zygote, in one process: typed records, a gone zygote, and
requests beyond the pipe's capacity, which never block the agent's event loop.

A request for many procs fills the zygote's 64 KiB pipe long before the
zygote has forked them all; a blocking write held the agent's loop (and its
heartbeats) until the zygote caught up.
"""

from __future__ import annotations

import asyncio
import os
import threading

from danaus._runtime.hosting.zygote import Exited, Fork, Forked, PipeWriter, read_msg, write_msg


def test_a_gone_zygote_is_reported_once_and_nothing_is_kept() -> None:
    loop = asyncio.new_event_loop()
    r, w = os.pipe()
    os.close(r)
    try:
        broken: list[bool] = []
        writer = PipeWriter(loop, w, lambda: broken.append(True))
        writer.send(Fork("p0", {}))
        assert broken == [True]
        assert not writer.pending
    finally:
        os.close(w)
        loop.close()


def test_the_zygote_s_reports_cross_the_pipe_as_typed_records() -> None:
    r, w = os.pipe()
    try:
        write_msg(w, Forked("p0", 123))
        write_msg(w, Exited("p0", 123, 9))
        assert read_msg(r) == Forked("p0", 123)
        assert read_msg(r) == Exited("p0", 123, 9)
    finally:
        os.close(r)
        os.close(w)


def test_requests_beyond_the_pipe_s_capacity_wait_in_order_without_blocking() -> None:
    loop = asyncio.new_event_loop()
    r, w = os.pipe()
    got: list[str] = []
    finished: asyncio.Future[None] = loop.create_future()

    def read_all() -> None:  # the zygote, slow to start
        try:
            for _ in range(200):
                msg = read_msg(r)
                assert msg is not None
                got.append(msg.name)
        finally:  # wake the loop, which writes the rest meanwhile
            loop.call_soon_threadsafe(finished.set_result, None)

    reader = threading.Thread(target=read_all)
    try:
        broken: list[bool] = []
        writer = PipeWriter(loop, w, lambda: broken.append(True))
        boot = {"pad": "x" * 4096}
        for i in range(200):  # ~800 KiB: the pipe takes 64 KiB, the rest must wait
            writer.send(Fork(f"p{i}", boot))
        assert writer.pending, "everything fit in the pipe: the test proves nothing"
        reader.start()
        try:
            loop.run_until_complete(asyncio.wait_for(finished, 60))
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            raise AssertionError("the reader never got every request") from None
        reader.join()
        assert got == [f"p{i}" for i in range(200)]
        assert not writer.pending and not broken
    finally:
        os.close(w)  # a reader still waiting sees the end of the pipe, and stops
        if reader.is_alive():
            reader.join(60)
        os.close(r)
        loop.close()
