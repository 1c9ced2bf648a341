"""command_r: Command R7B and Cohere2 MoE write their calls as one JSON list between markers::

    <|START_ACTION|>[
        {"tool_call_id": "0", "tool_name": "N", "parameters": {...}}, ...
    ]<|END_ACTION|>

and wrap their text in ``<|START_RESPONSE|>...<|END_RESPONSE|>`` (R7B) or
``<|START_TEXT|>...<|END_TEXT|>`` (Cohere2 MoE): the wrappers are dropped here (and by the
``cohere`` thinking format, which splits ``<|START_THINKING|>...<|END_THINKING|>``). As llama.cpp
does, a call starts once its ``tool_name`` is read (its id is the model's count, not kept); its
arguments stream as they come when they follow the name (else once its object is whole).
Their templates list the tools and render calls."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any, ClassVar

from .gbnf import WS, Grammar, Rules, lit, repeat
from .interface import history_as_is
from .jsoncall import JsonCalls
from .machine import Call
from .scan import CUT, DONE, JsonScan, escape, lead, loads

ACTION, ACTION_END = "<|START_ACTION|>", "<|END_ACTION|>"
WRAPS = ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")
MARKERS = (ACTION, ACTION_END, *WRAPS)
TOKEN = None  # the template decides: Command R+'s templates write calls in another syntax (command_r_plus)
EXAMPLE = ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": <function-name>, "parameters": '
           '<args-json-object>}\n]<|END_ACTION|>')


def shown_by(template: str) -> bool:
    return ACTION in template and "tool_name" in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


LIST_WS = '[ \\t\\n]{0,8}'  # the templates indent each call of the list by four spaces


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    alts = []
    for i, tool in enumerate(tools):
        name = json.dumps(tool["function"]["name"])
        alts.append(f'{lit(name)} {WS} "," {WS} "\\"parameters\\"" {WS} ":" {WS} {rules.args(tool, i)}')
    call = rules.rule("tool-call", f'"{{" {WS} "\\"tool_call_id\\"" {WS} ":" {WS} "\\"" [0-9]{{1,4}} "\\"" {WS} "," '
                                   f'{WS} "\\"tool_name\\"" {WS} ":" {WS} ({" | ".join(alts)}) {WS} "}}"')
    calls = repeat(call, parallel, f'{WS} "," {LIST_WS}')
    return f'{lit(ACTION)} {WS} "[" {LIST_WS} {calls} {LIST_WS} "]" {WS} {lit(ACTION_END)}', (re.escape(ACTION),)


history = history_as_is


class CommandR(Enum):
    LIST = "_s_list"  # after <|START_ACTION|>: the list's [
    ITEMS = "_s_items"  # inside the list, between calls
    CALL = "_s_call"  # one call's object, up to its closing }
    TAIL = "_s_tail"  # after the list's ]: <|END_ACTION|>


_STR = r'"(?:[^"\\]|\\.)*"'
_HEAD = re.compile(rf'\{{\s*(?:"tool_call_id"\s*:\s*(?:{_STR}|-?\d+)\s*,\s*)?"tool_name"\s*:\s*({_STR})')


_ARGS = re.compile(_HEAD.pattern + r'\s*,\s*"parameters"\s*:\s*\{')  # ... and the arguments object begun


class CallObjects(JsonCalls):
    """Reads one of the family's call objects (``{"tool_call_id": ..., "tool_name": N,
    "parameters": {...}}``, the id optional) from its ``{``, then goes to ``ITEMS``: the call
    starts once its ``tool_name`` is read; written in that order, its arguments stream as they
    come, else they follow once the object is whole. Command R+ (``command_r_plus``) writes the
    same objects in another frame."""

    ITEMS: ClassVar[Enum]  # the state between a list's calls
    CLOSERS: ClassVar[tuple[str, ...]]  # markers that cut a call's object (its frame's end)

    def __init__(self, tools: Any = None, *, stream: bool = True, prompt_tail: str = ""):
        super().__init__(tools, stream=stream, prompt_tail=prompt_tail)
        # the open call's arguments, streamed: where they begin in its text (None: not seen yet),
        # how far its text was read for them, and their own scan (None once they are whole)
        self._args_at: int | None = None
        self._args_seen = 0
        self._args_scan: JsonScan | None = None

    def _call_object(self, state: Enum) -> None:
        """A call object begins at ``_buf``'s start: read it in ``state`` (whose method is ``_s_call``)."""
        self._new_call()
        self._closers = self.CLOSERS
        self._args_at, self._args_seen, self._args_scan = None, 0, JsonScan()
        self._go(state)

    def _stream_args(self, call: Call) -> None:
        """The arguments' text read so far, out as it comes (once the call has begun)."""
        text = call.json.text
        if self._args_at is None:
            m = _ARGS.match(text)
            if m is None:
                return
            self._args_at = self._args_seen = m.end() - 1
        scan = self._args_scan
        if scan is None or not call.started:
            return
        out: list[str] = []
        for c in text[self._args_seen:]:
            was_in_str = scan.in_str
            scan.step(c)
            out.append(escape(c) if was_in_str and c < " " else c)
            if c in "}]" and not scan.in_str and scan.depth == 0:
                self._args_scan = None
                break
        self._args_seen += len(out)
        self._args(call, "".join(out))

    def _s_call(self, final: bool) -> bool:
        call = self._current
        status, n = self._scan(0, emit=False, final=final)
        if not call.started and not call.error:
            head = _HEAD.match(call.json.text)
            if head:
                self._name(call, loads(head.group(1)))
                if not call.error:
                    self._begin(call)
        self._stream_args(call)
        if status == CUT:
            self._end_call("the call was cut off")
            self._go(self.ITEMS)
            return True
        if status != DONE:
            return n > 0
        try:
            obj = loads(call.json.text)
        except ValueError:
            obj = None
        name = obj.get("tool_name", obj.get("name")) if isinstance(obj, dict) else None
        args = next((obj[k] for k in ("parameters", "arguments") if k in obj), None) if isinstance(obj, dict) else None
        if not isinstance(name, str) or not isinstance(args, dict):
            call.error = call.error or "not a call object"
        elif not call.started:
            self._name(call, name)
            if not call.error:
                self._begin(call)
        if not call.error and self._args_at is None:  # keys in another order: the arguments whole
            self._args(call, json.dumps(args, ensure_ascii=False))
        self._end_call()
        self._go(self.ITEMS)
        return True


class Parser(CallObjects):
    OPENERS = (ACTION,)
    STRAYS = (ACTION_END, *WRAPS)
    BLOCKS = frozenset({CommandR.LIST, CommandR.ITEMS, CommandR.TAIL})
    ITEMS = CommandR.ITEMS
    CLOSERS = (ACTION_END,)

    def _opened(self, marker: str) -> None:
        self._open(CommandR.LIST)

    def _s_list(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, ("[", "{", ACTION_END), final)
        if m == "":
            return False
        if m == "[":
            self._take(1)
            self._go(CommandR.ITEMS)
        elif m == "{":  # one call, not in a list
            self._go(CommandR.ITEMS)
        else:
            if m:
                self._take(len(m))
            self._close_block()
        return True

    def _s_items(self, final: bool) -> bool:
        if self._skip_ws(","):
            return True
        m = lead(self._buf, ("{", "]", ACTION_END), final)
        if m == "":
            return False
        if m == "{":
            self._call_object(CommandR.CALL)
        elif m == "]":
            self._take(1)
            self._go(CommandR.TAIL)
        else:
            if m:
                self._take(len(m))
            self._close_block()
        return True

    def _s_tail(self, final: bool) -> bool:
        return self._end_block(ACTION_END, final)
