"""The W3C trace context a request passes on to the servers it calls (an upstream hop), so that
a gateway behind a gateway shows one trace.

The observe middleware sets ``FORWARD`` for the request's task: with tracing on, the request's
own span (``server/tracing``); with it off, the ``traceparent`` and ``tracestate`` the request
came with, as they came (when well-formed). ``backends/upstream`` adds ``forward_headers()`` to
each request it sends. A context variable, so tasks a request starts carry it too."""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextvars import ContextVar

FORWARD: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("trace_forward", default=())

# version 00's form (W3C Trace Context, section 3.2): all-zero ids are invalid
_TRACEPARENT = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
MAX_TRACESTATE = 512  # the specification's own bound on what a vendor must pass on


def incoming(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A request's ``traceparent`` (and its ``tracestate``), where the former is well-formed."""
    parent = headers.get("traceparent", "").strip().lower()
    if not _TRACEPARENT.match(parent):
        return ()
    state = headers.get("tracestate", "").strip()
    return (("traceparent", parent),) + ((("tracestate", state),) if state and len(state) <= MAX_TRACESTATE
                                         and state.isprintable() else ())


def forward_headers() -> dict[str, str]:
    return dict(FORWARD.get())
