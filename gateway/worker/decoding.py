"""The decode loop's work: continuous batching over the context's sequence slots.

``Decoder.admit`` gives a prepared request the free slot whose cache shares the longest prefix
with its prompt, or loads into a slot the state the prompt cache kept (``promptcache.PromptCache``)
that shares a longer one, keeping the slot's own cache there first; ``Decoder.step`` advances
every active sequence by one ``llama_decode`` for the tokens they sampled last, then prompt
chunks while the step's budget lasts; each sequence's next token is chosen (``sampling``), its
text matched against the stops and queued (``outbox``), and a sequence that ends (a stop, its
length, a cancel, its deadline) frees its slot with a done event. Only the worker's main loop
calls this, between two polls of its inbox.
"""

from __future__ import annotations

import sys
import time

from .. import protocol
from . import checkpoints, media, savedslots
from .adapters import AdapterSet
from .generation import Generation
from .model import Model
from .outbox import Outbox
from .promptcache import PromptCache
from .refusals import failure
from .sampling import Sampling
from .slots import Batch, Sequence, Slot, choose, chunk_end, reusable

# Seconds of steps an adapter set keeps the decode while sequences under other sets wait
# (``Decoder._turn``): long enough that switching sets, a few milliseconds of llama.cpp planning
# its graph again, costs little; short enough that a waiting stream's next tokens come soon.
TURN = 0.1


