"""OpenAI's Responses API shapes (``/v1/responses``): a request's ``input`` items, ``instructions``
and options into a ``GenerationRequest``, and the answer as output items (``reasoning``,
``message``, ``function_call``), whole or as the documented event sequence.

One builder (``ResponseBuilder``) turns the answer's pieces into output items and events, for
streamed and whole answers alike: a whole answer is the same events with nobody listening.

Codex's shapes (``read_tools``): a ``namespace`` tool's tools are offered to the model under
Codex's flat names (``namespace__name``) and its calls are named back as ``name`` plus
``namespace``; a ``custom`` tool (free text, such as ``apply_patch``) is offered as a function of
one string argument, ``input``, and its calls come back as ``custom_tool_call`` items; hosted
tools this server cannot run (``web_search``, ``file_search``, ``mcp``, ...) are left out of the
prompt, and the response says which (``ToolSet.dropped``). ``reasoning.summary`` delivers the
thinking as a summary part too; ``include: ["reasoning.encrypted_content"]`` seals it into the
reasoning item (``seal``), so a stateless next turn restores it (``unseal``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import ApiError, InvalidRequest
from ..engine.ipc import GenerationRequest
from . import tools as wire_tools
from .answer import Call, CallArgs, Finish, Piece
from .params import EFFORTS, SAMPLING, Parsed, check_schema, read_sampling, require_model, shown, text_parts

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
RESPONSES_SAMPLING = {name: SAMPLING[name] for name in ("temperature", "top_p")}
EFFORT_ALIASES = {"xhigh": "high"}  # Codex's highest effort; this server's budgets stop at high
SUMMARIES = ("auto", "concise", "detailed")
ENCRYPTED = "reasoning.encrypted_content"
CUSTOM_INPUT = "input"  # a custom tool's one argument, as offered to the model: its free text
# Input items that record a hosted tool's work (done by OpenAI's servers, never by this one):
# nothing of them reaches the prompt, so a history from another server still reads.
HOSTED_ITEMS = frozenset({
    "web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call", "computer_call",
    "computer_call_output", "local_shell_call", "local_shell_call_output", "mcp_list_tools", "mcp_call",
    "mcp_approval_request", "mcp_approval_response", "tool_search_call", "tool_search_output"})
TOOL_TYPE = re.compile(r"[a-z0-9_]{1,64}")  # a tool type this server may drop (and name in a header)


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
    summary: str | None = None  # reasoning.summary: the thinking as a summary part too
    encrypted: bool = False  # include holds reasoning.encrypted_content: seal the thinking into its item
    origins: dict[str, ToolOrigin] = field(default_factory=dict)  # offered name -> a tool that is not a plain function
    dropped: list[str] = field(default_factory=list)  # the tools left out of the prompt, by type


# --- tools ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolOrigin:
    """A tool the model is offered under another name or shape than the caller gave."""

    name: str  # the caller's own name for it
    namespace: str | None = None  # the namespace tool it came in
    custom: bool = False  # free text in (its one argument, ``input``), a ``custom_tool_call`` out


@dataclass
class ToolSet:
    tools: list[dict[str, Any]]  # function tools in the chat templates' shape, flattened
    origins: dict[str, ToolOrigin]
    dropped: list[str]  # the types of the tools left out, each once, in order
    echo: list[dict[str, Any]]  # the tools as the response repeats them


def flat_name(namespace: str | None, name: str) -> str:
    """The name a namespaced tool is offered under: Codex's own flat form (``ToolName::
    canonical_flat_name``: the namespace's trailing and the name's leading underscores trimmed,
    joined by ``__``), so a model trained on Codex's transcripts calls it as it learned to."""
    if namespace is None:
        return name
    return f"{namespace.rstrip('_')}__{name.lstrip('_')}"


