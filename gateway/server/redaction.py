"""What a capture (``server/captures``) must not keep, taken out. Pure functions on bytes and
headers.

- Credentials: the headers that carry them are kept as ``[redacted]`` (``headers``), and the
  values the request presented (``presented``: its bearer token, ``x-api-key``, ...), with the
  keys the configuration gives as themselves, are cut out of every other byte a capture keeps
  wherever they appear, as they are and as a JSON string writes them (``Secrets``): the other
  headers' values, the query, the bodies, and a stream's writes as they are told, one secret
  across two writes included (``StreamCut``). A client that echoes its key into a prompt, or an
  answer that repeats the request (a Responses stream repeats ``instructions`` and
  ``metadata``), leaves no copy of it in a capture, nor in what is made of one (the kept file,
  a replay, ``curl``, the page).
- Content (``server.capture.redact_content``): every string in the JSON becomes its length,
  ``"[42 chars]"``, but for the words that give a message its shape (``SHAPE_KEYS``: roles,
  types, names of tools, finish reasons, ids), so a capture still shows how many messages,
  tools and calls went each way and how long each was, not what they said. A stream is redacted
  a line at a time (each ``data:`` line of server-sent events, each line of Ollama's NDJSON);
  what is not JSON is kept as its length alone."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

REDACTED = "[redacted]"
_REDACTED = REDACTED.encode()
# headers whose value is a credential, or may be; and any name with one of these words in it
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key"})
SECRET_WORDS = ("key", "token", "secret", "password", "auth", "cookie", "signature")
# headers that carry a key: its value is cut out of the bodies too
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key", "proxy-authorization")
MIN_SECRET = 4  # a shorter value is not looked for in the bodies (it would cut ordinary text)
# keys whose short string values give a message's shape and are kept by ``content``
SHAPE_KEYS = frozenset({"role", "type", "object", "model", "name", "id", "call_id", "tool_call_id", "tool_use_id",
                        "finish_reason", "stop_reason", "done_reason", "status", "event", "format", "media_type",
                        "detail", "tool_choice", "encoding_format", "created_at", "item_id"})
MAX_SHAPE_VALUE = 128  # a longer value under a shape key is text all the same


def is_secret(name: str) -> bool:
    lower = name.lower()
    return lower in SECRET_HEADERS or any(word in lower for word in SECRET_WORDS)


def headers(given: Mapping[str, str], max_count: int, max_length: int, *, max_total: int | None = None,
            secrets: Secrets | None = None) -> dict[str, str]:
    """The first ``max_count`` headers, each name and value at most ``max_length`` characters,
    with every credential's value ``[redacted]`` and ``secrets`` cut out of the others and out of
    every name; the names and values together at most ``max_total`` characters (the rest left
    out)."""
    out: dict[str, str] = {}
    total = 0
    for name, value in given.items():
        if len(out) >= max_count:
            break
        # a name is the caller's too: a key sent as a header's name is cut like one in a value
        name = secrets.cut_text(name[:max_length + secrets.longest])[:max_length] if secrets else name[:max_length]
        if is_secret(name):
            kept = REDACTED
        elif secrets:  # a secret across the cut is cut whole
            kept = secrets.cut_text(value[:max_length + secrets.longest])[:max_length]
        else:
            kept = value[:max_length]
        total += len(name) + len(kept)
        if max_total is not None and total > max_total:
            break
        out[name] = kept
    return out


def presented(given: Mapping[str, str]) -> tuple[bytes, ...]:
    """The credentials a request's headers carry (a bearer token without its scheme), as bytes."""
    found = []
    for name in CREDENTIAL_HEADERS:
        value = given.get(name, "").strip()
        if " " in value:  # "Bearer sk-...", "Basic ..."
            value = value.split(None, 1)[1].strip()
        if len(value) >= MIN_SECRET:
            found.append(value.encode("utf-8", errors="replace"))
    return tuple(found)


def cut_secrets(data: bytes | None, secrets: tuple[bytes, ...]) -> bytes | None:
    return None if data is None else Secrets.of(secrets).cut(data)


