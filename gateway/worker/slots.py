"""The context's sequence slots and what runs in them.

A ``Slot`` is one sequence of the context (one cache stream) and the tokens cached in it; a
``Sequence`` is one generation in a slot (its prompt, sampler chain, stop state and progress);
``choose`` is how a prompt picks among free slots and the states the prompt cache keeps (the
longest shared prefix); ``reuse_plan`` finds the chunks of a slot's cache past that prefix that
the prompt repeats (``cache_reuse``); ``chunk_end`` where a prompt's next chunk ends; ``Batch`` is
the reusable ``llama_batch`` a decode step fills.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from .. import protocol
from ..text.reasoning import ReasoningSplitter, closing
from ..text.textstream import StopMatcher, Utf8Stream
from .checkpoints import Checkpoint
from .outbox import Outbox
from .speculation import Pace, Watch

_STRIDE = 256


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens ``a`` and ``b`` share from the start. Compared a block at a time (a slice
    comparison runs in C): every admission compares its prompt with each slot and kept state,
    and agents' prompts share long openings."""
    end = min(len(a), len(b))
    n = 0
    while n + _STRIDE <= end and a[n:n + _STRIDE] == b[n:n + _STRIDE]:
        n += _STRIDE
    for x, y in zip(a[n:end], b[n:end]):
        if x != y:
            break
        n += 1
    return n


class Slot:
    """One sequence of the context (llama.cpp seq_id ``id``) and the tokens now cached in it."""

    def __init__(self, sid: int):
        self.id = sid
        self.cached: list[int] = []
        self.scope = ""  # whose prompts ``cached`` holds (``GenerationRequest.cache_scope``)
        self.seq: Sequence | None = None
        self.last_used = 0.0
        # where ``cached`` came from, as the next request that reuses it is told: "slot" (its own
        # decoding), "ram" (the prompt cache), "disk" (restored at load)
        self.origin = "slot"
        self.prompt_end = 0  # how many of ``cached`` its last request's prompt filled (the rest it generated)
        self.checkpoints: list[Checkpoint] = []  # of what ``cached`` holds, the oldest first
        # positions [start, end) whose sliding-window cells the cache lacks though it holds cells
        # after them: the start of a chunk moved in from a state that held only its last window
        # (``fit_window``); a window that reaches into one is not held (``SlotMemory.holds_window``)
        self.holes: list[tuple[int, int]] = []

    def keep(self, n: int) -> None:
        """The slot's cache now holds its first ``n`` tokens: the checkpoints taken past them go."""
        del self.cached[n:]
        self.checkpoints = [c for c in self.checkpoints if c.n_tokens <= n]
        self.holes = [(a, min(b, n)) for a, b in self.holes if a < n]


def reusable(slot: Slot, tokens: list[int], scope: str) -> int:
    """How many of the prompt's first tokens the slot's cache holds for a request of ``scope``
    (none where the cache is another scope's)."""
    return common_prefix(slot.cached, tokens) if slot.scope == scope else 0


def slot_score(slot: Slot, tokens: list[int], scope: str = "") -> tuple[float, float, int]:
    """How good a free slot is for a prompt: the prompt tokens its cache saves, less half of the
    cached tokens it would throw away (another conversation's history is not traded for a
    shared opening line); then the least recently used; then the lowest id."""
    common = reusable(slot, tokens, scope)
    return common - (len(slot.cached) - common) / 2, -slot.last_used, -slot.id


class Kept(Protocol):
    """A state the prompt cache keeps (``promptcache.Entry``), as ``choose`` sees it."""

    tokens: list[int]
    scope: str
    used: float


@dataclass(frozen=True)
class Choice:
    """Where a prompt runs: its slot, and what the slot holds for it before it is read."""

    slot: Slot
    common: int  # prompt tokens the slot (or the kept state) already holds
    kept: Any = None  # a kept state (``Kept``) loaded into the slot first; None: the slot's own cache
    save: bool = False  # the slot's cache goes to the prompt cache before it is overwritten


