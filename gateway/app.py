"""``create_app(config)``: the aiohttp application, its typed state and middlewares."""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Awaitable, Callable

from aiohttp import web

from .config import Config
from .errors import ApiError
from .registry import Registry

log = logging.getLogger(__name__)

CONFIG = web.AppKey("config", Config)
REGISTRY = web.AppKey("registry", Registry)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health"})


def is_anthropic(request: web.Request) -> bool:
    return request.path.startswith("/v1/messages")


def error_response(request: web.Request, err: ApiError) -> web.Response:
    body = err.anthropic_body() if is_anthropic(request) else err.openai_body()
    return web.json_response(body, status=err.status, headers=err.headers)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves in the caller's wire shape; nothing leaks a traceback."""
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(request, err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {404: f"No route for {request.method} {request.path}",
                   405: f"Method {request.method} is not allowed on {request.path}"}.get(exc.status, exc.reason)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status)
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(request, ApiError(message, status=exc.status, code=code, headers=headers))
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(request, ApiError("Internal server error", status=500, code="internal_error"))


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def auth_middleware(keys: tuple[str, ...]):
    """Bearer or ``x-api-key``; both sides hashed so the comparison is constant-time."""
    digests = [_digest(k) for k in keys]

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or request.method == "OPTIONS":
            return await handler(request)
        auth = request.headers.get("Authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        d = _digest(given)
        if not given or not any(hmac.compare_digest(d, k) for k in digests):
            raise ApiError("Invalid or missing API key", status=401, code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return middleware


def create_app(config: Config, registry: Registry | None = None) -> web.Application:
    from .api import admin, anthropic, openai

    middlewares = [errors_middleware]
    if config.server.api_keys:
        middlewares.append(auth_middleware(config.server.api_keys))
    app = web.Application(middlewares=middlewares)
    app[CONFIG] = config
    app[REGISTRY] = registry if registry is not None else Registry(config)
    app.cleanup_ctx.append(_workers_ctx)
    admin.setup(app)
    openai.setup(app)
    anthropic.setup(app)
    return app


async def _workers_ctx(app: web.Application):
    await app[REGISTRY].preload()
    yield
    await app[REGISTRY].close()
