"""Compaction (``POST /v1/responses/compact``), as OpenAI's API answers it: a conversation
replaced by its user messages and one ``compaction`` item, whose ``encrypted_content`` holds a
summary the model wrote (``api/compaction`` runs the summarising). Pure: no I/O.

The summary is sealed as reasoning is (``sealed.seal`` with ``field="summary"``): signed with
the gateway's key, so only this gateway reads it back, and a reasoning item's seal does not open
as a compaction. Read back (``as_message``), it is a user turn that says it is the summary so
far; ``joined`` folds it and the user messages next to it into one user turn, as a compacted
list (user messages, the compaction, then the next user message) would otherwise put several
user turns in a row, which many chat templates refuse (Gemma's: "roles must alternate").

The summariser reads the conversation as a transcript (``transcript``: a turn per line, calls
and results written out, thinking left out), cut into parts of a given size in bytes at line or
word boundaries (``parts``); instructions are not summarised: the next request carries its own.
A turn's further lines are indented, so no text in it (a tool's result, a fetched page) starts
a line that reads as another turn ("User: ..."): once summarised, what a tool said would be
read back in the user's own turn.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ...base.errors import ApiError, InvalidRequest
from ...protocol import GenerationRequest, Start
from ..answer import CONTENT, Finish, Item, Piece
from ..writer import Frame, Writer
from .sealed import EPHEMERAL, seal, unseal

FIELD = "summary"  # the sealed payload's field
MARK = "compaction"  # on a message read from a compaction item, until ``joined`` folds it in
KEPT = "kept"  # on the user turn ``joined`` made: the user messages' texts folded into it (``kept``)
NOTE = "Summary of the conversation so far:"
CONTINUED = "(continued) "  # opens a transcript's part that starts inside a line (``parts``)
SUMMARISE = ("You summarise conversations. Write a concise summary of the conversation below: the user's "
             "goals and requests, decisions made, facts and results learned (file names, values, tool "
             "results), and what remains to do. Write only the summary.")
ROLES = {"user": "User", "assistant": "Assistant", "tool": "Tool result", "system": "System"}


def new_id(prefix: str) -> str:
    """An item's id, as ``output.new_id`` makes them (``output`` imports this module's reader)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def as_message(item: dict[str, Any], where: str, key: bytes = EPHEMERAL) -> dict[str, Any]:
    """A ``compaction`` input item as the user turn that tells its summary; a 400 naming
    ``where.encrypted_content`` for one this gateway did not seal (another server's, altered)."""
    summary = unseal(item.get("encrypted_content"), f"{where}.encrypted_content", key, FIELD)
    return {"role": "user", "content": f"{NOTE}\n{summary}", MARK: True}


