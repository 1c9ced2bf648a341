"""OpenAI's chat and text completion answers: every body and chunk of one (``Renderer``), and
the wire's ``Writer``, which owns its whole and its streamed form (``wire.writer``)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import ApiError
from ..protocol import Start
from ..tools import citations
from ..tools.hosted import Page, SearchResult
from . import answer, writer
from .answer import Call, CallArgs, Finish, Item, Piece
from .context import Context
from .params import Parsed
from .writer import Frame, HostedResult, Usage


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(finishes: list[Finish], chat: bool) -> dict[str, Any]:
    prompt = sum(f.prompt_tokens for f in finishes)
    completion = sum(f.completion_tokens for f in finishes)
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion,
                           "prompt_tokens_details": {"cached_tokens": sum(f.cached_tokens for f in finishes)}}
    if chat:
        out["completion_tokens_details"] = {"reasoning_tokens": sum(f.reasoning_tokens for f in finishes)}
    drafted = sum(f.drafted for f in finishes)
    if drafted:  # speculative decoding (the model's spec_type): what it proposed and kept
        out["speculation"] = {"drafted": drafted, "accepted": sum(f.accepted for f in finishes)}
    return out


@dataclass
class Renderer:
    """Builds every body and chunk of one answer, chat or text completion."""

    # "chat" | "completion" | "fim": Mistral's /v1/fim/completions, in the chat shape (Mistral's
    # answers, and Continue reads ``choices[0].delta.content``), its last chunk carrying an empty
    # content and the usage (a chunk without choices would break those readers)
    kind: str
    model: str
    fields: tuple[str, ...] = ("reasoning_content", "reasoning")  # where thinking goes in a message or delta
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def chat(self) -> bool:
        return self.kind in ("chat", "fim")

    def __post_init__(self) -> None:
        if not self.id:
            self.id = new_id("chatcmpl" if self.chat else "cmpl")

    def _chunk(self, choice: dict[str, Any], usage_: dict[str, Any] | None = None, choices: bool = True):
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        body: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                                "choices": [choice] if choices else []}
        if usage_ is not None:
            body["usage"] = usage_
        return body

    def first_chunk(self) -> dict[str, Any] | None:
        if not self.chat:
            return None
        return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def _logprobs(self, entries: list[dict[str, Any]] | None, offset: int = 0) -> dict[str, Any] | None:
        """Chat: {"content": [...]}; text completions: the legacy tokens / token_logprobs shape."""
        if entries is None:
            return None
        if self.chat:
            return {"content": entries, "refusal": None}
        offsets, at = [], offset
        for e in entries:
            offsets.append(at)
            at += len(e["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}

    def delta_chunk(self, piece: Piece, index: int = 0, offset: int = 0) -> dict[str, Any]:
        logprobs = self._logprobs(piece.logprobs, offset)
        if not self.chat:
            return self._chunk({"index": index, "text": piece.text, "logprobs": logprobs, "finish_reason": None})
        if piece.kind == "thinking":
            delta = {f: piece.text for f in self.fields}
        else:
            delta = {"content": piece.text}
        return self._chunk({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None})

    def call_chunk(self, item: Call | CallArgs, index: int = 0) -> dict[str, Any]:
        """A streamed call: its id, type and name first, then its arguments in pieces."""
        if isinstance(item, Call):
            call = {"index": item.index, "id": item.id, "type": "function",
                    "function": {"name": item.name, "arguments": ""}}
        else:
            call = {"index": item.index, "function": {"arguments": item.text}}
        return self._chunk({"index": index, "delta": {"tool_calls": [call]}, "logprobs": None,
                            "finish_reason": None})

    def final_chunk(self, finish_reason: str, index: int = 0, finish: Finish | None = None) -> dict[str, Any]:
        if self.kind == "fim":
            return self._chunk({"index": index, "delta": {"content": ""}, "logprobs": None,
                                "finish_reason": finish_reason}, usage([finish], False) if finish else None)
        if self.chat:
            return self._chunk({"index": index, "delta": {}, "logprobs": None, "finish_reason": finish_reason})
        return self._chunk({"index": index, "text": "", "logprobs": None, "finish_reason": finish_reason})

    def annotations_chunk(self, notes: list[dict[str, Any]], index: int = 0) -> dict[str, Any]:
        """A streamed answer's citations, as OpenAI's search models send them: a delta of
        ``annotations`` alone, after the content's last piece."""
        return self._chunk({"index": index, "delta": {"annotations": notes}, "logprobs": None, "finish_reason": None})

    def usage_chunk(self, finishes: list[Finish]) -> dict[str, Any]:
        return self._chunk({}, usage(finishes, self.chat), choices=False)

    def choice(self, index: int, content: str, thinking: str, finish: Finish,
               logprobs: list[dict[str, Any]] | None, echo: str = "",
               calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """``calls``: the tool calls made, each ``{"id", "name", "arguments"}`` (arguments as
        JSON text); with calls, ``content`` is the text before them, or null."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
            if thinking:
                message.update({f: thinking for f in self.fields})
            if calls:
                message["content"] = content or None
                message["tool_calls"] = [{"id": c["id"], "type": "function",
                                          "function": {"name": c["name"], "arguments": c["arguments"]}}
                                         for c in calls]
            return {"index": index, "message": message, "logprobs": self._logprobs(logprobs),
                    "finish_reason": finish.reason}
        return {"index": index, "text": echo + content, "logprobs": self._logprobs(logprobs, len(echo)),
                "finish_reason": finish.reason}

    def whole(self, choices: list[dict[str, Any]], finishes: list[Finish]) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices,
                "usage": usage(finishes, self.chat)}


def annotation(found: citations.Citation) -> dict[str, Any]:
    return {"type": "url_citation", "url_citation": {"start_index": found.start, "end_index": found.end,
                                                     "url": found.url, "title": found.title}}


class Writer(writer.Writer):
    """An answer in OpenAI's shape: a chat completion (Mistral's fill in the middle too) or a
    text completion, whole or streamed as chunks ending in ``[DONE]``. A batch of prompts is
    one choice each, their generations one after another (``open`` again for each).

    A hosted tool's call has no form here; what it found is cited: a chat message whose
    content (written after the result) cites a search result or page carries ``annotations``
    (``url_citation``), streamed as one delta of them before the finish."""

    done = "[DONE]"

    def __init__(self, parsed: Parsed, ctx: Context, kind: str):
        super().__init__(parsed.model, parsed.stream)
        self.parsed = parsed
        self.render = Renderer(kind, parsed.model, fields=ctx.server.reasoning_fields,
                               id=f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{ctx.request_id}")
        self.id = self.render.id
        self.index = -1  # the choice being written
        self.offset = 0  # a text completion's characters so far (its logprobs' text_offset)
        self.choices: list[dict[str, Any]] = []
        self.finishes: list[Finish] = []
        self.echo = ""
        self.whole = answer.Whole()
        self.content: list[str] = []  # a streamed choice's content, for its citations
        self.sources: list[tuple[SearchResult | Page, int]] = []  # a source, and the content's length as it came

    def leased(self, model: str) -> None:
        self.model = self.render.model = model

    def open(self, begun: Start) -> list[Frame]:
        self.index += 1
        self.echo, self.offset = begun.prompt_text or "", 0
        self.content, self.sources = [], []
        if not self.stream:
            wants = self.parsed.requests[self.index].logprobs is not None
            self.whole = answer.Whole(logprobs=[] if wants else None)
            return []
        frames: list[Frame] = []
        if self.index == 0 and (chunk := self.render.first_chunk()) is not None:
            frames.append((chunk, None))
        if self.echo:
            frames.append((self.render.delta_chunk(Piece("content", self.echo), self.index), None))
            self.offset = len(self.echo)
        return frames

    def feed(self, item: Item) -> list[Frame]:
        if not self.stream:
            self.whole.feed(item)
            return []
        if isinstance(item, Piece):
            chunk = self.render.delta_chunk(item, self.index, self.offset)
            self.offset += len(item.text)
            if item.kind == "content":
                self.content.append(item.text)
            return [(chunk, None)]
        return [(self.render.call_chunk(item, self.index), None)]

    def hosted_result(self, result: HostedResult) -> list[Frame]:
        """Nothing is told; what it found may be cited by the content that follows."""
        if self.render.chat:
            written = len(self.whole.content if not self.stream else "".join(self.content))
            self.sources += [(source, written) for source in result.sources()]
        return []

    def _annotations(self, content: str) -> list[dict[str, Any]]:
        """The content's citations of each source, in what was written after it came."""
        found = citations.find(content, [source for source, _ in self.sources])
        return [annotation(c) for c in found if c.start >= self.sources[c.source][1]]

    def close(self, finish: Finish) -> list[Frame]:
        finish = self.usage.total(finish)  # a choice's generations before this one (``go_on``) count too
        self.usage = Usage()
        self.finishes.append(finish)
        if not self.stream:
            w = self.whole
            choice = self.render.choice(self.index, w.content, w.thinking, finish, w.logprobs, self.echo, w.calls)
            if self.sources and (notes := self._annotations(w.content)):
                choice["message"]["annotations"] = notes
            self.choices.append(choice)
            return []
        frames: list[Frame] = []
        if self.sources and (notes := self._annotations("".join(self.content))):
            frames.append((self.render.annotations_chunk(notes, self.index), None))
        return frames + [(self.render.final_chunk(finish.reason, self.index, finish), None)]

    def end(self) -> list[Frame]:
        if self.stream and self.parsed.include_usage:
            return [(self.render.usage_chunk(self.finishes), None)]
        return []

    def fail(self, err: ApiError) -> list[Frame]:
        """In-band: where a choice began, it ends with ``error``; then the error object."""
        told: list[Frame] = [(err.openai_body(), None)]
        return told if self.index < 0 else [(self.render.final_chunk("error"), None), *told]

    def body(self) -> dict[str, Any]:
        return self.render.whole(self.choices, self.finishes)
