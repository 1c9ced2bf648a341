"""What the capture store (``server/captures``) keeps: a finished capture (``Record``: its
JSON for ``/captures`` and its kept file's form), the line kept of a request refused at the
door (``Refusal``), and the bytes each is counted for (``weight``: every byte it holds, each
header and stream write with ``ENTRY`` for its place, each entry with ``OVERHEAD`` for its
fields). A stream whose text spelled a secret in pieces keeps, in place of its writes, its
answer read back with the secret cut (``withheld``), in memory and in its kept file alike."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

OVERHEAD = 512  # bytes an entry counts for beyond what ``weight`` finds in it: its fields and their places
ENTRY = 64  # bytes a header, a stream's write or a list's item counts for beyond its own bytes


def weight(value: Any) -> int:
    """The bytes ``value`` holds, as the store counts them: a string's UTF-8, a byte string's
    length, a mapping's and a list's items each with ``ENTRY``; anything else 8. Pure."""
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8", errors="surrogatepass"))
    if isinstance(value, dict):
        return sum(ENTRY + weight(k) + weight(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(ENTRY + weight(v) for v in value)
    return 8


@dataclass(slots=True)
class Refusal:
    """What is kept of a request refused at the door (``REFUSED``): one line, kept apart from the
    captures (a fixed count of the newest), so it never takes their room."""

    id: str
    time: float
    status: int
    route: str
    key: str
    code: str | None
    request_id: str

    def line(self) -> dict[str, Any]:
        return {"time": self.time, "status": self.status, "route": self.route, "key": self.key, "code": self.code,
                "request_id": self.request_id}


@dataclass(slots=True)
class Record:
    """A finished capture, as the store keeps it (``summary`` and ``detail`` are its JSON)."""

    id: str
    time: float
    method: str
    path: str
    route: str
    query: str
    request_id: str
    model: str
    key: str
    status: int
    request_headers: dict[str, str]
    request_body: bytes | None
    request_bytes: int
    response_headers: dict[str, str]
    stream: bool
    response_body: bytes | None  # a whole answer
    frames: list[tuple[float, bytes]]  # a streamed one
    response_bytes: int
    timings: dict[str, float | None]
    usage: dict[str, int]
    finish_reason: str | None
    trace_id: str | None
    redacted: bool
    request_cut: bool  # the request's body, or the answer, kept only in part (``max_body_bytes``)
    response_cut: bool
    replay_of: str | None = None
    owner: str | None = None  # the key that asked (``events.OWNER``: a digest), None: nobody
    # a stream whose text, read back and joined, spelled a secret: its writes are not kept
    # (``frames`` is empty) and this is kept instead, the answer read back with the secret cut
    withheld: dict[str, Any] | None = None
    # the tools the gateway ran itself in the answer, a row each (``Observation.hosted_tool_calls``)
    tools: list[dict[str, Any]] = field(default_factory=list)

    @property
    def size(self) -> int:
        """The bytes the store counts it for: everything it holds (``weight``)."""
        return OVERHEAD + sum(weight(getattr(self, name)) for name in self.__slots__)

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "time": self.time, "method": self.method, "path": self.path, "route": self.route,
                "request_id": self.request_id, "model": self.model, "key": self.key, "status": self.status,
                "stream": self.stream, **self.timings, **self.usage, "finish_reason": self.finish_reason,
                "request_bytes": self.request_bytes, "response_bytes": self.response_bytes,
                "truncated": self.request_cut or self.response_cut, "redacted": self.redacted,
                "trace_id": self.trace_id, "replay_of": self.replay_of, "withheld": self.withheld is not None}

    def request_json(self) -> Any:
        """The request's body as JSON, or None where it is cut, missing or not JSON."""
        if self.request_body is None or self.request_cut:
            return None
        try:
            return json.loads(self.request_body)
        except (ValueError, RecursionError):
            return None

    def detail(self) -> dict[str, Any]:
        """Everything kept: the bodies as text (and the request's as JSON where it parses), a
        stream as its writes with their times."""
        request_json = self.request_json()
        response: dict[str, Any] = {"status": self.status, "headers": self.response_headers, "stream": self.stream,
                                    "bytes": self.response_bytes, "truncated": self.response_cut}
        if self.stream:
            response["events"] = [{"t": round(t, 6), "data": _text(b)} for t, b in self.frames]
            response["withheld"] = self.withheld is not None
        else:
            response["body"] = _json_or_none(self.response_body)
            response["body_text"] = _text(self.response_body) if self.response_body is not None else None
        return {**self.summary(), "query": self.query,
                "request": {"headers": self.request_headers, "body": request_json,
                            "body_text": None if request_json is not None or self.request_body is None
                            else _text(self.request_body),
                            "bytes": self.request_bytes, "truncated": self.request_cut},
                "response": response, "tools": self.tools}

    def answer_bytes(self) -> bytes:
        """The answer as the client read it (a stream's writes joined), as far as it was kept."""
        return b"".join(b for _, b in self.frames) if self.stream else (self.response_body or b"")

    # --- kept on disk (``keep``): the record itself, its bytes in base64 ------------------------
    def to_json(self) -> str:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["request_body"] = _b64(self.request_body)
        out["response_body"] = _b64(self.response_body)
        out["frames"] = [[t, _b64(b)] for t, b in self.frames]
        return json.dumps(out, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Record:
        data = json.loads(text)
        data["request_body"] = _unb64(data["request_body"])
        data["response_body"] = _unb64(data["response_body"])
        data["frames"] = [(float(t), _unb64(b) or b"") for t, b in data["frames"]]
        return cls(**data)


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def _json_or_none(data: bytes | None) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)
