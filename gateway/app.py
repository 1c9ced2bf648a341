"""``create_app(config)``: the aiohttp application, its typed state and middlewares.

The middlewares, from the outside in:
1. connection: the connection guard's state (``server/connections``: a handler runs, its
   header and keep-alive deadlines pause);
2. observe: the request id, one ``Observation`` (metrics, the inference event), its trace
   and its capture where those are on;
3. errors: every failure in the caller's wire shape (``error_response``; in-band once a
   stream opened: ``failed_response``);
4. host check, when bound to loopback (DNS rebinding);
5. browser guard: a request that changes something from a page of another origin is refused
   unless ``server.cors_origins`` allows it (CSRF; ``cross_site`` is its pure policy);
6. CORS, when origins are configured;
7. access (``api/access.py``): the key, its role against ``admin_only``, its models' scope, and
   for a handler marked ``spends(wire)`` its limits (``Gate.admit``: a 429 naming the limit) and
   its charge when it ends, however it ends (``Gate.done``: the limits, the usage store, the
   per-key metrics); without keys it records usage as ``anonymous``.

``server_settings`` holds the per-connection aiohttp settings the command line serves with. Handlers
read the application's state through ``api/appkeys.py``, never through this module.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from .access.gate import Gate
from .access.keys import owner_of  # noqa: F401 (re-exported: what a key's requests leave behind is its own)
from .api import admin, anthropic, captures, compaction, dashboard, lora, mcp, ollama, openai, pulls, responses, usage
from .api.access import access_middleware, wire_of
from .api.appkeys import (
    CAPTURES,
    CONFIG,
    CONNECTIONS,
    EVENTS,
    GATE,
    LIFECYCLE,
    LIVE,
    MCP_SERVERS,
    METRICS,
    REGISTRY,
    SEAL_KEY,
    TOOLS,
    TRACING,
)
from .backends.workerclient import RequestFailed
from .base import tracecontext
from .base.addresses import is_loopback
from .base.errors import ApiError, shown
from .base.secretfile import KeptSecret
from .models.config import Config, default_kv_cache_dir, default_state_dir
from .server import tracing
from .server.captures import CAPTURE, CaptureStore
from .server.captures import FOLDER as CAPTURE_FOLDER
from .server.connections import ConnectionGuard, Limits, per_connection
from .server.events import ERROR_CODE, OBSERVATION, OWNER, PRINCIPAL, STREAM, EventSink, Observation, request_id
from .server.fetch import WebSessions
from .server.live import Live
from .server.metrics import Metrics
from .serving.registry import Registry, upstream_rows
from .tools.mcpservers import McpServers
from .tools.toolbox import Services
from .wire.answer import api_error

__all__ = ["CONFIG", "CONNECTIONS", "EVENTS", "LIFECYCLE", "METRICS", "REGISTRY", "create_app", "server_settings"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health"}) | dashboard.PAGE_PATHS
# the key a reasoning item's encrypted_content is signed with, in the gateway's state folder
# (where its saved KV caches are), made on first use and kept across restarts
SEAL_FILE = "seal.key"
# no inference event, no request metrics
UNOBSERVED = frozenset({"/health", "/metrics", "/dashboard/live", "/usage"}) | dashboard.PAGE_PATHS


def is_anthropic(request: web.Request) -> bool:
    return request.path.startswith("/v1/messages")


def error_response(request: web.Request, err: ApiError) -> web.Response:
    request[ERROR_CODE] = err.code or f"http_{err.status}"
    if request.path.startswith("/api/"):  # Ollama's shape: the message alone
        body: dict = {"error": err.message}
    else:
        body = err.anthropic_body() if is_anthropic(request) else err.openai_body()
    response = web.json_response(body, status=err.status, headers=err.headers)
    if err.headers.get("Connection") == "close":  # the header alone leaves aiohttp's connection open
        response.force_close()
    return response


def endpoint_of(request: web.Request) -> str:
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "other"


@per_connection
@web.middleware
async def connection_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection guard a handler runs: its header and keep-alive deadlines pause."""
    guard, transport = request.app[CONNECTIONS], request.transport
    guard.begin(transport)
    try:
        return await handler(request)
    finally:
        guard.end(transport)


