"""The worker's side of the pipes to the gateway (``protocol/framing.py``'s frames): its commands
read without blocking by its main loop itself (``CommandReader``), which waits on the command pipe
and on a ``Wakeup`` its prep threads set (``Waiter``); its events written blocking, from the main
loop.

The main loop reads its own pipe, with no reader thread between: a command is taken at the
first pass of the loop after it arrives, one wake-up (the loop's) rather than two (a reader
thread's, then the loop's through a queue)."""

from __future__ import annotations

import os
import select

from ..protocol import Command, decode_command
from ..protocol.framing import HEADER

# A command frame's length past this is refused: no command the gateway makes comes near it (a
# request's body is bounded by ``server.max_body_bytes``), so such a length is a broken pipe's,
# and waiting for its body would hold the worker's memory for nothing.
MAX_COMMAND_BYTES = 1 << 30
READ_BYTES = 1 << 16  # a pipe's buffer on Linux: one read takes what a write of it left


class FrameTooLarge(ValueError):
    """A command frame's header gives a length over the bound."""


class CommandReader:
    """The command pipe ``fd``, made non-blocking, read by the worker's main loop: ``read`` takes
    what the pipe holds now, never waiting, and returns the commands whose frames are whole, in
    order; a frame's part waits in the buffer for its rest. At the pipe's end (the gateway is
    gone) ``read`` returns None after the commands before it (in that read or an earlier one:
    a read that got less than it asked for does not ask again, and the pipe stays ready to a
    poll); a frame cut short there is dropped. A frame's length past ``max_bytes`` raises
    ``FrameTooLarge``, and a frame that is not a command raises what ``protocol.decode_command``
    raises."""

    def __init__(self, fd: int, max_bytes: int = MAX_COMMAND_BYTES):
        os.set_blocking(fd, False)
        self.fd = fd
        self.max_bytes = max_bytes
        self.ended = False  # the pipe's end was read
        self._buf = bytearray()

    def read(self) -> list[Command | None]:
        buf = self._buf
        while not self.ended:
            try:
                chunk = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                break
            except OSError:  # an unreadable pipe: the gateway is gone as surely
                chunk = b""
            if not chunk:
                self.ended = True
            buf += chunk
            if len(chunk) < READ_BYTES:
                break  # (what is left came after this read: the next poll says so)
        out: list[Command | None] = []
        at, size = 0, HEADER.size
        while len(buf) - at >= size:
            (n,) = HEADER.unpack_from(buf, at)
            if n > self.max_bytes:
                raise FrameTooLarge(f"a command frame of {n} bytes, over the bound of {self.max_bytes}")
            if len(buf) - at - size < n:
                break
            out.append(decode_command(bytes(buf[at + size:at + size + n])))
            at += size + n
        del buf[:at]
        if self.ended:
            buf.clear()  # a frame cut short by the end: nothing more of it will come
            out.append(None)
        return out


class Wakeup:
    """A file descriptor another thread makes readable (``set``) and the main loop makes quiet
    again (``clear``), so that one wait covers the command pipe and the prep threads' results:
    an eventfd where the system has one (Linux), else a pipe (macOS). A thread puts its result
    where the loop takes it first, then sets; the loop clears, then takes, so no result is left
    behind a wait."""

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self.fd = self._w = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:
            self.fd, self._w = os.pipe()
            os.set_blocking(self.fd, False)
            os.set_blocking(self._w, False)

    def set(self) -> None:
        try:
            os.write(self._w, b"\1\0\0\0\0\0\0\0")  # an eventfd's 8-byte count; to a pipe, any byte
        except BlockingIOError:  # a full pipe (or count) is readable already
            pass

    def clear(self) -> None:
        try:
            os.read(self.fd, READ_BYTES)  # an eventfd's count to zero; a pipe's bytes
        except BlockingIOError:
            pass


class Waiter:
    """The main loop's one wait: on the command pipe and on the wakeup. ``wait(block)`` answers
    (commands ready, wakeup set); without ``block`` it only looks (one ``poll`` system call).
    ``take(block)`` is what the loop calls between two steps: the commands the pipe holds, the
    wakeup cleared where it was set, so that the inbox is read after it."""

    def __init__(self, commands: CommandReader, wakeup: Wakeup):
        self.commands, self.wakeup = commands, wakeup
        self._poll = select.poll()
        self._poll.register(commands.fd, select.POLLIN)  # (the pipe's end reads as POLLHUP: ready too)
        self._poll.register(wakeup.fd, select.POLLIN)

    def wait(self, block: bool) -> tuple[bool, bool]:
        ready = self._poll.poll(None if block else 0)
        if not ready:
            return False, False
        fds = [fd for fd, _ in ready]
        return self.commands.fd in fds, self.wakeup.fd in fds

    def take(self, block: bool) -> list[Command | None]:
        commands, woken = self.wait(block)
        if woken:
            self.wakeup.clear()  # before the inbox is read: a result put after this sets it again
        return self.commands.read() if commands else []

    def first(self) -> list[Command | None]:
        """The first commands, waited for (nothing sets the wakeup before them)."""
        while not (came := self.take(block=True)):
            pass
        return came


def write_all_blocking(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