def _custom_parameters(tool: dict[str, Any], where: str) -> tuple[dict[str, Any], str | None]:
    """A custom tool as a function: one string argument, its format (a grammar) told in the
    description, since the answer's grammar only holds the call's JSON."""
    fmt = tool.get("format")
    note = None
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        note = f"The input follows this {fmt.get('syntax') or 'grammar'} grammar:\n{fmt['definition']}"
    elif fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") in ("text", "grammar")):
        raise InvalidRequest(f"`{where}.format` must be {{\"type\": \"text\"}} or a grammar", f"{where}.format")
    schema = {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string"}}, "required": [CUSTOM_INPUT]}
    return schema, note


def _function(tool: dict[str, Any], where: str, namespace: str | None, out: ToolSet) -> None:
    """One function or custom tool (in ``namespace``, if any) into ``out``."""
    name, kind = tool.get("name"), tool.get("type")
    offered = flat_name(namespace, name) if isinstance(name, str) else name
    description, parameters = tool.get("description"), tool.get("parameters")
    if kind == "custom":
        parameters, note = _custom_parameters(tool, where)
        if note:
            description = f"{description}\n\n{note}" if isinstance(description, str) and description else note
    out.tools.append(wire_tools._tool(offered, description, parameters, where, name_at=f"{where}.name",
                                      schema_at=f"{where}.parameters"))
    if namespace is not None or kind == "custom":
        assert isinstance(offered, str) and isinstance(name, str)
        out.origins[offered] = ToolOrigin(name, namespace, kind == "custom")


def read_tools(value: Any) -> ToolSet:
    """``tools``: function, custom and namespace tools for the model; any other (hosted) tool
    left out and named in ``dropped``. Flattened, at most ``MAX_TOOLS``, each name once."""
    out = ToolSet([], {}, [], [])
    if value is None:
        return out
    if not isinstance(value, list) or len(value) > wire_tools.MAX_TOOLS:
        raise InvalidRequest(f"`tools` must be an array of at most {wire_tools.MAX_TOOLS} tools", "tools")
    for i, t in enumerate(value):
        where = f"tools[{i}]"
        kind = t.get("type") if isinstance(t, dict) else None
        if not isinstance(kind, str) or not TOOL_TYPE.fullmatch(kind):
            raise InvalidRequest(f"`{where}` must be a tool object with a `type`, got {shown(kind)}", f"{where}.type")
        assert isinstance(t, dict)
        if kind in ("function", "custom"):
            _function(t, where, None, out)
            f = out.tools[-1]["function"]
            out.echo.append({"type": "function", "name": f["name"], "description": f.get("description"),
                             "parameters": f["parameters"], "strict": t.get("strict")} if kind == "function" else t)
        elif kind == "namespace":
            ns, members = t.get("name"), t.get("tools")
            if not isinstance(ns, str) or not wire_tools.NAME.fullmatch(ns):
                raise InvalidRequest(f"`{where}.name` must be a name of 1 to 128 letters, digits, _ . : or -, got "
                                     f"{shown(ns)}", f"{where}.name")
            if not isinstance(members, list) or len(members) > wire_tools.MAX_TOOLS:
                raise InvalidRequest(f"`{where}.tools` must be an array of at most {wire_tools.MAX_TOOLS} tools",
                                     f"{where}.tools")
            for j, member in enumerate(members):
                at = f"{where}.tools[{j}]"
                if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                    raise InvalidRequest(f"`{at}.type` must be function or custom", f"{at}.type")
                _function(member, at, ns, out)
            out.echo.append(t)
        elif kind not in out.dropped:
            out.dropped.append(kind)
    if len(out.tools) > wire_tools.MAX_TOOLS:
        raise InvalidRequest(f"`tools` may hold at most {wire_tools.MAX_TOOLS} functions, namespaces' included, "
                             f"got {len(out.tools)}", "tools")
    wire_tools._checked(out.tools, "tools")
    return out


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> wire_tools.ToolChoice:
    """``tool_choice`` in the Responses shapes: a mode, a named function or custom tool (in a
    namespace, by its flat name), ``allowed_tools`` (its mode over the functions and custom
    tools it names; hosted tools in it are left out, as from ``tools``), or a hosted tool (left
    out of the prompt, so ``auto``)."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        entries, picks = choice.get("tools"), []
        if not isinstance(entries, list) or not entries:
            raise InvalidRequest("`tool_choice.tools` must be a non-empty array of tools", "tool_choice.tools")
        for i, entry in enumerate(entries):
            kind = entry.get("type") if isinstance(entry, dict) else None
            if not isinstance(entry, dict) or not isinstance(kind, str) or not TOOL_TYPE.fullmatch(kind):
                raise InvalidRequest(f"`tool_choice.tools[{i}]` must be a tool, as in `tools`",
                                     f"tool_choice.tools[{i}].type")
            if kind in ("function", "custom"):
                name, namespace = entry.get("name"), entry.get("namespace")
                if isinstance(name, str) and isinstance(namespace, str):
                    name = flat_name(namespace, name)
                picks.append((f"tool_choice.tools[{i}].name", name))
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise InvalidRequest("`parallel_tool_calls` must be true or false", "parallel_tool_calls")
        return wire_tools.allowed_choice(choice.get("mode"), picks, tools, parallel is not False,
                                         "tool_choice.mode", "tool_choice.tools")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom"):
            name, namespace = choice.get("name"), choice.get("namespace")
            if isinstance(name, str) and isinstance(namespace, str):
                name = flat_name(namespace, name)
            choice = {"type": "function", "function": {"name": name}}
        elif isinstance(kind, str) and TOOL_TYPE.fullmatch(kind):
            choice = "auto"
    return wire_tools.openai_tool_choice({"tool_choice": choice,
                                          "parallel_tool_calls": body.get("parallel_tool_calls")}, tools)


# --- sealed reasoning ----------------------------------------------------------------------------

SEAL_VERSION = "gguf-gateway/1"


def seal(thinking: str) -> str:
    """A reasoning item's ``encrypted_content``: its thinking as base64 of versioned JSON. Not
    secret (the caller saw the thinking); opaque, so clients carry it back unchanged."""
    return base64.b64encode(json.dumps({"v": SEAL_VERSION, "thinking": thinking}).encode()).decode("ascii")


def unseal(value: Any, where: str) -> str:
    """The thinking ``seal`` made, or a 400 naming ``where``: the value came back from a client."""
    problem = InvalidRequest(f"`{where}` is not reasoning this server sealed (a response's own `encrypted_content`, "
                             "unchanged)", where)
    if not isinstance(value, str):
        raise problem
    try:
        data = json.loads(base64.b64decode(value.encode("ascii"), validate=True))
    except (ValueError, UnicodeError, binascii.Error):
        raise problem from None
    if not isinstance(data, dict) or data.get("v") != SEAL_VERSION or not isinstance(data.get("thinking"), str):
        raise problem
    return data["thinking"]


# --- input ---------------------------------------------------------------------------------------

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
        elif kind in ("function_call", "custom_tool_call"):
            call_id, name, namespace = item.get("call_id"), item.get("name"), item.get("namespace")
            field_ = "arguments" if kind == "function_call" else CUSTOM_INPUT
            arguments = item.get(field_, "{}" if kind == "function_call" else None)
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise InvalidRequest(f"`{where}` needs string `call_id`, `name` and `{field_}`", where)
            if namespace is not None and not isinstance(namespace, str):
                raise InvalidRequest(f"`{where}.namespace` must be a string", f"{where}.namespace")
            if kind == "custom_tool_call":
                args: Any = {CUSTOM_INPUT: arguments}
            else:
                try:
                    args = json.loads(arguments or "{}")
                except ValueError:
                    args = None
                if not isinstance(args, dict):
                    raise InvalidRequest(f"`{where}.arguments` must be a JSON object in a string",
                                         f"{where}.arguments")
            call = {"id": call_id, "type": "function",
                    "function": {"name": flat_name(namespace, name), "arguments": args}}
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
        elif kind in ("function_call_output", "custom_tool_call_output"):
            text = _text(_unseen_images(item.get("output")), f"{where}.output", ("input_text", "output_text", "text"))
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "name": ledger.name_of(item.get("call_id"), f"{where}.call_id"), "content": text})
        elif kind == "reasoning":
            thinking = _thinking(item, where)
        elif kind not in HOSTED_ITEMS:
            raise InvalidRequest(f"`{where}.type` {shown(kind)} is not supported by this server: message, "
                                 "function_call, custom_tool_call, their outputs, and reasoning items only",
                                 f"{where}.type")
    return out




def _unseen_images(output: Any) -> Any:
    """A tool's output with its images (Codex's ``view_image`` answers with one) told as a note:
    the models here read text, and refusing the result would end the caller's session."""
    if not isinstance(output, list):
        return output
    return [{"type": "input_text", "text": wire_tools.IMAGE_NOTE} if isinstance(part, dict) and part.get("type") in (
        "input_image", "input_file") else part for part in output]


