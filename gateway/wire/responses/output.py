"""A Responses answer: ``ResponseBuilder`` turns the answer's pieces into output items
(``reasoning``, ``message``, ``function_call``, ``custom_tool_call``) and the documented stream
events, for streamed and whole answers alike (a whole answer is the same events with nobody
listening), and the output back into history messages for ``previous_response_id``.

``reasoning.summary`` gives the thinking as a summary part too; ``include:
["reasoning.encrypted_content"]`` seals it into the reasoning item (``sealed.seal``)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ...base import strictjson
from ...base.errors import ApiError
from ...protocol import Start
from ...tools import citations
from ...tools.hosted import Page, SearchResult, ToolInfo
from .. import hostedhistory, writer
from ..answer import Call, CallArgs, Finish, Piece
from ..writer import Frame, Hosted, HostedResult
from .request import HOSTED_CALLS, ResponsesParsed, add_call
from .sealed import seal
from .tools import CUSTOM_INPUT, ToolOrigin, custom_input, flat_name


def frames(events: list[dict[str, Any]]) -> list[Frame]:
    """Stream events as they are sent: each under its type's event name."""
    return [(event, event["type"]) for event in events]


def _object(arguments: str) -> dict[str, Any]:
    try:
        value = strictjson.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def hosted_id(kind: str, call_id: str) -> str:
    """The Responses API's spelling of a hosted call's item id: ``ws_...``, an MCP call's ``mcp_...``."""
    prefix = "mcp_" if kind == "mcp" else "ws_"
    return call_id if call_id.startswith(prefix) else prefix + call_id.removeprefix("call_")


def hosted_item(call: Hosted) -> dict[str, Any]:
    """A hosted call's item, in progress: an ``mcp_call``, or a ``web_search_call`` whose action
    is a search (its query) or, for a fetch, ``open_page`` (its URL)."""
    if call.kind == "mcp":
        return {"type": "mcp_call", "id": hosted_id(call.kind, call.id), "server_label": call.server or "",
                "name": call.name, "arguments": call.arguments, "output": None, "error": None,
                "status": "in_progress", "approval_request_id": call.approval_request_id}
    given = _object(call.arguments)
    action: dict[str, Any]
    if call.kind == "web_fetch":
        action = {"type": "open_page", "url": str(given.get("url", ""))}
    else:
        action = {"type": "search", "query": str(given.get("query", ""))}
    return {"type": "web_search_call", "id": hosted_id(call.kind, call.id), "status": "in_progress",
            "action": action}


def hosted_done(item: dict[str, Any], result: HostedResult) -> None:
    """A hosted call's item as its result leaves it: an MCP call's output, or its error (the
    tool's own failure and the gateway's alike, told as a tool's execution error); a search's
    sources."""
    item["status"] = "failed" if result.failed else "completed"
    if item["type"] == "mcp_call":
        told = result.error if result.error is not None else getattr(result.output, "text", "")
        if result.failed:
            item["error"] = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": told}]}
        else:
            item["output"] = told
    elif item["action"]["type"] == "search" and not result.failed:
        item["action"]["sources"] = [{"type": "url", "url": r.url} for r in result.sources()]


def tool_list(tools: list[ToolInfo]) -> list[dict[str, Any]]:
    """An MCP server's tools as ``mcp_list_tools`` lists them."""
    return [{"name": t.name, "description": t.description, "input_schema": t.input_schema, "annotations": None}
            for t in tools]


def usage(finish: Finish) -> dict[str, Any]:
    """A response's ``usage``: the prompt tokens read from a slot's cache are its cached ones,
    the rest were decoded into it."""
    cached = finish.cached_tokens
    return {"input_tokens": finish.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": finish.prompt_tokens - cached},
            "output_tokens": finish.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": finish.reasoning_tokens},
            "total_tokens": finish.prompt_tokens + finish.completion_tokens}


def annotation(found: citations.Citation) -> dict[str, Any]:
    return {"type": "url_citation", "start_index": found.start, "end_index": found.end, "url": found.url,
            "title": found.title}