class Decoder(Generation):
    def __init__(self, model: Model, sampling: Sampling, out: Outbox):
        super().__init__(model, sampling, out)
        self.model = model
        self.n_ctx, self.n_batch, self.n_ubatch = model.n_ctx, model.n_batch, model.cp.n_ubatch
        self.n_swa = model.n_swa
        self.swa_full = model.params.swa_full
        self.slots = [Slot(i) for i in range(model.n_slots)]
        self.batch = Batch(model.ll, model.n_batch, model.n_slots)
        keep = model.params.prompt_cache_bytes
        self.cache = PromptCache(model.ll, model.ctx, keep) if keep and not model.params.embeddings else None
        self.last_step = 0.0  # seconds the last decode step took, sampling included
        self.adapters = model.adapters
        # each running adapter set's last turn (``_turn``): when it ended, and the set whose turn it is
        self.turns: dict[tuple[tuple[int, float], ...], float] = {}
        self.turn: tuple[tuple[int, float], ...] | None = None
        self.turn_began = 0.0

    def admit(self, rid: int, req: protocol.GenerationRequest, tokens: list[int], prompt_tail: str,
              runs: dict[int, media.Run] | None = None) -> Sequence:
        """Give a prepared request (``Prompts.prepare``) the free slot whose cache shares the
        longest prefix with its prompt, or the one a kept state that shares a longer one is loaded
        into (``slots.choose``), and drop the rest of that slot's cache (kept to whole pictures:
        ``media.floor``). Raises ``Refused``."""
        n_prompt = len(tokens)
        max_tokens = req.max_tokens
        room = self.n_ctx - n_prompt
        chosen = self.adapters.chosen(req.adapter, req.lora)  # before "start": an adapter it has not is a 400
        chosen, alora_at = self.adapters.activated(chosen, tokens)
        chain = self.sampling.chain(req)  # likewise: a grammar that does not parse
        scope = self.adapters.scope(req.cache_scope, chosen, alora_at)  # a cache made under other adapters is not its
        cache = self.cache
        choice = choose(self.free_slots(), cache.entries if cache else [], tokens, scope, cache is not None)
        slot = choice.slot
        if cache is not None:
            kept = cache.take(choice.kept) if choice.kept is not None else None  # safe from the room made below
            # another conversation's: kept before it is overwritten (not one the prompt reuses most of)
            if choice.save and (choice.kept is not None
                                or self.memory.keeps(slot, tokens, choice.common) < len(slot.cached) / 2):
                # the prefix the prompt keeps of this slot's own cache (none where a kept state replaces it)
                mine = 0 if choice.kept is not None else choice.common
                self._keep(slot, max(slot.prompt_end, mine), mine)
            if kept is not None:
                self.memory.release(slot)
                slot.origin = kept.origin if cache.restore(kept, slot) else "slot"  # failed: empty
        # At least one prompt token is decoded, for fresh logits.
        common = media.floor(runs or {}, min(reusable(slot, tokens, scope), n_prompt - 1))
        end, parked = self.memory.prepare(slot, tokens, common)
        if runs and media.floor(runs, end) != end:  # a checkpoint inside a picture: read it whole
            end, parked = self.memory.prepare(slot, tokens, media.floor(runs, end))
        slot.scope = scope
        seq = slot.seq = Sequence(rid, req, tokens, slot, end, prompt_tail, chain,
                                  max_tokens if max_tokens is not None else room)
        seq.adapters, seq.alora_at = chosen, alora_at
        seq.splices, seq.runs = parked, runs or {}
        self.speculate(seq, tokens)
        if self.n_swa and not self.swa_full and self.memory.keep_checkpoints:
            seq.marks = checkpoints.marks(end, n_prompt, self.n_ubatch)
        seq.common = end + sum(r.n for r in parked)
        seq.source = slot.origin if seq.common else None
        slot.origin, slot.prompt_end = "slot", n_prompt  # from here on, what it holds is its own decoding
        return seq

    def _keep(self, slot: Slot, upto: int, floor: int) -> None:
        """Keep ``slot``'s cache in the prompt cache before it is overwritten. A sliding-window
        model's state holds only the window before its last token, so the slot is cut where its
        prompt ended first (what it generated after is what a returning prompt most often differs
        in), and where every position is kept (``swa_full``) its checkpoints are taken now, by
        cutting it back to each mark in turn (never below ``floor``, the prefix the next prompt
        keeps): its prompt was read without stopping at them, as a cold read is."""
        assert self.cache is not None
        if self.n_swa and not self.memory.holds_window(slot, min(upto, len(slot.cached))):
            return  # a chunk moved in lacks cells its window needs (``Slot.holes``): a state would too
        if self.cache.save(slot, upto if self.n_swa else None):
            self.cache.attach(self.memory.checkpoints_behind(slot, floor))

    def free_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.seq is None]

    def active(self) -> list[Sequence]:
        return [s.seq for s in self.slots if s.seq is not None]

    def save_caches(self) -> None:
        """The slots' and the prompt cache's states into ``kv_cache_dir``, for the next load (a
        failure loses them only)."""
        params = self.model.params
        if not params.kv_cache_dir:
            return
        try:
            savedslots.save(self.model, self.slots, params.kv_cache_dir, params.kv_cache_max_bytes,
                            self.cache.entries if self.cache is not None else [], self.memory.checkpoints_behind)
        except Exception as e:  # a full disk, a directory we may not write
            sys.stderr.write(f"could not save the KV caches of {params.name}: {e}\n")

    def forget_cache(self) -> None:
        """The context's memory was cleared (an embedding pass): no slot holds cached tokens."""
        for slot in self.slots:
            slot.keep(0)

    def _forget_idle(self) -> bool:
        """Drop the caches of the slots no request holds (what a full shared pool can give back);
        whether there were any."""
        idle = [s for s in self.slots if s.seq is None and s.cached]
        for slot in idle:
            if self.cache is not None:
                self._keep(slot, slot.prompt_end, 0)
            self.memory.empty(slot)
        return bool(idle)

    def step(self) -> None:
        """Advance every active sequence: one llama_decode for the token each generating sequence
        sampled last, then prompt chunks of the prefilling ones (oldest first) while the step's
        budget of ``n_batch`` tokens lasts, so a long prompt never stops the streams running.

        Each prompt chunk is its own llama_decode (llama.cpp splits a batch over several sequences
        into micro-batches of equal counts per sequence, and a token's logits depend in the last
        bits on the micro-batch it was read in), ending where a cold read of the whole prompt
        splits it (``chunk_end``): a greedy answer does not change with the load (with the
        kernels of ``repack: false``), nor with a cached opening."""
        now = time.time()
        running = []
        for seq in self.active():
            if seq.cancelled:
                self.finish(seq, "cancelled")
            elif seq.deadline is not None and now >= seq.deadline:
                self.finish(seq, "length")  # server.request_timeout
            else:
                running.append(seq)
        if not running:
            return
        running = self._turn(running)
        t0 = time.monotonic()
        generating = [seq for seq in running if seq.pending is not None]
        room = (self.n_batch - len(generating)) // max(1, len(generating))  # each one's share of the drafts
        drafts = self.drafts([(seq, min(room, self.n_ctx - len(seq.slot.cached) - 1, seq.limit - seq.n_gen - 1))
                              for seq in generating]) if self.spec or self.drafter else {}
        drafted = [(seq, [tok, *drafts.get(seq.slot.id, [])]) for seq in generating if (tok := seq.pending) is not None]
        prefilling = sorted((s for s in running if s.pending is None), key=lambda s: s.order)
        if self.out.holding and prefilling:
            self.out.flush()  # a prompt chunk makes this step long: held text goes out first
        budget = self.n_batch
        if generating:
            # llama.cpp splits a batch over separate per-sequence caches into runs of consecutive
            # sequence ids: ordered by slot, neighbours share one pass over the weights.
            self._decode(sorted(((seq, part, len(part)) for seq, part in drafted), key=lambda c: c[0].slot.id))
            budget -= sum(len(part) for _, part in drafted)
        for seq in prefilling:
            if budget <= 0:  # never before the first: a prefilling slot leaves budget
                break
            run = seq.runs.get(seq.next)
            if run is not None:  # a picture or sound, encoded on a prep thread: its embeddings
                budget -= self._read_media(seq, run)
                continue
            end = media.next_start(seq.runs, seq.next, len(seq.tokens))
            stop = min(seq.splices[0].prompt if seq.splices else end, seq.marks[0] if seq.marks else end, end,
                       seq.alora_at if seq.next < seq.alora_at else end)  # an aLoRA's start: a set of its own
            part = seq.tokens[seq.next:min(chunk_end(seq.next, self.n_batch, self.n_ubatch), stop)]
            self._decode([(seq, part, int(seq.next + len(part) == len(seq.tokens)))])
            budget -= len(part)
        self.last_step = time.monotonic() - t0

    def _turn(self, running: list[Sequence]) -> list[Sequence]:
        """The running sequences this step decodes, their adapters set on the context: all of them
        where they share one LoRA set (llama.cpp applies a set to a whole decode), else those of
        the set whose turn it is. A set keeps its turn for ``TURN`` seconds of steps, then the
        set that has waited longest takes it: every set progresses, and a change of set (llama.cpp
        plans its graph again at the next decode) is paid once a turn, not once a step."""
        if not self.adapters.table and not self.adapters.current:
            return running
        groups: dict[tuple[tuple[int, float], ...], list[Sequence]] = {}
        for seq in running:
            groups.setdefault(tuple((id(a), s) for a, s in _set_of(seq)), []).append(seq)
        now = time.monotonic()
        key = self.turn
        if key not in groups or (len(groups) > 1 and now - self.turn_began >= TURN):
            others = [k for k in groups if k != key] or list(groups)
            key = min(others, key=lambda k: (self.turns.get(k, 0.0), min(s.order for s in groups[k])))
            self.turn, self.turn_began = key, now
        self.turns = {k: self.turns.get(k, 0.0) for k in groups}  # only the sets running now are kept
        self.turns[key] = now
        turn = groups[key]
        self.adapters.apply(_set_of(turn[0]))
        return turn

    def _decode(self, chunks: list[tuple[Sequence, list[int], int]]) -> None:
        """One llama_decode of ``chunks`` (sequence, tokens, how many of its last tokens' logits
        are wanted: a pending token's drafts are each read), then the next token of each sequence
        whose logits came back."""
        batch = self.batch
        batch.clear()
        row = 0
        for seq, part, want in chunks:
            batch.add(part, len(seq.slot.cached), seq.slot.id, want)
            seq.logit_row, row = row, row + want  # outputs are stored in batch order: its first
        rc = self.ll.llama_decode(self.ctx, batch.struct)
        if rc == 1 and self._forget_idle():  # a shared pool (kv_unified) is full: idle slots' caches make room
            rc = self.ll.llama_decode(self.ctx, batch.struct)
        self.sampling.logits_base = None  # the decode may have moved llama.cpp's logits
        if rc != 0:
            return self._failed([seq for seq, _, _ in chunks], rc)
        for seq, part, want in chunks:
            self._advance(seq, part)
            if want:
                try:
                    self._verify(seq, part) if want > 1 else self._next_token(seq)
                except Exception as e:  # a bug here must fail one request, not the others
                    self.drop(seq)
                    self.memory.empty(seq.slot)
                    self.out.send(failure(seq.rid, e))

    def _read_media(self, seq: Sequence, run: media.Run) -> int:
        """Evaluate a picture's (or a sound's) embeddings into the sequence's slot: the tokens
        it took of the step's budget. A prompt never ends with one (``Prompts.with_media``)."""
        assert self.projector is not None
        rc = self.projector.decode(self.ctx, run, seq.slot.id, len(seq.slot.cached), self.n_batch)
        self.sampling.logits_base = None
        self._failed([seq], rc) if rc else self._advance(seq, run.tokens)
        return run.n_tokens

    def _advance(self, seq: Sequence, part: list[int]) -> None:
        """What a decode added to a sequence's slot: its cells pinned, its tokens, and where its
        prompt's reading stands (chunks spliced in, checkpoints taken there)."""
        self.memory.pin(seq.slot, len(seq.slot.cached))
        seq.slot.cached.extend(part)
        if seq.pending is None:
            seq.next += len(part)
            while seq.splices and seq.splices[0].prompt == seq.next:
                self.memory.splice(seq)
            while seq.marks and seq.marks[0] <= seq.next:
                if seq.marks.pop(0) == seq.next:
                    self.memory.checkpoint(seq.slot)


def _set_of(seq: Sequence) -> AdapterSet:
    """The adapters ``seq``'s next decode runs under: its set, or the base's for the part of its
    prompt before an aLoRA's start (``Adapters.activated``)."""
    return () if seq.pending is None and seq.next < seq.alora_at else seq.adapters