def server_settings(config: Config) -> dict:
    """aiohttp's per-connection settings for serving ``create_app(config)``: bodies arrive as
    sent (``api/body.py`` decodes them, bounded), keep-alive as configured, and a handler is
    cancelled when its client goes away."""
    keepalive = config.server.keepalive_timeout
    # lingering: after an answer given before its body was read (a 413, a 408), the rest of the
    # body is read and dropped this long, so the client sees the answer and not a reset
    # aiohttp's own keep-alive is only a backstop: the connection guard closes idle ones (and counts them)
    return {"auto_decompress": False, "keepalive_timeout": keepalive + 5 if keepalive else 3630,
            "handler_cancellation": True, "access_log": None, "lingering_time": 2.0}


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id in and out, and one observation per request: metrics plus an inference event;
    where they are on, its trace (``server/tracing``) and its capture (``server/captures``: a
    request that spends tokens). The trace context a request came with, or its own span's, goes
    on to any upstream it calls (``base/tracecontext``)."""
    rid = request_id(request.headers.get("X-Request-Id"))
    if request.path in UNOBSERVED:
        return await handler(request)
    app = request.app
    obs = request[OBSERVATION] = Observation(rid, endpoint_of(request))
    tracer, span = app[TRACING], None
    forward: tuple[tuple[str, str], ...] = ()
    if tracer is not None:
        try:
            span = tracer.begin(request.headers, obs, request.method, obs.endpoint)
            forward = tracer.forward(span)
        except Exception:  # a trace is the operator's view: its failure is logged, never the request's
            log.exception("tracing could not begin this request's trace")
    else:
        forward = tracecontext.incoming(request.headers) if "traceparent" in request.headers else ()
    token = tracecontext.FORWARD.set(forward) if forward else None
    store = app[CAPTURES]
    if store.enabled and wire_of(request) is not None:
        request[CAPTURE] = store.begin(request.method, request.path, request.query_string, request.headers,
                                       obs.started, (k.secret for k in app[GATE].keys.specs if k.secret))
    try:
        if app[LIFECYCLE]["draining"]:
            response: web.StreamResponse = error_response(request, ApiError(
                "the gateway is shutting down", status=503, code="shutting_down", headers={"Connection": "close"}))
            status = 503
        else:
            try:
                response = await handler(request)
                status = response.status
            except asyncio.CancelledError:  # the client went away (handler cancellation)
                obs.disconnected = True
                _record(app, obs, 499, request, span, None)
                raise
        if not response.prepared:
            response.headers["X-Request-Id"] = rid
        _record(app, obs, status, request, span, response)
        return response
    finally:
        if token is not None:
            tracecontext.FORWARD.reset(token)


def _record(app: web.Application, obs: Observation, status: int, request: web.Request, span: object,
            response: web.StreamResponse | None) -> None:
    m = app[METRICS]
    duration = time.monotonic() - obs.started
    labels = (obs.model, obs.endpoint)
    m.series(m.requests, *labels, str(status)).inc()
    m.series(m.duration, *labels).observe(duration)
    if obs.first_token is not None:
        m.series(m.ttft, obs.model).observe(obs.first_token - obs.started)
    if obs.gaps:
        itl = m.series(m.itl, obs.model)
        for gap in obs.gaps:
            itl.observe(gap)
    for counter, n in ((m.prompt_tokens, obs.prompt_tokens), (m.cached_tokens, obs.cached_tokens),
                       (m.completion_tokens, obs.completion_tokens),
                       (m.reasoning_tokens, obs.reasoning_tokens), (m.drafted_tokens, obs.drafted_tokens),
                       (m.accepted_tokens, obs.accepted_tokens)):
        if n:
            m.series(counter, obs.model).inc(n)
    if obs.disconnected:
        m.series(m.disconnects, *labels).inc()
    for call in obs.hosted_tool_calls:
        m.tool_call(call)
    if status >= 400 and obs.first_token is None and not obs.disconnected:
        m.rejection(request.get(ERROR_CODE) or f"http_{status}")
    obs.principal, obs.owner = request.get(PRINCIPAL, obs.principal), request.get(OWNER)
    tracer = app[TRACING]
    if span is not None and tracer is not None:
        code = request.get(ERROR_CODE) or ("client_disconnected" if obs.disconnected and status == 499 else None)
        try:
            tracer.end(span, obs, status, code)
        except Exception:
            log.exception("tracing could not end this request's trace")
    event = obs.event(status, duration)
    app[EVENTS].write(event)
    app[LIVE].record(event, obs.owner)
    capture = request.get(CAPTURE)
    if capture is not None:
        whole = response.body if isinstance(response, web.Response) and isinstance(response.body, bytes) else None
        try:
            app[CAPTURES].finish(capture, obs, status, response.headers if response is not None else {}, whole,
                                 request.get(ERROR_CODE))
        except Exception:  # as a trace's: a capture that fails is logged, and the answer goes out
            log.exception("this request could not be captured")


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves in the caller's wire shape; nothing leaks a traceback."""
    try:
        return await handler(request)
    except ApiError as err:
        obs = request.get(OBSERVATION)
        if obs is not None and obs.model == "-" and err.model is not None:
            obs.model = err.model  # a load that failed, a full queue: the event names the model
        return await failed_response(request, err)
    except RequestFailed as failed:  # a question the model's worker refused (tokenize, embed, ...)
        return await failed_response(request, api_error(failed.event))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        limit = request.app[CONFIG].server.max_body_bytes
        message = {404: f"No route for {request.method} {request.path}",
                   405: f"Method {request.method} is not allowed on {request.path}",
                   413: f"The request body is larger than server.max_body_bytes ({limit} bytes)",
                   }.get(exc.status, exc.reason)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(request, ApiError(message, status=exc.status, code=code, headers=headers))
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return await failed_response(request, ApiError("Internal server error", status=500, code="internal_error"))


