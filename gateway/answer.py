"""One answer, whatever the wire shape: the worker's events turned into thinking and content
pieces and a finish. Streamed and whole answers both consume this, so they cannot drift."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from .backend import GenerationEvents
from .engine import protocol
from .errors import ApiError
from .events import Observation
from .reasoning import ReasoningSplitter, detect


@dataclass
class Piece:
    kind: str  # "thinking" | "content"
    text: str
    logprobs: list[dict[str, Any]] | None = None  # the tokens this piece completes, when asked for


@dataclass
class Call:
    """A tool call opens: its id and tool are known; its arguments follow as ``CallArgs``."""

    index: int  # 0, 1, ... within the answer
    id: str  # call_...
    name: str


@dataclass
class CallArgs:
    """A piece of a call's arguments, JSON text; a call's pieces together are one JSON object."""

    index: int
    text: str


Item = Piece | Call | CallArgs  # what an answer yields before its Finish


@dataclass
class Finish:
    reason: str  # stop | length | cancelled | tool_calls (the answer ended after its calls)
    stop: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from the slot's cache (not decoded again)


def api_error(event: protocol.Error) -> ApiError:
    """The one translation of a worker's error event into what the caller is told."""
    return ApiError(event.message, status=event.status, param=event.param, code=event.code)


def reasoning_format(configured: str, info: dict[str, Any]) -> str | None:
    """The marker format to split by: the model's ``reasoning`` setting, or for ``auto`` what its
    chat template and vocabulary show."""
    if configured == "none":
        return None
    if configured != "auto":
        return configured
    return detect(info.get("chat_template"), info.get("special_tokens", []))


async def start(gen: GenerationEvents, reasoning: str | None,
                info: dict[str, Any]) -> tuple[protocol.Start, ReasoningSplitter | None]:
    """Wait for the backend to accept the request (a refusal raises its error); returns its
    start event (prompt_tokens, prompt_text for echo, ...) and the splitter for the answer's
    thinking (``reasoning``: the model's setting; None: do not split; ``info``: what the
    backend reported at load, read for ``auto``)."""
    event = await gen.next()
    if isinstance(event, protocol.Error):
        raise api_error(event)
    if not isinstance(event, protocol.Start):
        raise ApiError(f"the model worker answered {type(event).__name__} before starting", status=500)
    fmt = reasoning_format(reasoning, info) if reasoning else None
    return event, ReasoningSplitter(fmt, event.prompt_tail) if fmt else None


async def pieces(gen: GenerationEvents, splitter: ReasoningSplitter | None,
                 obs: Observation | None = None) -> AsyncIterator[Item | Finish]:
    """Thinking and content pieces, then the finish. Token log-probabilities ride on the next
    piece to leave (a marker held back by the splitter delays them, never drops them).
    ``obs`` gets the token times and counts (time to first token, inter-token latency)."""
    seen = reasoning = 0
    probs: list[dict[str, Any]] = []
    async for event in gen:
        if isinstance(event, protocol.Error):
            raise api_error(event)
        if isinstance(event, protocol.Text):
            n, seen = event.tokens - seen, event.tokens
            if obs is not None:
                obs.tokens(n)
            if event.logprobs:
                probs += event.logprobs
            if splitter is None:
                segments = [("content", event.text)]
            else:
                segments = splitter.feed(event.text)
                if splitter.thinking or any(kind == "thinking" for kind, _ in segments):
                    reasoning += n
            for kind, text in segments:
                yield Piece(kind, text, probs or None)
                probs = []
        elif isinstance(event, protocol.Done):
            for kind, text in splitter.flush() if splitter else ():
                yield Piece(kind, text, probs or None)
                probs = []
            finish = Finish(event.finish_reason, event.stop, event.prompt_tokens, event.completion_tokens,
                            reasoning, event.cached_tokens)
            if obs is not None:
                obs.finished(finish)
            yield finish
