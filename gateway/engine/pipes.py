"""The worker's side of the pipes to the gateway (``ipc``'s frames): blocking reads of commands
on the worker's reader thread, blocking writes of events from its main loop."""

from __future__ import annotations

import os

from .ipc import _HEADER, Command, decode_command


def read_command_blocking(fd: int) -> Command | None:
    """One command from ``fd``, or None at end of file."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (n,) = _HEADER.unpack(header)
    body = _read_exact(fd, n)
    return None if body is None else decode_command(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def write_all_blocking(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
