"""Ollama's API: /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/ps,
/api/show, /api/version (``/api/pull`` and ``/api/delete`` are ``api/pulls.py``'s); /api/push,
/api/create and /api/copy answer 501. Errors are Ollama's ``{"error": "..."}``
(``app.error_response``), and streams are newline-delimited JSON, as Ollama's clients read them.

``/api/experimental/web_search`` (``{query, max_results}``: default 5, at most 10 ->
``{results: [{title, url, content}]}``) and ``/api/experimental/web_fetch`` (``{url}`` ->
``{title, content, links}``) answer as Ollama's own do (which pass them to ollama.com), from the
gateway's hosted tools (``tools/websearch``, ``tools/webfetch``): a 501 where
``server.web_search`` (or ``server.web_fetch``) leaves them off, a 400 for a URL refused, a 502
for a backend that failed and a 504 for one that took longer than ``server.tool_timeout``. Each
counts as a request of its key (its rate limits), spending no tokens.

A request's ``keep_alive`` sets how long its model stays loaded once idle. The model is
everyone's, so a user key's only ever lengthens that (``serving.supervisors.Supervisors.keep_alive``):
unloading, or unloading sooner than the configuration says, is an admin's.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any

from aiohttp import web

from .. import __version__
from ..access.scope import visible
from ..base.errors import ApiError, InvalidRequest
from ..models.config import ModelSpec
from ..server.events import observation
from ..text.formats import reasoning_format, tool_format
from ..tools.hosted import Ask, Kind
from ..tools.toolbox import Toolbox
from ..wire import ollama
from . import common, pipeline, toolloop
from .access import KEY, is_admin, require_admin, spends
from .appkeys import REGISTRY, TOOLS
from .body import read_json_object

FOREVER = 3650 * 86400.0  # seconds: how far off a model kept loaded for good (or busy) shows its expiry
SEARCH_RESULTS, MAX_SEARCH_RESULTS = 5, 10  # Ollama's web_search: its default and its most


@spends("ollama")
async def chat(request: web.Request) -> web.StreamResponse:
    parsed = ollama.parse_chat(await read_json_object(request))
    if not parsed.request.messages:
        return await _load_only(request, parsed, chat=True)
    return await _answer(request, parsed, chat=True)


@spends("ollama")
async def generate(request: web.Request) -> web.StreamResponse:
    parsed = ollama.parse_generate(await read_json_object(request))
    req = parsed.request
    if req.messages is not None and not req.messages[-1]["content"] and len(req.messages) == 1:
        return await _load_only(request, parsed, chat=False)
    return await _answer(request, parsed, chat=False)


async def _load_only(request: web.Request, parsed: ollama.OllamaParsed, chat: bool) -> web.Response:
    """An empty prompt or no messages: load the model (or, with keep_alive 0, unload it), as
    Ollama does. Unloading is an admin's: a user key's keep_alive 0 is refused, and its other
    keep_alives only ever lengthen the model's stay (``serving.supervisors.Supervisors.keep_alive``)."""
    registry = request.app[REGISTRY]
    spec = await registry.lookup(parsed.model)
    observation(request).model = spec.name
    if parsed.keep_alive == 0:
        require_admin(request, "unloading a model")
        await registry.unload(parsed.model)
        reason = "unload"
    else:
        await registry.load(parsed.model)
        registry.supervisors.keep_alive(spec, parsed.keep_alive, shorten=is_admin(request))
        reason = "load"
    return web.json_response(ollama.load_answer(parsed.model, chat, reason))


async def _answer(request: web.Request, parsed: ollama.OllamaParsed, chat: bool) -> web.StreamResponse:
    def on_lease(spec: ModelSpec) -> None:
        request.app[REGISTRY].supervisors.keep_alive(spec, parsed.keep_alive, shorten=is_admin(request))

    # Ollama gives each call whole, in a stream too
    return await pipeline.answer(request, parsed, partial(ollama.Writer, parsed, chat=chat),
                                 thinking=parsed.request.suffix is None, on_lease=on_lease, whole_calls=True)


@spends("ollama")
async def embed(request: web.Request) -> web.Response:
    return await _embed(request, legacy=False)


@spends("ollama")
async def embeddings(request: web.Request) -> web.Response:
    return await _embed(request, legacy=True)


async def _embed(request: web.Request, legacy: bool) -> web.Response:
    model, inputs, alive = ollama.parse_embed(await read_json_object(request), legacy)
    obs = observation(request)
    async with common.hold(request.app[REGISTRY], obs, model, embeddings=True) as (spec, backend):
        request.app[REGISTRY].supervisors.keep_alive(spec, alive, shorten=is_admin(request))
        reply = await common.embedded(request, backend.embed(inputs))
    if legacy:
        return await common.vectors_response({"embedding": reply.data[0]})
    assert obs.queued is not None and obs.leased is not None
    return await common.vectors_response({"model": model, "embeddings": reply.data,
                                          "total_duration": ollama.ns(time.monotonic() - obs.queued),
                                          "load_duration": ollama.ns(obs.leased - obs.queued),
                                          "prompt_eval_count": reply.prompt_tokens})


def _modified(spec) -> str:
    try:
        stamp = spec.path.stat().st_mtime if spec.path is not None else time.time()
    except OSError:
        stamp = time.time()
    return datetime.fromtimestamp(stamp, timezone.utc).isoformat().replace("+00:00", "Z")


def _entry(registry, spec) -> dict[str, Any]:
    info = registry.info(spec)
    name = ollama.ollama_name(spec.name)
    return {"name": name, "model": name, "modified_at": _modified(spec), "size": info.file_size if info else 0,
            "digest": hashlib.sha256(str(spec.path or spec.name).encode()).hexdigest(),
            "details": ollama.details(info)}


