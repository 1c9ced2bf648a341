"""An upstream server's failures as this gateway's errors: an answer that is not what the OpenAI
wire says (``MalformedStream``), an error inside its stream (``in_band_error``), its refusal
(``error_from``: the same status, message, param and code, so the client reads it in its own
wire shape) and its ``Retry-After``. Also the two readers of its JSON that the rest of the
upstream wire shares: ``json_of`` (JSON, or ``MalformedStream``) and ``count_of`` (a count, or 0).

Text the upstream chose that goes into a message is shown escaped (``untrusted.shown``). Pure.
"""

from __future__ import annotations

import re
from typing import Any

from ...base import strictjson
from ...base.errors import ApiError
from ..untrusted import shown

MAX_ERROR_BYTES = 64 * 1024  # of an upstream's error body read for its message
MAX_RETRY_AFTER = 3600.0  # seconds: an upstream's Retry-After is passed on at most this
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")  # an upstream's error code passed on (it becomes a metric's label)


class MalformedStream(ApiError):
    """The upstream's answer is not what the OpenAI wire says it should be."""

    def __init__(self, why: str, what: str = "stream"):
        super().__init__(f"the upstream server sent a malformed {what}: {why}", status=502,
                         code="upstream_malformed")


def too_large(what: str, limit: int) -> MalformedStream:
    return MalformedStream(f"{what} of more than {limit} bytes", "answer")


def json_of(data: str | bytes, what: str, where: str = "stream") -> Any:
    """JSON, or ``MalformedStream``: bounded as a caller's JSON is (``base/strictjson``: depth,
    lone surrogates), NaN and Infinity let through (some servers write them in logprobs)."""
    try:
        return strictjson.loads(data, constants=True)
    except ValueError:
        raise MalformedStream(f"{what} that is not JSON: {shown(_text_of(data[:80]))!r}", where) from None


def _text_of(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def count_of(value: Any) -> int:
    """A count the upstream sent (tokens): a non-negative int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def in_band_error(error: Any) -> ApiError:
    """An error event inside an upstream's stream: the answer ends with it."""
    message = error.get("message") if isinstance(error, dict) else error
    return ApiError(f"the upstream server failed mid-answer: {shown(str(message), 500)}", status=502,
                    code="upstream_error")


def error_from(status: int, body: bytes) -> ApiError:
    """An upstream's refusal (a 4xx) as this gateway's error: the same status, message, param and
    code, so the client reads it in its own wire shape. OpenAI's and Anthropic's error bodies and
    plain text are all read; the message is shown escaped and cut, a param or code that is not a
    short identifier is dropped."""
    message, param, code = None, None, None
    try:
        data = strictjson.loads(body[:MAX_ERROR_BYTES], constants=True)
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message, param, code = error.get("message"), error.get("param"), error.get("code")
    elif isinstance(error, str):
        message = error
    if not isinstance(message, str) or not message.strip():
        message = body[:500].decode(errors="replace").strip() or f"HTTP {status}"
    return ApiError(shown(message, 500), status=status,
                    param=param if isinstance(param, str) and len(param) <= 64 and param.isprintable() else None,
                    code=code if isinstance(code, str) and _CODE.fullmatch(code) else None)


def retry_after(value: str | None) -> float | None:
    """An upstream's ``Retry-After`` in seconds, at most MAX_RETRY_AFTER; None for anything but
    a number of seconds (an HTTP date, garbage)."""
    value = (value or "").strip()
    if not (value.isascii() and value.isdigit()):
        return None
    return MAX_RETRY_AFTER if len(value) > 6 else min(float(value), MAX_RETRY_AFTER)


def check_chunk(chunk: Any) -> None:
    """A streamed event must be a JSON object, and one that carries ``error`` ends the stream
    with it (an in-band error)."""
    if not isinstance(chunk, dict):
        raise MalformedStream("an event that is not a JSON object")
    if "error" in chunk:
        raise in_band_error(chunk["error"])
