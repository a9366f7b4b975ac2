"""Where the debugger prompt is shown: a ``danaus debug`` over a Unix socket, or the client's
own terminal.

The socket speaks JSON lines. The controller sends ``{"o": text}`` (output),
``{"p": prompt}`` (read one line) and ``{"bye": text}`` (closing); the CLI
answers each prompt with ``{"i": line}``. The socket lives in the client's
job directory (mode 0700, so only its user can reach it) and every
connection's peer user id is checked besides, so no one else can drive a
paused actor (which runs arbitrary code).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import sys
from typing import Any

__all__ = [
    "MAX_LINE",
    "Frontend",
    "FrontendClosed",
    "SocketFrontend",
    "TerminalFrontend",
    "same_user",
]

MAX_LINE = 1 << 20  # the longest line `danaus debug` may send; a longer one closes it


class FrontendClosed(Exception):
    """The person at the prompt went away (EOF, closed socket)."""


class Frontend:
    """One prompt the debugger talks to."""

    leaves_when_idle = False  # give the terminal back once no session is paused

    async def write(self, text: str) -> None:
        raise NotImplementedError

    async def input(self, prompt: str) -> str:
        """One line typed at ``prompt`` (without its newline); raises `FrontendClosed`."""
        raise NotImplementedError

    def close(self, message: str) -> None:
        """Say ``message`` and let go of the prompt (does not block)."""
        raise NotImplementedError


class SocketFrontend(Frontend):
    """A ``danaus debug`` connected to the client's debug socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    def _send(self, msg: dict[str, str]) -> None:
        if self._writer.is_closing():
            raise FrontendClosed("danaus debug disconnected")
        self._writer.write(json.dumps(msg).encode() + b"\n")

    async def write(self, text: str) -> None:
        self._send({"o": text})
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as e:
            raise FrontendClosed(str(e)) from e

    async def input(self, prompt: str) -> str:
        self._send({"p": prompt})
        try:
            await self._writer.drain()
            raw = await self._reader.readline()
        except (ConnectionError, OSError, ValueError) as e:  # ValueError: line over the limit
            raise FrontendClosed(str(e)) from e
        if not raw.endswith(b"\n"):
            raise FrontendClosed("danaus debug disconnected")
        try:
            line = json.loads(raw)["i"]
        except (ValueError, KeyError, TypeError) as e:
            raise FrontendClosed(f"danaus debug sent a malformed line: {raw[:80]!r}") from e
        if not isinstance(line, str):
            raise FrontendClosed(f"danaus debug sent a malformed line: {raw[:80]!r}")
        return line

    def close(self, message: str) -> None:
        if not self._writer.is_closing():
            try:
                self._writer.write(json.dumps({"bye": message}).encode() + b"\n")
            except (ConnectionError, OSError):
                pass
            self._writer.close()


class TerminalFrontend(Frontend):
    """The client's own terminal (its stdin and stdout are a tty)."""

    leaves_when_idle = True

    def __init__(self) -> None:
        self._buf = b""
        self._fd = sys.stdin.fileno()

    async def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    async def input(self, prompt: str) -> str:
        await self.write(prompt)
        while b"\n" not in self._buf:
            self._buf += await self._read()
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode(errors="replace")

    async def _read(self) -> bytes:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()

        def readable() -> None:
            err: OSError | None = None
            try:
                data = os.read(self._fd, 4096)
            except OSError as e:
                data, err = b"", e
            if not fut.done():
                if data:
                    fut.set_result(data)
                else:
                    fut.set_exception(FrontendClosed(f"the terminal closed ({err or 'EOF'})"))

        loop.add_reader(self._fd, readable)
        try:
            return await fut
        finally:
            loop.remove_reader(self._fd)

    def close(self, message: str) -> None:
        sys.stdout.write(message + "\n")
        sys.stdout.flush()

    @staticmethod
    def available() -> bool:
        """Whether this process's stdin and stdout are an interactive terminal."""
        try:
            return sys.stdin is not None and sys.stdin.isatty() and sys.stdout.isatty()
        except (ValueError, OSError):  # closed or detached streams
            return False


def same_user(writer: asyncio.StreamWriter) -> bool:
    """Whether the process at the other end of a Unix socket runs as this user."""
    sock: Any = writer.get_extra_info("socket")
    peercred = getattr(socket, "SO_PEERCRED", None)
    if sock is None or peercred is None:  # pragma: no cover - not Linux: the 0700 dir guards
        return True
    raw = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return bool(uid == os.getuid())
