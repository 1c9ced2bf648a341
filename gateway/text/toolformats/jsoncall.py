"""Readers of call bodies written in JSON, shared by the formats: a whole call object
(``{"name": N, "arguments": {...}}``), an arguments object alone (the name came before it, in
the format's own syntax), and the rest of a call found broken (kept as text up to where the
call ends). Each reads from the start of the text not yet consumed and, once its call is over,
goes to the state the format named (``_after``)."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from .machine import Call, Machine, Text
from .scan import CUT, DONE, HEAD_LIMIT, MORE, Status, escape, loads, match_head, until

ARG_KEYS = ("arguments", "parameters")  # a call object's key for its arguments


class Json(Enum):
    OBJ = "_s_obj"  # a call as one JSON object
    ARGS_ONLY = "_s_args_only"  # the arguments object alone
    TO_CLOSER = "_s_to_closer"  # after an arguments object alone: any text up to the call's closer
    JUNK = "_s_junk"  # the rest of a broken call


class Phase(Enum):
    """Where the reading of a call's JSON stands."""

    HEAD = "head"  # {"name": N, "arguments": not read yet
    VALUE = "value"  # the arguments' value comes next
    STREAM = "stream"  # inside the arguments object, which streams as it comes
    STRING = "string"  # inside arguments written as a JSON string holding the object
    TAIL = "tail"  # the arguments are whole; the rest of the object follows
    SLOW = "slow"  # keys in another order: the object is read once it is whole
    SKIP = "skip"  # the call failed: its object is read to its end


