"""OpenAI wire shape: /v1/models, /v1/chat/completions, /v1/completions (``suffix``: fill in
the middle), Mistral's /v1/fim/completions; and llama-server's /infill, /props, /tokenize,
/detokenize, /apply-template, /rerank."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from ..access.scope import visible
from ..backends.local import Backend
from ..base.errors import ApiError, InvalidRequest
from ..models.adapternames import qualified
from ..server.events import observation
from ..server.sse import EventStream
from ..serving.registry import adapters_of
from ..wire import answer, fim
from ..wire import openai as oai
from ..wire import props as props_wire
from ..wire import rerank as rerank_wire
from ..wire.params import require_model
from . import common, pipeline
from .access import spends
from .appkeys import CONFIG, REGISTRY
from .body import read_json_object
from .common import apply_limits, event_stream


async def list_models(request: web.Request) -> web.Response:
    """The models the key may use, each followed by its LoRA adapters as models of their own
    (``BASE:ADAPTER``, its ``parent`` the base: vLLM's listing of adapters)."""
    data = []
    registry = request.app[REGISTRY]
    for spec in visible(registry.specs()):
        try:
            created = int(spec.path.stat().st_mtime) if spec.path is not None else 0
        except OSError:
            created = 0
        data.append({"id": spec.name, "object": "model", "created": created,
                     "owned_by": "local" if spec.local else "upstream" if spec.upstream else "replicas",
                     # beside text (llama-server's modalities; LM Studio calls such a model a vlm)
                     "input_modalities": ["text", *registry.media(spec)]})
        data += [{"id": qualified(spec.name, a.name), "object": "model", "created": created, "owned_by": "local",
                  "parent": spec.name, "root": str(a.path), "input_modalities": data[-1]["input_modalities"]}
                 for a in adapters_of(registry, spec)]
    return web.json_response({"object": "list", "data": data})


@spends("chat")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, oai.parse_chat(await read_json_object(request)), "chat")


@spends("completions")
async def completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, oai.parse_completion(await read_json_object(request)), "completion")


@spends("fim")
async def fim_completions(request: web.Request) -> web.StreamResponse:
    """Mistral's fill-in-the-middle route, answered in Mistral's shape (a chat completion's)."""
    parsed = fim.parse_fim(await read_json_object(request))
    parsed.model = _fim_model(request, parsed.model)
    return await _complete(request, parsed, "fim")


def _told(err: ApiError) -> list[tuple[dict[str, Any], str | None]]:
    """A failure in an OpenAI-shaped stream (and llama-server's): the error object, in-band."""
    return [(err.openai_body(), None)]


