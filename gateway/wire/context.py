"""What the wire layer may know of the request it answers, beside its parsed body: a small
record the pipeline makes once, so that no wire module holds the HTTP request (a service
locator that would let it reach anything).

``observation`` is the request's, read for the timings an answer reports (llama-server's and
Ollama's); the wire never counts into it (the pipeline does)."""

from __future__ import annotations

from dataclasses import dataclass

from ..models.config import ServerConfig
from ..server.events import Observation


@dataclass(frozen=True)
class Context:
    request_id: str
    owner: str | None  # a digest of the request's API key (``events.OWNER``): None without keys
    admin: bool  # whether its key may do what is the operator's (unload a model, shorten a stay)
    server: ServerConfig
    observation: Observation