class ResponseBuilder(writer.Writer):
    """The answer's pieces in, the response's output items and stream events out (each event a
    frame under its type's name). Items open as the answer's kind changes (thinking, text, a
    call, a hosted tool's call) and close when the next begins. It names the model as asked."""

    def __init__(self, model: str, parsed: ResponsesParsed, response_id: str | None = None):
        super().__init__(model, parsed.stream)
        self.id = response_id or new_id("resp")
        self.parsed = parsed
        self.opened = False
        self._body: dict[str, Any] = {}
        self.created = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.seq = 0
        self._open: dict[str, Any] | None = None  # the item being written
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}  # the answer's call index -> its item
        self._hosted: dict[str, dict[str, Any]] = {}  # a hosted tool's item id -> its item, till its result
        self._listed: list[tuple[str, list[ToolInfo], str | None]] = []  # MCP listings told before ``open``
        self.sources: list[SearchResult | Page] = []  # what text written from now on may cite

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def response(self, status: str, finish: Finish | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": self.output if status != "in_progress" else [], "error": None, "incomplete_details": None,
            **self.parsed.echo}
        if status == "completed":
            body["completed_at"] = int(time.time())
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        if finish is not None:
            body["usage"] = usage(self.usage.total(finish))
        return body

    def leased(self, model: str) -> None:
        pass

    def open(self, begun: Start | None = None) -> list[Frame]:
        self.opened = True
        snapshot = self.response("in_progress")
        events = [self._event("response.created", response=snapshot),
                  self._event("response.in_progress", response=snapshot)]
        told = [frame for listed in self._listed for frame in self.listed(*listed)]
        self._listed = []
        return frames(events) + told

    def _index(self) -> int:
        return len(self.output) - 1

    def _close(self) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        i, events = self.output.index(item), []
        if item["type"] == "reasoning":
            text = "".join(self._text)
            item["content"] = [{"type": "reasoning_text", "text": text}]
            events.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=i,
                                      content_index=0, text=text))
            if self.parsed.summary is not None:
                summary = {"type": "summary_text", "text": text}
                item["summary"] = [summary]
                events += [self._event("response.reasoning_summary_text.done", item_id=item["id"], output_index=i,
                                       summary_index=0, text=text),
                           self._event("response.reasoning_summary_part.done", item_id=item["id"], output_index=i,
                                       summary_index=0, part=summary)]
            if self.parsed.encrypted:
                item["encrypted_content"] = seal(text, self.parsed.seal_key)
        elif item["type"] == "message":
            text = "".join(self._text)
            notes = [annotation(c) for c in citations.find(text, self.sources)]
            part = {"type": "output_text", "text": text, "annotations": notes, "logprobs": []}
            item["content"] = [part]
            events += [self._event("response.output_text.annotation.added", item_id=item["id"], output_index=i,
                                   content_index=0, annotation_index=n, annotation=note)
                       for n, note in enumerate(notes)]
            events += [self._event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                                   text=text, logprobs=[]),
                       self._event("response.content_part.done", item_id=item["id"], output_index=i,
                                   content_index=0, part=part)]
        elif item["type"] == "custom_tool_call":
            item["input"] = custom_input("".join(self._text))
            events += [self._event("response.custom_tool_call_input.delta", item_id=item["id"], output_index=i,
                                   delta=item["input"]),
                       self._event("response.custom_tool_call_input.done", item_id=item["id"], output_index=i,
                                   input=item["input"])]
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                      name=item["name"], arguments=item["arguments"]))
        if item["type"] != "custom_tool_call":  # OpenAI's custom tool call has no status
            item["status"] = "completed"
        self._text = []
        return events + [self._event("response.output_item.done", output_index=i, item=item)]

    def _begin(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.output.append(item)
        self._open = item
        added = json.loads(json.dumps(item))
        events.append(self._event("response.output_item.added", output_index=self._index(), item=added))
        if item["type"] == "message":
            events.append(self._event("response.content_part.added", item_id=item["id"], output_index=self._index(),
                                      content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                             "logprobs": []}))
        elif item["type"] == "reasoning" and self.parsed.summary is not None:
            events.append(self._event("response.reasoning_summary_part.added", item_id=item["id"],
                                      output_index=self._index(), summary_index=0,
                                      part={"type": "summary_text", "text": ""}))
        return events

    def feed(self, item: Piece | Call | CallArgs) -> list[Frame]:
        return frames(self._feed(item))

    def _feed(self, item: Piece | Call | CallArgs) -> list[dict[str, Any]]:
        if isinstance(item, Piece):
            kind = "reasoning" if item.kind == "thinking" else "message"
            events = []
            if self._open is None or self._open["type"] != kind:
                new = ({"type": "reasoning", "id": new_id("rs"), "summary": [], "content": [], "status": "in_progress"}
                       if kind == "reasoning" else
                       {"type": "message", "id": new_id("msg"), "status": "in_progress", "role": "assistant",
                        "content": []})
                events = self._begin(new)
            self._text.append(item.text)
            assert self._open is not None
            if kind == "reasoning":
                events.append(self._event("response.reasoning_text.delta", item_id=self._open["id"],
                                          output_index=self._index(), content_index=0, delta=item.text))
                if self.parsed.summary is not None:
                    events.append(self._event("response.reasoning_summary_text.delta", item_id=self._open["id"],
                                              output_index=self._index(), summary_index=0, delta=item.text))
            else:
                events.append(self._event("response.output_text.delta", item_id=self._open["id"],
                                          output_index=self._index(), content_index=0, delta=item.text, logprobs=[]))
            return events
        if isinstance(item, Call):
            origin = self.parsed.origins.get(item.name, ToolOrigin(item.name))
            call: dict[str, Any]
            if origin.custom:  # its input is told whole at its end: the model writes it as a JSON string
                call = {"type": "custom_tool_call", "id": new_id("ctc"), "call_id": item.id, "name": origin.name,
                        "input": ""}
            else:
                call = {"type": "function_call", "id": new_id("fc"), "call_id": item.id, "name": origin.name,
                        "arguments": "", "status": "in_progress"}
            if origin.namespace is not None:
                call["namespace"] = origin.namespace
            self._calls[item.index] = call
            return self._begin(call)
        call = self._calls[item.index]
        if call["type"] == "custom_tool_call":
            self._text.append(item.text)
            return []
        call["arguments"] += item.text
        return [self._event("response.function_call_arguments.delta", item_id=call["id"],
                            output_index=self.output.index(call), delta=item.text)]

    def hosted(self, call: Hosted) -> list[Frame]:
        """A tool the gateway runs: a ``web_search_call`` (its ``action``: a search, or a fetch's
        ``open_page``) or an ``mcp_call`` (its server, name and arguments) opens, in progress
        until its result."""
        item = hosted_item(call)
        events = self._begin({**item, "arguments": ""} if item["type"] == "mcp_call" else item)  # told in pieces
        item, i = self._open or item, self._index()
        self._open, self._hosted[item["id"]] = None, item  # closed by its result, not by what follows
        if item["type"] == "mcp_call":
            item["arguments"] = call.arguments
            events += [self._event("response.mcp_call_arguments.delta", item_id=item["id"], output_index=i,
                                   delta=call.arguments),
                       self._event("response.mcp_call_arguments.done", item_id=item["id"], output_index=i,
                                   arguments=call.arguments),
                       self._event("response.mcp_call.in_progress", item_id=item["id"], output_index=i)]
        else:
            events += [self._event("response.web_search_call.in_progress", item_id=item["id"], output_index=i),
                       self._event("response.web_search_call.searching", item_id=item["id"], output_index=i)]
        return frames(events)

    def hosted_result(self, result: HostedResult) -> list[Frame]:
        item = self._hosted.pop(hosted_id(result.kind, result.id), None)
        if item is None:
            return []
        i = self.output.index(item)
        ended = "failed" if result.failed else "completed"
        hosted_done(item, result)
        self.sources += result.sources()
        if item["type"] == "mcp_call":
            events = [self._event(f"response.mcp_call.{ended}", item_id=item["id"], output_index=i)]
        else:  # a search that failed has no event of its own: its item's status tells it
            events = [] if result.failed else [self._event("response.web_search_call.completed", item_id=item["id"],
                                                           output_index=i)]
        events.append(self._event("response.output_item.done", output_index=i, item=item))
        return frames(events)

    def listed(self, server: str, tools: list[ToolInfo], error: str | None = None) -> list[Frame]:
        """An ``mcp_list_tools`` item: the tools ``server`` offers, or why it could not list them;
        given before the response opened, it waits for ``open``."""
        if not self.opened:
            self._listed.append((server, tools, error))
            return []
        item: dict[str, Any] = {"type": "mcp_list_tools", "id": new_id("mcpl"), "server_label": server, "tools": [],
                                "error": None}
        events = self._begin(item)
        self._open, i = None, self._index()
        item["tools"], item["error"] = ([] if error is not None else tool_list(tools)), error
        ended = "failed" if error is not None else "completed"
        return frames(events + [self._event("response.mcp_list_tools.in_progress", item_id=item["id"], output_index=i),
                                self._event(f"response.mcp_list_tools.{ended}", item_id=item["id"], output_index=i),
                                self._event("response.output_item.done", output_index=i, item=item)])

    def approval(self, call: Hosted, request_id: str) -> list[Frame]:
        """An ``mcp_approval_request`` item under ``request_id``, the id the caller's
        ``mcp_approval_response`` names."""
        item = {"type": "mcp_approval_request", "id": request_id, "server_label": call.server or "",
                "name": call.name, "arguments": call.arguments}
        events = self._begin(item)
        self._open = None
        return frames(events + [self._event("response.output_item.done", output_index=self._index(), item=item)])

    def close(self, finish: Finish) -> list[Frame]:
        """The closing events; the whole response is ``body()``."""
        events = self._close()
        status = "incomplete" if finish.reason == "length" else "completed"
        self._body = self.response(status, finish)
        events.append(self._event(f"response.{status}", response=self._body))
        return frames(events)

    def body(self) -> dict[str, Any]:
        return self._body

    def fail(self, err: ApiError) -> list[Frame]:
        """An answer that broke mid-way: OpenAI's error event (this gateway's own code), then the
        failed response, whose error code is one of OpenAI's few; where it broke before the
        response began (a stream a load's progress opened), its first events come first."""
        begun = [] if self.opened else self.open()
        failed = self.response("failed")
        code = "rate_limit_exceeded" if err.status == 429 else "invalid_prompt" if err.status < 500 else "server_error"
        failed["error"] = {"code": code, "message": err.message}
        return begun + frames([self._event("error", code=err.code, message=err.message, param=err.param),
                               self._event("response.failed", response=failed)])

    def messages(self) -> list[dict[str, Any]]:
        """The output as history messages, for a later request's ``previous_response_id``."""
        return history(self.output)


