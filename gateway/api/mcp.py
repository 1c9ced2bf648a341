"""The gateway as one MCP server: ``POST /mcp`` (streamable HTTP) offers the tools of every
configured MCP server (``server.mcp_servers``) the caller's key may use, each named
``<server>_<tool>`` (``tools/hosted.function_name``, llama-server's naming), so a client adds one
URL (``claude mcp add --transport http gateway http://127.0.0.1:8080/mcp``) instead of one per
server.

The protocol is the official ``mcp`` SDK's (``api/mcpserver``, imported at the first request):
its low-level ``Server`` (``tools/list``, ``tools/call``) behind its
``StreamableHTTPSessionManager`` in stateless JSON mode: each POST is one self-contained
exchange answered with one JSON body, and no session is kept between them, so none can pile up.
``GET /mcp`` (a stream the server would push on) and ``DELETE /mcp`` (a session's end) are 405,
as the transport allows a server without them. The manager runs in a task of its own from the
first request to the application's cleanup (its task group must be entered and left in one
task); ``api/asgi.serve`` hands it each request.

Access is the API's (``api/access``): with keys, a key is needed (401 without), a user key may
use it, and its ``mcp`` list (``tools/hosted.may_use``) says which servers it sees and calls;
the host check and the browser guard of ``app.py`` apply. The body is read by ``api/body``
(``server.max_body_bytes``, ``server.body_timeout``, strict JSON) and the answer is bounded
(``MAX_ANSWER_BYTES``).

A server whose tools cannot be listed (``ToolError``, or past ``server.tool_timeout``) is left
out of the list, and logged; the others are listed. A call is split back into its server and
tool by the longest configured name, of those the key may use, that prefixes it; a failed call
(``ToolError``) is a result with ``isError`` and the reason; a name that is no usable server's
is the protocol's error (invalid params, "Unknown tool").
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..server.events import observation
from .access import KEY, spends
from .asgi import serve
from .body import read_json

PATH = "/mcp"
MAX_ANSWER_BYTES = 16 * 2**20  # one answer's bytes: a list of every server's tools, or one call's result


class Held:
    """The application's ``mcpserver.Endpoint``, made at the first request (the SDK imported then)."""

    endpoint: Any = None


ENDPOINT = web.AppKey("mcp_endpoint", Held)


@spends("mcp")  # held to the key's rpm, max_parallel and budget, as every route that works for it
async def handle(request: web.Request) -> web.StreamResponse:
    """``POST /mcp``: one MCP exchange (as the module says)."""
    from .mcpserver import SCOPE_KEY, Caller, Endpoint

    body = await read_json(request)  # one message: JSON-RPC batches left the protocol in 2025
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    key = request.get(KEY)
    obs = observation(request)
    caller = Caller(key.name, key.mcp, obs) if key is not None else Caller("anonymous", None, obs)
    # the body as parsed and written again: decoded, so its length is said anew and no encoding
    headers = [(k, v) for k, v in request.raw_headers if k.lower() not in (b"content-length", b"content-encoding")]
    headers.append((b"content-length", str(len(raw)).encode()))
    held = request.app[ENDPOINT]
    if held.endpoint is None:
        held.endpoint = Endpoint(request.app)
    manager = await held.endpoint.started()
    return await serve(manager.handle_request, request, raw, headers=headers, extra={SCOPE_KEY: caller},
                       max_bytes=MAX_ANSWER_BYTES)


async def _close(app: web.Application) -> None:
    if app[ENDPOINT].endpoint is not None:
        await app[ENDPOINT].endpoint.close()


def setup(app: web.Application) -> None:
    app[ENDPOINT] = Held()
    app.on_cleanup.append(_close)
    app.router.add_post(PATH, handle)
