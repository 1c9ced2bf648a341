"""A stdio MCP server's transport with bounds: the program the operator configured, started with a
minimal environment (the SDK's ``get_default_environment`` plus the configured ``env``), its
newline-delimited JSON-RPC read with a cap on one message's bytes.

The SDK's own ``stdio_client`` joins a line's chunks in one growing string, so a server that
writes a gigabyte with no newline would be held whole; here a line past ``max_message`` ends the
connection (``Lost.set(..., "too_large")``): its parts are never parsed, and no call can be told
which message it was. A line that is not JSON-RPC is dropped (logged at debug, never a traceback
per line). The server's stderr is read into a bounded tail, named in the reason when it exits,
less the values of its configured ``env`` (``hosted.redact``: its secrets).

Shutdown follows the MCP lifecycle: stdin closed, a grace period, then the process group
terminated (``terminate_posix_process_tree``), each wait bounded and shielded from the caller's
cancellation, so a cancelled caller never leaks a live server."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client._transport import TransportStreams
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from .hosted import redact
from .mcpclient import Lost

log = logging.getLogger(__name__)

GRACE = 2.0  # seconds a server has to exit after its stdin closes, and again after SIGTERM
STDERR_TAIL = 2048  # bytes of the server's stderr kept for the reason it failed


@asynccontextmanager
async def stdio_transport(command: str, args: tuple[str, ...], env: Mapping[str, str], cwd: Path | None,
                          lost: Lost, *, max_message: int) -> AsyncIterator[TransportStreams]:
    """Start ``command`` and yield the SDK's stream pair over its stdin and stdout (see the module)."""
    try:
        process = await anyio.open_process([command, *args], env=get_default_environment() | dict(env),
                                           cwd=cwd, stderr=subprocess.PIPE, start_new_session=True)
    except (OSError, ValueError) as exc:
        lost.set(f"could not start {command!r}: {exc.__class__.__name__}", "error")
        raise
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    tail = bytearray()
    secrets = tuple(env.values())  # its configured environment: its stderr may spell a token of it

    async def stdout_reader() -> None:
        assert process.stdout is not None
        buffer = bytearray()
        try:
            async with read_writer:
                async for chunk in process.stdout:
                    start = 0
                    while True:
                        end = chunk.find(b"\n", start)
                        piece = chunk[start:] if end < 0 else chunk[start:end]
                        if len(buffer) + len(piece) > max_message:
                            lost.set(f"the server sent a message over {max_message} bytes", "too_large")
                            return
                        buffer += piece
                        if end < 0:
                            break
                        start = end + 1
                        message = _parse(bytes(buffer))
                        buffer.clear()
                        if message is not None:
                            await read_writer.send(message)
                await _exits(process, 0.5)  # its status, where it exited
                lost.set(_exited(process, tail, secrets))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
            lost.set(_exited(process, tail, secrets))

    async def stderr_reader() -> None:
        assert process.stderr is not None
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
            async for chunk in process.stderr:
                tail.extend(chunk)
                del tail[:-STDERR_TAIL]

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            lost.set("the server stopped reading its input")
            await read_writer.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stderr_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                await _stop(process)
            tg.cancel_scope.cancel()


def _parse(line: bytes) -> SessionMessage | None:
    if not line.strip():
        return None
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError:
        log.debug("an MCP server wrote a line that is not JSON-RPC (%d bytes); dropped", len(line))
        return None


def _exited(process: Process, tail: bytearray, secrets: tuple[str, ...]) -> str:
    said = redact(bytes(tail).decode("utf-8", "replace"), secrets).strip().splitlines()
    last = f": {said[-1][:300]}" if said else ""
    code = process.returncode
    return (f"the server exited (status {code}){last}" if code is not None
            else f"the server closed its output{last}")


async def _stop(process: Process) -> None:
    """Close stdin, wait ``GRACE``, then terminate the process group (SIGTERM, SIGKILL)."""
    assert process.stdin is not None
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exits(process, GRACE):
        with suppress(OSError, ProcessLookupError):
            await terminate_posix_process_tree(process, GRACE)
        if not await _exits(process, GRACE):
            log.warning("MCP server process %d is still alive after SIGKILL; abandoning it", process.pid)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.aclose()
    # asyncio's transport of the process stays open (and warns when collected) unless closed
    close = getattr(getattr(getattr(process, "_process", None), "_transport", None), "close", None)
    if callable(close):
        with suppress(PermissionError):
            close()


async def _exits(process: Process, timeout: float) -> bool:
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(0.02)
    return process.returncode is not None