async def failed_response(request: web.Request, err: ApiError) -> web.StreamResponse:
    """``error_response``, or, where the answer's stream is already open (a load's progress
    opened it), the error in-band in the stream's wire shape, then the stream's end."""
    sse = request.get(STREAM)
    if sse is None or not sse.opened:
        return error_response(request, err)
    request[ERROR_CODE] = err.code or f"http_{err.status}"
    log.warning("stream ended by an error before its answer: %s", err.message)
    try:
        for data, event in sse.failure(err) if sse.failure is not None else [(err.openai_body(), None)]:
            await sse.send(data, event=event)
        await sse.close()
    except ConnectionResetError:
        pass
    return sse.response


def host_check_middleware():
    """Bound to loopback, answer only requests addressed to a loopback name: a web page whose
    DNS name was rebound to 127.0.0.1 sends its own Host, and gets 403 (DNS rebinding)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if host is not None:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
            if not is_loopback(name):
                raise ApiError(f"Host {shown(host, 100)} is not a loopback name; this gateway only answers requests "
                               "addressed to localhost", status=403, code="forbidden_host")
        return await handler(request)

    return middleware


UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def cross_site(method: str, origin: str | None, fetch_site: str | None, host: str | None,
               allowed: tuple[str, ...]) -> str | None:
    """Why a browser's request from another site must not act here (CSRF), or None. Pure.

    Browsers send a form or a ``text/plain`` POST to any address without asking first, so a page
    on any site could load and unload models or run prompts on a gateway without keys. They
    also say where such a request comes from (``Origin`` on every non-GET request,
    ``Sec-Fetch-Site``), which programs that are not browsers do not send: a request that
    changes something is refused when its origin is another one than this server's and
    ``server.cors_origins`` does not allow it. A page on another port of the same host is
    another origin (``Sec-Fetch-Site: same-site``). Reading (GET) stays open: the browser
    keeps another site's page from seeing the answer."""
    if method not in UNSAFE_METHODS:
        return None
    if origin is not None:
        if "*" in allowed or origin in allowed:
            return None
        try:
            netloc = urlsplit(origin).netloc.lower()
        except ValueError:  # not a URL ("null" from a sandboxed frame or a file, or garbage)
            netloc = ""
        if not netloc or netloc != (host or "").lower():
            return f"Origin {origin[:100]!r} is not this server's and is not in server.cors_origins"
        return None
    if (fetch_site or "").strip().lower() in ("cross-site", "same-site"):
        return f"a request from another site (Sec-Fetch-Site: {fetch_site[:20] if fetch_site else ''}) " \
               "with no Origin allowed by server.cors_origins"
    return None


