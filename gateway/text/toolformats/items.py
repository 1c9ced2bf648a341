"""The items an answer is read into: one vocabulary from the formats' parsers (``machine``)
up to the wires' renderers (``wire/answer.py`` passes them on as they are).

- ``Piece(kind, text)``: text of one kind, ``"thinking"`` or ``"content"``. A tuple, equal to
  the plain pair ``(kind, text)``; ``logprobs`` (the tokens it completes, when asked for) is
  set on it by ``answer.Reader`` and takes no part in that equality.
- ``CallStart(index, id, name)``: a call opens; ``index`` counts the answer's calls from 0.
- ``CallArgs(index, text)``: a piece of the call's arguments, JSON text; a call's pieces
  together are one JSON object.
- ``CallEnd(index, error)``: the call is over; ``error`` set only for a streamed call whose
  arguments turned out broken. The parsers' own: ``answer.Reader`` counts and drops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class _Text(NamedTuple):
    kind: str  # "thinking" | "content"
    text: str


class Piece(_Text):
    """Text of one kind (see above)."""

    logprobs: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str  # call_...
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    index: int
    error: str | None = None


Item = Piece | CallStart | CallArgs | CallEnd
