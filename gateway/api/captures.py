"""``/captures``: the requests ``server/captures`` kept, to list, open and replay. An admin's
alone (``admin_only``: a user key gets 403); open without keys, like the rest of the
operator's routes.

- ``GET /captures``: their summaries, newest first; filters ``model``, ``key``, ``status``
  (``200`` or a class, ``4xx``), ``route`` (``/v1/chat/completions``), ``since`` and ``until``
  (as ``/usage`` reads them), ``limit``. Says whether capture is on and what the store holds,
  and ``refused``: how many requests were refused at the door (401, 403, 429), how many by
  status and key, and the newest ``limit`` of the lines kept of them (time, status, route, key,
  error code, request id), kept apart from the captures (``server/captures.MAX_REFUSALS``).
- ``GET /captures/{id}``: one capture whole, its answer read back into thinking, content and
  calls (``wire/readback``; a stream whose text spelled a secret in pieces: the answer kept in
  place of its writes, ``withheld``), the keys models.yaml gives as themselves cut out of it
  again, and the ``curl`` command that sends its request again.
- ``POST /captures/{id}/replay`` ``{"model": ...}``: its request sent again to this gateway as
  it came (its model swapped for the one given: another local model, or one another machine
  serves), with the replaying key's own credentials; the answer is captured like any other
  and returned, ``replay_of`` naming the original. A request cut by the bound, or kept without
  its text, cannot be sent again (409)."""

from __future__ import annotations

import asyncio
import itertools
import json
import shlex
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from ..base.errors import ApiError, InvalidRequest
from ..server import redaction
from ..server.captures import CaptureStore, Record
from ..wire.readback import read_answer
from .access import admin_only
from .appkeys import CAPTURES, GATE
from .body import read_json_object
from .usage import query_time, query_values

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
KEEP_EVERY = 1.0  # seconds between writes of the kept captures to the state folder
# the request headers a replay sends as they were captured; its credentials are the replaying key's
REPLAYED = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta", "user-agent")
CREDENTIALS = ("authorization", "x-api-key")
READ_CHUNK = 1 << 16


def _store(request: web.Request) -> CaptureStore:
    return request.app[CAPTURES]


def _record(request: web.Request) -> Record:
    record = _store(request).get(request.match_info["id"])
    if record is None:
        raise ApiError(f"No capture {request.match_info['id'][:80]!r}: it was never kept, or the store dropped it "
                       "(server.capture.max_bytes)", status=404, code="capture_not_found")
    return record


@admin_only
async def list_captures(request: web.Request) -> web.Response:
    store = _store(request)
    try:
        limit = int(request.query.get("limit", DEFAULT_LIMIT))
    except ValueError:
        limit = -1
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"`limit` must be an integer from 1 to {MAX_LIMIT}", "limit")
    since = query_time(request.query["since"], "since") if request.query.get("since") else None
    until = query_time(request.query["until"], "until") if request.query.get("until") else None
    records = store.query(models=query_values(request, "model") or (), keys=query_values(request, "key") or (),
                          statuses=query_values(request, "status") or (), routes=query_values(request, "route") or (),
                          since=since, until=until, limit=limit)
    for record in records:  # each as it will stay: a stream still being checked for secrets, once checked
        await store.checked(record)
    config = store.config
    lines = [r.line() for r in itertools.islice(reversed(store.refusals.values()), limit)]
    by = [{"status": status, "key": key, "count": n} for (status, key), n in store.refused_by.most_common()]
    return web.json_response({"object": "list", "enabled": config.enabled, "redact_content": config.redact_content,
                              "count": len(store.records), "bytes": store.bytes, "max_bytes": config.max_bytes,
                              "data": [r.summary() for r in records],
                              "refused": {"count": store.refused, "kept": len(store.refusals), "by": by,
                                          "recent": lines}})


@admin_only
async def get_capture(request: web.Request) -> web.Response:
    record = _record(request)
    await _store(request).checked(record)
    detail = record.detail()
    detail["answer"] = await answer(request, record)
    detail["curl"] = curl(record, f"{request.scheme}://{request.host}")
    return web.json_response(detail)


async def answer(request: web.Request, record: Record) -> dict[str, Any]:
    """``record``'s answer read back (off the event loop), or the one kept in place of a
    withheld stream's writes; either with the keys models.yaml gives as themselves cut out
    again (a kept file from before, an escaping no cut foresaw)."""
    if record.withheld is not None:
        return record.withheld
    read = await asyncio.to_thread(read_answer, record.route, record.stream, record.answer_bytes())
    configured = tuple(sorted({k.secret.encode("utf-8", errors="replace")
                               for k in request.app[GATE].keys.specs if k.secret}))
    secrets = redaction.Secrets.of(configured)
    return redaction.cut_strings(read, secrets) if secrets else read


