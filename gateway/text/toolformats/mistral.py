"""mistral: ``[TOOL_CALLS]`` followed by a JSON array of calls (Mistral Nemo) or by
``N[ARGS]{...}`` (Small 3.2 with ``N[CALL_ID]id[ARGS]{...}``, Devstral, Ministral), each call
with its own ``[TOOL_CALLS]`` or chained right after the previous one. A model's call id is
dropped: every call gets the gateway's own. Its templates refuse call ids that are not 9
letters and digits, so each id in the history is mapped to one that is, the same way every
time."""

from __future__ import annotations

import hashlib
import re
import string
from enum import Enum
from typing import Any

from .gbnf import COMMA, WS, Grammar, Rules, json_call, lit, repeat
from .interface import Messages, Tools
from .jsoncall import JsonCalls
from .machine import Text
from .scan import BAD, MORE, NAME_LIMIT, lead, read_name

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
MARKERS = (TOOL_CALLS, ARGS, CALL_ID)
TOKEN = TOOL_CALLS
EXAMPLE = '[TOOL_CALLS][{"name": <function-name>, "arguments": <args-json-object>}]'
AGAIN = f'{WS} "[TOOL_CALLS]"'  # the name[ARGS] form repeats the marker before each call


def shown_by(template: str) -> bool:
    return TOOL_CALLS in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """Either form: the model takes the one it was trained on."""
    calls = repeat(json_call(rules, tools, "arguments"), parallel, sep=COMMA)
    array = rules.rule("call-array", f'"[" {WS} {calls} {WS} "]"')
    named = rules.rule("call-named", " | ".join(
        f'{lit(t["function"]["name"])} ("[CALL_ID]" [a-zA-Z0-9]+)? "[ARGS]" {rules.args(t, i)}'
        for i, t in enumerate(tools)))
    return f'"[TOOL_CALLS]" ({array} | {repeat(named, parallel, sep=AGAIN)})', (r"\[TOOL_CALLS\]",)


_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_ALNUM = string.ascii_letters + string.digits


def history(messages: Messages, tools: Tools) -> tuple[Messages, Tools]:
    return [_with_ids(m) for m in messages], tools


def mistral_id(call_id: str) -> str:
    """A 9-character id for ``call_id``: itself when it is one, else one derived from it."""
    if _MISTRAL_ID.fullmatch(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, r = divmod(n, len(_ALNUM))
        out.append(_ALNUM[r])
    return "".join(out)


def _with_ids(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("tool_calls"):
        calls = [dict(c, id=mistral_id(c["id"])) if isinstance(c.get("id"), str) else c for c in message["tool_calls"]]
        message = dict(message, tool_calls=calls)
    if isinstance(message.get("tool_call_id"), str):
        message = dict(message, tool_call_id=mistral_id(message["tool_call_id"]))
    return message


class Mistral(Enum):
    START = "_s_start"  # after [TOOL_CALLS]: an array or a name
    NAME = "_s_name"  # a call's name, up to [ARGS] or [CALL_ID]
    ID = "_s_id"  # a call's id, up to [ARGS]
    AFTER = "_s_after"  # after a call: another one chained, or text
    ARRAY = "_s_array"  # inside the array of call objects


_NAME_BAD = "\n{}[]\"<>"


class Parser(JsonCalls):
    OPENERS = (TOOL_CALLS,)
    STRAYS = (ARGS, CALL_ID)
    BLOCKS = frozenset({Mistral.START, Mistral.ARRAY})
    LEADS = frozenset({Mistral.AFTER})

    def _opened(self, marker: str) -> None:
        self._open(Mistral.START)

    def _s_start(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, (TOOL_CALLS, ARGS, CALL_ID), final)
        if m == "":
            return False
        if m == TOOL_CALLS:
            self._take(len(m))
            return True
        if self._buf[0] == "[" and not m:
            self._take(1)
            self._go(Mistral.ARRAY)
            return True
        self._new_call()
        self._go(Mistral.NAME)
        return True

    def _s_name(self, final: bool) -> bool:
        call = self._current
        r = read_name(self._buf, (ARGS, CALL_ID), final, bad=_NAME_BAD)
        if r == MORE:
            return False
        if r == BAD:
            self._junk(((TOOL_CALLS, False),), "a malformed call")
            self._after = Text.TEXT
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + len(r[1]))
        self._name(call, r[0].strip())
        if r[1] == CALL_ID:
            self._go(Mistral.ID)
        else:
            self._args_only((TOOL_CALLS,), after=Mistral.AFTER)
        return True

    def _s_id(self, final: bool) -> bool:
        r = read_name(self._buf, (ARGS,), final, bad=_NAME_BAD)
        if r == MORE:
            return False
        if r == BAD:
            self._junk(((TOOL_CALLS, False),), "a malformed call id")
            self._after = Text.TEXT
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + len(r[1]))
        self._args_only((TOOL_CALLS,), after=Mistral.AFTER)
        return True

    def _s_after(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        name = re.match(r"[^\s\[\]{}\"<>]*", self._buf)
        assert name is not None
        n = name.end()
        if n > NAME_LIMIT:
            m = None
        else:
            rest = self._buf[n:]
            m = next((k for k in (ARGS, CALL_ID, TOOL_CALLS) if rest.startswith(k)), None)
            if m is None and not final and any(k.startswith(rest) for k in (ARGS, CALL_ID, TOOL_CALLS)):
                return False
        self._group = ""
        if m in (ARGS, CALL_ID) and n:
            self._new_call()
            self._go(Mistral.NAME)
        else:
            self._go(Text.TEXT)
        return True

    def _s_array(self, final: bool) -> bool:
        if self._skip_ws(","):
            return True
        if self._buf[0] == "{":
            self._new_call()
            self._json_call((TOOL_CALLS,), after=Mistral.ARRAY)
            return True
        if self._buf[0] == "]":
            self._take(1)
        self._close_block()
        return True
