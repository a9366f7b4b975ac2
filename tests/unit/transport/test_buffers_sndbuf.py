"""A Unix connection asks for a send buffer a 1 MiB frame fits in, and says what fits."""

from __future__ import annotations

import socket

from danaus._transport.conn.buffers import UNIX_SNDBUF, set_unix_sndbuf


def test_a_unix_socket_gets_a_larger_send_buffer_and_reports_half_of_it() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        before = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        fits = set_unix_sndbuf(a)
        after = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert after >= before  # never smaller
        assert fits == after // 2
        with open("/proc/sys/net/core/wmem_max") as f:
            allowed = int(f.read())
        # The kernel grants what we asked for, up to wmem_max, and doubles it.
        assert after == 2 * min(UNIX_SNDBUF, allowed) or after == before
        if allowed >= UNIX_SNDBUF:
            # Then a 1 MiB frame leaves in one non-blocking write.
            a.setblocking(False)
            assert a.send(bytes(1 << 20)) == 1 << 20
