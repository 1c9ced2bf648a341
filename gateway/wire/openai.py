"""OpenAI's chat and text completion requests, and its embeddings: validated into a
``GenerationRequest`` (the answers are ``openai_answer``'s).

Fields are mapped one by one into a ``GenerationRequest``; unknown fields are accepted
(clients send many) and wrong types or ranges are a 400 naming ``param``. The hosted tools a
chat request asks for (``web_search_options``, and ``tools`` of a type the gateway runs, in the
Responses shape) are read into ``Parsed.hosted`` (``wire.asks``).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import struct
from typing import Any

from ..base.errors import InvalidRequest
from ..protocol import GenerationRequest, Media
from ..text import chat_template
from ..text.grammar import grammar_problem
from . import asks as wire_asks
from . import tools as wire_tools
from .fim import read_suffix
from .params import (  # noqa: F401 (apply_defaults: re-exported)
    EFFORTS,
    SAMPLING,
    Parsed,
    apply_defaults,
    check_schema,
    message_list,
    message_role,
    read_lora,
    read_sampling,
    read_stops,
    require_model,
    shown,
    text_parts,
)

log = logging.getLogger(__name__)

ROLES = ("system", "developer", "user", "assistant", "tool")
KNOWN_CHAT = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "stream",
    "stream_options", "seed", "presence_penalty", "frequency_penalty", "n", "user", "top_k", "min_p",
    "repeat_penalty", "chat_template_kwargs", "ignore_eos", "reasoning_format", "reasoning_effort", "response_format",
    "grammar", "lora",
    "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "metadata", "web_search_options",
}
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")  # llama-server's values; all but none split
KNOWN_COMPLETION = KNOWN_CHAT - {"messages", "max_completion_tokens", "chat_template_kwargs", "tools", "tool_choice",
                                 "parallel_tool_calls", "web_search_options",
                                 "reasoning_format", "top_logprobs"} | {"prompt"}
MAX_LOGGED_UNKNOWN = 256
_logged_unknown: set[str] = set()  # bounded: names come from callers


def _log_unknown(body: dict[str, Any], known: set[str]) -> None:
    """Name each unsupported field once in the debug log (at most MAX_LOGGED_UNKNOWN names
    are ever remembered: a caller can send any number of unique ones)."""
    for key in body:
        if len(_logged_unknown) >= MAX_LOGGED_UNKNOWN:
            return
        if key not in known and key not in _logged_unknown:
            _logged_unknown.add(key)
            log.debug("ignoring unsupported request field %s", shown(key))


# OpenAI's bounds on ``metadata`` (Chat Completions and Responses): pairs, a key's characters, a value's
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", list: "an array", dict: "an object"}.get(
        type(value), "null" if value is None else "a string")


def read_metadata(value: Any) -> dict[str, str]:
    """``metadata`` as OpenAI's API checks it: absent or null, or an object of at most
    ``METADATA_PAIRS`` pairs, each key at most ``METADATA_KEY`` characters and each value a
    string of at most ``METADATA_VALUE``. Anything else is a 400 naming ``metadata`` and the
    rule it breaks (a caller's key quoted bounded). A Response repeats what passes."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"Invalid type for 'metadata': expected an object, but got {_kind(value)} instead.",
                             "metadata", "invalid_type")
    if len(value) > METADATA_PAIRS:
        raise InvalidRequest(f"Invalid 'metadata': too many properties. Expected an object with at most "
                             f"{METADATA_PAIRS} properties, but got an object with {len(value)} properties instead.",
                             "metadata", "object_above_max_properties")
    for key, item in value.items():
        if len(key) > METADATA_KEY:
            raise InvalidRequest(f"Invalid 'metadata': key {shown(key)} too long. Expected a key of at most "
                                 f"{METADATA_KEY} characters, but got a key of {len(key)} characters instead.",
                                 "metadata", "string_above_max_length")
        if not isinstance(item, str):
            raise InvalidRequest(f"Invalid type for 'metadata.{key}': expected a string, but got {_kind(item)} "
                                 "instead.", "metadata", "invalid_type")
        if len(item) > METADATA_VALUE:
            raise InvalidRequest(f"Invalid 'metadata.{key}': string too long. Expected a string with maximum length "
                                 f"{METADATA_VALUE}, but got a string with length {len(item)} instead.",
                                 "metadata", "string_above_max_length")
    return value


