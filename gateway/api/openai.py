"""OpenAI wire shape: /v1/models, /v1/chat/completions, /v1/completions (``suffix``: fill in
the middle), Mistral's /v1/fim/completions; and llama-server's /infill, /props, /tokenize,
/detokenize, /apply-template, /rerank."""

from __future__ import annotations

from functools import partial

from aiohttp import web

from ..access.scope import visible
from ..base.errors import InvalidRequest
from ..models.adapternames import qualified
from ..server.events import observation
from ..wire import fim, openai_answer
from ..wire import openai as oai
from ..wire import props as props_wire
from ..wire import rerank as rerank_wire
from ..wire.params import require_model
from . import common, pipeline
from .access import spends
from .appkeys import REGISTRY
from .body import read_json_object


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
                 for a in registry.adapters.named(spec)]
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


async def _complete(request: web.Request, parsed: oai.Parsed, kind: str) -> web.StreamResponse:
    thinking = kind == "chat" and parsed.reasoning_format != "none"
    return await pipeline.answer(request, parsed, partial(openai_answer.Writer, parsed, kind=kind), thinking=thinking)


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
    return await pipeline.answer(request, parsed, partial(fim.InfillWriter, parsed), thinking=False)


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
    async with common.hold(request.app[REGISTRY], observation(request), model, embeddings=True) as (spec, backend):
        reply = await common.embedded(request, backend.embed(inputs))
    return await common.vectors_response(oai.embeddings_body(spec.name, reply.data, fmt, reply.prompt_tokens))


@spends("rerank")
async def rerank(request: web.Request) -> web.Response:
    """llama-server's, Jina's and Cohere's rerank: each document's relevance to the query."""
    model, query, documents, top_n, returned = rerank_wire.parse(await read_json_object(request))
    async with common.hold(request.app[REGISTRY], observation(request), model, rerank=True) as (spec, backend):
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
    reply, _ = await pipeline.unrun(request, parsed, lambda backend, req: backend.apply_template(req),
                                    embeddings=None)
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
