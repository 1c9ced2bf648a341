"""One answer, whatever the wire shape: the worker's events turned into thinking and content
pieces and a finish. Streamed and whole answers both consume this, so they cannot drift."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator

from .engine.client import Generation
from .errors import ApiError
from .reasoning import ReasoningSplitter, detect


@dataclass
class Piece:
    kind: str  # "thinking" | "content"
    text: str


@dataclass
class Finish:
    reason: str  # stop | length | cancelled
    stop: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int


def error_from(event: dict[str, Any]) -> ApiError:
    return ApiError(event["message"], status=event.get("status", 500), param=event.get("param"),
                    code=event.get("code"))


def reasoning_format(configured: str, info: dict[str, Any]) -> str | None:
    """The marker format to split by: the model's ``reasoning`` setting, or for ``auto`` what its
    chat template and vocabulary show."""
    if configured == "none":
        return None
    if configured != "auto":
        return configured
    return detect(info.get("chat_template"), info.get("special_tokens", []))


async def start(gen: Generation, reasoning: str | None) -> tuple[int, ReasoningSplitter | None]:
    """Wait for the worker to accept the request (a refusal raises its error); returns the
    prompt's token count and the splitter for the answer's thinking (``reasoning``: the
    model's setting; None: do not split)."""
    event = await gen.next()
    if event["ev"] == "error":
        raise error_from(event)
    fmt = reasoning_format(reasoning, gen.worker.info) if reasoning else None
    return event["prompt_tokens"], ReasoningSplitter(fmt, event.get("prompt_tail", "")) if fmt else None


async def pieces(gen: Generation, splitter: ReasoningSplitter | None) -> AsyncIterator[Piece | Finish]:
    seen = reasoning = 0
    async for event in gen:
        ev = event["ev"]
        if ev == "error":
            raise error_from(event)
        if ev == "text":
            n, seen = event["tokens"] - seen, event["tokens"]
            if splitter is None:
                yield Piece("content", event["text"])
                continue
            segments = splitter.feed(event["text"])
            if splitter.thinking or any(kind == "thinking" for kind, _ in segments):
                reasoning += n
            for kind, text in segments:
                yield Piece(kind, text)
        elif ev == "done":
            for kind, text in splitter.flush() if splitter else ():
                yield Piece(kind, text)
            yield Finish(event["finish_reason"], event.get("stop"), event["prompt_tokens"],
                         event["completion_tokens"], reasoning)
