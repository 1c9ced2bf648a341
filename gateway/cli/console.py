"""Operator commands that talk to a running gateway: ``status`` and ``chat``, and ``Gateway``,
the client ``pull`` and ``rm`` use through one.

Standard library only (urllib), so they work from the same install with nothing running but
the gateway. The address and key come from ``--url`` / ``--api-key``, else
``$GGUF_GATEWAY_URL`` / ``$GGUF_GATEWAY_API_KEY``, else the config file (host, port and its
first API key).

Every string a server sent (a model's name, an upstream's error, an answer) is written through
``untrusted.shown``: escape codes and bidi controls print as escapes, never act on the terminal.
A server's JSON is read by ``base/strictjson`` (bounded: a text nested thousands deep is not a
``RecursionError``); an answer that is not JSON, or not in the gateway's shape (a server at the
wrong address), is a ``BadAnswer``: one line, exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from .access.keys import KeyTable
from .backends.untrusted import shown
from .base import strictjson
from .models.config import Config

DIM, RESET = "\x1b[2m", "\x1b[0m"


class Unreachable(Exception):
    pass


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
        url = args.url or os.environ.get("GGUF_GATEWAY_URL")
        if not url:
            host = config.server.host if config else "127.0.0.1"
            host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
            url = f"http://{'[' + host + ']' if ':' in host else host}:{config.server.port if config else 8080}"
        key = args.api_key or os.environ.get("GGUF_GATEWAY_API_KEY") or (
            KeyTable(config.server.api_keys).first_secret() if config else None)
        return cls(url, key)

    def _request(self, path: str, body: dict[str, Any] | None = None, timeout: float = 10):
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            try:
                detail = strictjson.loads(e.read(), "error")
                message = _error_message(detail) or str(detail)
            except (ValueError, OSError):  # not JSON, nested too deep, cut off, ...
                message = str(e.reason)
            raise RuntimeError(f"{e.code}: {shown(message, 500)}") from None
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

    def get(self, path: str) -> Any:
        with self._request(path) as r:
            return self._json(path, r.read())

    def post(self, path: str, body: dict[str, Any], limit: int = 1 << 20) -> Any:
        """A POST's JSON answer, read within ``limit`` bytes."""
        with self._request(path, body) as r:
            return self._json(path, r.read(limit))

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


def _mib(n: int | None) -> str:
    return f"{n / 2**20:.0f} MiB" if n else "-"


def status(gw: Gateway, out=sys.stdout) -> int:
    try:
        return _status(gw, out)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:  # not the gateway's shape
        raise BadAnswer(f"{gw.url} answered /health or /models in a shape this client does not read "
                        f"({type(e).__name__}); is this a gguf-gateway?") from None


def _status(gw: Gateway, out) -> int:
    health = gw.get("/health")
    models = gw.get("/models")["data"]
    out.write(shown(f"gguf-gateway {health['version']} at {gw.url}: {health['status']}, "
                    f"{health.get('in_flight', 0)} request(s) in flight, "
                    f"{health.get('worker_failures', 0)} worker failure(s)") + "\n")
    rows: list[tuple[str, ...]] = [("MODEL", "STATE", "IN FLIGHT", "PID", "MEMORY", "SOURCE", "NOTE")]
    for m in models:
        note = m["error"] or ""
        if m["state"] == "failed" and m.get("retry_after"):
            note += f" (retry in {m['retry_after']} s)"
        if m.get("upstream"):  # another machine's server: where, and how it is doing
            up = m["upstream"]
            note += f"{up['url']}: {up['state']}" + (f" ({up['error']})" if up.get("error") else "")
        for r in m.get("replicas") or ():
            note += f"{' ' if note else ''}[{r['id']}: {'up' if r['up'] else 'down' if r['up'] is False else '-'}]"
        state = m["state"] + (f" {m['progress']:.0%}" if m.get("progress") is not None else "")
        rows.append(tuple(shown(str(cell)) for cell in (
            m["id"], state, m["in_flight"], m["pid"] or "-", _mib(m["memory_bytes"]), m["source"], note)))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[6] + "\n")
    return 0


def chat(gw: Gateway, model: str, system: str | None, color: bool, inp=sys.stdin, out=sys.stdout) -> int:
    history: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    interactive = inp.isatty()
    if interactive:
        out.write(f"chatting with {model} at {gw.url}; /reset forgets, /exit (or Ctrl-D) leaves\n")
    while True:
        if interactive:
            out.write("> ")
            out.flush()
        line = inp.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if text.strip() in ("/exit", "/quit"):
            break
        if text.strip() == "/reset":
            history = history[:1] if system else []
            continue
        if not text.strip():
            continue
        history.append({"role": "user", "content": text})
        thinking, answer, in_thinking = [], [], False
        try:
            for event in gw.stream_chat({"model": model, "messages": history}):
                choices = event.get("choices")
                if not choices:
                    continue
                first = choices[0] if isinstance(choices, list) else None
                delta = first.get("delta", {}) if isinstance(first, dict) else None
                if not isinstance(delta, dict):
                    raise BadAnswer(f"{gw.url}/v1/chat/completions streamed a chunk that is not a chat completion's")
                t = delta.get("reasoning_content") or delta.get("reasoning")
                if t and isinstance(t, str):  # text only: another server's reasoning objects are not shown
                    if not in_thinking:
                        out.write(DIM if color else "[thinking] ")
                        in_thinking = True
                    thinking.append(t)
                    out.write(shown(t, prose=True))
                c = delta.get("content")
                if c and isinstance(c, str):
                    if in_thinking:
                        out.write((RESET if color else "") + "\n\n")
                        in_thinking = False
                    answer.append(c)
                    out.write(shown(c, prose=True))
                out.flush()
        except BadAnswer:
            if color and in_thinking:
                out.write(RESET)
            out.write("\n")
            raise
        except RuntimeError as e:  # the gateway's own error: this turn failed, the chat goes on
            out.write((RESET if color and in_thinking else "") + f"\nerror: {shown(str(e), prose=True)}\n")
            history.pop()
            continue
        if in_thinking and color:
            out.write(RESET)
        out.write("\n")
        reply: dict[str, Any] = {"role": "assistant", "content": "".join(answer)}
        if thinking:
            reply["reasoning_content"] = "".join(thinking)
        history.append(reply)
    return 0
