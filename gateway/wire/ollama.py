"""Ollama's API shapes (``/api/chat``, ``/api/generate``, ``/api/embed``, ...): validate requests
into a ``GenerationRequest``, and build the NDJSON lines and whole bodies Ollama's clients read.

Fields are Ollama's (``options.num_predict``, ``format``, ``think``, ``keep_alive``...); unknown
options are accepted, as Ollama does, and wrong types are a 400 naming the field. Durations in
answers are nanoseconds, as Ollama's are.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..base import strictjson
from ..base.errors import ApiError, InvalidRequest
from ..models.config import parse_duration
from ..protocol import GenerationRequest, Media, Start
from . import answer, writer
from . import media as wire_media
from . import tools as wire_tools
from .answer import Finish, Item, Piece
from .context import Context
from .fim import read_suffix
from .params import SAMPLING, Parsed, check_schema, message_list, message_role, model_name, read_stops, shown
from .writer import Frame

ROLES = ("system", "user", "assistant", "tool")
# options -> the gateway's sampling fields (Ollama's names where they differ)
OPTIONS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
           "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty"}


@dataclass
class OllamaParsed(Parsed):
    keep_alive: float | None = None  # seconds the model stays loaded after this request (None: its own)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("model is required", "model")
    return model_name(model)


def flag(body: dict[str, Any], name: str, default: bool) -> bool:
    """A true-or-false field (absent or null: ``default``); else a 400 naming it."""
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false, got {shown(value)}", name)
    return value


def keep_alive(body: dict[str, Any]) -> float | None:
    """``keep_alive``: a duration ("5m", seconds, 0: unload once answered, negative: forever)."""
    value = body.get("keep_alive")
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        return float("inf")
    if isinstance(value, str) and value.strip().startswith("-"):
        return float("inf")
    seconds = parse_duration(value)
    if seconds is None:
        raise InvalidRequest(f'keep_alive must be a duration such as "5m", "30s" or a number of seconds, '
                             f"got {shown(value)}", "keep_alive")
    return seconds


def _options(body: dict[str, Any], req: GenerationRequest) -> set[str]:
    """``options`` into ``req``; returns the sampling fields set."""
    options = body.get("options")
    if options is None:
        return set()
    if not isinstance(options, dict):
        raise InvalidRequest("options must be an object", "options")
    given: set[str] = set()
    for name, field in OPTIONS.items():
        value = options.get(name)
        if value is None:
            continue
        problem = SAMPLING[field].problem(value)
        if problem:
            raise InvalidRequest(f"options.{name} {problem}, got {shown(value)}", f"options.{name}")
        setattr(req, field, value)
        given.add(field)
    predict = options.get("num_predict")
    if predict is not None:
        if isinstance(predict, bool) or not isinstance(predict, int) or predict < -2:
            raise InvalidRequest(f"options.num_predict must be an integer (-1: no limit), got {shown(predict)}",
                                 "options.num_predict")
        req.max_tokens = predict if predict > 0 else None
        if predict == 0:
            req.max_tokens = 1  # Ollama loads and answers nothing; one token is the least llama.cpp decodes
    if options.get("stop") is not None:
        req.stop = read_stops(options["stop"], "options.stop")
    return given


def _format(body: dict[str, Any], req: GenerationRequest) -> None:
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return
    if fmt == "json":
        req.response_format = "json_object"
    elif isinstance(fmt, dict):
        check_schema(fmt, "format")
        req.response_format, req.json_schema = "json_schema", fmt
    else:
        raise InvalidRequest(f'format must be "json" or a JSON schema object, got {shown(fmt)}', "format")
    req.format_param = "format"


def _think(body: dict[str, Any], req: GenerationRequest) -> str | None:
    """``think``: true or false turns thinking on or off in the template (off also ends any
    thinking at once); an effort (low, medium, high) is returned, for the model's budgets."""
    think = body.get("think")
    if think is None:
        return None
    if isinstance(think, bool):
        req.chat_template_kwargs["enable_thinking"] = think
        if not think:
            req.thinking_budget = 0
        return None
    if think in ("low", "medium", "high"):
        return think
    raise InvalidRequest(f'think must be true, false, "low", "medium" or "high", got {shown(think)}', "think")


def _images(value: Any, where: str, media: list[Media]) -> str:
    """``images`` (base64 strings) appended to ``media``; their markers, which go before the
    text they came with (as Ollama places them)."""
    if value is None:
        return ""
    if not isinstance(value, list):
        raise InvalidRequest(f"{where} must be an array of base64-encoded images", where)
    for j, image in enumerate(value):
        media.append(wire_media.from_base64(image, wire_media.IMAGE, f"{where}[{j}]"))
    return wire_media.MARKER * len(value)