async def _complete(request: web.Request, parsed: oai.Parsed, kind: str) -> web.StreamResponse:
    thinking = kind == "chat" and parsed.reasoning_format != "none"
    async with pipeline.lease(request, parsed, thinking=thinking, failure=_told) as (spec, backend):
        render = oai.Renderer(kind, spec.name, fields=request.app[CONFIG].server.reasoning_fields,
                              id=f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{observation(request).request_id}")
        if parsed.stream:
            return await _stream(request, render, parsed, backend)
        return await _whole(request, render, parsed, backend)


async def _whole(request: web.Request, render: oai.Renderer, parsed: oai.Parsed, backend: Backend) -> web.Response:
    choices, finishes = [], []
    for index, req in enumerate(parsed.requests):  # a batch of prompts runs one after another
        async with pipeline.generate(request, backend, req, stream=False) as run:
            whole = pipeline.Whole(logprobs=[] if req.logprobs is not None else None)
            finish = await pipeline.collect(run, whole.feed)
        choices.append(render.choice(index, whole.content, whole.thinking, finish, whole.logprobs,
                                     run.begun.prompt_text or "", whole.calls))
        finishes.append(finish)
    return web.json_response(render.whole(choices, finishes))


async def _stream(request: web.Request, render: oai.Renderer, parsed: oai.Parsed,
                  backend: Backend) -> web.StreamResponse:
    reqs = parsed.requests
    gens = [backend.generate(req) for req in reqs]  # queued in order in the worker
    runs: list[pipeline.Run] = []
    try:
        # a refusal is still a plain error response
        runs.append(await pipeline.start(request, gens[0], reqs[0], stream=True))
        finishes: list[answer.Finish] = []

        async def write(sse: EventStream) -> None:
            if (chunk := render.first_chunk()) is not None:
                await sse.send(chunk)
            for index, gen in enumerate(gens):
                if index == len(runs):
                    runs.append(await pipeline.start(request, gen, reqs[index], stream=True))
                run = runs[index]
                offset = 0
                if run.begun.prompt_text:
                    echo = run.begun.prompt_text
                    await sse.send(render.delta_chunk(answer.Piece("content", echo), index))
                    offset = len(echo)
                async for item in run.items:
                    if isinstance(item, answer.Piece):
                        await sse.send(render.delta_chunk(item, index, offset), hold=True)
                        offset += len(item.text)
                    elif isinstance(item, answer.Call | answer.CallArgs):
                        await sse.send(render.call_chunk(item, index), hold=True)
                    else:
                        await sse.send(render.final_chunk(item.reason, index, item))
                        finishes.append(item)
            if parsed.include_usage:
                await sse.send(render.usage_chunk(finishes))

        # the worker failed mid-answer: the choice ends with "error", then the error object
        return await pipeline.stream(request, event_stream(request), gens, write,
                                     lambda err: [(render.final_chunk("error"), None), *_told(err)],
                                     name=render.id, done="[DONE]")
    finally:
        for index, gen in enumerate(gens):  # each one's tokens counted, those of a prompt not reached yet too
            pipeline.left(request, gen, runs[index] if index < len(runs) else None)
            gen.close()


def _fim_model(request: web.Request, name: str) -> str:
    """``name``, or where the caller named none (llama-server's editor clients name none) the
    model ``fim.choose_model`` picks among the gateway's text models: a local model's GGUF
    header says whether it can fill in the middle, a loaded backend (an upstream's) says so
    once it runs."""
    if name:
        return name
    registry = request.app[REGISTRY]
    loaded = registry.loaded()
    candidates: list[tuple[str, bool | None]] = []
    for spec in visible(registry.specs()):
        if spec.embeddings or spec.reranker:
            continue
        # what a running backend reports beats the header, which knows FIM tokens by their ids
        # only (llama.cpp also finds them by their text once loaded)
        header, backend = registry.info(spec), loaded.get(spec.name)
        known = backend.info.get("fim") if backend is not None else None
        known = known if isinstance(known, bool) else None  # an upstream's: its server decides
        candidates.append((spec.name, known if known is not None else header.fim if header is not None else None))
    if not candidates:
        raise InvalidRequest("`model` is required: this gateway serves no text model (see /v1/models)", "model")
    return fim.choose_model(candidates)


@spends("fim")
async def infill(request: web.Request) -> web.StreamResponse:
    """llama-server's /infill: fill in the middle, answered in the shape of its /completion."""
    parsed = fim.parse_infill(await read_json_object(request))
    parsed.model = _fim_model(request, parsed.model)
    req, obs = parsed.request, observation(request)
    async with pipeline.lease(request, parsed, thinking=False, failure=_told) as (spec, backend):
        # the extra context cut to what this model can keep of it, before the worker tokenizes it
        if req.infill_extra and (budget := fim.extra_budget(backend.info, req.max_tokens)) is not None:
            req.infill_extra = fim.trim_extra(req.infill_extra, budget)
        started = time.monotonic()
        async with pipeline.generate(request, backend, req, stream=parsed.stream) as run:
            if parsed.stream:
                return await _infill_stream(request, spec.name, parsed, run, started)
            text: list[str] = []  # every piece: an upstream's thinking too, as the completion's text
            finish = await pipeline.collect(run, lambda item: text.append(item.text)
                                            if isinstance(item, answer.Piece) else None)
            timing = fim.timings(finish, started, obs.first_token, obs.last_token)
            return web.json_response(fim.pick(parsed.response_fields,
                                              fim.final(spec.name, "".join(text), finish, timing, req)))


async def _infill_stream(request: web.Request, model: str, parsed: fim.InfillParsed, run: pipeline.Run,
                         started: float) -> web.StreamResponse:
    """llama-server's /completion stream: ``data: {...}`` per piece, the final object last, no
    ``[DONE]``; a failure mid-answer is an ``error`` object in-band."""
    obs = observation(request)
    evaluated = run.begun.prompt_tokens

    async def write(sse: EventStream) -> None:
        async for item in run.items:
            if isinstance(item, answer.Piece):
                predicted = 1 + len(obs.gaps) if obs.first_token is not None else 0
                await sse.send(fim.partial(item.text, predicted, evaluated), hold=True)
            elif isinstance(item, answer.Finish):
                timing = fim.timings(item, started, obs.first_token, obs.last_token)
                await sse.send(fim.pick(parsed.response_fields, fim.final(model, "", item, timing, parsed.request)))

    return await pipeline.stream(request, event_stream(request), [run.gen], write, _told,
                                 name=f"for {model} (infill)")


async def props(request: web.Request) -> web.Response:
    """llama-server's GET /props for ``?model=NAME``; without it, the only model's, or with
    several the router's own answer. It loads nothing, nor keeps a loaded model longer: a model
    that is not loaded answers from its spec and header (``props_wire.expected``)."""
    registry = request.app[REGISTRY]
    name = request.query.get("model", "")
    specs = visible(registry.specs())
    if not name and len(specs) != 1:
        return web.json_response(props_wire.router(len(specs)))
    spec = await registry.lookup(name) if name else specs[0]
    observation(request).model = spec.name
    header = registry.info(spec)
    ftype = header.quantization if header else None
    backend = registry.loaded().get(spec.name)
    if backend is None:
        return web.json_response(props_wire.model(spec, props_wire.expected(spec, header, registry.media(spec)),
                                                  ftype, loaded=False))
    return web.json_response(props_wire.model(spec, backend.info, ftype))


@spends("embeddings")
async def embeddings(request: web.Request) -> web.Response:
    model, inputs, fmt = oai.parse_embeddings(await read_json_object(request))
    async with common.lease(request, model, embeddings=True) as (spec, backend):
        reply = await common.embedded(request, backend.embed(inputs))
    return await common.vectors_response(oai.embeddings_body(spec.name, reply.data, fmt, reply.prompt_tokens))


@spends("rerank")
async def rerank(request: web.Request) -> web.Response:
    """llama-server's, Jina's and Cohere's rerank: each document's relevance to the query."""
    model, query, documents, top_n, returned = rerank_wire.parse(await read_json_object(request))
    async with common.lease(request, model, rerank=True) as (spec, backend):
        reply = await common.embedded(request, backend.rerank(query, documents))
    return web.json_response(rerank_wire.body(spec.name, documents, [v[0] for v in reply.data], top_n, returned,
                                              reply.prompt_tokens))


async def tokenize(request: web.Request) -> web.Response:
    """llama-server's /tokenize: {"model", "content", "add_special", "with_pieces"} -> {"tokens"}."""
    body = await read_json_object(request)
    content = body.get("content")
    if not isinstance(content, str):
        raise InvalidRequest("`content` must be a string", "content")
    flags = {k: body.get(k, False) for k in ("add_special", "with_pieces")}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise InvalidRequest(f"`{key}` must be true or false", key)
    async with request.app[REGISTRY].lease(require_model(body), embeddings=None) as (_spec, backend):
        reply = await backend.tokenize({"prompt": content, "add_special": flags["add_special"], "param": "content"},
                                      with_pieces=flags["with_pieces"])
    if reply.pieces is not None:
        return web.json_response({"tokens": [{"id": t, "piece": p} for t, p in zip(reply.tokens, reply.pieces)]})
    return web.json_response({"tokens": reply.tokens})


async def detokenize(request: web.Request) -> web.Response:
    """llama-server's /detokenize: {"model", "tokens"} -> {"content"}."""
    body = await read_json_object(request)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise InvalidRequest("`tokens` must be an array of token ids", "tokens")
    async with request.app[REGISTRY].lease(require_model(body), embeddings=None) as (_spec, backend):
        reply = await backend.detokenize(tokens)
    return web.json_response({"content": reply.text})


async def apply_template(request: web.Request) -> web.Response:
    """llama-server's /apply-template: a chat request's messages through the model's chat
    template, unrun -> {"prompt": text}."""
    parsed = oai.parse_chat(await read_json_object(request))
    apply_limits(request, parsed)
    async with request.app[REGISTRY].lease(parsed.model, embeddings=None) as (spec, backend):
        answer.prepare(parsed.request, spec.name, backend.info)
        reply = await backend.apply_template(parsed.request.to_dict())
    return web.json_response({"prompt": reply.text})


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/fim/completions", fim_completions)
    app.router.add_post("/infill", infill)
    app.router.add_get("/props", props)
    app.router.add_post("/v1/embeddings", embeddings)
    for prefix in ("", "/v1"):
        app.router.add_post(f"{prefix}/rerank", rerank)
        app.router.add_post(f"{prefix}/reranking", rerank)  # llama-server's other name for it
        app.router.add_post(f"{prefix}/tokenize", tokenize)
        app.router.add_post(f"{prefix}/detokenize", detokenize)
        app.router.add_post(f"{prefix}/apply-template", apply_template)
