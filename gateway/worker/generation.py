"""A generating sequence's tokens: each next one chosen (greedy, or the request's sampler
chain), its text matched against the stops and queued, and the sequence's end (a stop, its
length, its deadline, a failed decode) with its done event. ``Decoder`` (``decoding``) is a
``Generation``: it admits requests and makes the decode steps whose logits this reads.
"""

from __future__ import annotations

import time
from itertools import takewhile

from .. import protocol
from .model import Model
from .outbox import Outbox
from .refusals import decode_failed
from .sampling import Sampling
from .slotmemory import SlotMemory
from .slots import Sequence, common_prefix
from .speculation import Lookup, Watch, accepted, paced, paid


class Generation:
    def __init__(self, model: Model, sampling: Sampling, out: Outbox):
        params = model.params
        self.spec = (params.spec_ngram_size_n, params.spec_ngram_size_m) if params.spec_type == "ngram" else None
        self.drafter = model.drafter
        # most tokens a step: the draft model's draft_max, prompt lookup's spec_ngram_size_m
        self.cap = params.draft_max if self.drafter is not None else params.spec_ngram_size_m
        self.ll, self.ctx, self.mem = model.ll, model.ctx, model.mem
        self.sampling, self.out = sampling, out
        self.memory = SlotMemory(model)
        self.projector = model.projector
        # bound once: called for every token
        self._logits, self._sample = sampling.logits, sampling.sample
        self._is_eog, self._piece = model.vocab.is_eog, model.vocab.piece
        self._tokenize = model.vocab.tokenize

    def _failed(self, seqs: list[Sequence], rc: int) -> None:
        """A decode failed: its sequences end with an error, their slots emptied."""
        for seq in seqs:
            self.drop(seq)
            self.memory.empty(seq.slot)
            self.out.send(decode_failed(seq.rid, rc))

    def _next_token(self, seq: Sequence) -> None:
        tok: int | None
        if seq.forced:  # a thinking budget ran out: its closing marker is written, not sampled
            tok = seq.forced.pop(0)
            if seq.chain is not None:
                self.ll.llama_sampler_accept(seq.chain, tok)
        elif seq.chain is not None:
            tok = self._sample(seq.chain, seq.logit_row)
            if tok is None:
                return self.finish(seq, "stop")
        else:
            logits = self._logits(seq.logit_row)
            tok = int(logits.argmax())  # the first of equal maxima, as llama.cpp's greedy sampler
            if seq.req.ignore_eos and self._is_eog(tok):
                tok = self.sampling.argmax_without_eog(logits)
        if self._is_eog(tok):
            return self.finish(seq, "stop")
        seq.n_gen += 1
        if seq.lookup is not None:
            seq.lookup.extend((tok,))
        if seq.watch is not None and (settled := seq.watch.see(tok)) is not None:
            seq.watch = None  # what it would have kept, drafted, counts as if it had been
            seq.pace = paced(seq.pace, *settled, self.cap)
        if seq.top_n is not None:
            seq.probs.append(self.sampling.logprobs(tok, seq.top_n, seq.logit_row))
        piece = self._piece(tok)
        if seq.thinking is not None:
            seq.watch_thinking(piece, self._tokenize)
        text, matched = seq.stops.feed(seq.utf8.feed(piece))
        if text:
            seq.send_text(text, self.out)
        if matched is not None:
            seq.matched = matched
            return self.finish(seq, "stop")
        if seq.n_gen >= seq.limit or (seq.deadline is not None and time.time() >= seq.deadline):
            return self.finish(seq, "length")  # max_tokens, the context, or server.request_timeout
        seq.pending = tok

    def speculate(self, seq: Sequence, tokens: list[int]) -> None:
        """Index a prompt's tokens for prompt lookup, where the model speculates."""
        if self.spec is not None:
            seq.lookup = Lookup(tokens, *self.spec)

    def drafts(self, wants: list[tuple[Sequence, int]]) -> dict[int, list[int]]:
        """By slot, the tokens proposed to follow each generating sequence's pending one, at most
        its ``room``: the draft model's (``drafting``), else prompt lookup's; none while a thinking
        budget's closing marker is being written, its pace says wait or its last proposal is still
        watched, never a picture's stand-in. Beside other sequences' rows, a sequence drafts what
        its credit pays for, and a proposal it cannot pay for at all is watched instead
        (``speculation.paid``)."""
        ready = []
        alone = len(wants) <= 1  # no other generating sequence's rows in the step (``speculation.draft_length``)
        for seq, room in wants:
            if seq.forced or seq.pending is None or seq.watch is not None:
                continue
            if seq.pace.wait:  # its proposals kept missing: it waits (``speculation.paced``)
                seq.pace = paced(seq.pace, 0, 0, self.cap)
            else:
                ready.append((seq, min(room, seq.pace.cap)))
        if self.drafter is not None:
            proposed = self.drafter.propose([(seq.slot.id, seq.slot.cached, tok, room) for seq, room in ready
                                             if not seq.runs and (tok := seq.pending) is not None])
        else:
            proposed = {seq.slot.id: list(takewhile(lambda t: t >= 0, seq.lookup.propose(room, seq.pace, alone)))
                        for seq, room in ready if seq.lookup is not None}
        out = {}
        for seq, _ in ready:
            proposal = proposed.get(seq.slot.id)
            if proposal:
                k = paid(len(proposal), seq.pace, alone)
                if not k:
                    seq.watch = Watch(proposal)
                out[seq.slot.id] = proposal[:k]
        return out

    def _verify(self, seq: Sequence, part: list[int]) -> None:
        """Read the logits of the pending token and its drafts (``part``, just decoded) in order
        (``speculation.accepted``): each next token chosen as without speculation, the drafts
        kept while the model agrees, the cells of the rest dropped."""
        base, start, draft = seq.logit_row, len(seq.slot.cached) - len(part), part[1:]

        def pick(i: int) -> int | None:
            if seq.slot.seq is not seq:
                return None
            seq.logit_row = base + i
            self._next_token(seq)
            return seq.pending if seq.slot.seq is seq else None

        good = 1 + common_prefix(accepted(draft, pick), draft)  # the cells the kept tokens read
        seq.drafted += len(draft)
        seq.kept_drafts += good - 1
        seq.pace = paced(seq.pace, len(draft), good - 1, self.cap)
        if good < len(part):
            self.memory.cut(seq.slot, start + good)

    def finish(self, seq: Sequence, finish: str) -> None:
        """End a sequence: the rest of its text (what the stop matcher and the UTF-8 decoder held
        back, unless a stop matched or it was cancelled), then its done event."""
        if seq.matched is None and finish != "cancelled":
            tail, matched = seq.stops.feed(seq.utf8.flush())
            tail += seq.stops.flush()
            if tail:
                self.out.send(seq.text_event(tail))  # with the done event that follows
            if matched is not None:
                seq.matched, finish = matched, "stop"
        self.drop(seq)
        self.out.send(protocol.Done(seq.rid, finish, seq.matched, len(seq.tokens), seq.n_gen, seq.common, seq.source,
                               seq.drafted, seq.kept_drafts))

    def drop(self, seq: Sequence) -> None:
        """Free the sequence's slot; its cache stays for the next request to reuse."""
        if seq.splices:
            seq.splices = []
            self.memory.unpark(seq.slot)
        if seq.runs and self.projector is not None:
            self.projector.free(seq.runs)
        if seq.slot.seq is seq:
            seq.slot.seq = None
            seq.slot.last_used = time.monotonic()
            if seq.chain is not None:
                self.sampling.free(seq.chain)
