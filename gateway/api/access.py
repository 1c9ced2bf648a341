"""Who asks, and what they may do: the access middleware, and the marks routes carry for it.

A handler marked ``spends(wire)`` spends tokens (a generation, embeddings, a rerank): its key's
limits are checked before it runs, and what it spent is charged and recorded (per key, model,
wire and hour: ``access/usage``) when it ends, whether it answered, failed or its client left.
A handler marked ``admin_only`` is refused to a key whose role is ``user``. With keys, a request
names its key by ``Authorization: Bearer`` or ``x-api-key``; it is named by the key's name
(``PRINCIPAL``: the log, the events, the page), owned by the key itself (``OWNER``:
``access.keys.owner_of``: stored responses, cache scope) and held to the key's models
(``access.scope.SCOPE``, for the request's task) and waits for a busy model as its key's share
(``access.claims.CLAIM``: without keys, its address's). On the open paths a key is optional, and a
key given still names and owns the request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..access.claims import CLAIM, claim_of
from ..access.gate import Gate, Pass
from ..access.keys import owner_of
from ..access.limits import Limit, Refusal
from ..access.scope import SCOPE
from ..base.errors import ApiError
from ..models.config import KeySpec
from ..server.events import OBSERVATION, OWNER, PRINCIPAL, request_key
from .appkeys import GATE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KEY = request_key("api_key", KeySpec)  # the request's key, where one was given

_WIRE = "_gateway_wire"
_ADMIN = "_gateway_admin_only"


def spends(wire: str) -> Callable[[Any], Any]:
    """Mark a handler as one that spends tokens on ``wire`` (chat, completions, embeddings,
    messages, responses, ollama, fim, rerank; mcp: no tokens, but its limits and captures)."""
    def mark(handler: Any) -> Any:
        setattr(handler, _WIRE, wire)
        return handler
    return mark


def admin_only(handler: Any) -> Any:
    """Mark a handler as an admin's alone: loading, unloading, pulling, deleting, reloading."""
    setattr(handler, _ADMIN, True)
    return handler


def wire_of(request: web.Request) -> str | None:
    """The wire a request's handler spends tokens on (``spends``), or None."""
    return getattr(request.match_info.handler, _WIRE, None)


def is_admin(request: web.Request) -> bool:
    """Whether the request may do what only an admin may: its key's role is admin, or the
    gateway has no keys (then everyone is)."""
    key = request.get(KEY)
    return key.role == "admin" if key is not None else not request.app[GATE].keys


def require_admin(request: web.Request, what: str) -> None:
    if not is_admin(request):
        raise forbidden(request, what)


def forbidden(request: web.Request, what: str) -> ApiError:
    key = request.get(KEY)
    name = key.name if key is not None else "anonymous"
    return ApiError(f"Key {name!r} is a user key: {what} needs an admin key", status=403, code="forbidden")


def refused(refusal: Refusal) -> ApiError:
    """A limit reached: 429 with Retry-After, in the caller's wire shape (the errors middleware)."""
    code = "budget_exceeded" if refusal.limit is Limit.BUDGET else "rate_limit_exceeded"
    return ApiError(refusal.message, status=429, code=code,
                    headers={"Retry-After": str(refusal.seconds),
                             "X-Gateway-Limit": refusal.limit.value})


def _given(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "").strip()


def access_middleware(open_paths: frozenset[str]):
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS":
            return await handler(request)
        gate = request.app[GATE]
        key = None
        if gate.keys:
            given = _given(request)
            key = gate.keys.find(given)
            if key is not None and key.expires is not None and time.time() >= key.expires:
                if request.path not in open_paths:
                    raise ApiError(f"API key {key.name!r} expired", status=401, code="expired_api_key",
                                   headers={"WWW-Authenticate": "Bearer"})
                key = None
            if key is None:
                if request.path in open_paths:
                    return await handler(request)
                raise ApiError("Invalid or missing API key", status=401, code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
            request[PRINCIPAL], request[OWNER], request[KEY] = key.name, owner_of(given), key
        target = request.match_info.handler
        if key is not None and key.role != "admin" and getattr(target, _ADMIN, False) \
                and request.path not in open_paths:
            raise forbidden(request, f"{request.method} {request.path}")
        token = SCOPE.set(key.models) if key is not None and key.models else None
        claimed = CLAIM.set(claim_of(key, request.remote))
        try:
            wire = getattr(target, _WIRE, None)
            if wire is None:
                return await handler(request)
            passed = gate.admit(key)
            if isinstance(passed, Refusal):
                if key is not None and gate.on_limited is not None:
                    gate.on_limited(key.name, key.named, passed.limit.value)
                raise refused(passed)
            return await _spend(request, handler, gate, passed, wire)
        finally:
            CLAIM.reset(claimed)
            if token is not None:
                SCOPE.reset(token)

    return middleware


async def _spend(request: web.Request, handler: Handler, gate: Gate, passed: Pass, wire: str) -> web.StreamResponse:
    try:
        return await handler(request)
    finally:
        obs = request.get(OBSERVATION)
        if obs is None:
            gate.done(passed, "-", wire, 0, 0)
        else:
            gate.done(passed, obs.model, wire, obs.prompt_tokens, obs.completion_tokens)