def choose(free: list[Slot], kept: Iterable[Kept], tokens: list[int], scope: str, caching: bool) -> Choice:
    """Where a prompt runs (pure). Without a prompt cache (``caching`` False), the free slot
    ``slot_score`` rates best. With one, the first of:
    - the free slot or kept state (of the request's scope) that shares the longest prefix with
      the prompt, a slot before a state of the same length; a slot counts here only where
      ``slot_score`` finds it worth taking (it keeps more of its cache than it throws away, by
      that score's measure);
    - an idle empty slot (another conversation's history is not copied out for a shared opening
      while a slot is free);
    - the slot that shares the longest prefix, then the least recently used.
    A kept state is loaded into an empty slot, else into the least recently used. A slot's cache
    that the prompt would mostly overwrite (it keeps less than half: llama-server's rule) is kept
    first."""
    if not caching:
        slot = max(free, key=lambda s: slot_score(s, tokens, scope))
        return Choice(slot, reusable(slot, tokens, scope))
    shares = {s.id: reusable(s, tokens, scope) for s in free}
    slot = max(free, key=lambda s: (shares[s.id] if slot_score(s, tokens, scope)[0] > 0 else 0, not s.cached,
                                    shares[s.id], -s.last_used, -s.id))
    mine = [k for k in kept if k.scope == scope]
    state = max(mine, key=lambda k: (common_prefix(k.tokens, tokens), k.used), default=None)
    shared = common_prefix(state.tokens, tokens) if state is not None else 0
    if shared > max(shares.values()):
        into = max(free, key=lambda s: (not s.cached, -s.last_used, -s.id))
        return Choice(into, shared, state, save=bool(into.cached))
    common = shares[slot.id]
    return Choice(slot, common, None, save=bool(slot.cached) and common < len(slot.cached) / 2)


@dataclass(frozen=True)
class Reuse:
    """A chunk of a slot's cache that a prompt repeats past their shared prefix: ``n`` tokens at
    ``cached`` in the cache, at ``prompt`` in the prompt (its cells are moved there)."""

    cached: int
    prompt: int
    n: int
    hole: int = 0  # its first tokens whose sliding-window cells the cache lacks (``fit_window``)


_PROBE = 8  # tokens a chunk's start is looked up by before it is compared in full


def reuse_plan(cached: list[int], tokens: list[int], start: int, min_chunk: int, splice: bool) -> list[Reuse]:
    """The chunks of ``cached`` past ``start`` (the shared prefix) that ``tokens`` repeats, each at
    least ``min_chunk`` tokens, in the order of both (pure). Without ``splice``, llama-server's
    ``--cache-reuse`` rule: only a chunk that goes on where the reused part ends (the prompt left
    out some of the cached tokens), so every cell moves back onto room made free. With
    ``splice`` (a unified pool, where a chunk's cells can wait under another sequence id while
    the new tokens before it are read), also a chunk after new tokens (a line that changed in
    the middle). The prompt's last token is never reused: it is read for fresh logits."""
    if min_chunk <= 0:
        return []
    end = len(tokens) - 1
    probe = min(_PROBE, min_chunk)
    starts: dict[tuple[int, ...], list[int]] = {}
    for c in range(start, len(cached) - min_chunk + 1):
        starts.setdefault(tuple(cached[c:c + probe]), []).append(c)
    out: list[Reuse] = []
    p, c_min = start, start
    while p + min_chunk <= end:
        found = None
        for c in starts.get(tuple(tokens[p:p + probe]), ()):
            if c < c_min:
                continue
            n = common_prefix(cached[c:], tokens[p:end])
            if n >= min_chunk:
                found = Reuse(c, p, n)
                break
        if found is not None:
            out.append(found)
            p, c_min = p + found.n, found.cached + found.n
        elif splice:
            p += 1
        else:
            break
    return out