def variants(secret: bytes) -> set[bytes]:
    """A secret as itself and as ``json.dumps`` writes it inside a string: the forms a write of
    a stream may end in the middle of (``Secrets.held``)."""
    out = {secret}
    try:
        text = secret.decode("utf-8")
    except UnicodeDecodeError:
        return out
    for ascii_only in (True, False):
        out.add(json.dumps(text, ensure_ascii=ascii_only)[1:-1].encode("utf-8", errors="replace"))
    return out


class Secrets:
    """Secrets to cut out of bytes and text, found together in one pass: each of at least
    ``MIN_SECRET`` bytes, as itself and as any JSON string may spell it (each character as
    itself or escaped: ``\\u0073``, ``\\"``, ``\\/``..., so no escaping hides one:
    ``_spelled``), replaced by ``[redacted]``. Made by ``of`` (cached: a key's requests share
    one)."""

    def __init__(self, secrets: tuple[bytes, ...]):
        texts = sorted({_text(s) for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True)
        self.texts = tuple(texts)
        self.pattern = re.compile(b"|".join(_spelled(t, bytes_=True) for t in texts)) if texts else None
        self.text_pattern = re.compile("|".join(_spelled(t, bytes_=False) for t in texts)) if texts else None
        # the most bytes one can take, each character escaped: what a cut reads past a bound
        self.longest = max((sum(_escaped_length(c) for c in t) for t in texts), default=0)
        found = sorted({v for t in texts for v in variants(t.encode("utf-8", errors="surrogateescape"))},
                       key=len, reverse=True)
        self._start_longest = len(found[0]) if found else 0
        # every proper beginning of each: what a write may end with and the next one complete
        self._starts = frozenset(v[:k] for v in found for k in range(1, len(v)))
        self._ends = frozenset(b for v in found for b in v[:-1])  # the last byte such a beginning can have

    @staticmethod
    @lru_cache(maxsize=32)  # the keys asking now; each holds its keys' beginnings (a few KiB a key)
    def of(secrets: tuple[bytes, ...]) -> Secrets:
        return Secrets(secrets)

    def __bool__(self) -> bool:
        return self.pattern is not None

    def cut(self, data: bytes) -> bytes:
        return self.pattern.sub(_REDACTED, data) if self.pattern is not None else data

    def cut_text(self, text: str) -> str:
        return self.text_pattern.sub(REDACTED, text) if self.text_pattern is not None else text

    def found_in(self, text: str) -> bool:
        return self.text_pattern is not None and self.text_pattern.search(text) is not None

    def may_spell(self, data: bytes) -> bool:
        """Whether the strings of ``data`` (JSON, a stream's frames), read and joined, could
        spell a secret: False only where that cannot be (``data`` has no ``\\u`` escape, and
        every secret is plain ASCII that JSON writes as itself whose characters are not all in
        ``data``, in order).
        Linear, in C: a stream's check needs a read-back (``wire/readback``) only where True."""
        if self.pattern is None:
            return False
        if b"\\u" in data:
            return True
        for text in self.texts:
            if not all(c in _PLAIN for c in text):
                return True
            at = -1
            for c in text.encode("ascii"):
                at = data.find(c, at + 1)
                if at < 0:
                    break
            else:
                return True
        return False

    def held(self, data: bytes) -> int:
        """The length of the longest ending of ``data`` that begins a secret (0: none)."""
        if not data or data[-1] not in self._ends:  # a write that ends a line, as most do
            return 0
        for k in range(min(self._start_longest - 1, len(data)), 0, -1):
            if data[-k:] in self._starts:
                return k
        return 0

    def bounded(self, data: bytes, limit: int) -> bytes:
        """``data``'s first ``limit`` bytes, cut: a secret across the limit is cut whole, and one
        that ``data`` ends inside of (it was cut short before it came) goes too."""
        if self.pattern is None:
            return data[:limit]
        head = data[:limit + self.longest]
        out = self.cut(head)
        if len(head) == len(data):  # the whole of it: an ending that begins a secret is taken out
            n = self.held(out)
            if n >= MIN_SECRET:
                out = out[:len(out) - n] + _REDACTED
        return out[:limit]


# printable ASCII that a JSON string writes as itself (others may come escaped in a stream)
_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\", "/"}
_SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
          "\t": "\\t"}


