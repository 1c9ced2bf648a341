"""An answer whose generations alternate with tools the gateway runs itself (``tools/``): the
loop of ARCHITECTURE.md's step 5 where a request asked for hosted tools.

``rounds`` reads a generation (``generation.read``, which holds the calls of hosted tools
out of the writer's way). Where the model called hosted tools, each is told to the writer
(``hosted``), run (``Toolbox.run``), its result told (``hosted_result``), and put into the
conversation as the model's own template has a function's result (an assistant message with
the calls, then a tool message each); a further generation then continues the same answer
(``go_on``). It ends when a generation calls no hosted tool, when it also called a tool of the
caller's (which goes back to the caller, as ever), or when a call waits for the caller's
approval (Responses' ``require_approval``: the answer ends with the request for it).

Bounds: at most ``server.max_tool_rounds`` rounds, after which the model answers with the
hosted tools taken away; each call's timeout and its result's bytes (``Toolbox.run``) and
tokens (``cut``, by the model's own tokenizer). A client that leaves cancels the task, and so
the call in flight and the generation. Every generation's tokens are counted into the
request's observation, so usage, a key's budget and its tpm are charged for every round."""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from .. import protocol
from ..backends.local import Backend
from ..server.events import Observation
from ..server.sse import EventStream
from ..tools.hosted import Approval, function_name
from ..tools.resulttext import CUT_NOTE
from ..tools.toolbox import Ran, Toolbox
from ..wire import answer as wire_answer
from ..wire.context import Context
from ..wire.writer import Hosted, HostedResult, Writer
from .generation import Held, HeldCall, Run, left, read, send, start

log = logging.getLogger(__name__)
Told = tuple[Hosted, HostedResult]  # a hosted call and its result, as the writer is told them


async def cut(backend: Backend, text: str, limit: int) -> str:
    """``text`` cut to ``limit`` of the model's tokens (a token is at least a byte: a text of no
    more bytes than that is never tokenized). A backend that cannot tokenize leaves it whole."""
    if len(text.encode("utf-8", "replace")) <= limit:
        return text
    try:
        tokens = await backend.tokenize({"prompt": text, "add_special": False}, with_pieces=True)
    except Exception as err:  # an upstream without /tokenize: the byte bound holds alone
        log.debug("tokenizing a tool's result failed: %s", err)
        return text
    if len(tokens.tokens) <= limit or tokens.pieces is None:
        return text
    return "".join(tokens.pieces[:limit]) + CUT_NOTE


def record(obs: Observation, ran: Ran) -> None:
    """A hosted call's line in the request's observation (the inference event, the trace's
    ``execute_tool`` span, the capture, the metric)."""
    obs.hosted_tool_calls.append(ran.record)


def _hosted(call: HeldCall, toolbox: Toolbox) -> Hosted:
    offer = toolbox.offers[call.name]
    return Hosted(call.id, offer.kind.value, offer.tool or offer.name, call.arguments or "{}", offer.server,
                  approval_request_id=call.approval)


def _result(call: HeldCall, hosted: Hosted, ran: Ran) -> HostedResult:
    return HostedResult(call.id, hosted.kind, ran.output, ran.error,
                        ran.record["outcome"] if ran.error is not None else None)


