"""OpenAI wire shape."""

from __future__ import annotations

from aiohttp import web

from ..app import REGISTRY


async def list_models(request: web.Request) -> web.Response:
    data = []
    for spec in request.app[REGISTRY].specs():
        try:
            created = int(spec.path.stat().st_mtime)
        except OSError:
            created = 0
        data.append({"id": spec.name, "object": "model", "created": created, "owned_by": "local"})
    return web.json_response({"object": "list", "data": data})


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
