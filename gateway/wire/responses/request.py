"""A Responses request (``/v1/responses``): its ``input`` items, ``instructions`` and options
(sampling, ``max_output_tokens``, ``text.format``, tools and ``tool_choice``, ``reasoning``,
``include``) into a ``GenerationRequest``, and the prompt's conversation.

Codex's shapes: ``reasoning.effort`` ``xhigh`` is read as ``high``; a reasoning item's thinking
comes back sealed (``sealed.unseal``) or as its content or summary; a tool output's images are
told as a note.

Hosted tools: those the gateway can run are read into ``Parsed.hosted`` (``wire.asks``); a
``web_search_call`` or ``mcp_call`` item in the input is a call and its result
(``wire.hostedhistory``); ``mcp_approval_response`` items are read into ``Parsed.approvals``
(``approvals``); the other hosted tools' items (``mcp_list_tools``, ``mcp_approval_request``,
``file_search_call``, ...) are passed over.

A ``compaction`` item (``/v1/responses/compact``'s) is read back into its summary
(``compaction.as_message``), joined with the user messages around it into one user turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...base import strictjson
from ...base.errors import InvalidRequest
from ...protocol import GenerationRequest, Media
from ...tools.hosted import Approval
from .. import hostedhistory
from .. import tools as wire_tools
from ..openai import read_metadata
from ..params import EFFORTS, SAMPLING, Parsed, check_schema, read_sampling, require_model, shown, text_parts
from .compaction import as_message, joined
from .sealed import EPHEMERAL, unseal
from .tools import CUSTOM_INPUT, ToolOrigin, flat_name, read_tool_choice, read_tools

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
RESPONSES_SAMPLING = {name: SAMPLING[name] for name in ("temperature", "top_p")}
EFFORT_ALIASES = {"xhigh": "high"}  # Codex's highest effort; this server's budgets stop at high
SUMMARIES = ("auto", "concise", "detailed")
ENCRYPTED = "reasoning.encrypted_content"
FORMAT_FIELDS = ("type", "name", "description", "schema", "strict")  # a text.format's, as a response repeats it
# Input items that record a hosted tool's work that the model does not read again (a tool this
# server does not run, a listing, an approval's request and answer): nothing of them reaches the
# prompt, so a history from another server still reads.
HOSTED_ITEMS = frozenset({
    "file_search_call", "image_generation_call", "code_interpreter_call", "computer_call",
    "computer_call_output", "local_shell_call", "local_shell_call_output", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response", "tool_search_call", "tool_search_output"})
HOSTED_CALLS = ("web_search_call", "mcp_call")  # read as a call and its result (``hostedhistory``)


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
    seal_key: bytes = EPHEMERAL  # what encrypted_content is signed with (the gateway's kept key)
    origins: dict[str, ToolOrigin] = field(default_factory=dict)  # offered name -> a tool that is not a plain function


def _text(content: Any, where: str, kinds: tuple[str, ...], media: list[Media] | None = None,
          note: str | None = None) -> str:
    return text_parts(content, where, kinds, ", ".join(kinds), media, note)


def input_messages(value: Any, history: list[dict[str, Any]] | None = None,
                   media: list[Media] | None = None, key: bytes = EPHEMERAL) -> list[dict[str, Any]]:
    """``input`` (a string, or message, ``function_call``, ``function_call_output`` and
    ``reasoning`` items) as messages in the chat templates' shape; a result may answer a call
    made in ``history`` (the conversation of ``previous_response_id``). A user's pictures
    (``input_image``) go to ``media``, marked in the text (``wire.media``); a reasoning item's
    ``encrypted_content`` opens with ``key`` (``sealed.unseal``)."""
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
                                                                 kinds + ("text",),
                                                                 None if role == "assistant" else media)}
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
            else:  # strict and bounded, a 400 naming the field (base/strictjson)
                args = strictjson.loads(arguments or "{}", f"{where}.arguments")
                if not isinstance(args, dict):
                    raise InvalidRequest(f"`{where}.arguments` must be a JSON object in a string",
                                         f"{where}.arguments")
            call: dict[str, Any] = {"id": call_id, "type": "function",
                                    "function": {"name": flat_name(namespace, name), "arguments": args}}
            ledger.add([call])
            thinking = add_call(out, call, thinking)
        elif kind in HOSTED_CALLS:
            pair = hostedhistory.responses_call(item, where)
            if pair is not None:
                hosted_call, result = pair
                thinking = add_call(out, hosted_call, thinking)
                out.append({"role": "tool", "tool_call_id": hosted_call["id"],
                            "name": hosted_call["function"]["name"], "content": result})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            text = _text(_unseen_files(item.get("output")), f"{where}.output", ("input_text", "output_text", "text"),
                         media, wire_tools.IMAGE_NOTE)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "name": ledger.name_of(item.get("call_id"), f"{where}.call_id"), "content": text})
        elif kind == "reasoning":
            thinking = _thinking(item, where, key)
        elif kind == "compaction":
            out.append(as_message(item, where, key))
        elif kind not in HOSTED_ITEMS:
            raise InvalidRequest(f"`{where}.type` {shown(kind)} is not supported by this server: message, "
                                 "function_call, custom_tool_call, their outputs, reasoning and compaction items "
                                 "only", f"{where}.type")
    return joined(out)


def add_call(out: list[dict[str, Any]], call: dict[str, Any], thinking: str | None) -> str | None:
    """``call`` into the assistant turn that ends ``out``, or a new one (which takes the
    reasoning item's ``thinking`` before it); returns the thinking still waiting."""
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
    return thinking


def approvals(value: Any, earlier: Any = None) -> list[Approval]:
    """``input``'s ``mcp_approval_response`` items (``hostedhistory.approvals``), each filled
    from its request in ``input`` or in ``earlier``, the previous response's ``output``."""
    return hostedhistory.approvals(value, earlier)


def _unseen_files(output: Any) -> Any:
    """A tool's output with its files told as a note: refusing the result would end the
    caller's session. Its images (Codex's ``view_image`` answers with one) are media, told as
    the same note to a model that takes none (``Media.note``)."""
    if not isinstance(output, list):
        return output
    return [{"type": "input_text", "text": wire_tools.IMAGE_NOTE} if isinstance(part, dict) and part.get("type") ==
            "input_file" else part for part in output]


def _thinking(item: dict[str, Any], where: str, key: bytes) -> str:
    """A reasoning item's thinking: sealed (``encrypted_content``, exactly as it was), else its
    ``content``, else its ``summary``."""
    if item.get("encrypted_content") is not None:
        return unseal(item["encrypted_content"], f"{where}.encrypted_content", key)
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
        return {"type": "text"}
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
    # repeated in every answer and kept with it: the format's own fields, not whatever else came
    return {k: fmt[k] for k in FORMAT_FIELDS if k in fmt}


def parse(body: dict[str, Any], key: bytes = EPHEMERAL) -> ResponsesParsed:
    """The request, its reasoning items' ``encrypted_content`` opened with ``key`` and its
    answer's sealed with it."""
    model = require_model(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("`instructions` must be a string", "instructions")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequest("`previous_response_id` must be a string", "previous_response_id")
    # with a previous response, a result may answer one of its calls: read once it is known
    media: list[Media] = []
    messages = input_messages(body.get("input"), media=media, key=key) if previous is None else []
    approved = approvals(body.get("input")) if previous is None else []
    req = GenerationRequest(messages=messages, media=media)
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
    choice = read_tool_choice(body, tools, toolset.hosted)
    if choice.mode == "none":
        toolset.hosted = []  # no tool at all: the hosted ones are not offered either
    elif toolset.hosted and not tools:  # hosted tools only: the pipeline offers them, under this choice
        req.tool_choice, req.tool_names = choice.mode, choice.names
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
    metadata = read_metadata(body.get("metadata"))  # repeated in every answer and kept with it: bounded
    echo = {"instructions": instructions, "max_output_tokens": limit, "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "tools": toolset.echo, "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "reasoning": {"effort": effort, "summary": summary}, "metadata": metadata,
            "text": {"format": text_format},
            "previous_response_id": previous, "store": flags["store"], "truncation": "disabled"}
    return ResponsesParsed(model, req, flags["stream"], explicit=explicit, reasoning_effort=effort,
                           instructions=instructions, previous_response_id=previous, store=flags["store"], echo=echo,
                           input_messages=messages, raw_input=body.get("input"), summary=summary,
                           encrypted=ENCRYPTED in (include or ()), seal_key=key, origins=toolset.origins,
                           dropped=toolset.dropped, hosted=toolset.hosted, approvals=approved)


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
