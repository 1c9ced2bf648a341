"""What every wire shape's request parser shares: sampling fields, stops, the model name, the
parsed request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..base.errors import MAX_MODEL_NAME, InvalidRequest, ModelNotFound, shown
from ..protocol import GenerationRequest, Media
from ..protocol.bounds import MAX_ADAPTERS, MAX_SCALE, is_scale
from ..text.sampling_params import SAMPLING, Param  # noqa: F401 (re-exported to the request parsers)
from ..text.schemacheck import schema_problem
from ..tools.hosted import Approval, Ask
from .media import MARKER, MEDIA_PARTS, openai_part


def named(param: str, anthropic: bool = False) -> str:
    """How an error message names the field it is about: ``param:`` in Anthropic's shape, the
    name in backquotes in OpenAI's."""
    return f"{param}:" if anthropic else f"`{param}`"


def check_schema(schema: Any, param: str, anthropic: bool = False) -> None:
    """Refuse a JSON schema that no grammar should be built from (``schemacheck``): a 400 naming
    the keyword at fault by its path under ``param``, the field the schema came in."""
    problem = schema_problem(schema)
    if problem is not None:
        at = param + "".join(f"[{p}]" if isinstance(p, int) and not anthropic else f".{p}" for p in problem.path)
        raise InvalidRequest(f"{named(at, anthropic)} {problem.message}", at)


def read_sampling(body: dict[str, Any], req: GenerationRequest, params: dict[str, Param], *,
                  anthropic: bool = False) -> set[str]:
    """Copy the sampling fields ``body`` sets into ``req``, checked against ``params``; returns
    the names it set (they beat a model's defaults). A bad value is a 400 naming the field."""
    explicit: set[str] = set()
    for name, param in params.items():
        value = body.get(name)
        if value is None or name == "max_tokens":
            continue
        problem = param.problem(value)
        if problem:
            raise InvalidRequest(f"{named(name, anthropic)} {problem}, got {shown(value)}", name)
        setattr(req, name, value)
        explicit.add(name)
    return explicit


def text_parts(content: Any, where: str, kinds: tuple[str, ...] = ("text",), what: str = "text parts",
               media: list[Media] | None = None, note: str | None = None) -> str:
    """A message's content: a string, or an array of parts of ``kinds`` (each with a ``text``),
    joined; anything else is a 400 naming the part. Given ``media``, pictures and sounds
    (``wire.media.MEDIA_PARTS``) are taken too: each appended to it, its place in the text
    marked (``MARKER``); ``note``: each one's ``Media.note`` (a tool's output)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"`{where}` must be a string or an array of content parts", where)
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequest(f"`{where}[{j}]` must be a content part object with a `type`", f"{where}[{j}]")
        if media is not None and part["type"] in MEDIA_PARTS:
            media.append(openai_part(part, f"{where}[{j}]"))
            media[-1].note = note
            parts.append(MARKER)
            continue
        if part["type"] not in kinds:
            raise InvalidRequest(f"`{where}[{j}].type` {shown(part['type'])} is not supported: {what} only",
                                 f"{where}[{j}].type")
        if not isinstance(part.get("text"), str):
            raise InvalidRequest(f"`{where}[{j}].text` must be a string", f"{where}[{j}].text")
        parts.append(part["text"])
    return "".join(parts)


def require_model(body: dict[str, Any], *, anthropic: bool = False) -> str:
    """The request's model name: required on every route that names one (``model_name``)."""
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        where = "model: Field required" if anthropic else "`model` is required"
        raise InvalidRequest(f"{where}: the name of a model on this gateway (see /v1/models)", "model")
    return model_name(model)


def model_name(name: str) -> str:
    """A model's name as a caller gave it, at the wire's edge: one longer than any real name
    (``MAX_MODEL_NAME``) goes no further than the 404 that names no model by it (quoting it
    cut), so it reaches no lookup, span, event or log line whole."""
    if len(name) > MAX_MODEL_NAME:
        raise ModelNotFound(name)
    return name


MAX_STOPS = 16
MAX_STOP_CHARS = 4096  # all stop strings together: each is matched against every token's text