def _assistant(text: str, calls: list[HeldCall]) -> dict[str, Any]:
    return {"role": "assistant", "content": text,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": _object(c.arguments)}} for c in calls]}


def _object(arguments: str) -> Any:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def _run(ctx: Context, backend: Backend, toolbox: Toolbox, call: HeldCall, out: Writer,
               sse: EventStream | None) -> str:
    """One hosted call told, run and its result told; returns the text the model reads."""
    hosted = _hosted(call, toolbox)
    await send(sse, out.hosted(hosted))
    ran = await toolbox.run(call.name, call.arguments)
    record(ctx.observation, ran)
    await send(sse, out.hosted_result(_result(call, hosted, ran)))
    return await cut(backend, ran.text, ctx.server.max_tool_result_tokens)


DECLINED = "The user declined this call: it was not run."


async def approved(ctx: Context, backend: Backend, toolbox: Toolbox, approvals: list[Approval],
                   req: protocol.GenerationRequest) -> list[Told]:
    """The calls the caller approved (or declined) since the answer that asked for it (Responses'
    ``mcp_approval_response``), settled before this answer's first generation: an approved one
    is run, a declined one is not; each goes into the conversation with its result, or with the
    word that it was declined. One of a tool this request does not offer, or whose calls wait for
    no approval (made up, to run a tool without the model), is no approval at all. Returns what
    the writer is told of those that ran, once the answer opens."""
    told: list[Told] = []
    calls: list[HeldCall] = []
    results: list[str] = []
    for a in approvals:
        if a.name is None or a.server is None:
            continue
        name = function_name(a.server, a.name)
        call = HeldCall(f"call_{secrets.token_hex(12)}", name, a.arguments or "{}", a.request_id)
        if not (toolbox.owns(name) and toolbox.offers[name].needs_approval):
            continue  # made up (its tool waits for no approval) or no longer offered: nothing to settle
        calls.append(call)
        if not a.approve:
            results.append(DECLINED)
            continue
        hosted = _hosted(call, toolbox)
        ran = await toolbox.run(call.name, call.arguments)
        record(ctx.observation, ran)
        told.append((hosted, _result(call, hosted, ran)))
        results.append(await cut(backend, ran.text, ctx.server.max_tool_result_tokens))
    if calls:
        _converse(req, "", calls, results)
    return told



async def rounds(ctx: Context, backend: Backend, req: protocol.GenerationRequest, out: Writer,
                 sse: EventStream | None, toolbox: Toolbox, run: Run,
                 first: list[Told] | None = None) -> wire_answer.Finish:
    """The answer of ``req`` from its first generation, ``run`` (started by the caller, so a
    refusal is a plain error response; its events are the caller's to leave), through every
    round of hosted calls (see the module); ``first``: approved calls run before it (``approved``),
    told once it opens.
    Returns the last generation's finish (the writer's ``go_on`` kept the ones before)."""
    obs = ctx.observation
    await send(sse, out.open(run.begun))
    for hosted, result in first or ():
        await send(sse, out.hosted(hosted))
        await send(sse, out.hosted_result(result))
    done = 0
    mine: tuple[Any, Run | None] | None = None  # a further generation, this loop's to leave
    try:
        while True:
            held = Held(toolbox.owns)
            finish = await read(obs, run, out, sse, held)
            calls = list(held.calls.values())
            if not calls:
                return finish
            waiting = [c for c in calls if toolbox.offers[c.name].needs_approval]
            if waiting:  # the answer ends asking for the caller's approval (Responses)
                for call in waiting:
                    await send(sse, out.approval(_hosted(call, toolbox), f"mcpr_{secrets.token_hex(12)}"))
                return finish
            results = [await _run(ctx, backend, toolbox, call, out, sse) for call in calls]
            if held.callers:  # a tool of the caller's too: the answer goes back to the caller now
                return finish
            _converse(req, "".join(held.text), calls, results)
            done += 1
            if done >= ctx.server.max_tool_rounds:
                _without_hosted(req, toolbox)  # the last generation: no hosted tool left to call
            if mine is not None:
                left(obs, mine[0], mine[1])
                mine[0].close()
            gen = backend.generate(req)
            mine = (gen, None)
            if sse is not None:
                gen.on_idle = sse.flush
            run = await start(obs, gen, req, stream=False)
            mine = (gen, run)
            await send(sse, out.go_on(finish, run.begun))
    finally:
        if mine is not None:
            left(obs, mine[0], mine[1])
            mine[0].close()


def _converse(req: protocol.GenerationRequest, text: str, calls: list[HeldCall], results: list[str]) -> None:
    """The round's calls and their results put into the conversation, as the model's template
    has a function's: the assistant's message (``text``) with its calls, then a tool message each."""
    messages = req.messages if req.messages is not None else []
    messages.append(_assistant(text, calls))
    messages.extend({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": text}
                    for c, text in zip(calls, results, strict=True))
    req.messages = messages
    req.tool_choice = "auto"  # a choice that forced a call was answered by the first


def _without_hosted(req: protocol.GenerationRequest, toolbox: Toolbox) -> None:
    req.tools = [t for t in req.tools or () if not toolbox.owns(t["function"]["name"])] or None
    if req.tool_names is not None:
        req.tool_names = tuple(n for n in req.tool_names if not toolbox.owns(n)) or None
