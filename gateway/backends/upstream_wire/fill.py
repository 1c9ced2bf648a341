"""Fill in the middle at an upstream server: its llama-server-shaped ``/infill`` (where it is,
its request body, its answer read back as backend events) and what a backend reports of it. Pure.

A FIM request (``req.suffix`` set) goes to the upstream's ``POST /infill`` (at the server's root,
beside the OpenAI base URL's /v1: llama-server and this gateway serve it there), which lays the
prompt out from the model's FIM tokens where the vocabulary is. An upstream that answers one of
FIM_FALLBACK for it (vLLM, Ollama, LM Studio) gets ``request_body``'s ``/completions`` with
``prompt`` and ``suffix`` instead (`upstream_wire/bodies.py`), the OpenAI shape their completions
take a suffix in.
"""

from __future__ import annotations

from typing import Any

from ...protocol import Done, Event, GenerationRequest, Text
from .bodies import add_sampling
from .failures import MalformedStream, check_chunk, count_of, json_of
from .stream import Bounds

FIM_FALLBACK = (404, 405)
# A backend's ``fim`` info where its upstream server is sent fill-in-the-middle: whether the model
# can is not known here, the upstream refuses for itself
FIM_FORWARDED = "upstream"
_BOUNDS = Bounds()  # an answer's bounds without max_tokens: frozen, so one serves every reader


def infill_url(base_url: str) -> str:
    """The upstream's /infill: at the root of the server whose OpenAI base URL is ``base_url``
    (its trailing ``/v1`` left out)."""
    root = base_url.rstrip("/")
    return (root[:-len("/v1")] if root.endswith("/v1") else root) + "/infill"


def infill_body(req: GenerationRequest, model: str) -> dict[str, Any]:
    """llama-server's /infill request for ``req`` (``req.suffix`` set), always streamed."""
    assert req.suffix is not None and req.prompt is not None
    body: dict[str, Any] = {"model": model, "stream": True, "input_prefix": req.prompt, "input_suffix": req.suffix}
    if req.infill_extra:
        body["input_extra"] = req.infill_extra
    if req.infill_prompt:
        body["prompt"] = req.infill_prompt
    if req.max_tokens is not None:
        body["n_predict"] = req.max_tokens
    add_sampling(body, req)
    if req.ignore_eos:
        body["ignore_eos"] = True
    return body


class InfillReader:
    """An upstream's /infill stream (llama-server's /completion shape: ``{"content", "stop":
    false}`` per piece, the last with ``"stop": true``, its ``stop_type``, token counts and
    ``timings``; no ``[DONE]``) -> backend events, with ``ChunkReader``'s bounds and interface."""

    chat = False

    def __init__(self, rid: int, bounds: Bounds = _BOUNDS):
        self.rid, self.bounds = rid, bounds
        self.tokens = self.pieces = self.kept = 0
        self.done = self.truncated = False
        self.finish: str | None = None
        self.stop: str | None = None
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.usage = False

    def feed(self, data: str) -> list[Event]:
        if self.done:
            return []
        if data.strip() == "[DONE]":  # a server that sends one anyway
            self.done = True
            return [self.finished()]
        return self.take(json_of(data, "an event"), len(data))

    def whole(self, body: bytes) -> list[Event]:
        """A whole answer (stream: false, or a server that ignored stream: true): the last object."""
        return self.take(json_of(body, "a whole answer", "answer"), len(body)) + self.feed("[DONE]")

    def take(self, chunk: Any, size: int) -> list[Event]:
        if self.done:
            return []
        check_chunk(chunk)
        content = chunk.get("content")
        if content is not None and not isinstance(content, str):
            raise MalformedStream("`content` that is not a string")
        out: list[Event] = []
        if content:
            self.tokens += 1
            out.append(Text(self.rid, content, self.tokens, None))
            self.pieces += 1
            self.kept += size
            if self.pieces > self.bounds.chunks or self.kept > self.bounds.bytes:
                return [self.cut()]
        if chunk.get("stop") is True:
            kind = chunk.get("stop_type")
            self.finish = "length" if kind == "limit" else "stop"
            word = chunk.get("stopping_word")
            self.stop = word if kind == "word" and isinstance(word, str) and word else None
            if "tokens_predicted" in chunk or "tokens_evaluated" in chunk:
                self.usage = True
                self.prompt_tokens = count_of(chunk.get("tokens_evaluated"))
                self.completion_tokens = count_of(chunk.get("tokens_predicted"))
                timings = chunk.get("timings")
                cached = chunk.get("tokens_cached", timings.get("cache_n") if isinstance(timings, dict) else 0)
                self.cached_tokens = count_of(cached)
            self.done = True
            out.append(self.finished())
        return out

    def cut(self, reason: str = "length") -> Done:
        self.done = self.truncated = True
        self.finish = reason
        return self.finished()

    def finished(self) -> Done:
        completion = self.completion_tokens if self.usage else self.tokens
        return Done(self.rid, self.finish or "stop", self.stop, self.prompt_tokens, completion, self.cached_tokens)
