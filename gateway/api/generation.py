"""One generation of an answer, as the pipeline runs it (``api/pipeline``, and the rounds of
``api/toolloop`` where the gateway runs tools between generations): started (``start``: a
refusal is still a plain error), read into the writer with its tokens counted (``read``), and
counted however it is left (``left``). ``Held`` takes out of an answer the calls of tools the
gateway runs itself, which the writer never sees as calls of the caller's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import protocol
from ..backends.local import GenerationEvents
from ..base.errors import ApiError
from ..server.events import Observation, Tally
from ..server.sse import EventStream
from ..wire import answer as wire_answer
from ..wire.writer import Frame, Writer


@dataclass
class HeldCall:
    id: str
    name: str
    arguments: str = ""
    approval: str | None = None  # the approval request it answers (a call the caller approved)


@dataclass
class Held:
    """What ``read`` keeps of an answer for the tool loop: the calls of hosted tools (``owns``
    says which names are), not fed to the writer; whether the answer called a tool of the
    caller's too; and its content's text, for the conversation that goes on after the calls."""

    owns: Callable[[str], bool]
    calls: dict[int, HeldCall] = field(default_factory=dict)
    callers: bool = False
    text: list[str] = field(default_factory=list)

    def take(self, item: wire_answer.Item) -> bool:
        """Whether ``item`` is the loop's (held), not the writer's."""
        if isinstance(item, wire_answer.Call):
            if self.owns(item.name):
                self.calls[item.index] = HeldCall(item.id, item.name)
                return True
            self.callers = True
            return False
        if isinstance(item, wire_answer.CallArgs):
            call = self.calls.get(item.index)
            if call is None:
                return False
            call.arguments += item.text
            return True
        if item.kind == "content":
            self.text.append(item.text)
        return False


@dataclass
class Run:
    """One generation the backend accepted: its events, its start event (prompt tokens, the
    prompt's text for echo, ...), the reader of its answer and its tally (its tokens, as its
    request's observation counts them)."""

    gen: GenerationEvents
    begun: protocol.Start
    reader: wire_answer.Reader
    tally: Tally


async def start(obs: Observation, gen: GenerationEvents, req: protocol.GenerationRequest, *, stream: bool,
                refused: Callable[[ApiError], ApiError] | None = None) -> Run:
    """``gen`` (the generation of ``req``) once the backend accepted it. A refusal raises its
    error, before anything of the answer is written, so it is still a plain error response;
    ``refused`` puts it in the wire's own words. ``stream=False``: each call is given whole,
    once its arguments parse (``answer.start``)."""
    try:
        begun, reader = await wire_answer.start(gen, req, stream=stream)
    except ApiError as err:
        if refused is None:
            raise
        raise refused(err) from None
    return Run(gen, begun, reader, obs.began(begun))  # its prompt counted from here


async def read(obs: Observation, run: Run, out: Writer, sse: EventStream | None,
               held: Held | None = None) -> wire_answer.Finish:
    """``run``'s answer handed to ``out`` (after its ``open``, which the caller sends), its
    frames sent to ``sse`` (None: a whole answer, whose writer makes none) as they come, and its
    tokens, times and calls counted into ``obs``; ``held``: what the tool loop takes out of it.
    Returns its finish; an answer that ends without one is the worker's fault (500)."""
    tally, reader = run.tally, run.reader
    async for event in run.gen:
        items = reader.read(event)
        if reader.fresh is not None:
            tally.generated(reader.tokens)
            obs.tokens(reader.fresh)
        for item in items:
            if isinstance(item, wire_answer.Finish):
                tally.counts(item.prompt_tokens, item.cached_tokens, item.completion_tokens)
                obs.finished(item)
                obs.tool_calls += reader.completed
                obs.tool_call_failures += reader.failures
                return item
            if held is not None and held.take(item):
                continue
            if sse is not None:
                for data, name in out.feed(item):
                    await sse.send(data, event=name, hold=True)
            else:
                out.feed(item)
    raise ApiError("the model worker ended the answer without finishing it", status=500)


async def send(sse: EventStream | None, frames: list[Frame]) -> None:
    if sse is not None:
        for data, name in frames:
            await sse.send(data, event=name)


def left(obs: Observation, gen: GenerationEvents, run: Run | None) -> None:
    """``gen`` (``run``'s, or one never started) is left, maybe before its end: its client went,
    it failed, or it was cancelled. What its backend sent and nobody read was generated all the
    same and is counted too: the prompt of a ``Start``, the tokens the last text event says, or a
    ``Done``'s own counts; so the access middleware charges it however the request ended. (What
    a worker generates after the cancel reaches it, a step or so, is not seen here.) Cheap at
    the end of an answer read whole: nothing is left unread."""
    unread = gen.unread()
    if not unread:
        return
    tally = run.tally if run is not None else None
    if tally is None:
        first = unread[0]
        if not isinstance(first, protocol.Start):
            return  # refused or failed before it began: nothing was read of its prompt
        tally = obs.began(first)
    for event in reversed(unread):  # the last count a backend sent holds every one before it
        if isinstance(event, protocol.Done):
            tally.counts(event.prompt_tokens, event.cached_tokens, event.completion_tokens)
            return
        if isinstance(event, protocol.Text | protocol.Thinking | protocol.CallDelta) and event.tokens:
            tally.generated(event.tokens)
            return