def read_lora(value: Any) -> list[tuple[int, float]] | None:
    """llama-server's per-request ``lora``: ``[{"id": N, "scale": S}, ...]``, each listed adapter at
    its scale (0 where none is given, as llama-server reads it) and the model's others at 0; the
    worker refuses an id its model lacks (``worker.adapters``)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_ADAPTERS:
        raise InvalidRequest(f"`lora` must be an array of at most {MAX_ADAPTERS} objects with `id` and `scale`", "lora")
    pairs = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise InvalidRequest(f"`lora[{i}]` must be an object with `id` and `scale`", f"lora[{i}]")
        aid, scale = entry.get("id"), entry.get("scale", 0.0)
        if isinstance(aid, bool) or not isinstance(aid, int) or not 0 <= aid < MAX_ADAPTERS:
            raise InvalidRequest(f"`lora[{i}].id` must be an adapter's id (GET /lora-adapters), got {shown(aid)}",
                                 f"lora[{i}].id")
        if not is_scale(scale):
            raise InvalidRequest(f"`lora[{i}].scale` must be a number from -{MAX_SCALE:g} to {MAX_SCALE:g}, "
                                 f"got {shown(scale)}", f"lora[{i}].scale")
        pairs.append((aid, float(scale)))
    return pairs


def read_stops(value: Any, name: str, *, anthropic: bool = False) -> list[str]:
    """``stop`` (a string or a list of strings) or ``stop_sequences`` (a list), bounded in
    count and in total length; empty strings are dropped."""
    where = named(name, anthropic)
    if value is None:
        return []
    if isinstance(value, str) and not anthropic:
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest(f"{where} must be {'' if anthropic else 'a string or '}a list of strings", name)
    if len(value) > MAX_STOPS:
        raise InvalidRequest(f"{where} may hold at most {MAX_STOPS} strings, got {len(value)}", name)
    total = sum(len(s) for s in value)
    if total > MAX_STOP_CHARS:
        raise InvalidRequest(f"{where} may hold at most {MAX_STOP_CHARS} characters in all, got {total}", name)
    return [s for s in value if s]


@dataclass
class Parsed:
    """A validated request: what to run, and how to answer."""

    model: str
    request: GenerationRequest
    stream: bool = False
    include_usage: bool = False
    explicit: set[str] = field(default_factory=set)  # sampling fields the caller set
    reasoning_format: str = "auto"  # "none": thinking stays in the content, markers and all
    reasoning_effort: str | None = None  # OpenAI's: none | minimal | low | medium | high
    more: list[GenerationRequest] = field(default_factory=list)  # further prompts of a batch, one choice each
    # the tools the request gave that its prompt leaves out (hosted ones this server cannot run), by type
    dropped: list[str] = field(default_factory=list)
    # the hosted tools the request asks for that the gateway can run (``wire.asks``); the pipeline
    # runs those the server's configuration serves, and adds the others' types to ``dropped``
    hosted: list[Ask] = field(default_factory=list)
    approvals: list[Approval] = field(default_factory=list)  # Responses' mcp_approval_response items

    @property
    def requests(self) -> list[GenerationRequest]:
        return [self.request, *self.more]


def message_list(value: Any, *, empty: bool = False) -> list[Any]:
    """``messages``, an array of messages (``empty``: where the wire takes none), in the words
    every wire of OpenAI's style uses (OpenAI's, Ollama's)."""
    if not isinstance(value, list) or (not value and not empty):
        raise InvalidRequest(f"`messages` must be {'an' if empty else 'a non-empty'} array of messages", "messages")
    return value


def message_role(m: Any, where: str, roles: tuple[str, ...]) -> str:
    """The role of the message at ``where`` (``messages[N]``), checked in the same words by every
    wire of OpenAI's style: the message an object, its role one of ``roles``."""
    if not isinstance(m, dict):
        raise InvalidRequest(f"`{where}` must be an object", where)
    role = m.get("role")
    if role not in roles:
        raise InvalidRequest(f"`{where}.role` must be one of {', '.join(roles)}, got {shown(role)}", f"{where}.role")
    return role


def apply_defaults(parsed: Parsed, defaults: dict[str, Any]) -> None:
    """A model's models.yaml defaults fill the sampling fields the caller did not set."""
    for req in parsed.requests:
        req.given = sorted(parsed.explicit | set(defaults))
        for name, value in defaults.items():
            if name == "max_tokens":
                if req.max_tokens is None:
                    req.max_tokens = value
            elif name not in parsed.explicit:
                setattr(req, name, value)


EFFORTS = ("none", "minimal", "low", "medium", "high")
# Thinking tokens each effort allows (None: no cap), unless a model's models.yaml says otherwise:
# "high" leaves a model its own judgement, the others cap it at sizes that suit an interactive answer.
DEFAULT_BUDGETS: dict[str, int | None] = {"minimal": 256, "low": 1024, "medium": 4096, "high": None}


def apply_effort(req: GenerationRequest, effort: str | None, budgets: dict[str, int | None],
                 reasoning: str | None) -> None:
    """OpenAI's ``reasoning_effort``, once the model is known: a thinking budget from the model's
    ``reasoning_budgets`` (over ``DEFAULT_BUDGETS``); ``none`` turns thinking off where the
    template allows (``enable_thinking``) and ends any thinking at once. gpt-oss's template takes
    the effort itself (``reasoning_effort``: low, medium or high). A caller's own
    ``chat_template_kwargs`` win."""
    if effort is None:
        return
    kwargs = req.chat_template_kwargs
    if effort == "none":
        kwargs.setdefault("enable_thinking", False)
        req.thinking_budget = 0
        return
    if reasoning in ("harmony", "harmony_inline"):
        kwargs.setdefault("reasoning_effort", "low" if effort == "minimal" else effort)
    budget = {**DEFAULT_BUDGETS, **budgets}.get(effort)
    if budget is not None and req.thinking_budget is None:
        req.thinking_budget = budget