def _text(secret: bytes) -> str:
    return secret.decode("utf-8", errors="surrogateescape")


def _escaped_length(char: str) -> int:
    return max(len(char.encode("utf-8", errors="surrogateescape")), 6 if ord(char) < 0x10000 else 12)


def _spelled(text: str, *, bytes_: bool) -> Any:
    """A pattern for ``text`` as a JSON string may spell it: each character as itself, as
    ``\\uXXXX`` (any case; a surrogate pair past the BMP) or as its short escape."""
    parts = []
    for char in text:
        code = ord(char)
        units = [code] if code < 0x10000 else \
            [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)]
        escaped = "".join("\\\\u" + "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{u:04x}")
                          for u in units)
        alternatives = [re.escape(char), escaped]
        if char in _SHORT:
            alternatives.append(re.escape(_SHORT[char]))
        parts.append("(?:" + "|".join(alternatives) + ")")
    pattern = "".join(parts)
    return pattern.encode("utf-8", errors="surrogateescape") if bytes_ else pattern


class StreamCut:
    """A stream's writes with ``secrets`` cut out, across writes too: a write's ending that
    begins a secret is held back until the next write says whether it is one (``flush``: what
    is held at the end, itself cut where it could be one)."""

    def __init__(self, secrets: Secrets):
        self.secrets = secrets
        self.held = b""

    def feed(self, data: bytes) -> bytes:
        buf = self.secrets.cut(self.held + data) if self.held else self.secrets.cut(data)
        n = self.secrets.held(buf)
        self.held = buf[len(buf) - n:] if n else b""
        return buf[:len(buf) - n] if n else buf

    def flush(self) -> bytes:
        rest, self.held = self.held, b""
        return _REDACTED if len(rest) >= MIN_SECRET else rest


def cut_strings(value: Any, secrets: Secrets) -> Any:
    """A JSON-like value (an answer read back) with ``secrets`` cut out of every string in it,
    keys too; and where its ``thinking`` and ``content`` spell one only joined, the two cut at
    it. Pure, recursive."""
    if isinstance(value, str):
        return secrets.cut_text(value)
    if isinstance(value, list):
        return [cut_strings(v, secrets) for v in value]
    if not isinstance(value, dict):
        return value
    out = {secrets.cut_text(k) if isinstance(k, str) else k: cut_strings(v, secrets) for k, v in value.items()}
    thinking, text = out.get("thinking"), out.get("content")
    if isinstance(thinking, str) and isinstance(text, str) and secrets.text_pattern is not None:
        # each is cut alone: what is left can only be one across the two
        found = secrets.text_pattern.search(thinking + text)
        if found is not None:
            out["thinking"] = thinking[:found.start()] + REDACTED
            out["content"] = text[max(0, found.end() - len(thinking)):]
    return out


def content(data: bytes | None, *, sse: bool) -> bytes | None:
    """``data`` (a JSON body, or a stream's write: server-sent events where ``sse``, else JSON
    lines) with its text redacted as the module says."""
    if data is None:
        return None
    if not sse:
        whole = _redacted_json(data)
        if whole is not None:
            return whole
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if sse:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload and payload != b"[DONE]":
                    lines[i] = b"data: " + (_redacted_json(payload) or _length(payload))
        elif line.strip():
            lines[i] = _redacted_json(line) or _length(line)
    return b"\n".join(lines)


def _length(text: bytes) -> bytes:
    return f"[{len(text)} bytes]".encode()


def _redacted_json(data: bytes) -> bytes | None:
    try:
        return json.dumps(redact_value(json.loads(data)), ensure_ascii=False, separators=(",", ":")).encode()
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python goes
        return None


def redact_value(value: Any, key: str | None = None) -> Any:
    """A parsed JSON value with its text redacted (``key``: the key it is under); recursive, as
    deep as ``json.loads`` went."""
    if isinstance(value, str):
        if key in SHAPE_KEYS and len(value) <= MAX_SHAPE_VALUE:
            return value
        return f"[{len(value)} chars]"
    if isinstance(value, dict):
        return {k: redact_value(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(v, key) for v in value]
    return value