def _messages(value: Any, media: list[Media]) -> list[dict[str, Any]]:
    if value is None:
        return []
    value = message_list(value, empty=True)
    out: list[dict[str, Any]] = []
    calls: list[tuple[str, str]] = []  # (id, tool name) of the calls made so far, for tool results
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        role = message_role(m, where, ROLES)
        content = m.get("content", "")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise InvalidRequest(f"`{where}.content` must be a string", f"{where}.content")
        msg: dict[str, Any] = {"role": role, "content": _images(m.get("images"), f"{where}.images", media) + content}
        thinking = m.get("thinking")
        if isinstance(thinking, str) and thinking and role == "assistant":
            msg["reasoning_content"] = msg["thinking"] = thinking
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = []
            if not isinstance(m["tool_calls"], list):
                raise InvalidRequest(f"{where}.tool_calls must be an array", f"{where}.tool_calls")
            for j, call in enumerate(m["tool_calls"]):
                f = call.get("function") if isinstance(call, dict) else None
                at = f"{where}.tool_calls[{j}].function"
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    raise InvalidRequest(f'{at} must be {{"name": ..., "arguments": {{...}}}}', at)
                args = f.get("arguments") or {}
                if isinstance(args, str):  # strict and bounded, a 400 naming the field (base/strictjson)
                    args = strictjson.loads(args, f"{at}.arguments")
                if not isinstance(args, dict):
                    raise InvalidRequest(f"{at}.arguments must be an object", f"{at}.arguments")
                call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{i}_{j}"
                calls.append((call_id, f["name"]))
                msg["tool_calls"].append({"id": call_id, "type": "function",
                                          "function": {"name": f["name"], "arguments": args}})
        if role == "tool":
            name = m.get("tool_name") or m.get("name")
            match = next((c for c in reversed(calls) if name is None or c[1] == name), None)
            if match is None:
                raise InvalidRequest(f"{where}: a tool result needs an earlier tool call"
                                     + (f" to {shown(name)}" if name else ""), f"{where}.tool_name")
            msg["tool_call_id"], msg["name"] = match
        out.append(msg)
    return out  # empty: the request only loads (or with keep_alive 0 unloads) the model, as Ollama's does


def _common(body: dict[str, Any], req: GenerationRequest) -> tuple[set[str], float | None, str | None]:
    given = _options(body, req)
    _format(body, req)
    return given, keep_alive(body), _think(body, req)


def parse_chat(body: dict[str, Any]) -> OllamaParsed:
    model = _model(body)
    media: list[Media] = []
    req = GenerationRequest(messages=_messages(body.get("messages"), media), media=media)
    given, alive, effort = _common(body, req)
    tools = wire_tools.openai_tools(body)
    if tools:
        if req.response_format is not None:
            raise InvalidRequest("give tools or format, not both", "tools")
        req.tools = tools
    return OllamaParsed(model, req, flag(body, "stream", True), explicit=given, keep_alive=alive,
                        reasoning_effort=effort)


def parse_generate(body: dict[str, Any]) -> OllamaParsed:
    """``/api/generate``: ``prompt`` (with ``system``) through the chat template, or as it is
    with ``raw``; with ``suffix``, ``prompt`` and ``suffix`` as the text before and after the
    cursor (fill in the middle, ``system`` unused). An empty prompt without a suffix only loads
    the model (``keep_alive: 0``: unloads it)."""
    model = _model(body)
    prompt, system = body.get("prompt", ""), body.get("system")
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt must be a string", "prompt")
    if system is not None and not isinstance(system, str):
        raise InvalidRequest("system must be a string", "system")
    media: list[Media] = []
    marks = _images(body.get("images"), "images", media)
    for name in ("template", "context"):
        if body.get(name):
            raise InvalidRequest(f"{name} is not supported by this gateway", name)
    suffix = read_suffix(body)
    raw = flag(body, "raw", False)
    if suffix is not None:  # fill in the middle, as Ollama does for a model whose template has .Suffix
        if media:
            raise InvalidRequest("images cannot go with a suffix (fill in the middle)", "images")
        req = GenerationRequest(prompt=prompt, suffix=suffix)
    elif raw:
        req = GenerationRequest(prompt=marks + prompt, media=media)
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user",
                                                                                   "content": marks + prompt}]
        req = GenerationRequest(messages=messages, media=media)
    given, alive, effort = _common(body, req)
    return OllamaParsed(model, req, flag(body, "stream", True), explicit=given, keep_alive=alive,
                        reasoning_effort=effort)


def parse_embed(body: dict[str, Any], legacy: bool = False) -> tuple[str, list[str], float | None]:
    """``/api/embed`` (``input``: a string or strings) or the older ``/api/embeddings``
    (``prompt``: one string)."""
    model = _model(body)
    name = "prompt" if legacy else "input"
    value = body.get(name)
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not inputs or not all(isinstance(x, str) for x in inputs):
        raise InvalidRequest(f"{name} must be a string" + ("" if legacy else " or an array of strings"), name)
    if len(inputs) > 2048:
        raise InvalidRequest(f"{name} may hold at most 2048 items, got {len(inputs)}", name)
    return model, inputs, keep_alive(body)


