"""Anthropic's Messages shape: validate requests, build messages and stream events.

Field names and limits follow Anthropic's API: ``max_tokens`` is required, ``temperature``
is 0..1, ``stop_sequences`` replaces ``stop``, ``thinking: {"type": "disabled"}`` turns
thinking off where the chat template allows (``enable_thinking``); ``"adaptive"`` leaves it
on, and ``output_config.effort`` picks its budget as OpenAI's ``reasoning_effort`` does
(``params.apply_effort``).

What Claude Code sends, served as it means it:
- a ``system`` message inside ``messages`` is folded into the neighbouring user turn as
  ``<system-reminder>`` text (Claude Code's own fallback; many chat templates refuse a system
  message that is not first), or joins the system prompt where no user turn came before it;
- a system text block of per-session header lines (``x-anthropic-billing-header: cc_version=...``)
  is left out of the prompt unless ``server.keep_billing_header``: it changes every session, and
  kept, a new session's prompt shares no cached prefix with the last one's;
- fields and blocks that do not apply to a local model (``metadata``, checked as Anthropic checks it: only
  ``user_id``, at most 256 characters; ``cache_control``,
  ``context_management``, ``container``, ``service_tier``, an ``anthropic-beta`` header,
  server tools the gateway cannot run) are accepted and ignored; ``output_config.format``
  (structured output) is served as OpenAI's ``response_format`` json_schema;
- the hosted tools the gateway can run (web search and fetch tools, ``mcp_servers`` and their
  ``mcp_toolset`` tools) are read into ``Parsed.hosted`` (``wire.asks``), and their earlier
  calls and results in an assistant turn (``server_tool_use``, ``mcp_tool_use`` and their
  result blocks) become a call and a tool message each (``wire.hostedhistory``);
- a context overflow is told in Anthropic's words (``context_error``), which Claude Code parses
  to shrink ``max_tokens`` or compact the conversation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import ApiError, InvalidRequest
from ..protocol import GenerationRequest, Media
from ..tools.hosted import Kind
from . import asks as wire_asks
from . import hostedhistory
from . import media as wire_media
from . import tools as wire_tools
from .params import SAMPLING, Param, Parsed, check_schema, read_sampling, read_stops, require_model, shown

ANTHROPIC_SAMPLING = {"temperature": Param(float, 0, 1), "top_p": Param(float, 0, 1), "top_k": SAMPLING["top_k"]}
# output_config.effort -> params.apply_effort's effort: "high" is Anthropic's default (no cap)
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
BILLING_HEADER = "x-anthropic-billing-header:"


def per_session_header(text: str) -> bool:
    """Whether a system text block is nothing but per-session header lines (Claude Code's first
    block: ``x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=cli;``)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return bool(lines) and all(line.lower().startswith(BILLING_HEADER) for line in lines)


def _without_headers(system: Any) -> Any:
    """``system`` with its per-session header blocks emptied (in place, so that the blocks after
    them keep their index in error messages)."""
    if isinstance(system, str):
        return "" if per_session_header(system) else system
    if not isinstance(system, list):
        return system
    return [{"type": "text", "text": ""} if isinstance(b, dict) and b.get("type") == "text"
            and isinstance(b.get("text"), str) and per_session_header(b["text"]) else b for b in system]


def reminder(text: str) -> str:
    """A system message met inside ``messages``, as the user-turn text Claude Code itself writes."""
    return f"<system-reminder>\n{text}\n</system-reminder>"


@dataclass
class _Blocks:
    text: str = ""
    thinking: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)  # tool_use blocks (assistant)
    results: list[dict[str, Any]] = field(default_factory=list)  # tool_result blocks (user), as tool messages
    media: list[Media] = field(default_factory=list)  # the text's pictures, in order (``wire.media``)
    result_media: list[Media] = field(default_factory=list)  # the tool results' pictures
    # an assistant turn's hosted calls with their results (``hostedhistory``): the assistant messages
    # and tool messages that come before the rest of the turn
    before: list[dict[str, Any]] = field(default_factory=list)