def history(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as history messages: a hosted tool's call (``web_search_call``,
    ``mcp_call``) as the call and its result, as the model read them within the answer
    (``hostedhistory``); its other items (``mcp_list_tools``, an approval's request) left out."""
    out: list[dict[str, Any]] = []
    thinking = None
    for index, item in enumerate(output):
        kind = item["type"]
        if kind == "reasoning":
            thinking = "".join(c["text"] for c in item["content"])
            continue
        if kind == "message":
            msg: dict[str, Any] = {"role": "assistant", "content": item["content"][0]["text"]}
            if thinking is not None:
                msg["reasoning_content"] = msg["thinking"] = thinking
                thinking = None
            out.append(msg)
        elif kind in HOSTED_CALLS:
            pair = hostedhistory.responses_call(item, f"output[{index}]")
            if pair is not None:
                call, result = pair
                thinking = add_call(out, call, thinking)
                out.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                            "content": result})
        elif kind in ("function_call", "custom_tool_call"):
            if kind == "custom_tool_call":
                args: Any = {CUSTOM_INPUT: item["input"]}
            else:
                try:
                    args = strictjson.loads(item["arguments"] or "{}")
                except ValueError:  # a streamed call that broke: its history is kept as an empty call
                    args = {}
            thinking = add_call(out, {"id": item["call_id"], "type": "function", "function": {
                "name": flat_name(item.get("namespace"), item["name"]), "arguments": args}}, thinking)
    return out
