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

A step that decodes several sequences pays for every drafted row in every sequence's time, so
there a sequence drafts only what it has proven it can pay for (``paid``): at most its credit,
what its proposals kept on balance. A sequence with none yet does not draft: what it would
have proposed is watched instead (``Watch``), checked against the tokens the model then
chooses, and settled into its credit as if it had been read, so a sequence that copies earns
the right to draft beside others at no row's cost, and one whose proposals miss never costs
the others a row.
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

    def propose(self, limit: int, pace: Pace | None = None, alone: bool = True) -> list[int]:
        """What followed the latest earlier occurrence of the last ``n`` tokens, as many as
        ``draft_length`` allows a sequence of that ``pace`` for a match whose text before agrees
        as far as it does (``depth``), at most ``min(m, limit)``; none where the last ``n`` tokens
        never occurred before. ``alone``: no other sequence's rows are in the step."""
        n, seq = self.n, self.tokens
        if len(seq) < n or limit <= 0:
            return []
        start = self.after.get(tuple(seq[-n:]))
        if start is None:
            return []
        pace = pace or Pace()
        most = min(self.m, limit)
        agree = depth(seq, start, max(most, evidence(n, pace.credit, alone)))
        return seq[start:start + draft_length(agree, n, pace, most, alone, self.m)]


def paid(length: int, pace: Pace, alone: bool) -> int:
    """How many of a proposal of ``length`` tokens a sequence of ``pace`` drafts: all of them
    alone in the step; beside other sequences' rows, only as many as its credit pays for (every
    row it adds slows every sequence in the step, so it risks only what its proposals won)."""
    return length if alone else min(length, max(0, pace.credit))


class Watch:
    """A proposal not read (``paid`` allowed none of it), checked against the tokens the
    sequence then takes: ``see`` each one in order, until it settles."""

    __slots__ = ("proposal", "seen")

    def __init__(self, proposal: Sequence[int]):
        self.proposal, self.seen = list(proposal), 0

    def see(self, tok: int) -> tuple[int, int] | None:
        """The next token taken; once the proposal is settled (a token it did not propose, or
        all of it taken), (its length, how many of it the model would have kept), else None."""
        if tok == self.proposal[self.seen]:
            self.seen += 1
            if self.seen < len(self.proposal):
                return None
        return len(self.proposal), self.seen


def depth(seq: list[int], start: int, most: int) -> int:
    """How many of ``seq``'s last tokens equal those before index ``start`` (at most ``most``)."""
    k, end = 0, len(seq)
    while k < most and k < start and seq[start - 1 - k] == seq[end - 1 - k]:
        k += 1
    return k


def evidence(n: int, credit: int, alone: bool = True) -> int:
    """How many tokens must agree before a match (its ``depth``) for it to be a long one
    (``draft_length``), for a sequence of ``credit``: twice the n-gram alone in the step (a
    chance match of ``n`` tokens in prose is common, of ``2n`` rare, in copied text the rule),
    four times it beside other sequences' rows (there every extra row slows every sequence in
    the step: only a copy well under way is worth one), and one more for each drafted token
    its proposals lost on balance (``-credit``)."""
    return (2 if alone else 4) * n + max(0, -credit)


def draft_length(agree: int, n: int, pace: Pace, most: int, alone: bool, full: int | None = None) -> int:
    """How many tokens a match proposes (at most ``most``), where ``agree`` tokens before it
    agree with those before its earlier occurrence, for a sequence of ``pace``; ``full``: the
    setting's longest draft (``most`` where not given). A drafted token costs a row of the
    decode whether it is kept or not; on a CPU a row costs a good part of a step (a short draft
    nearly a whole one), so only drafts kept more often than not pay, and a sequence risks what
    its proposals earned:
    - a long match (``agree`` at least ``evidence``: longer beside other sequences' rows, and
      after misses that cost more than they won): as many as agree, or the sequence's credit
      where that is more;
    - a short one (a chance match, or a copy resuming after an edit): only for a sequence whose
      credit is a whole draft or more (a copy under way): its credit or as many as agree,
      whichever is more, or only as many as agree after a miss (the copy resumes once the text
      after the edit agrees again, a short draft first); else none."""
    credit = pace.credit
    if agree >= evidence(n, credit, alone):
        return min(most, max(agree, credit))
    if credit < (full or most):
        return 0
    return min(most, agree if pace.misses else max(credit, agree))


MAX_WAIT = 16  # most steps a sequence whose proposals keep missing waits before proposing again
CREDIT = 2  # a sequence's credit lies within this many of the longest drafts either side of 0


@dataclass(frozen=True, slots=True)
class Pace:
    """How much a sequence proposes: at most ``cap`` tokens a step (the setting's at first),
    none for the next ``wait`` steps; ``misses``: proposals in a row the model kept less than
    half of; ``credit``: its drafted tokens kept less those refused, bounded (``paced``), 0 at
    first: what its proposals earned the right to risk (``draft_length``)."""

    cap: int = 1 << 30
    misses: int = 0
    wait: int = 0
    credit: int = 0


def paced(pace: Pace, proposed: int, kept: int, most: int) -> Pace:
    """The pace after a step that proposed ``proposed`` tokens, of which the model kept ``kept``.

    A refused token costs a row of the decode for nothing (on a CPU, where a step's cost grows
    with its rows, a good part of a step), so a sequence that copies its context proposes many,
    one whose proposals miss proposes few, and one whose proposals keep missing stops proposing
    a while. The length starts at ``most``, doubles after a draft kept whole (up to ``most``),
    else halves, or becomes one more than were kept where that is more: a miss (an edit in a
    copied file) does not undo a run of hits. A proposal of which less than half was kept is a
    miss; after misses in a row the sequence waits 0, 1, 3, 7... steps (``MAX_WAIT`` at most)
    before proposing again, and a proposal half kept or more ends that. The credit gains each
    kept token and loses each refused one, within ``CREDIT`` longest drafts of 0 either way (a
    long copy does not buy a long run of misses; a long run of misses does not bar a sequence
    for good: ``evidence``). A step that proposed nothing (none to propose, or waiting) counts
    down the wait. A draft model's proposals are paced alike (its credit unused)."""
    if not proposed:
        return replace(pace, wait=max(0, pace.wait - 1))
    now = min(pace.cap, most)  # the setting's at first
    cap = min(most, 2 * now) if kept == proposed else max(1, kept + 1, now // 2)
    bound = CREDIT * most
    credit = max(-bound, min(bound, pace.credit + kept - (proposed - kept)))
    if 2 * kept >= proposed:
        return Pace(cap, credit=credit)
    misses = pace.misses + 1
    return Pace(cap, misses, min(MAX_WAIT, (1 << (misses - 1)) - 1), credit)


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