def _blocks(value: Any, where: str, *, role: str, ledger: wire_tools.CallLedger | None = None,
            media: bool = False) -> _Blocks:
    """A string or a list of content blocks, read by kind. With ``media``, ``image`` blocks are
    taken (their places marked in the text); a tool result's picture (Claude Code's Read of
    one) is told as a note to a model that takes none (``Media.note``), not a 400 every turn.
    An assistant's hosted call and its result, met in the same turn, end an assistant message
    there (its text, thinking and calls so far, the hosted call last) and a tool message
    follows (``_Blocks.before``); a hosted call whose result is not in the turn is left out."""
    if isinstance(value, str):
        return _Blocks(value)
    if not isinstance(value, list):
        raise InvalidRequest(f"{where}: must be a string or a list of content blocks", where)
    out, text, thinking = _Blocks(), [], []
    hosted: dict[str, dict[str, Any]] = {}  # hosted calls waiting for their result block, by id
    for j, block in enumerate(value):
        at = f"{where}.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking" and role == "assistant":
            continue
        elif kind == "image" and media:
            out.media.append(wire_media.anthropic_source(block, at))
            out.media[-1].note = wire_tools.IMAGE_NOTE if role == "tool" else None
            text.append(wire_media.MARKER)
        elif kind in ("image", "document") and role == "tool":
            text.append(wire_tools.IMAGE_NOTE)  # Claude Code's Read of a picture: told, not a 400 every turn
        elif kind in ("text", "thinking"):
            raise InvalidRequest(f"{at}: a {kind} block needs a string `{kind}`", at)
        elif kind == "tool_use" and role == "assistant" and ledger is not None:
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise InvalidRequest(f"{at}: a tool_use block needs a string `id` and `name`", at)
            if not isinstance(block.get("input", {}), dict):
                raise InvalidRequest(f"{at}.input: must be an object", f"{at}.input")
            out.calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": block.get("input", {})}})
        elif kind in hostedhistory.ANTHROPIC_USES and role == "assistant" and ledger is not None:
            use = hostedhistory.anthropic_use(block, at)
            hosted[use["id"]] = use
        elif kind in hostedhistory.ANTHROPIC_RESULTS and role == "assistant" and ledger is not None:
            use_id = block.get("tool_use_id")
            call = hosted.pop(use_id) if isinstance(use_id, str) and use_id in hosted else None
            if call is None:
                raise InvalidRequest(f"{at}.tool_use_id: {shown(use_id)} matches no server_tool_use or mcp_tool_use "
                                     "block before it in this message", f"{at}.tool_use_id")
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(text), "tool_calls": [*out.calls, call]}
            if thinking:
                msg["reasoning_content"] = msg["thinking"] = "".join(thinking)
            out.before += [msg, {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                                 "content": hostedhistory.anthropic_result(block, at)}]
            text, thinking, out.calls = [], [], []
        elif kind == "tool_result" and role == "user" and ledger is not None:
            name = ledger.name_of(block.get("tool_use_id"), f"{at}.tool_use_id")
            result = _blocks(block.get("content", ""), f"{at}.content", role="tool", media=True)
            content = result.text
            out.result_media += result.media
            is_error = block.get("is_error", False)
            if not isinstance(is_error, bool):
                raise InvalidRequest(f"{at}.is_error: must be true or false", f"{at}.is_error")
            out.results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "name": name,
                                "content": f"Error: {content}" if is_error else content})
        else:
            raise InvalidRequest(f"{at}.type: {shown(kind)} blocks are not supported here by this server",
                                 f"{at}.type")
    out.text, out.thinking = "".join(text), "".join(thinking)
    return out


