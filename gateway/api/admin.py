from __future__ import annotations

from aiohttp import web

from .. import __version__
from ..app import REGISTRY


async def health(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    return web.json_response({"status": "ok", "version": __version__, "models": len(registry.specs()),
                              "workers": {name: w.proc.pid for name, w in sorted(registry.loaded().items())},
                              "worker_failures": registry.worker_failures})


def setup(app: web.Application) -> None:
    app.router.add_get("/health", health)