def fit_window(plan: list[Reuse], n_swa: int, missing: list[tuple[int, int]], splice: bool) -> list[Reuse]:
    """The chunks of ``plan`` a sliding-window model can reuse (pure), ``missing`` being the
    position ranges [start, end) of the cache whose sliding-window cells it lacks (a state loaded
    back holds only the window before its last token; ``Slot.holes``). A token read after a chunk
    attends to the ``n_swa - 1`` positions before it, so a chunk is kept only where the cells of
    its last ``n_swa - 1`` tokens are there; the positions it lacks further back are out of every
    later token's window, and are recorded in ``Reuse.hole``. A chunk that fails is read instead
    (always right), and without ``splice`` the chunks after it go too (they no longer follow the
    reused part). A model without a window (``n_swa`` 0) keeps them all."""
    if not n_swa:
        return plan
    out: list[Reuse] = []
    for r in plan:
        end, tail = r.cached + r.n, max(r.cached, r.cached + r.n - n_swa + 1)
        if any(a < end and b > tail for a, b in missing):
            if not splice:
                break
            continue
        lacked = max((min(b, end) for a, b in missing if a < end and b > r.cached), default=r.cached)
        out.append(Reuse(r.cached, r.prompt, r.n, lacked - r.cached))
    return out


def chunk_end(start: int, n_batch: int, n_ubatch: int) -> int:
    """Where a prompt chunk read from token ``start`` ends (pure): the last multiple of
    ``n_ubatch`` within ``n_batch`` tokens, counted from the prompt's first token, as a cold read
    of the whole prompt splits it (a token's logits depend in the last bits on the micro-batch it
    was read in); ``start + n_batch`` where no multiple falls in between."""
    end = (start + n_batch) // n_ubatch * n_ubatch
    return end if end > start else start + n_batch


class Sequence:
    """One generation in a slot: its prompt, sampler chain, stop state and progress."""

    _order = 0

    def __init__(self, rid: int, req: protocol.GenerationRequest, tokens: list[int], slot: Slot, common: int,
                 prompt_tail: str, chain, limit: int):
        Sequence._order += 1
        self.order = Sequence._order  # admission order: the oldest prompt is prefilled first
        self.rid, self.req, self.tokens, self.slot = rid, req, tokens, slot
        self.common, self.next, self.prompt_tail = common, common, prompt_tail
        self.source: str | None = None  # where the ``common`` tokens came from (``Slot.origin``)
        self.splices: list[Reuse] = []  # chunks of the cache parked until the prompt is read up to them
        self.runs: dict[int, Any] = {}  # its pictures and sounds by start (``media.Run``s)
        self.lookup: Any = None  # its tokens' n-grams, where it speculates (``speculation.Lookup``)
        self.drafted = self.kept_drafts = 0  # tokens proposed, and those the model agreed with
        self.pace = Pace()  # how much it proposes, where it speculates
        self.watch: Watch | None = None  # a proposal it did not draft, being checked (``speculation.paid``)
        self.parked_shift = 0  # how far the parked chunks' cells have moved so far
        self.marks: list[int] = []  # where its prompt's reading stops for a checkpoint (``checkpoints.marks``)
        self.chain = chain  # the native sampler chain (``Sampling.chain``); None: greedy
        self.limit = limit  # tokens it may generate: max_tokens, or the room left in the context
        self.top_n = req.logprobs  # None: no log-probabilities; N: the chosen token's and N alternatives
        self.deadline = req.deadline
        self.utf8, self.stops = Utf8Stream(), StopMatcher(req.stop or [])
        self.pending: int | None = None  # the last sampled token, decoded in the next step
        self.logit_row = 0  # and its row among the step's outputs
        self.n_gen = 0
        self.probs: list[dict[str, Any]] = []
        self.matched: str | None = None
        self.cancelled = False
        self.shown = False  # a text event has been sent (the first one is never held back)
        # a thinking budget: the answer's thinking is watched, and once it has taken the budget's
        # tokens, ``forced`` holds the tokens that close it, written before anything is sampled
        self.thinking = self.budget = None
        if req.reasoning and req.thinking_budget is not None:
            self.thinking = ReasoningSplitter(req.reasoning, prompt_tail)
            self.budget = req.thinking_budget
        self.n_thinking = 0
        self.forced: list[int] = []
        self.adapters: tuple[tuple[Any, float], ...] = ()  # its LoRA set (``adapters.Adapters.chosen``)
        self.alora_at = 0  # where that set starts, an aLoRA's (before: the base's; ``Adapters.activated``)

    def watch_thinking(self, piece: bytes, tokenize: Callable[..., list[int]]) -> None:
        """Count the answer's thinking tokens (a budget of N lets N through); at the budget, queue
        the tokens that end the thinking the way the model's format ends it (once: the watch
        stops there). A grammar constraining from the first token (a required call) owns the
        answer, so no budget is forced into it."""
        watch = self.thinking
        assert watch is not None and self.budget is not None
        was = watch.thinking
        watch.feed(piece.decode("utf-8", "replace"))
        if was:  # a token begun inside the thinking is a thinking token; the opening marker is not
            self.n_thinking += 1
        if watch.thinking and self.n_thinking >= self.budget:
            self.thinking = None
            if not (self.req.grammar and not self.req.grammar_triggers):
                self.forced = tokenize(closing(self.req.reasoning or "think"), add_special=False)

    def text_event(self, text: str) -> protocol.Text:
        event = protocol.Text(self.rid, text, self.n_gen, self.probs or None)
        self.probs = []
        return event

    def send_text(self, text: str, out: Outbox) -> None:
        """Queue the answer's next text (the per-token path: a frame without JSON unless the
        request asked for log-probabilities); after its first, it may be held."""
        if self.probs:
            out.send(self.text_event(text), hold=self.shown)
        else:
            out.put(protocol.text_frame(self.rid, text, self.n_gen), hold=self.shown)
        self.shown = True


