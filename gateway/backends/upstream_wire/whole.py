"""An upstream's answers that come whole, not streamed: its embeddings (a vector per input) and
its model list (the ids that can be names, ``untrusted.name_problem``, at most ``MAX_LISTED``).
Each is bounded in bytes before it is read: embeddings by their inputs (``embeddings_bound``), a
model list by ``MAX_LIST_BYTES``. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..untrusted import name_problem, shown
from .failures import MAX_ERROR_BYTES, MalformedStream, count_of, json_of

EMBEDDING_BYTES = 256 * 1024  # one input's vector as JSON floats, with room past 8192 dimensions
MAX_LIST_BYTES = 2 * 2**20  # an upstream's /models answer: parsed on the event loop, so kept small
MAX_LISTED = 1000  # model ids taken from one upstream's list (each becomes a row of /models)


def embeddings_bound(inputs: int) -> int:
    """The most bytes an embeddings answer for ``inputs`` inputs may take."""
    return MAX_ERROR_BYTES + inputs * EMBEDDING_BYTES


def embeddings_answer(body: bytes, inputs: int) -> tuple[list[list[float]], int]:
    """An upstream's embeddings answer -> (a vector per input, in the inputs' order, prompt
    tokens); ``MalformedStream`` for anything else (a vector too many or too few included)."""
    what = "embeddings answer"
    data = json_of(body, "an answer", what)
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list) or len(items) != inputs or not all(isinstance(d, dict) for d in items):
        raise MalformedStream(f"not one vector for each of the {inputs} inputs", what)
    try:
        items = sorted(items, key=lambda d: d["index"])
        vectors = [[float(x) for x in d["embedding"]] for d in items]
    except (KeyError, TypeError, ValueError, OverflowError):
        raise MalformedStream("an item without an `index` or a list of numbers as its `embedding`", what) from None
    usage = data.get("usage")
    return vectors, count_of(usage.get("prompt_tokens") if isinstance(usage, dict) else None)


@dataclass(frozen=True)
class Listing:
    """The model ids an upstream's /models lists that are taken (in its order, each once, at
    most MAX_LISTED), how many were refused as names (and why the first was), and how many
    entries came after the last one taken."""

    ids: list[str]
    refused: int = 0
    why: str | None = None
    left_out: int = 0


def listing(body: bytes) -> Listing | None:
    """An upstream's /models answer (at most MAX_LIST_BYTES: it is parsed on the event loop);
    None when it is not OpenAI's model list."""
    data = json_of(body, "a model list", "model list")
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    ids: dict[str, None] = {}
    refused, why = 0, None
    for seen, item in enumerate(items):
        if len(ids) == MAX_LISTED:  # the rest is not even looked at
            return Listing(list(ids), refused, why, len(items) - seen)
        mid = item.get("id") if isinstance(item, dict) else None
        if (problem := name_problem(mid)) is not None:
            refused += 1
            why = why or f"{shown(str(mid), 40)!r}: {problem}"
        else:
            ids[mid] = None  # type: ignore[index]  # a str: name_problem checked it
    return Listing(list(ids), refused, why)