def joined(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each run of user turns that holds a compaction's summary folded into
    one user turn (texts joined by a blank line, in order); other messages as they were."""
    if not any(m.get(MARK) for m in messages):
        return messages
    out: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []

    def flush() -> None:
        if any(m.get(MARK) for m in run):
            texts = [t for m in run if not m.get(MARK) for t in m.get(KEPT, [m["content"]])]
            out.append({"role": "user", "content": "\n\n".join(str(m["content"]) for m in run), KEPT: texts})
        else:
            out.extend(run)
        run.clear()

    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            run.append(m)
            continue
        flush()
        out.append(m)
    flush()
    return out


def transcript(messages: list[dict[str, Any]]) -> str:
    """The conversation as the summariser reads it: a line per turn, each call and result
    written out; thinking and system turns (the caller's instructions) left out."""
    lines: list[str] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        content = m.get("content")
        text = content if isinstance(content, str) else ""
        if role == "tool":
            lines.append(_turn(f"Tool result ({m.get('name') or 'tool'}): {text}"))
            continue
        if text:
            lines.append(_turn(f"{ROLES.get(str(role), 'User')}: {text}"))
        for call in m.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments = function.get("arguments")
            shown = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            lines.append(_turn(f"Assistant called {function.get('name')} with {shown}"))
    return "\n".join(lines)


def _turn(line: str) -> str:
    """A turn's line, each line after its first indented (every line break Python knows, a bare
    carriage return and U+2028 included, made a newline): only a turn starts a line."""
    return "\n  ".join(line.splitlines())


def parts(text: str, size: int, mark: str = "") -> list[str]:
    """``text`` cut into parts of at most ``size`` bytes of UTF-8 (a part smaller than a
    character: that character), each cut at the last line break, else space, of its part when
    one lies in its second half, never inside a character; blanks at a part's end and line
    breaks at its start dropped (a continuation line's indent is kept). ``mark`` (``CONTINUED``
    for a transcript's parts) opens each part that starts inside a line, past its size: a
    part's first words are then never read as a turn's start ("User: ...") they were not."""
    size = max(1, size)
    out: list[str] = []
    data = text.encode()
    start = 0
    while start < len(data):
        end = min(len(data), start + size)
        if end < len(data):
            cut = max(data.rfind(b"\n", start, end), data.rfind(b" ", start, end))
            if cut > start + size // 2:
                end = cut + 1
            back = end
            while back > start and (data[back] & 0xC0) == 0x80:  # not inside a character
                back -= 1
            if back == start:  # a part smaller than its one character: that character whole
                while end < len(data) and (data[end] & 0xC0) == 0x80:
                    end += 1
            else:
                end = back
        # a part cut at a line break keeps the indent of a turn's further line (``transcript``)
        part = data[start:end].decode("utf-8", "replace").rstrip().lstrip("\r\n")
        inside = start > 0 and data[start - 1:start] != b"\n" and data[start:start + 1] not in (b"\n", b"\r")
        out.append(mark + part if part and inside else part)
        start = end
    return [p for p in out if p]


def summary_request(text: str, max_tokens: int) -> GenerationRequest:
    """The generation that summarises ``text`` (a transcript, or the summaries of its parts):
    one user turn, which every chat template takes (some refuse a system turn)."""
    return GenerationRequest(messages=[{"role": "user", "content": f"{SUMMARISE}\n\nConversation:\n{text}"}],
                             max_tokens=max_tokens, temperature=0.2)


def kept(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user messages of ``messages`` as a compacted list keeps them (output message items),
    in order; of a turn that holds an earlier compaction's summary, the user messages folded
    into it (the summary is summarised again instead)."""
    texts = [t for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)
             for t in m.get(KEPT, [m["content"]])]
    return [{"id": new_id("msg"), "type": "message", "status": "completed", "role": "user",
             "content": [{"type": "input_text", "text": text}]} for text in texts]


def compacted(users: list[dict[str, Any]], summary: str, key: bytes, usage: dict[str, int]) -> dict[str, Any]:
    """The ``CompactedResponse``: the user messages kept, then the compaction item holding the
    sealed ``summary``; ``usage``: the summarising's tokens (``input``, ``cached``, ``output``)."""
    item = {"id": new_id("cmp"), "type": "compaction", "encrypted_content": seal(summary, key, FIELD)}
    return {"id": new_id("resp"), "object": "response.compaction", "created_at": int(time.time()),
            "output": [*users, item],
            "usage": {"input_tokens": usage["input"], "input_tokens_details": {"cached_tokens": usage["cached"]},
                      "output_tokens": usage["output"], "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": usage["input"] + usage["output"]}}


def nothing(param: str = "input") -> InvalidRequest:
    return InvalidRequest("nothing to compact: `input` (or the response `previous_response_id` names) holds no "
                          "messages", param)


class Collector(Writer):
    """A summary's text, gathered from its answer (thinking apart, the text used where the
    answer is thinking alone); it writes no frames."""

    def __init__(self, model: str):
        super().__init__(model, stream=False)
        self.content: list[str] = []
        self.thinking: list[str] = []

    def open(self, begun: Start) -> list[Frame]:
        return []

    def feed(self, item: Item) -> list[Frame]:
        if isinstance(item, Piece):
            (self.content if item.kind == CONTENT else self.thinking).append(item.text)
        return []

    def close(self, finish: Finish) -> list[Frame]:
        return []

    def fail(self, err: ApiError) -> list[Frame]:
        return []

    def text(self) -> str:
        return ("".join(self.content).strip() or "".join(self.thinking).strip())
