"""What every format's parser is built on: the call being read, and ``Machine``, which holds
the text not yet consumed, the output (``items``' vocabulary) and the calls' lifecycle, and
runs the format's states over the text. A format's parser subclasses it (usually through the
shared readers in ``jsoncall`` and ``xmlcall``) and adds its own states: an ``Enum`` whose
values name the methods that read in that state. ``_go`` is the one place the state changes.

A state method takes ``final`` (no more text will come) and returns whether it made progress;
it consumes text with ``_take`` (kept in the open call's raw text, for a failure, or in the
open block's ``_group``). ``Machine`` reads free text itself (``Text.TEXT``): content until one
of the format's ``OPENERS`` (the format's ``_opened`` takes over) or ``STRAYS`` (dropped).
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Sequence
from enum import Enum
from typing import Any, ClassVar

from ..reasoning import CONTENT
from .items import CallArgs, CallEnd, CallStart, Item, Piece
from .scan import WS, JsonScan, is_object, lead, tool_params, until

_ALNUM = string.ascii_letters + string.digits


class Call:
    """One call being read: its raw text (for a failure), what it emitted, and the JSON scan of
    its text (for the readers that read JSON)."""

    def __init__(self, raw: str = ""):
        self.raw = raw
        self.name: str | None = None
        self.error: str | None = None
        self.index = -1
        self.started = False  # CallStart made (held or released)
        self.released = False  # some item reached the caller
        self.complete = False  # its arguments are whole: only a closer may still come
        self.items: list[Item] = []
        self.args: list[str] = []
        self.json = JsonScan()
        self.phase: Enum | None = None  # where the reader of its body stands


class Text(Enum):
    TEXT = "_s_text"  # free text, looking for an opening marker


class Machine:
    """Incremental parser of one answer in one format; ``ToolCallParser`` is what callers use."""

    OPENERS: ClassVar[tuple[str, ...]] = ()  # markers that open a call or a block of calls
    STRAYS: ClassVar[tuple[str, ...]] = ()  # closing or inner markers met outside a call: dropped
    START: ClassVar[Enum] = Text.TEXT  # the state an answer starts in
    # when the answer ends in one of these with no call read, the block's text failed
    BLOCKS: ClassVar[frozenset[Enum]] = frozenset()
    LEADS: ClassVar[frozenset[Enum]] = frozenset()  # ... in one of these, the text held is content
    THINKING_ENDS: ClassVar[tuple[str, ...]] = ()  # openers that end thinking left open (the call is read)
    # every answer is framed in this format, calls or not (functionary v3.2's recipients): the
    # parser reads an answer without tools too, as llama.cpp's parser of the family does
    FRAMES: ClassVar[bool] = False

    def __init__(self, tools: Sequence[dict[str, Any]] | None = None, *, stream: bool = True,
                 prompt_tail: str = ""):
        self.stream = stream
        self.params = tool_params(tools)
        self.failed: list[str] = []  # why each failed call failed, with the start of its text
        self._openers = self.OPENERS + self.STRAYS
        self._out: list[Item] = []
        self._buf = ""
        self._state: Enum = self.START
        self._after: Enum = Text.TEXT  # where a shared reader goes once its call is over
        self._ws = ""  # trailing whitespace of content, sent once more content follows
        self._drop_ws = False  # right after a call: leading whitespace is not content
        self._group = ""  # text of an open block that belongs to no call yet
        self._block_calls = 0
        self._raw = ""  # failed calls' text, sent as content once what follows is known
        self._call: Call | None = None
        self._next_index = 0
        self._ids: set[str] = set()

    @property
    def _current(self) -> Call:
        """The call being read: the states that read one are entered only with one open."""
        assert self._call is not None
        return self._call

    # --- public ----------------------------------------------------------------------------

    @property
    def thinking(self) -> bool:
        return False

    def feed(self, text: str) -> list[Item]:
        self._buf += text
        self._run(final=False)
        return self._take_out()

    def flush(self) -> list[Item]:
        self._end_input()
        self._flush_raw()
        if self._ws and not self._drop_ws:
            self._emit(Piece(CONTENT, self._ws))
        self._ws = ""
        return self._take_out()

    # --- output ----------------------------------------------------------------------------

    def _take_out(self) -> list[Item]:
        out, self._out = self._out, []
        return out

    def _emit(self, item: Item) -> None:
        last = self._out[-1] if self._out else None
        if isinstance(item, Piece) and isinstance(last, Piece) and last.kind == item.kind:
            self._out[-1] = Piece(item.kind, last.text + item.text)
        else:
            self._out.append(item)

    def _flush_raw(self) -> None:
        if self._raw:
            self._emit(Piece(CONTENT, self._ws + self._raw))
            self._raw = self._ws = ""
            self._drop_ws = False

    def _content(self, text: str) -> None:
        if not text:
            return
        if self._drop_ws:
            text = text.lstrip()
            if not text:
                return
            self._drop_ws = False
        self._flush_raw()
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body):]
        if body:
            self._emit(Piece(CONTENT, body))

    # --- calls -----------------------------------------------------------------------------

    def _new_id(self) -> str:
        while True:
            cid = "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))
            if cid not in self._ids:
                self._ids.add(cid)
                return cid

    def _release(self, call: Call) -> None:
        self._flush_raw()
        for item in call.items:
            if isinstance(item, CallStart):
                self._next_index += 1
            last = self._out[-1] if self._out else None
            if isinstance(item, CallArgs) and isinstance(last, CallArgs) and last.index == item.index:
                self._out[-1] = CallArgs(item.index, last.text + item.text)
            else:
                self._out.append(item)
        call.items = []
        call.released = True

    def _begin(self, call: Call) -> None:
        """The call's CallStart: its name is known and valid."""
        assert call.name is not None and call.error is None
        call.index = self._next_index
        call.started = True
        call.items.append(CallStart(call.index, self._new_id(), call.name))
        if self.stream:
            self._release(call)

    def _args(self, call: Call, text: str) -> None:
        if not call.started or not text:
            return
        call.args.append(text)
        call.items.append(CallArgs(call.index, text))
        if self.stream:
            self._release(call)

    def _name(self, call: Call, name: str) -> None:
        call.name = name
        if name not in self.params:
            call.error = f"unknown tool {name!r}"

    def _new_call(self) -> Call:
        self._call = Call(self._group)
        self._group = ""
        return self._call

    def _end_call(self, error: str | None = None) -> None:
        call, self._call = self._call, None
        assert call is not None
        self._block_calls += 1
        error = call.error or error
        if error is None and not call.started:
            error = "no arguments object"
        if error is None and not is_object("".join(call.args)):
            error = "the arguments are not one JSON object"
        if error is None:
            call.items.append(CallEnd(call.index))
            self._release(call)
            self._drop_ws = True
            return
        self.failed.append(f"{error}: {call.raw[:200]!r}")
        if call.released:
            call.items.append(CallEnd(call.index, error))
            self._release(call)
            self._drop_ws = True
        else:
            self._raw += call.raw

    # --- the machine -----------------------------------------------------------------------

    def _go(self, state: Enum) -> None:
        self._state = state

    def _run(self, final: bool) -> None:
        stuck = 0
        while self._buf:
            before = (len(self._buf), self._state, id(self._call))
            if not getattr(self, self._state.value)(final):
                break
            stuck = stuck + 1 if (len(self._buf), self._state, id(self._call)) == before else 0
            if stuck > 3:
                raise RuntimeError(f"tool-call parser stuck in {self._state}")
        if final and self._buf:
            raise RuntimeError(f"tool-call parser left text in {self._state}")

    def _end_input(self) -> None:
        """The end of the answer (or of a harmony call's body): settle whatever is open."""
        self._run(final=True)
        if self._call is not None:
            self._end_call(None if self._call.complete else "the answer ended inside the call")
        elif self._state in self.BLOCKS and self._group and not self._block_calls:
            self.failed.append(f"the answer ended inside the call: {self._group[:200]!r}")
            self._raw += self._group
        elif self._state in self.LEADS:
            self._content(self._group)
        self._group = ""
        self._go(self.START)

    def _take(self, n: int) -> str:
        s, self._buf = self._buf[:n], self._buf[n:]
        if self._call is not None:
            self._call.raw += s
        else:
            self._group += s
        return s

    def _skip_ws(self, extra: str = "") -> int:
        n = len(self._buf) - len(self._buf.lstrip(WS + extra))
        self._take(n)
        return n

    def _open(self, state: Enum) -> None:
        """A block opened by the marker just consumed into ``_group``."""
        self._group = self._ws + self._group
        self._ws = ""
        self._block_calls = 0
        self._go(state)

    def _close_block(self) -> None:
        if not self._block_calls:
            self.failed.append(f"no call in the block: {self._group[:200]!r}")
            self._raw += self._group
        elif self._raw:
            self._raw += self._group
        self._group = ""
        self._go(Text.TEXT)

    def _end_block(self, closer: str, final: bool) -> bool:
        """After a block's last call: whitespace, then ``closer`` if it comes (taken), and the block is over."""
        if self._skip_ws():
            return True
        m = lead(self._buf, (closer,), final)
        if m == "":
            return False  # the start of the closer, maybe: wait for more
        self._take(len(m or ""))
        self._close_block()
        return True

    def _s_text(self, final: bool) -> bool:
        text, marker = until(self._buf, self._openers, final)
        self._content(text)
        self._buf = self._buf[len(text):]
        if marker is None:
            return bool(text)
        self._buf = self._buf[len(marker):]
        if marker in self.STRAYS:
            return True
        self._group = marker
        self._opened(marker)
        return True

    def _opened(self, marker: str) -> None:
        """One of ``OPENERS`` was just consumed (it is ``_group``): go read what it opens."""
        raise NotImplementedError