class Batch:
    """A reusable ``llama_batch`` over numpy arrays: filling it costs slice copies, not a
    ctypes call per token. Each token belongs to one sequence; ``seq_id[i]`` points into a
    fixed array of sequence ids."""

    def __init__(self, ll, capacity: int, n_seqs: int):
        import numpy as np

        self.np = np
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.ones(capacity, np.int32)
        self.logits = np.zeros(capacity, np.int8)
        self.seq_ids = np.arange(n_seqs, dtype=np.int32)
        self.seq_ptr = np.zeros(capacity, np.uintp)
        self.addr = [self.seq_ids.ctypes.data + 4 * i for i in range(n_seqs)]
        b = self.struct = ll.llama_batch()
        b.token = self.token.ctypes.data_as(ctypes.POINTER(ll.llama_token))
        b.pos = self.pos.ctypes.data_as(ctypes.POINTER(ll.llama_pos))
        b.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b.seq_id = ctypes.cast(self.seq_ptr.ctypes.data, ctypes.POINTER(ctypes.POINTER(ll.llama_seq_id)))
        b.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        b.n_tokens = 0

    def clear(self) -> None:
        self.struct.n_tokens = 0

    def add(self, tokens: list[int], pos: int, seq: int, want_logits: int) -> None:
        """Append ``tokens`` of sequence ``seq`` from position ``pos``, the last ``want_logits``
        of them with their logits."""
        a = self.struct.n_tokens
        b = a + len(tokens)
        if len(tokens) == 1:
            self.token[a], self.pos[a] = tokens[0], pos
        else:
            self.token[a:b] = tokens
            self.pos[a:b] = self.np.arange(pos, pos + len(tokens), dtype=self.np.int32)
        self.seq_ptr[a:b] = self.addr[seq]
        self.logits[a:b] = 0
        if want_logits:
            self.logits[b - want_logits:b] = 1
        self.struct.n_tokens = b