def browser_guard_middleware(allowed: tuple[str, ...]):
    """Refuse what ``cross_site`` refuses, with a 403 before any handler runs."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # a WebSocket's upgrade is a GET that then acts as POSTs do (a page may open one to any address)
        method = "POST" if request.headers.get("Upgrade", "").lower() == "websocket" else request.method
        why = cross_site(method, request.headers.get("Origin"), request.headers.get("Sec-Fetch-Site"),
                         request.headers.get("Host"), allowed)
        if why is not None:
            raise ApiError(f"Refused: {why}. A page on another origin may call this gateway only when "
                           "server.cors_origins names it", status=403, code="forbidden_origin")
        return await handler(request)

    return middleware


CORS_HEADERS = "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, X-Request-Id"


def cors_middleware(origins: tuple[str, ...]):
    allowed = set(origins)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin", "")
        ok = bool(origin) and ("*" in allowed or origin in allowed)
        if request.method == "OPTIONS" and request.headers.get("Access-Control-Request-Method"):
            if not ok:
                raise ApiError(f"Origin {shown(origin, 100)} is not in server.cors_origins", status=403,
                               code="forbidden_origin")
            return web.Response(status=204, headers={
                "Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", CORS_HEADERS),
                "Access-Control-Max-Age": "600"})
        response = await handler(request)
        if ok:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = "X-Request-Id, Retry-After"
            response.headers["Vary"] = "Origin"
        return response

    return middleware


def create_app(config: Config, registry: Registry | None = None) -> web.Application:
    middlewares = [connection_middleware, observe_middleware, errors_middleware]
    if is_loopback(config.server.host):
        middlewares.append(host_check_middleware())
    middlewares.append(browser_guard_middleware(config.server.cors_origins))
    if config.server.cors_origins:
        middlewares.append(cors_middleware(config.server.cors_origins))
    middlewares.append(access_middleware(OPEN_PATHS | ({"/metrics"} if config.server.metrics_public else set())))
    app = web.Application(middlewares=middlewares, client_max_size=config.server.max_body_bytes)
    app[CONFIG] = config
    app[REGISTRY] = registry if registry is not None else Registry(config)
    app[METRICS] = Metrics()
    app[REGISTRY].metrics = app[METRICS]
    app[REGISTRY].pulls.on_bytes = lambda source, n: app[METRICS].pull_bytes.labels(source).inc(n)
    app[REGISTRY].pulls.on_outcome = lambda source, outcome: app[METRICS].pulls.labels(source, outcome).inc()
    app[METRICS].watch_models(app[REGISTRY].metrics_rows)
    app[METRICS].watch_upstreams(lambda: upstream_rows(app[REGISTRY]), lambda: app[REGISTRY].supervisors.replica_rows())
    app[METRICS].watch_gpus(lambda: [(d.name, d.description, d.free, d.total) for d in app[REGISTRY].devices.gpus])
    app[GATE] = gate = Gate(config.server)
    app[REGISTRY].queues.key_terms = lambda name: app[GATE].terms(name)  # the gate in force
    gate.on_spend = lambda name, named, wire, p, c: app[METRICS].spent(app[METRICS].key_label(name, named), wire, p, c)
    gate.on_limited = lambda name, named, limit: app[METRICS].key_limited.labels(
        app[METRICS].key_label(name, named), limit).inc()
    app[EVENTS] = EventSink(config.server.events_path)
    app[LIVE] = Live()
    state = config.server.state_dir or default_state_dir()
    app[CAPTURES] = CaptureStore(config.server.capture, state / CAPTURE_FOLDER)
    app[TRACING] = tracing.make(config.server.otel, os.environ)
    app[LIFECYCLE] = {"draining": False}
    servers = McpServers(config.server.mcp_servers, state, tool_timeout=config.server.tool_timeout,
                         max_result_bytes=config.server.max_tool_result_bytes)
    app[TOOLS] = Services(config.server, servers, WebSessions())  # its sessions made at the start (_workers_ctx)
    app[MCP_SERVERS] = servers
    app[SEAL_KEY] = KeptSecret((config.server.kv_cache_dir or default_kv_cache_dir()) / SEAL_FILE)
    server = config.server
    app[CONNECTIONS] = ConnectionGuard(Limits(server.header_timeout, server.keepalive_timeout, server.max_connections),
                                       on_close=lambda reason: app[METRICS].connections_closed.labels(reason).inc())
    app[METRICS].watch_connections(lambda: len(app[CONNECTIONS].conns))
    app.cleanup_ctx.append(_workers_ctx)
    admin.setup(app)
    openai.setup(app)
    anthropic.setup(app)
    ollama.setup(app)
    pulls.setup(app)
    compaction.setup(app)  # its plain paths before /v1/responses/{response_id}
    responses.setup(app)
    usage.setup(app)
    captures.setup(app)
    lora.setup(app)
    dashboard.setup(app)
    mcp.setup(app)
    return app


async def _workers_ctx(app: web.Application):
    await app[GATE].start()
    app[TOOLS].web.create()
    watch = asyncio.ensure_future(app[REGISTRY].upstreams.watch())  # upstreams' health, and the models they list
    keys = asyncio.ensure_future(admin.watch_keys(app))  # the keys file, read again when it changes
    kept = asyncio.ensure_future(captures.keep(app[CAPTURES]))  # captures kept in the state folder
    await app[REGISTRY].preload()
    yield
    for task in (watch, keys, kept):
        task.cancel()
    await asyncio.gather(watch, keys, kept, return_exceptions=True)
    await app[REGISTRY].close()
    await app[TOOLS].close()
    await app[GATE].close()
    app[EVENTS].close()
    tracer = app[TRACING]
    if tracer is not None:  # the last spans sent, within the drain time: a collector down holds no exit
        await asyncio.to_thread(tracer.shutdown, min(tracing.SHUTDOWN_SECONDS, app[CONFIG].server.drain_seconds))
