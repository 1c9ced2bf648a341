"""``Gateway``: the client of a running gateway that ``status``, ``chat``, ``pull``, ``rm``,
``usage`` and ``launch`` talk through.

Standard library only (urllib), so the commands work from the same install with nothing
running but the gateway. The address and key come from ``--url`` / ``--api-key``, else
``$GGUF_GATEWAY_URL`` / ``$GGUF_GATEWAY_API_KEY``, else the config file (host, port and its
first API key; that key goes to a named address only with ``--config``).

A server's JSON is read by ``base/strictjson`` (bounded: a text nested thousands deep is not a
``RecursionError``); an answer that is not JSON, or not in the gateway's shape (a server at the
wrong address), is a ``BadAnswer``. An error the server answered is a ``RuntimeError`` whose
message is written through ``untrusted.shown`` (a ``Refused``, with its status), with the key
it was sent, where the server echoes it, left out; no server at all is ``Unreachable``.

Every answer is bounded: its bytes (an error's too), each wait (``TIMEOUT``) and, for ``get``
and ``post``, the whole answer (``DEADLINE``: a server that drips a byte at a time ends the
command), and one cut off or late is a ``BadAnswer``. A redirect is not followed (it is a
``Refused``): the gateway's API never answers one, and following it would send the key to
whatever host it names.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from ..access.keys import KeyTable
from ..backends.untrusted import shown
from ..base import strictjson
from ..models.config import Config

TIMEOUT = 10.0  # seconds: the longest wait for a server (to connect, for each part of an answer)
DEADLINE = 30.0  # seconds: the longest a whole answer of get or post is read for
MAX_ERROR = 1 << 16  # bytes read of an error's answer


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises the 3xx as an HTTPError


_OPENER = urllib.request.build_opener(_NoRedirect)


class Unreachable(Exception):
    pass


class Refused(RuntimeError):
    """An error the gateway answered: its HTTP ``status`` (401: no key, or a key it does not know)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class BadAnswer(RuntimeError):
    """The server's answer is not JSON this client reads, or not in the gateway's shape: it ends
    the command (``chat`` too), where an error the gateway answered ends one turn."""


def _error_message(detail: Any) -> str | None:
    """The message of an error answer in OpenAI's shape (``{"error": {"message": ...}}``), else None."""
    error = detail.get("error") if isinstance(detail, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


class Gateway:
    def __init__(self, url: str, api_key: str | None):
        self.url = url.rstrip("/")
        self.api_key = api_key

    @classmethod
    def from_args(cls, args: argparse.Namespace, config: Config | None) -> Gateway:
        """The gateway the arguments name, and the key for it. The configuration's first key
        goes to the configured address, and to one named (``--url``, ``$GGUF_GATEWAY_URL``)
        only where the configuration is named too (``--config``): a configuration found by
        itself holds the keys of this machine's gateway, not of whatever host is named."""
        named = args.url or os.environ.get("GGUF_GATEWAY_URL")
        url = named
        if not url:
            host = config.server.host if config else "127.0.0.1"
            host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
            url = f"http://{'[' + host + ']' if ':' in host else host}:{config.server.port if config else 8080}"
        tied = not named or getattr(args, "config", None)
        key = args.api_key or os.environ.get("GGUF_GATEWAY_API_KEY") or (
            KeyTable(config.server.api_keys).first_secret() if config and tied else None)
        return cls(url, key)

    @classmethod
    def running(cls, args: argparse.Namespace, config: Config | None) -> Gateway | None:
        """The gateway to work through: named (``--url``, ``$GGUF_GATEWAY_URL``), or found
        answering ``/health`` at the configured address; None where none answers there."""
        gw = cls.from_args(args, config)
        if args.url or os.environ.get("GGUF_GATEWAY_URL"):
            return gw
        try:
            health = gw.get("/health")
        except (Unreachable, RuntimeError, OSError):
            return None
        return gw if isinstance(health, dict) and "version" in health else None

    def _request(self, path: str, body: dict[str, Any] | None = None, timeout: float | None = None):
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            return _OPENER.open(req, timeout=TIMEOUT if timeout is None else timeout)
        except urllib.error.HTTPError as e:
            if 300 <= e.code < 400:
                where = shown(e.headers.get("Location") or "nowhere", 200)
                raise Refused(e.code, f"a redirect to {where}, which is not followed (the gateway's API "
                              "answers where it is): name the gateway's own address with --url") from None
            try:
                detail = strictjson.loads(e.read(MAX_ERROR), "error")
                message = _error_message(detail) or str(detail)
            except (ValueError, OSError, http.client.HTTPException):  # not JSON, too long, cut off, ...
                message = str(e.reason)
            if self.api_key:
                message = message.replace(self.api_key, "<the key>")
            raise Refused(e.code, shown(message, 500)) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise Unreachable(f"cannot reach gguf-gateway at {self.url} ({reason}); is it running? "
                              "(gguf-gateway serve)") from None

    def _json(self, path: str, text: bytes | str) -> Any:
        """An answer's JSON, by the bounded parser; ``BadAnswer`` where it is none."""
        try:
            return strictjson.loads(text, path)
        except ValueError as e:  # strictjson.JSONRefused: its message quotes none of the answer
            raise BadAnswer(f"{self.url} did not answer with JSON this client reads: {e}; "
                            "is this a gguf-gateway?") from None

    def _read(self, path: str, r: http.client.HTTPResponse, limit: int) -> bytes:
        """The answer's body, at most ``limit`` bytes (-1: whole), read within ``DEADLINE``."""
        deadline = time.monotonic() + DEADLINE
        parts: list[bytes] = []
        left = limit if limit >= 0 else float("inf")
        try:
            while left > 0:
                if time.monotonic() > deadline:
                    raise BadAnswer(f"{self.url}{path} did not answer in {DEADLINE:g} s; is this a gguf-gateway?")
                part = r.read1(int(min(left, 1 << 16)))
                if not part:
                    break
                parts.append(part)
                left -= len(part)
        except (OSError, http.client.HTTPException) as e:  # cut off, a wait past TIMEOUT, a broken chunk
            raise BadAnswer(f"{self.url}{path} answered in part ({type(e).__name__}); "
                            "is this a gguf-gateway?") from None
        return b"".join(parts)

    def get(self, path: str, limit: int = -1) -> Any:
        """A GET's JSON answer, read within ``limit`` bytes (-1: whole)."""
        with self._request(path) as r:
            return self._json(path, self._read(path, r, limit))

    def post(self, path: str, body: dict[str, Any], limit: int = 1 << 20) -> Any:
        """A POST's JSON answer, read within ``limit`` bytes."""
        with self._request(path, body) as r:
            return self._json(path, self._read(path, r, limit))

    def stream_lines(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """A POST answered with newline-delimited JSON (a pull's progress): each line read
        within a bound and parsed by the bounded parser."""
        with self._request(path, body, timeout=3600) as r:
            while raw := r.readline(1 << 16):
                line = self._json(path, raw)
                if not isinstance(line, dict):
                    raise BadAnswer(f"{self.url}{path} streamed a line that is not a JSON object")
                yield line

    def stream_chat(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        path = "/v1/chat/completions"
        with self._request(path, {**body, "stream": True}, timeout=600) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = self._json(path, line[6:])
                if not isinstance(event, dict):
                    raise BadAnswer(f"{self.url}{path} streamed an event that is not a JSON object")
                if "error" in event:
                    raise RuntimeError(shown(_error_message(event) or "the stream ended with an error", 500))
                yield event
