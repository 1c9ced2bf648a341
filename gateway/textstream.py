"""Text out of a token stream: incremental UTF-8, and stop strings that never leak.

Both are pure and fed in arbitrary cuts, so a streamed answer and a whole one are the
same text by construction.
"""

from __future__ import annotations

import codecs
from typing import Sequence


class Utf8Stream:
    """Bytes in, text out; a character split over several pieces comes out whole."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        return self._dec.decode(piece)

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class StopMatcher:
    """Ends text before the first stop string to complete, holding back what could still become one.

    ``feed`` returns ``(safe_text, matched)``: ``safe_text`` can be sent now; ``matched``
    is the stop string once one has appeared (everything from it on is dropped).
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, str | None]:
        if self.matched is not None:
            return "", self.matched
        if not self.stops:
            return text, None
        buf = self._held + text
        # The first stop string to be *completed* wins (generation would have ended there),
        # then the one that starts first.
        best = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (best is None or (i + len(s), i) < (best[0] + len(best[1]), best[0])):
                best = (i, s)
        if best is not None:
            self._held = ""
            self.matched = best[1]
            return buf[: best[0]], self.matched
        keep = 0
        for s in self.stops:  # the longest tail of buf that starts some stop string
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        out, self._held = ("" if self.matched is not None else self._held), ""
        return out