class JsonCalls(Machine):
    """The JSON readers; a format enters them with ``_json_call``, ``_args_only`` or ``_junk``."""

    # what the call being read was entered with
    _closers: tuple[str, ...] = ()  # markers that cut its JSON scan
    _junk_until: tuple[tuple[str, bool], ...] = ()  # markers that end a broken call (True: part of it)
    _strict = False
    _end_at_json = True
    _tail: Enum | None = None
    _value_at = 0  # where arguments written as a string begin in the call's JSON text

    def _junk(self, until: tuple[tuple[str, bool], ...], error: str) -> None:
        """The call is broken: keep its text up to one of ``until`` (consumed when flagged)."""
        assert self._call is not None
        self._call.error = self._call.error or error
        self._junk_until = until
        self._go(Json.JUNK)

    def _s_junk(self, final: bool) -> bool:
        text, marker = until(self._buf, [m for m, _ in self._junk_until], final)
        self._take(len(text))
        if marker is None:
            return bool(text)
        if dict(self._junk_until)[marker]:
            self._take(len(marker))
        self._end_call()
        self._go(self._after)
        return True

    def _json_call(self, closers: tuple[str, ...], after: Enum, strict: bool = False) -> None:
        """Read a call written as a JSON object, from the ``{`` at the start of ``_buf``.
        ``strict``: when it does not begin as a call, it is text (not a failed call)."""
        assert self._call is not None
        self._call.phase = Phase.HEAD
        self._closers, self._after, self._strict = closers, after, strict
        self._go(Json.OBJ)

    def _scan(self, stop: int, emit: bool, final: bool) -> tuple[Status, int]:
        """Consume the call's JSON until its depth comes back to ``stop`` (``DONE``), a closer
        marker outside strings (``CUT``), or the end of ``_buf`` (``MORE``); and how much."""
        call = self._current
        js = call.json
        buf, closers = self._buf, self._closers
        heads = {m[0] for m in closers}
        out: list[str] = []
        i, status = 0, MORE
        while i < len(buf):
            c = buf[i]
            if not js.in_str and c in heads:
                if any(buf.startswith(m, i) for m in closers):
                    status = CUT
                    break
                if not final and any(m.startswith(buf[i:]) for m in closers):
                    break
            was_in_str = js.in_str
            js.step(c)
            if emit:
                out.append(escape(c) if was_in_str and c < " " else c)
            i += 1
            if c in '}]"' and not js.in_str and js.depth == stop:
                status = DONE
                break
        js.text += self._take(i)
        if out:
            self._args(call, "".join(out))
        return status, i

    def _s_obj(self, final: bool) -> bool:
        call = self._current
        if call.phase == Phase.HEAD:
            return self._obj_head(call, final)
        if call.phase == Phase.VALUE:
            return self._obj_value(call)
        stop = 1 if call.phase in (Phase.STREAM, Phase.STRING) else 0
        status, n = self._scan(stop, emit=call.phase == Phase.STREAM, final=final)
        if status == DONE:
            if call.phase == Phase.STRING:
                self._string_args(call, call.json.text[self._value_at:])
                call.phase, call.complete = Phase.TAIL, True
            elif call.phase == Phase.STREAM:
                call.phase, call.complete = Phase.TAIL, True
            else:
                if call.phase == Phase.SLOW:
                    self._whole_object(call)
                self._end_call()
                self._go(self._after)
            return True
        if status == CUT:
            self._end_call(None if call.phase == Phase.TAIL else "the call was cut off")
            self._go(self._after)
            return True
        return n > 0

    def _obj_head(self, call: Call, final: bool) -> bool:
        r = match_head(self._buf, ARG_KEYS)
        if r == MORE and not final and len(self._buf) < HEAD_LIMIT:
            return False
        if isinstance(r, tuple):
            name, end = r
            for c in self._buf[:end]:
                call.json.step(c)
            call.json.text += self._take(end)
            self._name(call, name)
            call.phase = Phase.VALUE
        elif self._strict:  # not a call after all: text
            self._call = None
            self._content(call.raw)
            self._go(Text.TEXT)
        else:
            call.phase = Phase.SLOW
        return True

    def _obj_value(self, call: Call) -> bool:
        if self._skip_ws():
            return True
        c = self._buf[0]
        if call.error:
            call.phase = Phase.SKIP
        elif c == "{":
            self._begin(call)
            call.phase = Phase.STREAM
        elif c == '"':
            self._value_at = len(call.json.text)
            call.phase = Phase.STRING
        else:
            call.error = "the arguments are not an object"
            call.phase = Phase.SKIP
        return True

    def _whole_args(self, call: Call, args: Any) -> None:
        """Arguments read whole: an object begins the call and is its arguments at once; anything
        else is the call's error."""
        if not isinstance(args, dict):
            call.error = "the arguments are not an object"
            return
        self._begin(call)
        self._args(call, json.dumps(args, ensure_ascii=False))

    def _string_args(self, call: Call, text: str) -> None:
        """Arguments written as a JSON string holding the object."""
        try:
            args = loads(loads(text))
        except (ValueError, TypeError):
            args = None
        self._whole_args(call, args)

    def _whole_object(self, call: Call) -> None:
        """A call object whose keys came in another order: read once it is complete."""
        try:
            obj = loads(call.json.text)
        except ValueError:
            call.error = "the call is not JSON"
            return
        if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
            obj = obj["function"]
        name = obj.get("name") if isinstance(obj, dict) else None
        if not isinstance(name, str):
            call.error = "the call has no name"
            return
        self._name(call, name)
        if call.error:
            return
        args = next((obj[k] for k in ARG_KEYS if k in obj), None)
        if isinstance(args, str):
            try:
                args = loads(args)
            except ValueError:
                args = None
        self._whole_args(call, args)

    def _args_only(self, closers: tuple[str, ...], after: Enum, end_at_json: bool = True,
                   tail: Enum | None = None) -> None:
        """Read a call's arguments object alone, from ``_buf``'s start (after whitespace).
        ``end_at_json``: the call ends with the object; else the state ``tail`` reads on to
        the call's closing marker (``Json.TO_CLOSER``: to the first of ``closers``)."""
        self._closers, self._after, self._end_at_json, self._tail = closers, after, end_at_json, tail
        self._go(Json.ARGS_ONLY)

    def _s_args_only(self, final: bool) -> bool:
        call = self._current
        if call.phase is None:
            if self._skip_ws():
                return True
            if self._buf[0] != "{":
                self._junk(tuple((m, False) for m in self._closers), "the arguments are not an object")
                return True
            if not call.error:
                self._begin(call)
            call.phase = Phase.STREAM
        status, n = self._scan(0, emit=call.started, final=final)
        if status == DONE:
            if self._end_at_json:
                self._end_call()
                self._go(self._after)
            else:
                assert self._tail is not None
                call.phase, call.complete = Phase.TAIL, True
                self._go(self._tail)
            return True
        if status == CUT:
            self._end_call("the call was cut off")
            self._go(self._after)
            return True
        return n > 0

    def _s_to_closer(self, final: bool) -> bool:
        """Any text after the arguments object (a closing fence) up to one of ``_closers``: the
        first is the call's own closer, taken with the call; another is left for ``_after``."""
        text, marker = until(self._buf, self._closers, final)
        self._take(len(text))
        if marker is None:
            return bool(text)
        if marker == self._closers[0]:
            self._take(len(marker))
        self._end_call()
        self._go(self._after)
        return True
