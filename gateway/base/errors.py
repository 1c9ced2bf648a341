"""One exception hierarchy for everything a caller can be told, in either wire shape.

Handlers raise ``ApiError`` (or a subclass); the middleware in ``app.py`` renders it as
OpenAI's ``{"error": {...}}`` or Anthropic's ``{"type": "error", "error": {...}}``
depending on the route, so a handler never thinks about the shape.
"""

from __future__ import annotations

import math
from typing import Any

# The longest model name the gateway takes: more than any real one. A longer name is cut at the
# wire's edge (``wire.params.require_model``), as not found, before it reaches a lookup, a
# span or a log line.
MAX_MODEL_NAME = 256
# How much of a caller's value an error message quotes (``shown``): a message that quotes what
# a caller sent is bounded however much was sent.
QUOTED = 60


def shown(value: object, limit: int = QUOTED) -> str:
    """A caller's value for an error message: its ``repr``, cut to ``limit`` characters (a
    string is cut before its ``repr`` is made, so a long one costs nothing)."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        text = repr(value[:limit])
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."

# HTTP status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}

# HTTP status -> OpenAI's error type.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
}


class ApiError(Exception):
    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers or {}
        # the resolved model the error is about, where one was (``Registry.lease`` notes it):
        # the request's inference event names it even though no answer began
        self.model: str | None = None

    def openai_body(self) -> dict[str, Any]:
        etype = _OPENAI_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": etype, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        etype = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": etype, "message": self.message}}


def from_event(event: Any) -> ApiError:
    """A backend's error event (``protocol.Error``: status, message, param, code,
    retry_after) as what the caller is told."""
    retry = getattr(event, "retry_after", None)
    headers = {"Retry-After": str(max(1, math.ceil(retry)))} if retry is not None else None
    return ApiError(event.message, status=event.status, param=event.param, code=event.code, headers=headers)


class InvalidRequest(ApiError):
    """The caller's mistake: 400 naming ``param``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message, status=400, param=param, code=code)


class ModelNotFound(ApiError):
    """404 for a name no model has (or none the key may use); the name quoted as far as a real
    one can be long."""

    def __init__(self, name: str):
        super().__init__(
            f"The model {shown(name, MAX_MODEL_NAME + 2)} does not exist or is not available on this gateway.",
            status=404, param="model", code="model_not_found",
        )
