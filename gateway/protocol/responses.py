"""OpenAI's Responses API shapes (``/v1/responses``): a request's ``input`` items, ``instructions``
and options into a ``GenerationRequest``, and the answer as output items (``reasoning``,
``message``, ``function_call``), whole or as the documented event sequence.

One builder (``ResponseBuilder``) turns the answer's pieces into output items and events, for
streamed and whole answers alike: a whole answer is the same events with nobody listening.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..answer import Call, CallArgs, Finish, Piece
from ..engine.protocol import GenerationRequest
from ..errors import ApiError, InvalidRequest
from . import tools as wire_tools
from .params import EFFORTS, SAMPLING, Parsed, check_schema, read_sampling, require_model, shown, text_parts

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
RESPONSES_SAMPLING = {name: SAMPLING[name] for name in ("temperature", "top_p")}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ResponsesParsed(Parsed):
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    echo: dict[str, Any] = field(default_factory=dict)  # the request's fields a response object repeats
    input_messages: list[dict[str, Any]] = field(default_factory=list)  # this request's own input, as messages
    raw_input: Any = None  # read once the previous response's conversation is known


def _text(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    return text_parts(content, where, kinds, ", ".join(kinds))


def input_messages(value: Any, history: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """``input`` (a string, or message, ``function_call``, ``function_call_output`` and
    ``reasoning`` items) as messages in the chat templates' shape; a result may answer a call
    made in ``history`` (the conversation of ``previous_response_id``)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("`input` must be a string or a non-empty array of input items", "input")
    out: list[dict[str, Any]] = []
    ledger = wire_tools.CallLedger()
    for earlier in history or ():
        ledger.add(earlier.get("tool_calls") or [])
    thinking: str | None = None  # a reasoning item's text, for the assistant turn that follows it
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"`{where}` must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise InvalidRequest(f"`{where}.role` must be user, system, developer or assistant, got "
                                     f"{shown(item.get('role'))}", f"{where}.role")
            kinds = ("output_text", "refusal") if role == "assistant" else ("input_text",)
            msg: dict[str, Any] = {"role": role, "content": _text(item.get("content"), f"{where}.content",
                                                                 kinds + ("text",))}
            if role == "assistant" and thinking is not None:
                msg["reasoning_content"] = msg["thinking"] = thinking
                thinking = None
            out.append(msg)
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise InvalidRequest(f"`{where}` needs string `call_id`, `name` and `arguments`", where)
            try:
                args = json.loads(arguments or "{}")
            except ValueError:
                args = None
            if not isinstance(args, dict):
                raise InvalidRequest(f"`{where}.arguments` must be a JSON object in a string", f"{where}.arguments")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            ledger.add([call])
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            elif out and out[-1]["role"] == "assistant" and thinking is None:
                out[-1]["tool_calls"] = [call]
            else:
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
                if thinking is not None:
                    msg["reasoning_content"] = msg["thinking"] = thinking
                    thinking = None
                out.append(msg)
        elif kind == "function_call_output":
            output = item.get("output")
            text = _text(output, f"{where}.output", ("input_text", "output_text", "text"))
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "name": ledger.name_of(item.get("call_id"), f"{where}.call_id"), "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            if not isinstance(parts, list):
                raise InvalidRequest(f"`{where}.content` must be an array", f"{where}.content")
            thinking = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"),
                                                                                                       str))
        else:
            raise InvalidRequest(f"`{where}.type` {shown(kind)} is not supported by this server: message, "
                                 "function_call, function_call_output and reasoning items only", f"{where}.type")
    return out


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, wire_tools.ToolChoice]:
    value = body.get("tools")
    tools: list[dict[str, Any]] | None = None
    if value is not None:
        if not isinstance(value, list) or len(value) > wire_tools.MAX_TOOLS:
            raise InvalidRequest(f"`tools` must be an array of at most {wire_tools.MAX_TOOLS} tools", "tools")
        tools = []
        for i, t in enumerate(value):
            where = f"tools[{i}]"
            if not isinstance(t, dict) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, dict) else None
                raise InvalidRequest(f"`{where}.type` {shown(kind)} is not supported by this server: function tools "
                                     "only", f"{where}.type")
            tools.append(wire_tools._tool(t.get("name"), t.get("description"), t.get("parameters"), where,
                                          name_at=f"{where}.name", schema_at=f"{where}.parameters"))
        tools = wire_tools._checked(tools, "tools") or None
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return tools, wire_tools.openai_tool_choice({"tool_choice": choice,
                                                 "parallel_tool_calls": body.get("parallel_tool_calls")}, tools)