async def tags(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    return web.json_response({"models": [_entry(registry, s) for s in visible(registry.specs())]})


async def ps(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    out = []
    for spec in visible(registry.specs()):
        model = registry.supervisor(spec)
        if model.backend is None or not model.backend.alive:
            continue
        keep = model.keep_alive if model.keep_alive is not None else model.timing.keep_alive
        left = math.inf if model.in_flight else keep - (time.monotonic() - model.last_used)
        until = datetime.now(timezone.utc) + timedelta(seconds=min(max(0.0, left), FOREVER))
        entry = _entry(registry, spec)
        entry.update(expires_at=until.isoformat().replace("+00:00", "Z"), size_vram=0)
        out.append(entry)
    return web.json_response({"models": out})


async def show(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    name = body.get("model") or body.get("name")
    registry = request.app[REGISTRY]
    spec = await registry.lookup(name)
    info = registry.info(spec)
    arch = info.architecture if info else None
    model_info: dict[str, Any] = {}
    if info is not None:
        model_info = {"general.architecture": arch, "general.name": info.name, "general.size_label": info.size_label,
                      f"{arch}.context_length": info.context_length, f"{arch}.embedding_length": info.embedding_length}
        model_info = {k: v for k, v in model_info.items() if v is not None}
    template = spec.chat_template or (info.chat_template if info else None) or ""
    capabilities = ["embedding"] if spec.embeddings else [] if spec.reranker else ["completion"]
    fills = False
    if capabilities == ["completion"]:
        # what a loaded model reported (its vocabulary's markers too), else what its template shows
        model = registry.supervisor(spec)
        known = model.backend.info if model.backend is not None and model.backend.alive else {}
        known = {"chat_template": template, "special_tokens": [], **known}
        if tool_format(spec.tool_format, known) not in (None, "plain"):
            capabilities.append("tools")
        if reasoning_format(spec.reasoning, known) not in (None, "think_leading"):
            capabilities.append("thinking")
        # its vocabulary's FIM tokens: what the loaded model reported, else what its header names
        fills = bool(known.get("fim", info.fim if info is not None else False))
        if fills:
            capabilities.append("insert")  # Ollama's name for fill in the middle
        media = registry.media(spec)
        capabilities += ["vision"] * ("image" in media) + ["audio"] * ("audio" in media)
    return web.json_response({"modelfile": f"FROM {spec.path or spec.name}\n", "parameters": "",
                              "template": ollama.show_template(template, fills), "details": ollama.details(info),
                              "model_info": model_info,
                              "capabilities": capabilities, "modified_at": _modified(spec)})


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})


async def not_here(request: web.Request) -> web.Response:
    raise ApiError(f"{request.path} is not available: this gateway serves GGUF models on disk and pulls them "
                   "(/api/pull), but does not make or push them", status=501, code="not_implemented")


async def _hosted(request: web.Request, kind: Kind, arguments: dict[str, Any], max_results: int | None = None) -> Any:
    """One hosted tool's call, made for Ollama's experimental routes: through the request's own
    ``Toolbox`` (the same bounds, and the call counted in the event, the trace and the metric as
    an answer's would be). 501 where the server runs no such tool; a failure in Ollama's words,
    with its status: 400 for what the caller gave, 504 for a timeout, else 502."""
    what = "web search" if kind is Kind.WEB_SEARCH else "web fetch"
    toolbox = await Toolbox.open([Ask(kind, "ollama", param="query", max_results=max_results)],
                                 request.app[TOOLS], key.mcp if (key := request.get(KEY)) is not None else None)
    try:
        if not toolbox:
            setting = "server.web_search" if kind is Kind.WEB_SEARCH else "server.web_fetch (on where web_search is)"
            raise ApiError(f"{what} is not configured on this gateway ({setting})", status=501, code="not_configured")
        ran = await toolbox.run(kind.value, json.dumps(arguments))
    finally:
        await toolbox.aclose()
    toolloop.record(observation(request), ran)
    if ran.error is not None:
        outcome = ran.record["outcome"]
        status = 400 if outcome in ("refused", "invalid_tool_input") else 504 if outcome == "timeout" else 502
        raise ApiError(ran.error, status=status, code=f"tool_{outcome}")
    return ran.output


@spends("ollama")
async def web_search(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    query, count = body.get("query"), body.get("max_results")
    if not isinstance(query, str) or not query.strip():
        raise InvalidRequest("query is required: a non-empty string", "query")
    if count is None:
        count = SEARCH_RESULTS
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidRequest("max_results must be a positive integer", "max_results")
    found = await _hosted(request, Kind.WEB_SEARCH, {"query": query}, min(count, MAX_SEARCH_RESULTS))
    return web.json_response({"results": [{"title": r.title, "url": r.url, "content": r.content} for r in found]})


@spends("ollama")
async def web_fetch(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    url = body.get("url")
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequest("url is required: a non-empty string", "url")
    page = await _hosted(request, Kind.WEB_FETCH, {"url": url})
    return web.json_response({"title": page.title, "content": page.text, "links": list(page.links)})


def setup(app: web.Application) -> None:
    app.router.add_post("/api/chat", chat)
    app.router.add_post("/api/generate", generate)
    app.router.add_post("/api/embed", embed)
    app.router.add_post("/api/embeddings", embeddings)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show)
    app.router.add_get("/api/version", version)
    app.router.add_post("/api/experimental/web_search", web_search)
    app.router.add_post("/api/experimental/web_fetch", web_fetch)
    for path in ("/api/push", "/api/create", "/api/copy"):
        app.router.add_route("*", path, not_here)
