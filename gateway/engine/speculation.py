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
same way). Greedy answers are token for token those of plain decoding wherever a token's
logits do not depend on the batch it is read in; llama.cpp's CPU kernels round a row read
among several otherwise than one read alone, so on a real model an answer can part from the
plain one where its two likeliest tokens are all but tied (``tests/test_speculation_real``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace


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

    def propose(self, limit: int, proven: bool = False) -> list[int]:
        """Up to ``min(m, limit)`` tokens that followed the latest earlier occurrence of the last
        ``n`` tokens; none where they never occurred before. Unless the sequence's proposals
        have ``proven`` themselves (``Pace.proven``), no more than the tokens before the match
        agree with those before the occurrence (``depth``): a chance match of ``n`` tokens is
        trusted for ``n``, a long stretch of copied text for long."""
        n, seq = self.n, self.tokens
        if len(seq) < n or limit <= 0:
            return []
        start = self.after.get(tuple(seq[-n:]))
        if start is None:
            return []
        most = min(self.m, limit)
        return seq[start:start + (most if proven else depth(seq, start, most))]


def depth(seq: list[int], start: int, most: int) -> int:
    """How many of ``seq``'s last tokens equal those before index ``start`` (at most ``most``)."""
    k, end = 0, len(seq)
    while k < most and k < start and seq[start - 1 - k] == seq[end - 1 - k]:
        k += 1
    return k


MAX_WAIT = 16  # most steps a sequence whose proposals keep missing waits before proposing again


@dataclass(frozen=True, slots=True)
class Pace:
    """How much a sequence proposes: at most ``cap`` tokens a step (the setting's at first),
    none for the next ``wait`` steps; ``misses``: proposals in a row the model kept less than
    half of; ``proven``: its last proposal was kept half or more (``paced``)."""

    cap: int = 1 << 30
    misses: int = 0
    wait: int = 0
    proven: bool = False


def paced(pace: Pace, proposed: int, kept: int, most: int) -> Pace:
    """The pace after a step that proposed ``proposed`` tokens, of which the model kept ``kept``.

    A refused token costs a row of the decode for nothing (on a CPU, where a step's cost grows
    with its rows, nearly a step's worth), so a sequence that copies its context proposes many,
    one whose proposals miss proposes few, and one whose proposals keep missing stops proposing
    a while. The length starts at ``most``, doubles after a draft kept whole (up to ``most``),
    else halves, or becomes one more than were kept where that is more: a miss (an edit in a
    copied file) does not undo a run of hits. A proposal of which less than half was kept is a
    miss; after misses in a row the sequence waits 0, 1, 3, 7... steps (``MAX_WAIT`` at most)
    before proposing again, and a proposal half kept or more ends that (and proves the sequence:
    ``Lookup.propose`` trusts its matches whole). A step that proposed nothing (none to
    propose, or waiting) counts down the wait. A draft model's proposals are paced alike."""
    if not proposed:
        return replace(pace, wait=max(0, pace.wait - 1))
    now = min(pace.cap, most)  # the setting's at first
    cap = min(most, 2 * now) if kept == proposed else max(1, kept + 1, now // 2)
    if 2 * kept >= proposed:
        return Pace(cap, proven=True)
    misses = pace.misses + 1
    return Pace(cap, misses, min(MAX_WAIT, (1 << (misses - 1)) - 1))


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