def parse(body: dict[str, Any], *, keep_billing_header: bool = False, counting: bool = False) -> Parsed:
    """A Messages request. ``counting``: for ``count_tokens``, which takes no ``max_tokens`` (nor
    holds one against a thinking budget)."""
    model = require_model(body, anthropic=True)
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not counting:
        raise InvalidRequest("max_tokens: Field required", "max_tokens")
    problem = SAMPLING["max_tokens"].problem(max_tokens) if max_tokens is not None else None
    if problem:
        raise InvalidRequest(f"max_tokens: {problem}, got {shown(max_tokens)}", "max_tokens")
    tools = wire_tools.anthropic_tools(body)
    hosted = wire_asks.anthropic_asks(body)
    choice = wire_tools.anthropic_tool_choice(body, tools, {a.name or a.kind.value: a.kind.value for a in hosted
                                                            if a.kind is not Kind.MCP})
    if choice.mode == "none":
        hosted = []  # no tool at all: the hosted ones are not offered either

    system = body.get("system")
    if system is not None and not keep_billing_header:
        system = _without_headers(system)
    prompt = _blocks(system, "system", role="system").text if system is not None else ""
    media: list[Media] = []
    messages = _messages(body.get("messages"), prompt, media)

    req = GenerationRequest(messages=messages, max_tokens=max_tokens, media=media)
    if tools and choice.mode != "none":
        req.tools, req.tool_choice, req.tool_names, req.parallel_tool_calls = (tools, choice.mode, choice.names,
                                                                             choice.parallel)
    elif hosted:  # hosted tools only: the pipeline offers them, under this choice
        req.tool_choice, req.tool_names, req.parallel_tool_calls = choice.mode, choice.names, choice.parallel
    explicit = read_sampling(body, req, ANTHROPIC_SAMPLING, anthropic=True)
    req.stop = read_stops(body.get("stop_sequences"), "stop_sequences", anthropic=True)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream: must be true or false", "stream")
    _metadata(body.get("metadata"))
    _thinking(body.get("thinking"), req, None if counting else max_tokens)
    _output_format(body, req)
    return Parsed(model, req, stream, explicit=explicit, reasoning_effort=_effort(body.get("output_config")),
                  dropped=wire_tools.anthropic_left_out(body), hosted=hosted)


MAX_USER_ID = 256  # Anthropic's bound on ``metadata.user_id``


