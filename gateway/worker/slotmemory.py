"""What a slot's cache keeps of a new prompt, carried out in llama.cpp's memory.

``SlotMemory.prepare`` is the one place a slot's cache is cut to a new prompt: it keeps the
shared prefix, moves the chunks that ``slots.reuse_plan`` finds past the first difference
(``cache_reuse``, llama-server's ``--cache-reuse``) or parks them under the slot's second
sequence id until the tokens before them are read (``splice``: a unified pool only, where cells
can belong to two ids), and where the cache cannot be cut there (a recurrent or hybrid model, a
sliding-window cache that has dropped positions the next token attends to) goes on from the
latest context checkpoint before it (``worker/checkpoints``), else empties it. The decoder calls
``splice`` when a prefilling sequence reaches a parked chunk and ``checkpoint`` at a mark.
Only the worker's main loop calls this.
"""

from __future__ import annotations

from . import checkpoints
from .checkpoints import Checkpoint
from .model import Model
from .slots import Reuse, Sequence, Slot, fit_window, reuse_plan


class SlotMemory:
    def __init__(self, model: Model):
        self.ll, self.ctx, self.mem = model.ll, model.ctx, model.mem
        self.n_slots, self.n_swa = model.n_slots, model.n_swa  # (the window whatever ``swa_full`` says)
        # cache_reuse's minimum chunk (0: off); whether chunks may be parked (a unified pool)
        self.reuse, self.splice_on = model.cache_reuse, model.splice
        self.pin_base = model.pin_base if model.pin else None
        self.keep_checkpoints = model.params.ctx_checkpoints  # per slot
        self.swa_full, self.n_ubatch = model.params.swa_full, model.cp.n_ubatch

    def prepare(self, slot: Slot, tokens: list[int], common: int) -> tuple[int, list[Reuse]]:
        """Cut ``slot``'s cache to what ``tokens`` can keep of it, ``common`` being the prefix they
        share: how many of the prompt's first tokens it then holds, and the chunks parked to be
        moved in later (``splice``). The slot's tokens, checkpoints and holes follow.

        Where the cache lacks the window before ``common`` (a state loaded back) but a checkpoint
        before it serves, the prompt is read on from the checkpoint, and in a unified pool the
        chunks past ``common`` are still parked and spliced in behind it."""
        ll, mem = self.ll, self.mem
        held = self.holds_window(slot, common)
        plan: list[Reuse] = []
        if self.reuse and len(slot.cached) > common and \
                (held or self.splice_on and checkpoints.pick(slot.checkpoints, common) is not None):
            plan = fit_window(reuse_plan(slot.cached, tokens, common, self.reuse, self.splice_on),
                              self.n_swa, self.missing(slot), self.splice_on)
        slot.keep(common)
        end, parked = self._move(slot, common, plan, in_place=held)
        if not ll.llama_memory_seq_rm(mem, slot.id, end, -1) or not self.holds_window(slot, end):
            # recurrent and hybrid models cannot cut a sequence in the middle, and a sliding-window
            # cache may have dropped positions the next token attends to: go on from the latest
            # checkpoint before ``end``, else start it afresh
            end = self._from_checkpoint(slot, end)
            if parked and not end:
                self.unpark(slot)
                parked = []
        slot.cached = tokens[:end]  # the shared prefix and the chunks moved behind it
        slot.keep(end)
        self.pin(slot)
        return end, parked

    def pin(self, slot: Slot, since: int = -1) -> None:
        """Hold the slot's cells from position ``since`` on (all of them, and those of the chunks
        parked for it, by default) under its pin id as well, so that llama.cpp gives none of them
        to another sequence once the window masks it (``Model.pin``): all after its cache is cut
        (what it let go of goes), the new ones after each decode adds to it."""
        if self.pin_base is not None:
            ll, mem, pin = self.ll, self.mem, self.pin_base + slot.id
            if since < 0:
                self.release(slot)
                if self.splice_on:
                    ll.llama_memory_seq_cp(mem, slot.id + self.n_slots, pin, -1, -1)
            ll.llama_memory_seq_cp(mem, slot.id, pin, since, -1)

    def release(self, slot: Slot) -> None:
        """Let go of what the slot's pin id holds (before its cache is replaced: the cells it
        drops are free for the state loaded in its place)."""
        if self.pin_base is not None:
            self.ll.llama_memory_seq_rm(self.mem, self.pin_base + slot.id, -1, -1)

    def cut(self, slot: Slot, n: int) -> None:
        """Drop the slot's cells from position ``n`` on (a speculation's drafts the model did
        not keep), its pin's too."""
        self.ll.llama_memory_seq_rm(self.mem, slot.id, n, -1)
        if self.pin_base is not None:
            self.ll.llama_memory_seq_rm(self.mem, self.pin_base + slot.id, n, -1)
        slot.keep(n)

    def empty(self, slot: Slot) -> None:
        """Drop all the slot holds (its cells, its tokens, its pin)."""
        self.ll.llama_memory_seq_rm(self.mem, slot.id, -1, -1)
        slot.keep(0)
        self.release(slot)

    def keeps(self, slot: Slot, tokens: list[int], common: int) -> int:
        """How many of the slot's cached tokens a prompt sharing ``common`` of them keeps: the
        prefix, and with ``cache_reuse`` the chunks it repeats past it."""
        if not self.reuse or len(slot.cached) <= common:
            return common
        return common + sum(r.n for r in reuse_plan(slot.cached, tokens, common, self.reuse, self.splice_on))

    def _move(self, slot: Slot, common: int, plan: list[Reuse], in_place: bool) -> tuple[int, list[Reuse]]:
        """Carry out ``reuse_plan``'s chunks: each that goes on where the reused part ends has its
        cells moved back onto the room the left-out tokens leave (as llama-server's
        ``--cache-reuse``; not where the cache is to go on from a checkpoint before ``common``,
        ``in_place`` False); the others are parked under the slot's second id."""
        ll, mem, sid = self.ll, self.mem, slot.id
        end, i = common, 0
        while in_place and i < len(plan) and plan[i].prompt == end:
            r = plan[i]
            ll.llama_memory_seq_rm(mem, sid, end, r.cached)
            ll.llama_memory_seq_add(mem, sid, r.cached, r.cached + r.n, end - r.cached)
            if r.hole:
                slot.holes.append((end, end + r.hole))
            end, i = end + r.n, i + 1
        parked = plan[i:]
        for r in parked:  # a unified pool's cells can belong to both ids
            ll.llama_memory_seq_cp(mem, sid, sid + self.n_slots, r.cached, r.cached + r.n)
        return end, parked

    def splice(self, seq: Sequence) -> None:
        """The prompt has been read up to its next parked chunk: move the chunk's cells there (with
        every chunk parked after it, so that none overlaps another) and give them back to the slot."""
        ll, mem, r = self.ll, self.mem, seq.splices.pop(0)
        sid = seq.slot.id
        scratch = sid + self.n_slots
        at = r.cached + seq.parked_shift  # where its cells wait now
        ll.llama_memory_seq_add(mem, scratch, at, -1, r.prompt - at)
        seq.parked_shift += r.prompt - at
        ll.llama_memory_seq_cp(mem, scratch, sid, r.prompt, r.prompt + r.n)
        ll.llama_memory_seq_rm(mem, scratch, r.prompt, r.prompt + r.n)
        seq.slot.cached.extend(seq.tokens[r.prompt:r.prompt + r.n])
        if r.hole:
            seq.slot.holes.append((r.prompt, r.prompt + r.hole))
        seq.next += r.n

    def unpark(self, slot: Slot) -> None:
        """Drop what waits under the slot's second id (its request ended before the splice)."""
        if self.splice_on:
            self.ll.llama_memory_seq_rm(self.mem, slot.id + self.n_slots, -1, -1)

    def _from_checkpoint(self, slot: Slot, upto: int) -> int:
        """Load the slot's latest checkpoint at or before ``upto`` and cut the rest of its cache
        there; how many tokens it then holds (0, the cache emptied, where none serves)."""
        ll, mem = self.ll, self.mem
        cp = checkpoints.pick(slot.checkpoints, upto)
        if cp is not None and checkpoints.restore(ll, self.ctx, slot.id, cp) \
                and ll.llama_memory_seq_rm(mem, slot.id, cp.n_tokens, -1) and self.holds_window(slot, cp.n_tokens):
            return cp.n_tokens
        ll.llama_memory_seq_rm(mem, slot.id, -1, -1)
        return 0

    def checkpoint(self, slot: Slot) -> None:
        """Keep a checkpoint of what the slot holds now (the latest ``ctx_checkpoints``)."""
        n = len(slot.cached)
        cp = checkpoints.take(self.ll, self.ctx, slot.id, n)
        if cp is not None:
            slot.checkpoints = ([c for c in slot.checkpoints if c.n_tokens != n] + [cp])[-self.keep_checkpoints:]

    def checkpoints_behind(self, slot: Slot, floor: int = 0) -> list[Checkpoint]:
        """Checkpoints of what a slot holding every position (``swa_full``) caches, as it is kept
        or saved at an exit, taken by cutting it back to each point, the latest first, never
        below ``floor``; oldest first. At the marks near its prompt's end (the latest
        ``ctx_checkpoints``), and one each window of ``n_swa`` tokens before: a state loaded back
        holds only its last window, and with these it holds, as the slot did, every position, so
        that a prompt that changes anywhere goes on from the window before the change (the
        prompt cache's bound holds them with the state). A point whose window the slot lacks is
        passed over. None without ``swa_full`` (a slot takes its own as its prompt is read)."""
        if not (self.n_swa and self.swa_full and self.keep_checkpoints):
            return []
        ll, mem = self.ll, self.mem
        ends = checkpoints.marks(0, len(slot.cached), self.n_ubatch)[-self.keep_checkpoints:]
        spread = range(self.n_swa, len(slot.cached), self.n_swa)
        out: list[Checkpoint] = []
        for m in sorted({*ends, *spread}, reverse=True):
            if m < max(floor, 1) or not ll.llama_memory_seq_rm(mem, slot.id, m, -1):
                break
            slot.keep(m)
            if self.holds_window(slot, m) and (cp := checkpoints.take(ll, self.ctx, slot.id, m)) is not None:
                out.insert(0, cp)
        return out

    def missing(self, slot: Slot) -> list[tuple[int, int]]:
        """The positions [start, end) whose sliding-window cells the slot's cache lacks: before its
        oldest cell (a state loaded back holds only its last window), and its holes."""
        oldest = self.ll.llama_memory_seq_pos_min(self.mem, slot.id)
        return [(0, oldest if oldest >= 0 else len(slot.cached)), *slot.holes]

    def holds_window(self, slot: Slot, common: int) -> bool:
        """Whether the slot's cache still holds every position that a token at ``common`` attends
        to. A sliding-window layer's cache (without ``swa_full``) overwrites positions that fell
        out of the window of the sequence's newest token, and a state loaded back holds only that
        window (with ``swa_full`` too); cutting the sequence back to ``common`` moves the window
        back onto them. A token at ``common`` attends to the positions after ``common - n_swa``
        (llama.cpp masks p0 where ``p1 - p0 >= n_swa``; a chunked window needs fewer), so the
        oldest position held must be at most ``common - n_swa + 1`` (llama-server's test asks for
        one more, and so never takes a state back to read its last token again), and the newest
        at least ``common - 1``: a window loaded back that lies wholly past ``common`` is gone
        once the sequence is cut there, and a sequence with no cell (-1) holds nothing."""
        if not self.n_swa or common == 0:
            return True
        ll, mem = self.ll, self.mem
        oldest, newest = ll.llama_memory_seq_pos_min(mem, slot.id), ll.llama_memory_seq_pos_max(mem, slot.id)
        first = max(0, common - self.n_swa + 1)
        return 0 <= oldest <= first and newest >= common - 1 and all(b <= first or a >= common for a, b in slot.holes)
