"""One observation per request: the inference event it becomes, and the metrics it feeds.

The outermost middleware opens an ``Observation`` (request id, endpoint, clock), handlers
note the model and the answer pipeline notes token times and counts; when the request ends
the middleware turns it into metrics and one JSON line, written to the log (logger
``gateway.server.events``) and appended to ``server.events_path`` when that is set.

Token counts are put in as they arrive, each generation's through its ``Tally``: its prompt's
at its ``Start``, its text's with each text event, its ``Done``'s own counts in their place at
the end. So however a request ends (an answer, a client that left, a cancel, a worker that
died, an upstream that broke off), its observation holds what was generated, and that is what
the access middleware charges to its key (``api/access``).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from .sse import EventStream

log = logging.getLogger("gateway.server.events")

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def request_id(incoming: str | None) -> str:
    """The caller's X-Request-Id when it is a sane token, else a new one."""
    return incoming if incoming and _REQUEST_ID_RE.match(incoming) else uuid.uuid4().hex


@dataclass
class Observation:
    request_id: str
    endpoint: str
    started: float = field(default_factory=time.monotonic)
    model: str = "-"
    principal: str = "anonymous"
    # a digest of the API key that asked (``OWNER``), for the page's own-requests filter only:
    # two keys may share a name; never in the event, which is logged
    owner: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # where the cached tokens came from: slot (the slot's own cache), ram (the prompt cache in
    # memory), disk (saved at an unload); None: nothing reused (several prompts: the first that did)
    cache_source: str | None = None
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    drafted_tokens: int = 0  # speculative decoding's proposals, and those the model kept
    accepted_tokens: int = 0
    first_token: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between generated tokens
    finish_reason: str | None = None
    disconnected: bool = False
    tool_calls: int = 0  # calls the answer made that parsed
    tool_call_failures: list[str] = field(default_factory=list)  # why each call that did not parse failed
    dropped_tools: list[str] = field(default_factory=list)  # tools the request gave that the prompt left out, by type
    # the tools the gateway ran itself in the answer (``tools/toolbox.Ran.record``: name, server,
    # kind, seconds, bytes, error, outcome; ``started`` a monotonic mark, for the trace)
    hosted_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    media: dict[str, int] = field(default_factory=dict)  # the pictures and sounds its prompts held, by kind
    # What traces and captures read (``server/tracing``, ``server/captures``); the clocks are
    # ``time.monotonic()``, like ``started``, each None until the request got that far.
    trace_id: str | None = None  # the request's trace, where tracing is on
    asked_model: str | None = None  # the model as the request named it (``model`` is what served it)
    request: Any = None  # the ``GenerationRequest`` of its first prompt: its sampling fields
    queued: float | None = None  # the model's lease asked for
    leased: float | None = None  # the lease held: the model loaded, a place in its queue given
    load: Any = None  # the load it waited for (``serving.supervisor.Loaded``), if it waited for one
    admitted: float | None = None  # its ``Start`` came: a sequence took it, its prompt's read begins

    def tokens(self, n: int) -> None:
        """``n`` more tokens arrived now (n > 1: several tokens in one piece of text)."""
        now = time.monotonic()
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None and n > 0:
            gap = (now - self.last_token) / n
            self.gaps.extend([gap] * n)
        self.last_token = now

    def began(self, start: Any) -> Tally:
        """A generation began (a backend's ``Start`` event): its prompt's tokens are counted now
        (its worker has taken the prompt to read, and a ``Done`` after a cancel counts it whole
        too). Returns the ``Tally`` that counts the rest of it."""
        self.cache_source = self.cache_source or start.cache_source
        if self.admitted is None:
            self.admitted = time.monotonic()
        tally = Tally(self)
        tally.counts(start.prompt_tokens, start.cached_tokens, 0)
        return tally

    def finished(self, finish: Any) -> None:
        """A generation's answer ended (its ``Finish``; its token counts are its ``Tally``'s)."""
        self.reasoning_tokens += finish.reasoning_tokens
        self.drafted_tokens += finish.drafted
        self.accepted_tokens += finish.accepted
        self.finish_reason = finish.reason

    def event(self, status: int, duration: float) -> dict[str, Any]:
        return {
            "event": "inference", "request_id": self.request_id, "model": self.model, "endpoint": self.endpoint,
            "principal": self.principal, "status": status, "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens, "cache_source": self.cache_source,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "drafted_tokens": self.drafted_tokens, "accepted_tokens": self.accepted_tokens,
            "time_to_first_token_s": round(self.first_token - self.started, 6) if self.first_token else None,
            "duration_s": round(duration, 6), "finish_reason": self.finish_reason,
            "client_disconnected": self.disconnected, "tool_calls": self.tool_calls,
            "tool_call_failures": self.tool_call_failures, "dropped_tools": self.dropped_tools,
            "hosted_tool_calls": [{k: v for k, v in c.items() if k != "started"} for c in self.hosted_tool_calls],
            "media": self.media, "trace_id": self.trace_id, "time": time.time(),
        }


class Tally:
    """One generation's tokens as its request's observation holds them. Each count moves the
    observation's totals by the difference, so a generation's ``Done`` (or the events it left
    unread, which ``api.pipeline`` reads at its end) replaces what its ``Start`` and text events
    put in, and never counts anything twice. Per text event: an int add, nothing made."""

    __slots__ = ("obs", "prompt", "cached", "completion")

    def __init__(self, obs: Observation):
        self.obs = obs
        self.prompt = self.cached = self.completion = 0

    def generated(self, tokens: int) -> None:
        """Its text events say ``tokens`` generated so far."""
        self.obs.completion_tokens += tokens - self.completion
        self.completion = tokens

    def counts(self, prompt: int, cached: int, completion: int) -> None:
        """Its counts are now these (its ``Start``'s, or its ``Done``'s)."""
        obs = self.obs
        obs.prompt_tokens += prompt - self.prompt
        obs.cached_tokens += cached - self.cached
        obs.completion_tokens += completion - self.completion
        self.prompt, self.cached, self.completion = prompt, cached, completion


def request_key(name: str, kind: type):
    """A typed request key (aiohttp >= 3.13 warns on string keys); a plain string on older aiohttp."""
    factory = getattr(web, "RequestKey", None)
    return factory(name, kind) if factory is not None else name


OBSERVATION = request_key("observation", Observation)
PRINCIPAL = request_key("principal", str)  # the API key's name, set by the access middleware
# whose stored responses and cached prompts a request's are: a digest of its API key itself
# (``access.keys.owner_of``), so a key's name or place in the list hands nothing to another key
OWNER = request_key("owner", str)
ERROR_CODE = request_key("error_code", str)  # the code of the error answered, for rejected_requests
STREAM = request_key("stream", EventStream)  # the request's sse.EventStream, once a handler asked for one


def observation(request: web.Request) -> Observation:
    """The request's observation, made by ``app.observe_middleware`` for every observed route."""
    return request[OBSERVATION]


class EventSink:
    """Appends JSON lines to a file; safe to call from the event loop (one small write, flushed)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._lock = threading.Lock()
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8", buffering=1)

    def write(self, event: dict[str, Any]) -> None:
        if self._file is None and not log.isEnabledFor(logging.INFO):
            return  # neither a file nor the log takes it: no JSON is made
        line = json.dumps(event, separators=(",", ":"))
        log.info("%s", line)
        if self._file is not None:
            with self._lock:
                self._file.write(line + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class JsonLogFormatter(logging.Formatter):
    """``--log-format json``: one JSON object per log line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)
