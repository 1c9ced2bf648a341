"""Speculative decoding with a draft model (models.yaml ``draft:``, llama-server's ``-md``): a
smaller model of the same vocabulary, loaded in the model's worker with a sequence per slot,
proposes the next tokens greedily; the target verifies them as it verifies prompt lookup's
(``speculation.accepted``: greedy answers unchanged, sampled ones the target's distribution).

``Drafter.propose`` keeps each slot's draft sequence equal to the target's cache (the prefix
they share stays; the rest the draft reads, batched with the other slots'), then drafts up to
``draft_max`` tokens a step, all slots together: one draft decode a token, stopping a slot's
draft where the draft model's own top probability falls below ``draft_p_min``, and proposing
nothing where fewer than ``draft_min`` tokens came.

``compatible`` is llama.cpp's rule (``common_speculative_are_compatible``): the same kind of
vocabulary, the same BOS and EOS, at most ``VOCAB_SLACK`` tokens more or fewer, and the same
text for every token both have past the first few; a draft that breaks it fails the load.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import protocol
from .slots import Batch, common_prefix
from .vocab import Vocab

VOCAB_SLACK = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_FROM = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


def compatible(target: Vocab, draft: Vocab) -> str | None:
    """Why ``draft`` cannot propose tokens for ``target`` (None: it can)."""
    ll = target.ll
    if ll.llama_vocab_type(target.handle) != ll.llama_vocab_type(draft.handle):
        return "its vocabulary is of another kind"
    if (target.bos, target.eos) != (draft.bos, draft.eos):
        return f"its BOS / EOS tokens ({draft.bos}, {draft.eos}) are not the model's ({target.bos}, {target.eos})"
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_SLACK:
        return f"its vocabulary has {draft.n_vocab} tokens, the model's {target.n_vocab}"
    for tok in range(VOCAB_CHECK_FROM, min(target.n_vocab, draft.n_vocab)):
        if target.piece(tok) != draft.piece(tok):
            return f"its token {tok} is {draft.piece(tok)!r}, the model's {target.piece(tok)!r}"
    return None


def draft_params(params: protocol.LoadParams, n_ctx: int, n_slots: int) -> protocol.LoadParams:
    """How a model's draft model loads: its own file, GPU layers and context (the model's by
    default), a sequence per slot of the model, the model's threads and devices."""
    assert params.draft is not None
    if not params.draft.is_absolute():  # a name the catalog did not resolve (settings: a file or a name)
        raise RuntimeError(f"the draft model {str(params.draft)!r} is neither a file nor a model this gateway serves")
    if not params.draft.is_file():
        raise RuntimeError(f"the draft model file {params.draft} does not exist")
    return protocol.LoadParams(name=f"{params.name} (draft)", path=str(params.draft), n_ctx=params.draft_n_ctx or n_ctx,
                          n_gpu_layers=params.draft_n_gpu_layers, parallel=n_slots, n_threads=params.n_threads,
                          n_threads_batch=params.n_threads_batch, devices=params.devices, prompt_cache_bytes=0)


class Drafter:
    """The draft model of a worker's model, a sequence per slot."""

    def __init__(self, model: Any, draft: Any, params: protocol.LoadParams):
        """``model`` the target, ``draft`` the draft model loaded (``Model``s: ``draft_params``)."""
        self.params, self.model = params, draft
        why = compatible(model.vocab, self.model.vocab)
        if why is not None:
            raise RuntimeError(f"the draft model {params.draft} cannot draft for {params.path}: {why}")
        self.ll, self.ctx, self.mem = self.model.ll, self.model.ctx, self.model.mem
        self.n_ctx, self.n_batch = self.model.n_ctx, self.model.n_batch
        self.n_vocab = self.model.vocab.n_vocab
        self.batch = Batch(self.ll, self.n_batch, model.n_slots)
        self.held: list[list[int]] = [[] for _ in range(model.n_slots)]  # each slot's draft sequence

    def propose(self, wants: list[tuple[int, list[int], int, int]]) -> dict[int, list[int]]:
        """Drafts by slot for ``wants``: (slot, the target's cached tokens, its pending one, most
        tokens wanted). A slot whose sequence the draft cannot read gets none."""
        p = self.params
        out: dict[int, list[int]] = {slot: [] for slot, _, _, _ in wants}
        most = {slot: min(room, p.draft_max) for slot, _, _, room in wants}
        rows: dict[int, np.ndarray] = {}  # slot -> the logits its next draft token is picked from
        for slot, cached, pending, _ in wants:
            if most[slot] > 0 and (row := self._sync(slot, cached, pending)) is not None:
                rows[slot] = row
        while rows:
            for slot, row in list(rows.items()):
                tok = int(row.argmax())
                if p.draft_p_min > 0 and 1.0 / float(np.exp(row - row[tok]).sum()) < p.draft_p_min:
                    del rows[slot]  # the draft is unsure: propose what it has
                    continue
                out[slot].append(tok)
                if len(out[slot]) >= most[slot] or len(self.held[slot]) + 1 >= self.n_ctx:
                    del rows[slot]
            if not rows:
                break
            self.batch.clear()
            for slot in rows:
                self.batch.add([out[slot][-1]], len(self.held[slot]), slot, 1)
            if self.ll.llama_decode(self.ctx, self.batch.struct) != 0:
                break
            for i, slot in enumerate(rows):
                self.held[slot].append(out[slot][-1])
                rows[slot] = self._row(i)
        return {slot: d if len(d) >= p.draft_min else [] for slot, d in out.items()}

    def _sync(self, slot: int, cached: list[int], pending: int) -> np.ndarray | None:
        """The draft's sequence for ``slot`` made the slot's ``cached`` tokens and its ``pending``
        one (the prefix they share kept, the rest read; never a picture's stand-ins, which
        ``Generation.drafts`` leaves out): the logits after ``pending``; None where it cannot be
        (longer than the draft's context, a failed decode)."""
        if len(cached) + 1 >= self.n_ctx:
            return None
        held = self.held[slot]
        keep = common_prefix(held, cached)  # ``pending`` is read again: its logits
        if not self.ll.llama_memory_seq_rm(self.mem, slot, keep, -1):
            self.ll.llama_memory_seq_rm(self.mem, slot, -1, -1)
            keep = 0
        del held[keep:]
        missing = [*cached[keep:], pending]
        for start in range(0, len(missing), self.n_batch):
            part = missing[start:start + self.n_batch]
            self.batch.clear()
            self.batch.add(part, len(held), slot, 1)
            if self.ll.llama_decode(self.ctx, self.batch.struct) != 0:
                self.ll.llama_memory_seq_rm(self.mem, slot, -1, -1)
                held.clear()
                return None
            held.extend(part)
        return self._row(-1)

    def _row(self, i: int) -> np.ndarray:
        """A copy of the last decode's logits at batch index ``i`` (the next decode overwrites them)."""
        return np.ctypeslib.as_array(self.ll.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()
