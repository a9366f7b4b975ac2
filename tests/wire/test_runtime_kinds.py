"""A runtime's table of frame kinds takes one handler per kind (moved from the wire's
tests, which import no runtime: its place is tests/unit/messaging once the issue 39
refactor's branch, which adds that directory, is merged)."""

from __future__ import annotations

import pytest

from danaus._wire.protocol import Kind


def test_a_second_handler_for_a_kind_is_refused(tmp_path) -> None:
    from danaus._runtime.messaging.runtime import Runtime

    rt = Runtime("t", str(tmp_path))
    try:
        with pytest.raises(RuntimeError, match="frame kind CALL already has a handler"):
            rt.register(Kind.CALL, lambda conn, msg: None)
        rt.register(Kind.RDMA_DATA, lambda conn, msg: None)
        with pytest.raises(RuntimeError, match="RDMA_DATA already has a handler"):
            rt.register(Kind.RDMA_DATA, lambda conn, msg: None)
    finally:
        rt.loop.close()
