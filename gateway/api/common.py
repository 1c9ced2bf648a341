"""What every route's handler shares beyond reading its body (``body.py``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable

from aiohttp import web

from ..appkeys import CONFIG
from ..errors import InvalidRequest
from ..protocol.params import Parsed
from ..sse import EventStream


def apply_limits(request: web.Request, parsed: Parsed) -> None:
    """server.max_messages before any work, and server.request_timeout as each request's deadline."""
    server = request.app[CONFIG].server
    messages = parsed.request.messages
    if messages is not None and len(messages) > server.max_messages:
        raise InvalidRequest(f"`messages` holds {len(messages)} messages; this server takes at most "
                             f"{server.max_messages} (server.max_messages)", "messages")
    if server.request_timeout:
        deadline = time.time() + server.request_timeout
        for req in parsed.requests:
            req.deadline = deadline


def event_stream(request: web.Request) -> EventStream:
    """A server-sent event stream for this request, its writes bounded by server.write_timeout."""
    return EventStream(request, write_timeout=request.app[CONFIG].server.write_timeout)


async def ignore_gone(write: Awaitable[object]) -> None:
    """A last write to a client that has just gone away: nothing left to tell it."""
    try:
        await write
    except ConnectionResetError:
        pass