def _text_format(body: dict[str, Any], req: GenerationRequest) -> dict[str, Any]:
    """``text.format`` into ``req``; returns the format, as the response repeats it."""
    text = body.get("text")
    if text is None:
        return {"type": "text"}
    if not isinstance(text, dict):
        raise InvalidRequest("`text` must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return fmt
    if kind == "json_object":
        req.response_format = "json_object"
    elif kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise InvalidRequest("`text.format.schema` must be a JSON Schema object", "text.format.schema")
        check_schema(fmt["schema"], "text.format.schema")
        req.response_format, req.json_schema = "json_schema", fmt["schema"]
    else:
        raise InvalidRequest("`text.format.type` must be text, json_object or json_schema", "text.format.type")
    req.format_param = "text.format"
    return fmt


def parse(body: dict[str, Any]) -> ResponsesParsed:
    model = require_model(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("`instructions` must be a string", "instructions")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequest("`previous_response_id` must be a string", "previous_response_id")
    # with a previous response, a result may answer one of its calls: read once it is known
    messages = input_messages(body.get("input")) if previous is None else []
    req = GenerationRequest(messages=messages)
    explicit = read_sampling(body, req, RESPONSES_SAMPLING)
    limit = body.get("max_output_tokens")
    if limit is not None:
        problem = SAMPLING["max_tokens"].problem(limit)
        if problem:
            raise InvalidRequest(f"`max_output_tokens` {problem}, got {shown(limit)}", "max_output_tokens")
        req.max_tokens = limit
    text_format = _text_format(body, req)
    tools, choice = _tools(body)
    if tools and choice.mode != "none":
        if req.response_format is not None:
            raise InvalidRequest("give `tools` or `text.format`, not both", "tools")
        req.tools, req.tool_choice, req.tool_name, req.parallel_tool_calls = (tools, choice.mode, choice.name,
                                                                             choice.parallel)
    reasoning = body.get("reasoning")
    effort = None
    if reasoning is not None:
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else "?"
        if effort is not None and effort not in EFFORTS:
            raise InvalidRequest(f"`reasoning.effort` must be one of {', '.join(EFFORTS)}, got {shown(effort)}",
                                 "reasoning.effort")
    flags = {}
    for name, default in (("stream", False), ("store", True)):
        value = body.get(name, default)
        if value is None:
            value = default
        if not isinstance(value, bool):
            raise InvalidRequest(f"`{name}` must be true or false", name)
        flags[name] = value
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequest("`metadata` must be an object", "metadata")
    echo = {"instructions": instructions, "max_output_tokens": limit, "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "tools": [{"type": "function", "name": t["function"]["name"],
                       "description": t["function"].get("description"), "parameters": t["function"]["parameters"],
                       "strict": (body["tools"][i] or {}).get("strict")} for i, t in enumerate(tools or [])],
            "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "reasoning": {"effort": effort, "summary": None}, "metadata": metadata or {},
            "text": {"format": text_format},
            "previous_response_id": previous, "store": flags["store"], "truncation": "disabled"}
    return ResponsesParsed(model, req, flags["stream"], explicit=explicit, reasoning_effort=effort,
                           instructions=instructions, previous_response_id=previous, store=flags["store"], echo=echo,
                           input_messages=messages, raw_input=body.get("input"))


