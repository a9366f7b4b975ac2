"""The agent's pipe to its zygote, in one process: typed records, and a gone zygote."""

from __future__ import annotations

import asyncio
import os

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
