"""The context's sequence slots and what runs in them.

A ``Slot`` is one sequence of the context (one cache stream) and the tokens cached in it; a
``Sequence`` is one generation in a slot (its prompt, sampler chain, stop state and progress);
``slot_score`` is how a prompt picks among free slots (the longest shared prefix); ``Batch`` is
the reusable ``llama_batch`` a decode step fills.
"""

from __future__ import annotations

import ctypes
from typing import Any

from ..text.reasoning import ReasoningSplitter
from ..text.textstream import StopMatcher, Utf8Stream
from . import ipc
from .outbox import Outbox


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens ``a`` and ``b`` share from the start."""
    n = 0
    for x, y in zip(a, b):
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


class Sequence:
    """One generation in a slot: its prompt, sampler chain, stop state and progress."""

    _order = 0

    def __init__(self, rid: int, req: ipc.GenerationRequest, tokens: list[int], slot: Slot, common: int,
                 prompt_tail: str, chain, limit: int):
        Sequence._order += 1
        self.order = Sequence._order  # admission order: the oldest prompt is prefilled first
        self.rid, self.req, self.tokens, self.slot = rid, req, tokens, slot
        self.common, self.next, self.prompt_tail = common, common, prompt_tail
        self.chain = chain  # the native sampler chain (``Sampling.chain``); None: greedy
        self.limit = limit  # tokens it may generate: max_tokens, or the room left in the context
        self.top_n = req.logprobs  # None: no log-probabilities; N: the chosen token's and N alternatives
        self.deadline = req.deadline
        self.utf8, self.stops = Utf8Stream(), StopMatcher(req.stop or [])
        self.pending: int | None = None  # the last sampled token, decoded in the next step
        self.logit_index = -1  # this step's batch entry with its logits (for llama_sampler_sample)
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

    def text_event(self, text: str) -> ipc.Text:
        event = ipc.Text(self.rid, text, self.n_gen, self.probs or None)
        self.probs = []
        return event

    def send_text(self, text: str, out: Outbox) -> None:
        """Queue the answer's next text (the per-token path: a frame without JSON unless the
        request asked for log-probabilities); after its first, it may be held."""
        if self.probs:
            out.send(self.text_event(text), hold=self.shown)
        else:
            out.put(ipc.text_frame(self.rid, text, self.n_gen), hold=self.shown)
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

    def add(self, tokens: list[int], pos: int, seq: int, want_logits: bool) -> int:
        """Append ``tokens`` of sequence ``seq`` from position ``pos``; the index of the last one."""
        a = self.struct.n_tokens
        b = a + len(tokens)
        if len(tokens) == 1:
            self.token[a], self.pos[a] = tokens[0], pos
        else:
            self.token[a:b] = tokens
            self.pos[a:b] = self.np.arange(pos, pos + len(tokens), dtype=self.np.int32)
        self.seq_ptr[a:b] = self.addr[seq]
        self.logits[a:b] = 0
        self.logits[b - 1] = want_logits
        self.struct.n_tokens = b
        return b - 1
