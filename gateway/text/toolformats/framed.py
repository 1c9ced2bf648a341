"""Formats whose answer is a run of messages, each framed by a header naming its channel or
recipient (gpt-oss's harmony, muse-glimmer): the framing is ``reasoning.ReasoningSplitter``'s
(its format named by ``FRAMING``, run with ``calls=True``), so such a parser runs that splitter
itself on the raw answer and reads its segments (``_segment``): thinking, content, and a call
message's recipient and body. ``AnswerParser`` then splits no thinking of its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..reasoning import ReasoningSplitter
from .items import Item
from .machine import Machine


class Framed(Machine):
    FRAMING: ClassVar[str]  # the reasoning format that frames the messages

    def __init__(self, tools: Sequence[dict[str, Any]] | None = None, *, stream: bool = True,
                 prompt_tail: str = ""):
        super().__init__(tools, stream=stream)
        self.splitter = ReasoningSplitter(self.FRAMING, prompt_tail, calls=True)

    @property
    def thinking(self) -> bool:
        return self.splitter.thinking

    def feed(self, text: str) -> list[Item]:
        for kind, t in self.splitter.feed(text):
            self._segment(kind, t)
        return self._take_out()

    def flush(self) -> list[Item]:
        for kind, t in self.splitter.flush():
            self._segment(kind, t)
        return super().flush()

    def _segment(self, kind: str, text: str) -> None:
        """One segment of the splitter's: (kind, text)."""
        raise NotImplementedError
