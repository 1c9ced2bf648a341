"""A parsed request made ready, whatever its wire: ``admit`` holds it to the server's limits
before anything waits; ``prepare`` is the one step that readies it for the model its lease
got. Everything that depends on the model happens there, in this order: a suffix (fill in
the middle) refused on a model that cannot fill; media of a kind the model does not take
refused, or a tool's picture told as its note (``media.require``); the model's sampling
defaults under the caller's own fields; each request's answer formats, settled by the model's
load (``answer.prepare``: thinking split out where ``thinking``); its reasoning budget
(``params.apply_effort``); and llama-server's infill context cut to what the model can keep of
it before its worker tokenizes it."""

from __future__ import annotations

import time
from typing import Any

from ..base.errors import InvalidRequest
from ..models.config import ModelSpec
from . import answer, fim
from . import media as wire_media
from .context import Context
from .params import Parsed, apply_defaults, apply_effort


def admit(parsed: Parsed, ctx: Context) -> None:
    """Before any wait: ``server.max_messages``, ``server.request_timeout`` as each request's
    deadline, and the cache scope of ``server.isolate_cache_by_key``: the API key's own
    (``Context.owner``, a digest of the key, never its name: a key renamed, or another key given
    its old name or place in the list, does not reuse or learn from its saved caches)."""
    server = ctx.server
    messages = parsed.request.messages
    if messages is not None and len(messages) > server.max_messages:
        raise InvalidRequest(f"`messages` holds {len(messages)} messages; this server takes at most "
                             f"{server.max_messages} (server.max_messages)", "messages")
    if server.request_timeout:
        deadline = time.time() + server.request_timeout
        for req in parsed.requests:
            req.deadline = deadline
    if server.isolate_cache_by_key:
        for req in parsed.requests:
            req.cache_scope = ctx.owner or ""


def prepare(parsed: Parsed, spec: ModelSpec, info: dict[str, Any], *, thinking: bool = True) -> None:
    """``parsed``'s requests made ready for ``spec``, whose backend reported ``info`` at its load.
    A request the model cannot serve raises its 400 here."""
    if parsed.request.suffix is not None:
        fim.require_fim(info, spec.name, parsed.request.suffix_param)
    for req in parsed.requests:
        wire_media.require(req, info, spec.name)
    apply_defaults(parsed, spec.defaults)
    for req in parsed.requests:
        answer.prepare(req, spec.name, info, thinking=thinking)
        apply_effort(req, parsed.reasoning_effort, spec.reasoning_budgets, req.reasoning)
        if req.infill_extra and (budget := fim.extra_budget(info, req.max_tokens)) is not None:
            req.infill_extra = fim.trim_extra(req.infill_extra, budget)