@admin_only
async def replay(request: web.Request) -> web.Response:
    record = _record(request)
    body = await read_json_object(request)
    model = body.get("model", record.model)
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("`model` must be a model's name", "model")
    payload = replayable(record)
    payload["model"] = model.strip()
    rid = uuid.uuid4().hex
    headers = {k: v for k, v in record.request_headers.items() if k.lower() in REPLAYED}
    headers.update({k: v for k, v in request.headers.items() if k.lower() in CREDENTIALS})
    headers["X-Request-Id"] = rid
    url, connector = _self_address(request)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        target = url + record.path + (f"?{record.query}" if record.query else "")
        async with session.request(record.method, target, data=json.dumps(payload).encode(),
                                   headers=headers, allow_redirects=False) as resp:
            while await resp.content.read(READ_CHUNK):  # the capture keeps it; here it is only read to its end
                pass
    again = _store(request).by_request_id(rid)
    if again is None:  # capture turned off by a reload meanwhile, or the store too small for it
        raise ApiError("The replay ran, but its capture was not kept (server.capture)", status=409,
                       code="capture_not_kept")
    await _store(request).checked(again)
    _store(request).replayed(again, record)
    detail = again.detail()
    detail["answer"] = await answer(request, again)
    return web.json_response(detail)


def replayable(record: Record) -> dict[str, Any]:
    """The captured request's body to send again, or the 409 that says why it cannot be."""
    if record.redacted:
        raise ApiError("This capture was kept without its text (server.capture.redact_content), so it cannot be "
                       "sent again", status=409, code="capture_redacted")
    if record.request_cut:
        raise ApiError(f"This capture's request was cut at server.capture.max_body_bytes (it had "
                       f"{record.request_bytes} bytes), so it cannot be sent again", status=409, code="capture_cut")
    body = record.request_json()
    if not isinstance(body, dict):
        raise ApiError("This capture's request has no JSON body to send again", status=409, code="capture_no_body")
    return body


def _self_address(request: web.Request) -> tuple[str, aiohttp.BaseConnector | None]:
    """The URL of the listener the replay request came in on, from this machine (a wildcard
    address is reached on loopback), and the connector for a Unix socket."""
    name = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if isinstance(name, str):  # a Unix socket
        return "http://localhost", aiohttp.UnixConnector(path=name)
    if not isinstance(name, tuple) or len(name) < 2:
        raise ApiError("This gateway's own address is unknown, so it cannot send a request to itself", status=500)
    host, port = name[0], name[1]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}", None


def curl(record: Record, base: str) -> str:
    """The shell command that sends the captured request again, its key from
    ``$GGUF_GATEWAY_API_KEY`` (the captured one is never kept). Pure."""
    parts = ["curl", "-sS"]
    if record.stream:
        parts.append("-N")
    if record.method != "POST":
        parts += ["-X", record.method]
    parts.append(shlex.quote(base + record.path + (f"?{record.query}" if record.query else "")))
    for name, value in record.request_headers.items():
        if name.lower() in REPLAYED:
            parts += ["-H", shlex.quote(f"{name}: {value}")]
    parts += ["-H", '"Authorization: Bearer $GGUF_GATEWAY_API_KEY"']
    if record.request_body is not None:
        text = record.request_body.decode("utf-8", errors="replace")
        parts += ["--data-binary", shlex.quote(text)]
    return " ".join(parts)


async def keep(store: CaptureStore) -> None:
    """Where ``keep`` is on: read the kept captures back, then write new ones and remove
    dropped ones every ``KEEP_EVERY`` seconds, off the event loop, and once more at the end."""
    if store.folder is None:
        return
    store.restore(await asyncio.to_thread(store.read_kept))
    try:
        while True:
            await asyncio.sleep(KEEP_EVERY)
            if store.pending:
                await asyncio.to_thread(store.persist, store.take_pending())
    finally:
        await asyncio.shield(_last_persist(store))


async def _last_persist(store: CaptureStore) -> None:
    """The streams still being checked for secrets, then what is left to write."""
    await asyncio.gather(*list(store.checking.values()))
    await asyncio.to_thread(store.persist, store.take_pending())


def setup(app: web.Application) -> None:
    app[CAPTURES].reader = read_answer  # the store checks a finished stream's text for secrets with it
    app.router.add_get("/captures", list_captures)
    app.router.add_get("/captures/{id}", get_capture)
    app.router.add_post("/captures/{id}/replay", replay)
