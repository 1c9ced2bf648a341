"""The gateway's own page: the dashboard and playground at ``/`` (static files shipped in the
package, ``gateway/api/web/``: ``index.html`` at ``/``, every other file at ``/ui`` and its path
there, the script as ES modules the browser loads itself), and the live stream it draws from
(``/dashboard/live``).

The page's files are open to all, as they hold no data; everything the page shows comes from
routes behind the API keys (``/models``, ``/dashboard/live``, the admin and chat routes), which
the page calls with the key its user gives it (kept in ``sessionStorage``). The Host guard and
CORS apply as to the API. The page (``index.html``, ``app.css``, and the ES modules ``app.js``:
the key form and the start; ``lib/``: requests, DOM, formats, the live stream, ``panels.js``
with the cards' hooks and their shared head; one module per card in ``cards/``, which imports
``lib/`` and never another card) has no build step, no library and nothing from another
origin, and is served under a strict Content-Security-Policy;
``tests/test_dashboard_browser.py`` and ``tests/test_captures_browser.py`` drive it in Chromium.

``/dashboard/mcp`` lists the configured MCP servers the key may use (``tools/hosted.may_use``):
each one's transport, state, tools, calls and last error (``McpTools.status``), for the page's MCP
card, with the path of the gateway's own MCP endpoint (``api/mcp``).

``/dashboard/live`` streams snapshots: ``/models``' rows, ``live.Live``'s per-model series and
recent requests (with keys, each key's own, by ``OWNER``, which the observation carries and
``Live.record`` keeps beside the event, never in it), the models' queues (``queues``: to an
admin every model's, as ``/admin/queues``; to a user key those of the models it may use, its
own key's rows kept and every other key's folded into one, ``serving.queues.folded``), and
whether the key is an admin's (the page asks for ``/captures`` only then).
"""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from aiohttp import web

from ..access.scope import SCOPE, visible
from ..server.events import OWNER
from ..serving import queues
from ..tools.hosted import may_use
from .access import KEY, is_admin
from .admin import describe
from .appkeys import GATE, LIFECYCLE, LIVE, MCP_SERVERS, REGISTRY
from .common import event_stream
from .mcp import PATH as MCP_PATH

if TYPE_CHECKING:
    from importlib.abc import Traversable

WEB = resources.files("gateway.api") / "web"
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}  # a module must be text/javascript


def page_files(folder: Traversable = WEB, prefix: str = "") -> dict[str, str]:
    """URL path -> the file's path under ``web/``: ``index.html`` at ``/``, the rest at ``/ui/...``
    (``web/cards/models.js`` at ``/ui/cards/models.js``); only the types of ``TYPES``."""
    files: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        name = prefix + entry.name
        if entry.is_dir():
            files.update(page_files(entry, name + "/"))
        elif name == "index.html":
            files["/"] = name
        elif PurePosixPath(name).suffix in TYPES:
            files["/ui/" + name] = name
    return files


FILES = page_files()
PAGE_PATHS = frozenset(FILES)  # open without a key, and not observed as requests
LIVE_EVERY = 1.0  # seconds between the live stream's snapshots

# Only the page's own files run, nothing is inlined, and the page talks to this origin alone.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def snapshot(request: web.Request) -> dict:
    """What the page draws. With API keys set, the recent requests are the asking key's own, by
    the key itself (``OWNER``), not its name, which two keys may share: another key's prompts'
    models, sizes and timings are not its to see; an admin's key sees every key's with
    ``?all=1``. The models are those the key may use."""
    registry, live = request.app[REGISTRY], request.app[LIVE]
    now = time.time()
    everyone = not request.app[GATE].keys or (is_admin(request) and request.query.get("all") in ("1", "true"))
    recent = live.recent(owner=request.get(OWNER), everyone=everyone)
    models = visible(registry.specs())
    series = live.series(now)
    if SCOPE.get() is not None:  # another model's traffic is not the key's to see
        names = {s.name for s in models}
        series["points"] = [{**p, "models": {m: v for m, v in p["models"].items() if m in names}}
                            for p in series["points"]]
    return {"time": now, "models": [describe(registry, s) for s in models],
            "series": series, "recent": recent,
            "pulls": registry.pulls.rows() if is_admin(request) else [],
            "queues": queue_rows(request),
            "admin": is_admin(request)}  # what the page may ask for: the captures are an admin's


def queue_rows(request: web.Request) -> list[dict]:
    """The queues the page shows: an admin's (or anyone's without keys) every model's; a user
    key's, the models it may use, with every other key's rows folded (``queues.folded``)."""
    registry = request.app[REGISTRY]
    if is_admin(request):
        return queues.rows(registry.supervisors.all())
    key = request.get(KEY)
    names = {s.name for s in visible(registry.specs())}
    mine = queues.rows(m for m in registry.supervisors.all() if m.spec.name in names)
    return queues.folded(mine, key.name if key is not None else "")


async def live_stream(request: web.Request) -> web.StreamResponse:
    """A snapshot every ``LIVE_EVERY`` seconds (``event: snapshot``) until the client leaves or
    the gateway drains."""
    sse = event_stream(request)
    await sse.open()
    try:
        while not request.app[LIFECYCLE]["draining"]:
            await sse.send(snapshot(request), event="snapshot")
            await asyncio.sleep(LIVE_EVERY)
        await sse.close()
    except ConnectionResetError:
        pass
    return sse.response


async def mcp_servers(request: web.Request) -> web.Response:
    """``GET /dashboard/mcp``: ``{"endpoint": "/mcp", "servers": [status rows]}``, the rows of the
    servers the key may use (none where no MCP server is set)."""
    servers, key = request.app.get(MCP_SERVERS), request.get(KEY)
    patterns = key.mcp if key is not None else None
    rows = [r for r in servers.status() if may_use(patterns, str(r.get("name")))] if servers is not None else []
    return web.json_response({"endpoint": MCP_PATH, "servers": rows})


def setup(app: web.Application) -> None:
    for path, name in FILES.items():
        body = WEB.joinpath(*name.split("/")).read_bytes()  # read once, at start: a few small files
        content_type = TYPES[PurePosixPath(name).suffix]

        async def page(request: web.Request, body: bytes = body, content_type: str = content_type) -> web.Response:
            return web.Response(body=body, content_type=content_type, charset="utf-8", headers=HEADERS)

        app.router.add_get(path, page)
    app.router.add_get("/dashboard/live", live_stream)
    app.router.add_get("/dashboard/mcp", mcp_servers)