def _max_tokens(body: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        problem = SAMPLING["max_tokens"].problem(value)
        if problem:
            raise InvalidRequest(f"`{name}` {problem}, got {shown(value)}", name)
        return value
    return None


def _common(body: dict[str, Any], req: GenerationRequest) -> tuple[bool, bool, set[str]]:
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise InvalidRequest(f"`n` must be 1 (one choice per request), got {shown(n)}", "n")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("`stream` must be true or false", "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise InvalidRequest("`stream_options` must be an object", "stream_options")
        include_usage = opts.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise InvalidRequest("`stream_options.include_usage` must be true or false", "stream_options.include_usage")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("`user` must be a string", "user")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise InvalidRequest("`ignore_eos` must be true or false", "ignore_eos")
    req.ignore_eos = ignore_eos
    explicit = read_sampling(body, req, SAMPLING)
    req.stop = read_stops(body.get("stop"), "stop")
    req.lora = read_lora(body.get("lora"))
    return stream, include_usage, explicit


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    want, top = body.get("logprobs"), body.get("top_logprobs")
    if want is not None and not isinstance(want, bool):
        raise InvalidRequest("`logprobs` must be true or false", "logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise InvalidRequest(f"`top_logprobs` must be an integer from 0 to 20, got {shown(top)}", "top_logprobs")
        if not want:
            raise InvalidRequest("`top_logprobs` needs `logprobs: true`", "top_logprobs")
    return (top or 0) if want else None


def _grammar(body: dict[str, Any], req: GenerationRequest) -> None:
    """``grammar`` (llama.cpp's GBNF field) or ``response_format`` (json_object, json_schema)
    into ``req``. A schema becomes a grammar in the model's worker (the converter is
    llama-cpp-python's, which this process does not load); one it cannot follow is a 400 there."""
    grammar, fmt = body.get("grammar"), body.get("response_format")
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise InvalidRequest("`grammar` must be a GBNF grammar in a string", "grammar")
        if fmt not in (None, {"type": "text"}):
            raise InvalidRequest("give `grammar` or `response_format`, not both", "grammar")
        if (problem := grammar_problem(grammar)) is not None:
            raise InvalidRequest(f"`grammar` {problem}", "grammar")
        req.grammar = grammar
        return
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidRequest("`response_format.type` must be text, json_object or json_schema", "response_format")
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest("`response_format.json_schema.schema` must be a JSON Schema object",
                                 "response_format.json_schema.schema")
        check_schema(schema, "response_format.json_schema.schema")
        req.json_schema = schema
    if fmt["type"] != "text":
        req.response_format = fmt["type"]


def _messages(body: dict[str, Any], media: list[Media]) -> list[dict[str, Any]]:
    """The messages, their pictures and sounds (a user's, a system's) appended to ``media``."""
    messages = message_list(body.get("messages"))
    out = []
    ledger = wire_tools.CallLedger()
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = message_role(m, where, ROLES)
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        msg: dict[str, Any] = {"role": role, "content": text_parts(content, f"{where}.content",
                                                                   media=media if role in ("user", "system") else None)}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if role == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = wire_tools.openai_calls(m["tool_calls"], f"{where}.tool_calls")
            ledger.add(msg["tool_calls"])
        if role == "tool":
            msg["name"] = ledger.name_of(m.get("tool_call_id"), f"{where}.tool_call_id")
            msg["tool_call_id"] = m["tool_call_id"]
        for key in ("reasoning_content", "reasoning"):  # earlier thinking, handed to the template as such
            value = m.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise InvalidRequest(f"`{where}.{key}` must be a string", f"{where}.{key}")
            msg["reasoning_content"] = msg["thinking"] = value  # the names templates read it by
        out.append(msg)
    return out


def parse_chat(body: dict[str, Any]) -> Parsed:
    model = require_model(body)
    media: list[Media] = []
    req = GenerationRequest(messages=_messages(body, media), media=media)
    stream, include_usage, explicit = _common(body, req)
    req.max_tokens = _max_tokens(body, ("max_completion_tokens", "max_tokens"))
    read_metadata(body.get("metadata"))  # not kept nor repeated, but refused as OpenAI refuses it
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise InvalidRequest("`chat_template_kwargs` must be an object", "chat_template_kwargs")
        taken = next((k for k in kwargs if k in chat_template.RESERVED), None)
        if taken is not None:
            raise InvalidRequest(f"`chat_template_kwargs.{taken}` is a name the chat template's renderer sets "
                                 "itself; it cannot be given", f"chat_template_kwargs.{taken}")
        req.chat_template_kwargs = dict(kwargs)
    _grammar(body, req)
    tools = wire_tools.openai_tools(body)
    choice = wire_tools.openai_tool_choice(body, tools)
    if tools and choice.mode != "none":
        if req.grammar is not None or req.response_format is not None:
            raise InvalidRequest("give `tools` or a `grammar` / `response_format`, not both", "tools")
        req.tools, req.tool_choice, req.tool_names, req.parallel_tool_calls = (tools, choice.mode, choice.names,
                                                                             choice.parallel)
    hosted, dropped = wire_asks.responses_asks(body.get("tools"))
    search = wire_asks.web_search_options(body)
    req.logprobs = _chat_logprobs(body)
    fmt = body.get("reasoning_format")
    if fmt is not None and fmt not in REASONING_FORMATS:
        raise InvalidRequest(f"`reasoning_format` must be one of {', '.join(REASONING_FORMATS)}, got {shown(fmt)}",
                             "reasoning_format")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest(f"`reasoning_effort` must be one of {', '.join(EFFORTS)}, got {shown(effort)}",
                             "reasoning_effort")
    _log_unknown(body, KNOWN_CHAT)
    return Parsed(model, req, stream, include_usage, explicit, fmt or "auto", effort, dropped=dropped,
                  hosted=([search] if search is not None else []) + hosted)


MAX_PROMPTS = 64


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def parse_completion(body: dict[str, Any]) -> Parsed:
    model = require_model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _is_ids(prompt):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        prompts = prompt  # a batch: one choice per prompt
    else:
        raise InvalidRequest("`prompt` must be a string, an array of token ids, or an array of those", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise InvalidRequest(f"`prompt` may hold at most {MAX_PROMPTS} prompts, got {len(prompts)}", "prompt")
    best_of = body.get("best_of")
    if best_of is not None and (type(best_of) is not int or best_of != 1):
        raise InvalidRequest("`best_of` is not supported", "best_of")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise InvalidRequest("`echo` must be true or false", "echo")
    suffix = read_suffix(body)  # fill-in-the-middle: the prompt is the text before the cursor
    if suffix is not None and (echo or not all(isinstance(p, str) for p in prompts)):
        raise InvalidRequest("`suffix` needs text prompts and no `echo`", "suffix")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 5):
        raise InvalidRequest(f"`logprobs` must be an integer from 0 to 5, got {shown(logprobs)}", "logprobs")
    if echo and logprobs is not None:
        raise InvalidRequest("`echo` together with `logprobs` (log-probabilities of the prompt) is not supported",
                             "logprobs")
    req = GenerationRequest(echo=echo, logprobs=logprobs)
    stream, include_usage, explicit = _common(body, req)
    _grammar(body, req)
    req.max_tokens = _max_tokens(body, ("max_tokens",))
    if req.max_tokens is None:
        req.max_tokens = 16  # OpenAI's default for /v1/completions
    requests = []
    for p in prompts:  # a batch's prompts each their own request (the one prompt of most: ``req`` itself)
        one = req if len(prompts) == 1 else dataclasses.replace(req, stop=list(req.stop))
        if isinstance(p, str):
            one.prompt, one.suffix = p, suffix
        else:
            one.prompt_tokens = p
        requests.append(one)
    _log_unknown(body, KNOWN_COMPLETION | {"echo", "logprobs", "suffix", "best_of"})
    return Parsed(model, requests[0], stream, include_usage, explicit, more=requests[1:])


def parse_embeddings(body: dict[str, Any]) -> tuple[str, list[Any], str]:
    """(model, inputs as texts or token-id lists, encoding_format)."""
    model = require_model(body)
    raw = body.get("input")

    if isinstance(raw, str):
        inputs: list[Any] = [raw]
    elif _is_ids(raw):
        inputs = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) or _is_ids(x) for x in raw):
        inputs = raw
    else:
        raise InvalidRequest("`input` must be a string, an array of strings, an array of token ids, "
                             "or an array of token-id arrays", "input")
    if len(inputs) > 2048:
        raise InvalidRequest(f"`input` may hold at most 2048 items, got {len(inputs)}", "input")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64", None):
        raise InvalidRequest("`encoding_format` must be float or base64", "encoding_format")
    return model, inputs, fmt or "float"


def embeddings_body(model: str, vectors: list[list[float]], fmt: str, prompt_tokens: int) -> dict[str, Any]:
    def encode(v: list[float]) -> Any:
        return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if fmt == "base64" else v

    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