# --- answers -----------------------------------------------------------------------------------

def ns(seconds: float) -> int:
    return int(seconds * 1e9)


@dataclass
class Clock:
    """A request's timings, for the final object's durations."""

    began: float
    loaded: float = 0.0  # when the model was ready
    first: float = 0.0  # when the prompt was read (the first event)

    def stats(self, prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        end = time.monotonic()
        loaded = self.loaded or self.began
        first = self.first or loaded
        return {"total_duration": ns(end - self.began), "load_duration": ns(loaded - self.began),
                "prompt_eval_count": prompt_tokens, "prompt_eval_duration": ns(first - loaded),
                "eval_count": completion_tokens, "eval_duration": ns(end - first)}


def load_answer(model: str, chat: bool, reason: str) -> dict[str, Any]:
    """The answer to a request that only loads (``reason`` "load") or unloads ("unload") its
    model: an empty, finished answer, as Ollama's."""
    body = chunk(model, chat)
    body.update(done=True, done_reason=reason)
    return body


def done_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def chunk(model: str, chat: bool, content: str = "", thinking: str = "",
          calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One streamed line (or, with ``done`` fields added, the whole answer)."""
    out: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:  # whole calls (``whole_calls``): JSON ``answer`` has parsed, bounded and written again
            message["tool_calls"] = [{"function": {"name": c["name"], "arguments": json.loads(c["arguments"] or "{}")}}
                                     for c in calls]
        out["message"] = message
    else:
        out["response"] = content
        if thinking:
            out["thinking"] = thinking
    out["done"] = False
    return out


def details(info: Any) -> dict[str, Any]:
    """Ollama's ``details`` of a model, from its GGUF header."""
    arch = getattr(info, "architecture", None) or ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": getattr(info, "size_label", None) or "",
            "quantization_level": getattr(info, "quantization", None) or ""}


# /api/show's template for a model that fills in the middle: Continue's editor extension (and
# Ollama's own clients) send a ``suffix`` only to a model whose template mentions ``.Suffix``.
FIM_TEMPLATE = ("{{- if .Suffix }}{{- /* fill in the middle: the model's FIM tokens around .Prompt and .Suffix, "
                "as llama-server's /infill lays them out */ -}}{{ .Prompt }}{{ .Suffix }}{{- else }}\n{template}\n"
                "{{- end }}")


def show_template(template: str, fim: bool) -> str:
    """/api/show's ``template``: the model's chat template, inside a ``.Suffix`` branch where
    the model fills in the middle (Ollama's FIM models' templates have that shape)."""
    return FIM_TEMPLATE.replace("{template}", template) if fim else template


def ollama_name(name: str) -> str:
    """Ollama's clients show ``name:tag``; a name without a tag is ``name:latest``."""
    return name if ":" in name else f"{name}:latest"


class Writer(writer.Writer):
    """An answer as Ollama writes it: JSON lines of ``message`` (``/api/chat``) or ``response``
    (``/api/generate``) pieces, calls given whole in one line once the answer ends, and a last
    line with ``done`` and the durations; whole, the same object at once. A failure mid-stream
    is an ``{"error"}`` line. Its streams carry no load progress (its clients read each line as
    JSON), and it names the model as asked."""

    lines = True
    progress = False

    def __init__(self, parsed: Parsed, ctx: Context, chat: bool):
        super().__init__(parsed.model, parsed.stream)
        self.chat = chat
        self.id = f"for {parsed.model}"
        self.clock = Clock(time.monotonic())
        self.whole = answer.Whole()  # whole: everything; streamed: the calls held to the end

    def leased(self, model: str) -> None:
        self.clock.loaded = time.monotonic()

    def open(self, begun: Start) -> list[Frame]:
        self.clock.first = time.monotonic()
        return []

    def feed(self, item: Item) -> list[Frame]:
        if self.stream and isinstance(item, Piece):
            content, thinking = (item.text, "") if item.kind == "content" else ("", item.text)
            return [(chunk(self.model, self.chat, content, thinking), None)]
        self.whole.feed(item)
        return []

    def close(self, finish: Finish) -> list[Frame]:
        total = self.usage.total(finish)
        done = {"done": True, "done_reason": done_reason(finish.reason),
                **self.clock.stats(total.prompt_tokens, total.completion_tokens)}
        w = self.whole
        if not self.stream:
            self._whole = chunk(self.model, self.chat, w.content, w.thinking, w.calls)
            self._whole.update(done)
            return []
        frames: list[Frame] = [(chunk(self.model, self.chat, calls=w.calls), None)] if w.calls else []
        last = chunk(self.model, self.chat)
        last.update(done)
        return [*frames, (last, None)]

    def fail(self, err: ApiError) -> list[Frame]:
        return [({"error": err.message}, None)]

    def body(self) -> dict[str, Any]:
        return self._whole
