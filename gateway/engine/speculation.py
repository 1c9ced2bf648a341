"""Speculative decoding without a draft model: prompt lookup (llama.cpp's ``ngram-simple``).

Where an answer repeats what its context holds (an edited file, a quoted passage), the tokens
that followed the last ``n`` tokens' latest earlier occurrence are proposed as the next ones;
the target model reads them in the same decode as the token it sampled last, and keeps the
longest run it agrees with (``Lookup`` proposes, ``accepted`` decides).

Verification samples each position with the request's own sampler chain (or takes the argmax
for a greedy request), in order, and keeps a drafted token only where the sample equals it. A
proposal is a fixed token (no draft distribution), so the kept tokens follow the target's
distribution exactly: the first position's token is the target's sample, and each next
position is sampled only after the one before was kept (llama-server verifies its drafts the
same way). Greedy answers are token for token those of plain decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class Lookup:
    """A sequence's tokens so far (prompt and answer), indexed by their ``n``-grams: each
    n-gram that has a following token maps to where its latest occurrence was followed."""

    def __init__(self, tokens: Sequence[int], n: int, m: int):
        self.n, self.m = n, m
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}  # n-gram -> the index of the token after its latest occurrence
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """More tokens of the sequence (its prompt, or what the model kept)."""
        n, seq, after = self.n, self.tokens, self.after
        for tok in tokens:
            if len(seq) >= n:
                after[tuple(seq[-n:])] = len(seq)  # the n-gram ending here is followed by ``tok``
            seq.append(tok)

    def propose(self, limit: int) -> list[int]:
        """Up to ``min(m, limit)`` tokens that followed the latest earlier occurrence of the last
        ``n`` tokens; none where they never occurred before."""
        n, seq = self.n, self.tokens
        if len(seq) < n or limit <= 0:
            return []
        start = self.after.get(tuple(seq[-n:]))
        if start is None:
            return []
        return seq[start:start + min(self.m, limit)]


def next_cap(cap: int, proposed: int, kept: int, most: int) -> int:
    """How many tokens to propose next step: twice as many after a draft kept whole (up to
    ``most``), after a refused one half as many, or one more than were kept where that is more.
    A refused token costs a row of the decode for nothing, so a sequence whose proposals keep
    missing proposes few; one that copies its context proposes many, and a miss (an edit in a
    copied file) does not undo that."""
    if not proposed:
        return cap
    return min(most, 2 * cap) if kept == proposed else max(1, kept + 1, cap // 2)


def accepted(draft: Sequence[int], pick: Callable[[int], int | None]) -> list[int]:
    """The tokens kept from one verification: ``pick(i)`` is the model's token at position ``i``
    (after the token sampled last, then after each drafted one; None: the answer ends there).
    Each position is picked only once the one before was kept, so ``pick`` may advance a
    sampler's state. The first picked token is always kept; a drafted token is kept where the
    pick before it equals it."""
    out: list[int] = []
    for i in range(len(draft) + 1):
        tok = pick(i)
        if tok is None:
            break
        out.append(tok)
        if i == len(draft) or tok != draft[i]:
            break
    return out