# --- answers -----------------------------------------------------------------------------------

class ResponseBuilder:
    """The answer's pieces in, the response's output items and stream events out. Items open as
    the answer's kind changes (thinking, text, a call) and close when the next begins."""

    def __init__(self, model: str, parsed: ResponsesParsed, response_id: str | None = None):
        self.id = response_id or new_id("resp")
        self.model, self.parsed = model, parsed
        self.created = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.seq = 0
        self._open: dict[str, Any] | None = None  # the item being written
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}  # the answer's call index -> its item

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
            cached = finish.cached_tokens  # read from a slot's cache; the rest were decoded into it
            body["usage"] = {"input_tokens": finish.prompt_tokens,
                             "input_tokens_details": {"cached_tokens": cached,
                                                      "cache_write_tokens": finish.prompt_tokens - cached},
                             "output_tokens": finish.completion_tokens,
                             "output_tokens_details": {"reasoning_tokens": finish.reasoning_tokens},
                             "total_tokens": finish.prompt_tokens + finish.completion_tokens}
        return body

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.response("in_progress")
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

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
        elif item["type"] == "message":
            text = "".join(self._text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [part]
            events += [self._event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                                   text=text, logprobs=[]),
                       self._event("response.content_part.done", item_id=item["id"], output_index=i,
                                   content_index=0, part=part)]
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                      name=item["name"], arguments=item["arguments"]))
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
        return events

    def feed(self, item: Piece | Call | CallArgs) -> list[dict[str, Any]]:
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
            else:
                events.append(self._event("response.output_text.delta", item_id=self._open["id"],
                                          output_index=self._index(), content_index=0, delta=item.text, logprobs=[]))
            return events
        if isinstance(item, Call):
            call = {"type": "function_call", "id": new_id("fc"), "call_id": item.id, "name": item.name,
                    "arguments": "", "status": "in_progress"}
            self._calls[item.index] = call
            return self._begin(call)
        call = self._calls[item.index]
        call["arguments"] += item.text
        return [self._event("response.function_call_arguments.delta", item_id=call["id"],
                            output_index=self.output.index(call), delta=item.text)]

    def finish(self, finish: Finish) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The closing events and the whole response."""
        events = self._close()
        status = "incomplete" if finish.reason == "length" else "completed"
        body = self.response(status, finish)
        events.append(self._event(f"response.{status}", response=body))
        return events, body

    def fail(self, err: ApiError) -> list[dict[str, Any]]:
        """An answer that broke mid-way: OpenAI's error event (this gateway's own code), then the
        failed response, whose error code is one of OpenAI's few."""
        failed = self.response("failed")
        code = "rate_limit_exceeded" if err.status == 429 else "invalid_prompt" if err.status < 500 else "server_error"
        failed["error"] = {"code": code, "message": err.message}
        return [self._event("error", code=err.code, message=err.message, param=err.param),
                self._event("response.failed", response=failed)]

    def messages(self) -> list[dict[str, Any]]:
        """The output as history messages, for a later request's ``previous_response_id``."""
        out: list[dict[str, Any]] = []
        thinking = None
        for item in self.output:
            if item["type"] == "reasoning":
                thinking = "".join(c["text"] for c in item["content"])
                continue
            if item["type"] == "message":
                msg: dict[str, Any] = {"role": "assistant", "content": item["content"][0]["text"]}
            else:
                try:
                    args = json.loads(item["arguments"] or "{}")
                except ValueError:  # a streamed call that broke: its history is kept as an empty call
                    args = {}
                call = {"id": item["call_id"], "type": "function",
                        "function": {"name": item["name"], "arguments": args}}
                if out and out[-1]["role"] == "assistant":
                    out[-1].setdefault("tool_calls", []).append(call)
                    continue
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
            if thinking is not None:
                msg["reasoning_content"] = msg["thinking"] = thinking
                thinking = None
            out.append(msg)
        return out
