"""Text out of a token stream: incremental UTF-8, and stop strings that never leak.

Both are pure and fed in arbitrary cuts, so a streamed answer and a whole one are the
same text by construction.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


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

    Each stop string is followed by a Knuth-Morris-Pratt automaton whose state is the longest
    prefix of it that the text ends with, so the work per character is bounded by the number
    of stop strings, never by their length or the text's.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._fail = [_failure(s) for s in self.stops]
        self._state = [0] * len(self.stops)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, str | None]:
        if self.matched is not None:
            return "", self.matched
        if not self.stops:
            return text, None
        stops, fail, state = self.stops, self._fail, self._state
        for i, ch in enumerate(text):
            done = -1
            for j, s in enumerate(stops):
                k = state[j]
                while k and s[k] != ch:
                    k = fail[j][k - 1]
                if s[k] == ch:
                    k += 1
                if k == len(s):
                    # the first to complete wins; of those completing here, the one that starts first
                    if done < 0 or len(s) > len(stops[done]):
                        done = j
                    k = fail[j][k - 1]
                state[j] = k
            if done >= 0:
                buf = self._held + text[: i + 1]
                self._held, self.matched = "", stops[done]
                return buf[: len(buf) - len(self.matched)], self.matched
        buf = self._held + text
        keep = max(state)  # the longest tail of the text that starts some stop string
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        out, self._held = ("" if self.matched is not None else self._held), ""
        return out


def _failure(s: str) -> list[int]:
    """KMP's table: for each prefix of ``s``, the length of its longest proper border."""
    table, k = [0] * len(s), 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = table[k - 1]
        if s[i] == s[k]:
            k += 1
        table[i] = k
    return table
