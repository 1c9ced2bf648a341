"""Embeddings: one L2-normalized, pooled vector per input, from a context made for them
(``LoadParams.embeddings``: pooling on, the whole input in one micro-batch). Each input is
decoded alone in sequence 0, after the context's memory is cleared."""

from __future__ import annotations

import math
from typing import Any

from . import protocol
from .model import Model
from .prompts import Prompts
from .refusals import Refused


def embed(model: Model, prompts: Prompts, rid: int, inputs: list[Any]) -> protocol.Embeddings:
    """The vectors of ``inputs`` (each a text or token ids). Raises ``Refused``. It clears the
    context's memory: what the slots had cached is gone."""
    ll, n_ctx = model.ll, model.n_ctx
    vectors, total = [], 0
    for i, item in enumerate(inputs):
        source = protocol.PromptRequest(prompt=item) if isinstance(item, str) else \
            protocol.PromptRequest(prompt_tokens=item)
        tokens = prompts.tokens(source, param="input").tokens
        if not tokens:
            raise Refused(400, f"input {i} is empty", "input")
        if len(tokens) > n_ctx:
            raise Refused(400, f"input {i} has {len(tokens)} tokens; this model embeds at most {n_ctx}",
                          "input", "context_length_exceeded")
        total += len(tokens)
        if model.mem:
            ll.llama_memory_clear(model.mem, True)
        batch = ll.llama_batch_init(len(tokens), 0, 1)
        try:
            for pos, tok in enumerate(tokens):
                batch.token[pos], batch.pos[pos], batch.n_seq_id[pos] = tok, pos, 1
                batch.seq_id[pos][0], batch.logits[pos] = 0, True
            batch.n_tokens = len(tokens)
            if ll.llama_decode(model.ctx, batch) != 0:
                raise Refused(500, "llama_decode failed while embedding", None, "decode_failed")
        finally:
            ll.llama_batch_free(batch)
        ptr = ll.llama_get_embeddings_seq(model.ctx, 0)
        vec = [float(ptr[j]) for j in range(model.n_embd)]
        norm = math.sqrt(sum(x * x for x in vec)) or 1.0
        vectors.append([x / norm for x in vec])
    return protocol.Embeddings(rid, vectors, total)
