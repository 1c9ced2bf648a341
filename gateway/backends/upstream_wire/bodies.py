"""A ``GenerationRequest`` as the body an upstream server hears: ``/chat/completions`` for
messages, ``/completions`` for a prompt (with a suffix: fill in the middle where the upstream has
no ``/infill``, whose own body is in `upstream_wire/fill.py`). Always streamed: a whole answer is the
stream collected, as for a local model.

Whatever the caller spoke (OpenAI or Anthropic), the upstream hears OpenAI: the gateway's own
request is already the common ground, and every server in reach (another gguf-gateway,
llama-server, vLLM, Ollama's and LM Studio's ``/v1``) speaks it. Pure.
"""

from __future__ import annotations

import json
from typing import Any

from ...base.errors import ApiError
from ...protocol import GenerationRequest

# Sampling fields OpenAI defines, then those llama.cpp's server (and vLLM, LM Studio) add: only
# the ones a caller or the model's defaults set are sent (GenerationRequest.given).
SAMPLING_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "seed",
                   "top_k", "min_p", "repeat_penalty")


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A history message as OpenAI takes it: a call's arguments as JSON text, thinking as
    ``reasoning_content`` (llama.cpp's server and vLLM read it back), nothing of the chat
    template's own shape."""
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content", "")}
    if m["role"] == "tool":
        out["tool_call_id"] = m.get("tool_call_id")
    elif isinstance(m.get("name"), str):
        out["name"] = m["name"]
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["function"]["name"], "arguments": _json_text(
                                  c["function"]["arguments"])}} for c in m["tool_calls"]]
        out["content"] = out["content"] or None
    if isinstance(m.get("reasoning_content"), str):
        out["reasoning_content"] = m["reasoning_content"]
    return out


def _json_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def request_body(req: GenerationRequest, model: str) -> tuple[str, dict[str, Any]]:
    """(path under the upstream's base URL, JSON body) for ``req``, always streamed: a whole
    answer is the stream collected, as for a local model."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if req.messages is not None:
        path = "/chat/completions"
        body["messages"] = [_message(m) for m in req.messages]
        if req.tools:
            # a choice of several tools (allowed_tools) reaches the upstream as those tools alone,
            # which every OpenAI-compatible server follows
            allowed = req.tool_names
            body["tools"] = [t for t in req.tools if allowed is None or t["function"]["name"] in allowed]
            body["tool_choice"] = ({"type": "function", "function": {"name": allowed[0]}}
                                   if allowed is not None and len(allowed) == 1 and req.tool_choice == "required"
                                   else req.tool_choice)
            if not req.parallel_tool_calls:
                body["parallel_tool_calls"] = False
        if req.chat_template_kwargs:
            body["chat_template_kwargs"] = req.chat_template_kwargs
        if req.logprobs is not None:
            body["logprobs"], body["top_logprobs"] = True, req.logprobs
    else:
        path = "/completions"
        body["prompt"] = req.prompt if req.prompt is not None else req.prompt_tokens
        if req.echo:
            body["echo"] = True
        if req.suffix is not None:  # fill in the middle, where the upstream has no /infill
            _fim_fallback(req)
            body["suffix"] = req.suffix
    if req.max_tokens is not None:
        body["max_tokens"] = req.max_tokens
    add_sampling(body, req)
    if req.grammar is not None:
        body["grammar"] = req.grammar
    if req.response_format == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif req.response_format == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": req.json_schema}}
    if req.ignore_eos:
        body["ignore_eos"] = True
    return path, body


def _fim_fallback(req: GenerationRequest) -> None:
    """Refuse what the OpenAI completions shape cannot carry, rather than drop it."""
    for value, param in ((req.infill_extra, "input_extra"), (req.infill_prompt, "prompt")):
        if value:
            raise ApiError(f"`{param}` cannot reach this model: its upstream server has no /infill, and its "
                           "/completions takes a prompt and a suffix only; leave it out", status=501,
                           param=param, code="fim_not_supported")


def add_sampling(body: dict[str, Any], req: GenerationRequest) -> None:
    """The sampling fields the caller gave, and the stops, into an upstream's request body."""
    for name in req.given:
        if name in SAMPLING_FIELDS:
            body[name] = getattr(req, name)
    if req.stop:
        body["stop"] = req.stop
