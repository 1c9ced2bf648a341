"""OpenAI wire shape: /v1/models, /v1/chat/completions, /v1/completions (``suffix``: fill in
the middle), Mistral's /v1/fim/completions; and llama-server's /infill, /props, /tokenize,
/detokenize, /apply-template, /rerank."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from .. import answer
from ..appkeys import CONFIG, REGISTRY
from ..errors import ApiError, InvalidRequest
from ..events import observation
from ..protocol import fim
from ..protocol import openai as oai
from ..protocol import props as props_wire
from ..protocol import rerank as rerank_wire
from ..protocol.params import apply_defaults, apply_effort, require_model
from .body import read_json_object
from .common import apply_limits, event_stream, ignore_gone, load_progress

log = logging.getLogger(__name__)


async def list_models(request: web.Request) -> web.Response:
    data = []
    for spec in request.app[REGISTRY].specs():
        try:
            created = int(spec.path.stat().st_mtime) if spec.path is not None else 0
        except OSError:
            created = 0
        data.append({"id": spec.name, "object": "model", "created": created,
                     "owned_by": "local" if spec.local else "upstream" if spec.upstream else "replicas"})
    return web.json_response({"object": "list", "data": data})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, oai.parse_chat(await read_json_object(request)), "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, oai.parse_completion(await read_json_object(request)), "completion")


async def fim_completions(request: web.Request) -> web.StreamResponse:
    """Mistral's fill-in-the-middle route, answered in Mistral's shape (a chat completion's)."""
    return await _complete(request, fim.parse_fim(await read_json_object(request)), "fim")


async def _complete(request: web.Request, parsed: oai.Parsed, kind: str) -> web.StreamResponse:
    apply_limits(request, parsed)
    progress = load_progress(request, parsed.stream, lambda err: [(err.openai_body(), None)])
    async with request.app[REGISTRY].lease(parsed.model, on_progress=progress) as (spec, backend):
        observation(request).model = spec.name
        if parsed.request.suffix is not None:
            fim.require_fim(backend.info, spec.name, parsed.request.suffix_param)
        oai.apply_defaults(parsed, spec.defaults)
        return await _run(request, parsed, kind, spec, backend)


async def _run(request: web.Request, parsed: oai.Parsed, kind: str, spec, backend) -> web.StreamResponse:
    obs = observation(request)
    render = oai.Renderer(kind, spec.name, fields=request.app[CONFIG].server.reasoning_fields,
                          id=f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{obs.request_id}")
    reasoning = spec.reasoning if kind == "chat" and parsed.reasoning_format != "none" else None
    for req in parsed.requests:
        answer.prepare(req, spec.name, reasoning, spec.tool_format, backend.info)
        apply_effort(req, parsed.reasoning_effort, spec.reasoning_budgets, req.reasoning)
    if parsed.stream:
        return await _stream(request, render, parsed, backend)
    choices, finishes = [], []
    for index, req in enumerate(parsed.requests):  # a batch of prompts runs one after another
        async with backend.generate(req) as gen:
            begun, parser = await answer.start(gen, req, stream=False)
            text: dict[str, list[str]] = {"content": [], "thinking": []}
            probs: list[dict] | None = [] if req.logprobs is not None else None
            calls: list[dict] = []
            async for item in answer.pieces(gen, parser, obs):
                if isinstance(item, answer.Piece):
                    text[item.kind].append(item.text)
                    if probs is not None and item.logprobs:
                        probs += item.logprobs
                elif isinstance(item, answer.Call):
                    calls.append({"id": item.id, "name": item.name, "arguments": ""})
                elif isinstance(item, answer.CallArgs):
                    calls[-1]["arguments"] += item.text
                else:
                    choices.append(render.choice(index, "".join(text["content"]), "".join(text["thinking"]), item,
                                                 probs, begun.prompt_text or "", calls))
                    finishes.append(item)
    return web.json_response(render.whole(choices, finishes))


async def _stream(request: web.Request, render: oai.Renderer, parsed: oai.Parsed, backend):
    gens = [backend.generate(req) for req in parsed.requests]  # queued in order in the worker
    try:
        # a refusal is still a plain error response
        first, parser = await answer.start(gens[0], parsed.requests[0], stream=True)
        sse = event_stream(request)
        await sse.open()
        for gen in gens:
            gen.on_idle = sse.flush  # the deltas of events that arrived together go out in one write
        finishes = []
        try:
            if (chunk := render.first_chunk()) is not None:
                await sse.send(chunk)
            for index, gen in enumerate(gens):
                begun = first if index == 0 else None
                if begun is None:
                    begun, parser = await answer.start(gen, parsed.requests[index], stream=True)
                offset = 0
                if begun.prompt_text:
                    echo = begun.prompt_text
                    await sse.send(render.delta_chunk(answer.Piece("content", echo), index))
                    offset = len(echo)
                async for item in answer.pieces(gen, parser, observation(request)):
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
        except ApiError as err:  # the worker failed mid-answer: say so in-band, then end the stream
            log.warning("stream %s ended by an error: %s", render.id, err.message)
            await ignore_gone(sse.send(render.final_chunk("error")))
            await ignore_gone(sse.send(err.openai_body()))
        except ConnectionResetError:  # the client went away; closing the generations cancels the work
            log.info("client disconnected from stream %s", render.id)
            observation(request).disconnected = True
            return sse.response
        await ignore_gone(sse.send("[DONE]"))
        await ignore_gone(sse.close())
        return sse.response
    finally:
        for gen in gens:
            gen.close()


def _only_model(request: web.Request, name: str) -> str:
    """``name``, or where the caller named none (llama-server's clients name none) the
    gateway's only model; with several, a 400 naming ``model`` (as llama-server's router's
    "model name is missing from the request")."""
    if name:
        return name
    specs = request.app[REGISTRY].specs()
    if len(specs) == 1:
        return specs[0].name
    raise InvalidRequest(f"`model` is required: this gateway serves {len(specs)} models (see /v1/models)", "model")


async def infill(request: web.Request) -> web.StreamResponse:
    """llama-server's /infill: fill in the middle, answered in the shape of its /completion."""
    parsed = fim.parse_infill(await read_json_object(request))
    parsed.model = _only_model(request, parsed.model)
    apply_limits(request, parsed)
    req, obs = parsed.request, observation(request)
    progress = load_progress(request, parsed.stream, lambda err: [(err.openai_body(), None)])
    async with request.app[REGISTRY].lease(parsed.model, on_progress=progress) as (spec, backend):
        obs.model = spec.name
        fim.require_fim(backend.info, spec.name, req.suffix_param)
        apply_defaults(parsed, spec.defaults)
        answer.prepare(req, spec.name, None, spec.tool_format, backend.info)
        started = time.monotonic()
        async with backend.generate(req) as gen:
            begun, parser = await answer.start(gen, req, stream=parsed.stream)
            if parsed.stream:
                return await _infill_stream(request, spec.name, parsed, gen, parser, begun.prompt_tokens, started)
            text: list[str] = []
            async for item in answer.pieces(gen, parser, obs):
                if isinstance(item, answer.Piece):
                    text.append(item.text)
                elif isinstance(item, answer.Finish):
                    timing = fim.timings(item, started, obs.first_token, obs.last_token)
                    whole = fim.final(spec.name, "".join(text), item, timing, req)
                    return web.json_response(fim.pick(parsed.response_fields, whole))
    raise ApiError("the model worker ended the answer without finishing it", status=500)


async def _infill_stream(request: web.Request, model: str, parsed: fim.InfillParsed, gen, parser, evaluated: int,
                         started: float) -> web.StreamResponse:
    """llama-server's /completion stream: ``data: {...}`` per piece, the final object last, no
    ``[DONE]``; a failure mid-answer is an ``error`` object in-band."""
    obs = observation(request)
    sse = event_stream(request)
    await sse.open()
    gen.on_idle = sse.flush
    try:
        async for item in answer.pieces(gen, parser, obs):
            if isinstance(item, answer.Piece):
                predicted = 1 + len(obs.gaps) if obs.first_token is not None else 0
                await sse.send(fim.partial(item.text, predicted, evaluated), hold=True)
            elif isinstance(item, answer.Finish):
                timing = fim.timings(item, started, obs.first_token, obs.last_token)
                await sse.send(fim.pick(parsed.response_fields, fim.final(model, "", item, timing, parsed.request)))
    except ApiError as err:
        log.warning("infill stream for %s ended by an error: %s", model, err.message)
        await ignore_gone(sse.send(err.openai_body()))
    except ConnectionResetError:
        obs.disconnected = True
        return sse.response
    await ignore_gone(sse.close())
    return sse.response


async def props(request: web.Request) -> web.Response:
    """llama-server's GET /props for ``?model=NAME`` (loading it, as llama-server's router
    does); without it, the only model's, or with several the router's own answer."""
    registry = request.app[REGISTRY]
    name = request.query.get("model", "")
    specs = registry.specs()
    if not name and len(specs) != 1:
        return web.json_response(props_wire.router(len(specs)))
    name = name or specs[0].name
    async with registry.lease(name, embeddings=None) as (spec, backend):
        observation(request).model = spec.name
        info = backend.info
    header = registry.info(spec)
    return web.json_response(props_wire.model(spec, info, header.quantization if header else None))


async def embeddings(request: web.Request) -> web.Response:
    model, inputs, fmt = oai.parse_embeddings(await read_json_object(request))
    async with request.app[REGISTRY].lease(model, embeddings=True) as (spec, backend):
        observation(request).model = spec.name
        reply = await backend.embed(inputs)
        observation(request).prompt_tokens = reply.prompt_tokens
    return web.json_response(oai.embeddings_body(spec.name, reply.data, fmt, reply.prompt_tokens))


async def rerank(request: web.Request) -> web.Response:
    """llama-server's, Jina's and Cohere's rerank: each document's relevance to the query."""
    model, query, documents, top_n, returned = rerank_wire.parse(await read_json_object(request))
    async with request.app[REGISTRY].lease(model, rerank=True) as (spec, backend):
        observation(request).model = spec.name
        reply = await backend.rerank(query, documents)
        observation(request).prompt_tokens = reply.prompt_tokens
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
        answer.prepare(parsed.request, spec.name, spec.reasoning, spec.tool_format, backend.info)
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
