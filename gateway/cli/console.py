"""Operator commands that talk to a running gateway: ``status`` and ``chat``, through ``Gateway``
(``client``).

Every string a server sent (a model's name, an upstream's error, an answer) is written through
``untrusted.shown``: escape codes and bidi controls print as escapes, never act on the terminal.
An answer that is not JSON, or not in the gateway's shape (a server at the wrong address), is a
``BadAnswer``: one line, exit code 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..backends.untrusted import shown
from .client import BadAnswer, Gateway, Unreachable
from .configfile import config_arg, config_if_any

DIM, RESET = "\x1b[2m", "\x1b[0m"


def add_commands(sub: argparse._SubParsersAction) -> None:
    status = sub.add_parser("status", help="ask a running gateway what is loaded, in flight and failed")
    chat = sub.add_parser("chat", help="chat in the terminal with a model of a running gateway")
    chat.add_argument("model")
    chat.add_argument("--system", help="a system prompt")
    chat.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                      help="show thinking dimmed (auto: when the output is a terminal)")
    for p in (status, chat):
        config_arg(p)
        p.add_argument("--url", help="the gateway (default: $GGUF_GATEWAY_URL, else host and port from the config)")
        p.add_argument("--api-key", help="default: $GGUF_GATEWAY_API_KEY, else the config's first key "
                   "(sent to a named --url only with --config)")
        p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    gw = Gateway.from_args(args, config_if_any(args))
    try:
        if args.command == "status":
            return status(gw)
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
        return chat(gw, args.model, args.system, color)
    except Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


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