def _thinking(item: dict[str, Any], where: str) -> str:
    """A reasoning item's thinking: sealed (``encrypted_content``, exactly as it was), else its
    ``content``, else its ``summary``."""
    if item.get("encrypted_content") is not None:
        return unseal(item["encrypted_content"], f"{where}.encrypted_content")
    for name in ("content", "summary"):
        parts = item.get(name)
        if parts is None or parts == []:
            continue
        if not isinstance(parts, list):
            raise InvalidRequest(f"`{where}.{name}` must be an array", f"{where}.{name}")
        return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def conversation(instructions: str | None, history: list[dict[str, Any]],
                 messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt's messages: ``instructions`` first, and the system (and developer) messages
    that open the conversation joined into that one system turn, as every chat template takes
    (Codex opens with its instructions and then developer messages; many templates refuse a
    second system turn)."""
    out = ([{"role": "system", "content": instructions}] if instructions else []) + history + messages
    while len(out) > 1 and out[0]["role"] == "system" and out[1]["role"] == "system":
        out[:2] = [{"role": "system", "content": f"{out[0]['content']}\n\n{out[1]['content']}"}]
    return out


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
    toolset = read_tools(body.get("tools"))
    tools = toolset.tools or None
    choice = _tool_choice(body, tools)
    if tools and choice.mode != "none":
        if req.response_format is not None:
            raise InvalidRequest("give `tools` or `text.format`, not both", "tools")
        req.tools, req.tool_choice, req.tool_names, req.parallel_tool_calls = (tools, choice.mode, choice.names,
                                                                             choice.parallel)
    effort, summary = _reasoning(body.get("reasoning"))
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(x, str) for x in include)):
        raise InvalidRequest("`include` must be an array of strings", "include")
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
            "tools": toolset.echo, "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "reasoning": {"effort": effort, "summary": summary}, "metadata": metadata or {},
            "text": {"format": text_format},
            "previous_response_id": previous, "store": flags["store"], "truncation": "disabled"}
    return ResponsesParsed(model, req, flags["stream"], explicit=explicit, reasoning_effort=effort,
                           instructions=instructions, previous_response_id=previous, store=flags["store"], echo=echo,
                           input_messages=messages, raw_input=body.get("input"), summary=summary,
                           encrypted=ENCRYPTED in (include or ()), origins=toolset.origins, dropped=toolset.dropped)


def _reasoning(value: Any) -> tuple[str | None, str | None]:
    """``reasoning``: its effort (Codex's ``xhigh`` read as ``high``) and summary (``auto``,
    ``concise`` or ``detailed`` all mean the whole thinking, which is short enough to show)."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise InvalidRequest("`reasoning` must be an object", "reasoning")
    effort, summary = value.get("effort"), value.get("summary", value.get("generate_summary"))
    effort = EFFORT_ALIASES.get(effort, effort)  # type: ignore[arg-type]
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest(f"`reasoning.effort` must be one of {', '.join(EFFORTS)} or xhigh, got {shown(effort)}",
                             "reasoning.effort")
    if summary == "none":  # Codex's own word for no summary
        summary = None
    if summary is not None and summary not in SUMMARIES:
        raise InvalidRequest(f"`reasoning.summary` must be one of {', '.join(SUMMARIES)}, got {shown(summary)}",
                             "reasoning.summary")
    return effort, summary


# --- answers -----------------------------------------------------------------------------------

def custom_input(arguments: str) -> str:
    """A custom tool's input from the call the model wrote (``{"input": "..."}``); a call that
    broke off gives what there is of it, as text."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return arguments
    value = args.get(CUSTOM_INPUT) if isinstance(args, dict) else None
    return value if isinstance(value, str) else json.dumps(value if value is not None else args)


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
            if self.parsed.summary is not None:
                summary = {"type": "summary_text", "text": text}
                item["summary"] = [summary]
                events += [self._event("response.reasoning_summary_text.done", item_id=item["id"], output_index=i,
                                       summary_index=0, text=text),
                           self._event("response.reasoning_summary_part.done", item_id=item["id"], output_index=i,
                                       summary_index=0, part=summary)]
            if self.parsed.encrypted:
                item["encrypted_content"] = seal(text)
        elif item["type"] == "message":
            text = "".join(self._text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [part]
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
                if item["type"] == "custom_tool_call":
                    args: Any = {CUSTOM_INPUT: item["input"]}
                else:
                    try:
                        args = json.loads(item["arguments"] or "{}")
                    except ValueError:  # a streamed call that broke: its history is kept as an empty call
                        args = {}
                call = {"id": item["call_id"], "type": "function",
                        "function": {"name": flat_name(item.get("namespace"), item["name"]), "arguments": args}}
                if out and out[-1]["role"] == "assistant":
                    out[-1].setdefault("tool_calls", []).append(call)
                    continue
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
            if thinking is not None:
                msg["reasoning_content"] = msg["thinking"] = thinking
                thinking = None
            out.append(msg)
        return out