def _metadata(value: Any) -> None:
    """``metadata`` as Anthropic's API checks it: absent or null, or an object whose one field
    is ``user_id`` (a string of at most ``MAX_USER_ID`` characters, or null). Nothing of it is
    kept; a 400 naming ``metadata`` otherwise."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise InvalidRequest("metadata: must be an object", "metadata")
    extra = next((k for k in value if k != "user_id"), None)
    if extra is not None:
        raise InvalidRequest(f"metadata.{shown(extra)}: Extra inputs are not permitted", "metadata")
    user = value.get("user_id")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("metadata.user_id: must be a string", "metadata")
    if user is not None and len(user) > MAX_USER_ID:
        raise InvalidRequest(f"metadata.user_id: String should have at most {MAX_USER_ID} characters, "
                             f"got {len(user)}", "metadata")


def _messages(raw: Any, system: str, media: list[Media]) -> list[dict[str, Any]]:
    """``messages`` in the shape of Hugging Face's chat templates, after the system prompt.

    A ``system`` message inside them: before any other turn it joins the system prompt; after
    one it is folded, as ``reminder`` text, into the user turn that follows at once (before its
    text), else into the user turn just before (after its text), else it is a user turn of its
    own. Every chat template takes that."""
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("messages: must be a non-empty list", "messages")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    reminders: list[str] = []  # system messages waiting for a user turn

    def fold_back() -> None:
        """Reminders that no user turn follows at once: into the user turn before, else their own."""
        if not reminders:
            return
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"] = _joined(messages[-1]["content"], *reminders)
        else:
            messages.append({"role": "user", "content": "\n".join(reminders)})
        reminders.clear()

    ledger = wire_tools.CallLedger(anthropic=True)
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant", "system"):
            raise InvalidRequest(f"{where}.role: must be user, assistant or system", f"{where}.role")
        if role == "system":
            text = _blocks(m.get("content"), f"{where}.content", role="system").text
            if not text:
                continue
            if all(msg["role"] == "system" for msg in messages):  # no turn yet: the system prompt
                if messages:
                    messages[0]["content"] += "\n\n" + text
                else:
                    messages.append({"role": "system", "content": text})
            else:
                reminders.append(reminder(text))
            continue
        blocks = _blocks(m.get("content"), f"{where}.content", role=role, ledger=ledger, media=role == "user")
        media += blocks.result_media + blocks.media  # in the order the prompt holds them (results first)
        if role == "user" and reminders:
            blocks.text = _joined(*reminders, blocks.text)
            reminders.clear()
        fold_back()
        messages += blocks.results  # a user turn's tool results come before its text
        messages += blocks.before  # an assistant turn's hosted calls and results, before the rest of it
        for earlier in blocks.before:
            ledger.add(earlier.get("tool_calls") or [])
        if (blocks.results and not blocks.text) or (blocks.before and not (blocks.text or blocks.calls
                                                                            or blocks.thinking)):
            continue
        msg: dict[str, Any] = {"role": role, "content": blocks.text}
        if blocks.thinking:
            msg["reasoning_content"] = msg["thinking"] = blocks.thinking
        if blocks.calls:
            msg["tool_calls"] = blocks.calls
            ledger.add(blocks.calls)
        messages.append(msg)
    fold_back()
    return messages


def _joined(*texts: str) -> str:
    return "\n".join(t for t in texts if t)


def _thinking(value: Any, req: GenerationRequest, max_tokens: int | None) -> None:
    """``thinking``: enabled with a budget, disabled, or adaptive (the model's own judgement,
    within ``output_config.effort``'s budget)."""
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise InvalidRequest("thinking.type: must be enabled, disabled or adaptive", "thinking.type")
    if kind == "enabled":
        budget = value.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise InvalidRequest("thinking.budget_tokens: must be an integer >= 0 (0: no thinking)",
                                 "thinking.budget_tokens")
        if max_tokens is not None and budget >= max_tokens:
            raise InvalidRequest(f"max_tokens must be greater than thinking.budget_tokens ({budget})",
                                 "thinking.budget_tokens")
        req.thinking_budget = budget
        kind = "disabled" if budget == 0 else kind
    req.chat_template_kwargs.setdefault("enable_thinking", kind != "disabled")


def _effort(config: Any) -> str | None:
    """``output_config.effort`` as ``params.apply_effort``'s effort; its other fields are ignored."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise InvalidRequest("output_config: must be an object", "output_config")
    effort = config.get("effort")
    if effort is None:
        return None
    if effort not in EFFORTS:
        raise InvalidRequest(f"output_config.effort: must be one of {', '.join(EFFORTS)}, got {shown(effort)}",
                             "output_config.effort")
    return EFFORTS[effort]


def _output_format(body: dict[str, Any], req: GenerationRequest) -> None:
    """Structured output: ``output_config.format`` (or the older ``output_format``),
    ``{"type": "json_schema", "schema": {...}}``, as OpenAI's ``response_format`` json_schema."""
    config = body.get("output_config")
    fmt, param = (config.get("format"), "output_config.format") if isinstance(config, dict) else (None, "")
    if fmt is None:
        fmt, param = body.get("output_format"), "output_format"
    if fmt is None:
        return
    schema = fmt.get("schema") if isinstance(fmt, dict) and fmt.get("type") == "json_schema" else None
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param}: must be {{\"type\": \"json_schema\", \"schema\": {{...}}}}", param)
    check_schema(schema, f"{param}.schema", anthropic=True)
    req.response_format, req.json_schema, req.format_param = "json_schema", schema, f"{param}.schema"


# The worker's context refusals (``worker/prompts``, code ``context_length_exceeded``, in OpenAI's
# words), read back for their numbers: the prompt and max_tokens past the context, or the prompt
# alone past it (``at least`` N tokens: refused by its bytes before it was tokenized).
_REQUESTED = re.compile(r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens "
                        r"\((\d+) in the prompt, (\d+) for the completion\)")
_AT_LEAST = re.compile(r"maximum context length is (\d+) tokens\. However, the \w+ is (\d+) bytes long, "
                       r"at least (\d+) tokens")


def context_error(err: ApiError) -> ApiError:
    """A context overflow in Anthropic's own words, which Claude Code matches (its regexes:
    ``input length and `max_tokens` exceed context limit: (\\d+) \\+ (\\d+) > (\\d+)``, then it
    asks again with a smaller max_tokens; ``prompt is too long[^0-9]*(\\d+)\\s*tokens?\\s*>\\s*(\\d+)``,
    then it compacts). Any other error, or one whose numbers cannot be read, as it is."""
    if err.code != "context_length_exceeded":
        return err
    if m := _REQUESTED.search(err.message):
        limit, prompt, completion = map(int, m.groups())
        if prompt < limit:
            message = (f"input length and `max_tokens` exceed context limit: {prompt} + {completion} > {limit}, "
                       "decrease input length or `max_tokens` and try again")
        else:
            message = f"prompt is too long: {prompt} tokens > {limit - 1} maximum"
    elif m := _AT_LEAST.search(err.message):
        limit, size, least = map(int, m.groups())
        message = f"prompt is too long: at least {least} tokens > {limit - 1} maximum (the prompt is {size} bytes long)"
    else:
        return err
    out = InvalidRequest(message, err.param, err.code)
    out.model = err.model
    return out
