"""Embeddings: one L2-normalized, pooled vector per input, from a context made for them
(``LoadParams.embeddings``: pooling on, the whole input in one micro-batch). Each input is
decoded alone in sequence 0, after the context's memory is cleared."""

from __future__ import annotations

import math
from typing import Any

from . import ipc
from .model import Model
from .prompts import Prompts
from .refusals import Refused


def rerank_tokens(model: Model, prompts: Prompts, query: str, document: str) -> list[int]:
    """A query and a document as one input, as llama.cpp's server puts them: the model's own
    "rerank" template ({query}, {document}) where its GGUF has one, else BOS, the query, EOS or
    SEP as the vocabulary adds them, the document, EOS."""
    ll, vocab = model.ll, model.vocab
    template = ll.llama_model_chat_template(model.handle, b"rerank")
    if template:
        text = template.decode("utf-8", "replace").replace("{query}", query).replace("{document}", document)
        prompts.check_fits(text, "documents")
        return vocab.tokenize(text, add_special=False)
    prompts.check_fits(query + document, "documents")
    v = vocab.handle
    eos = vocab.eos if vocab.eos != -1 else ll.llama_vocab_sep(v)
    add_eos, add_sep = ll.llama_vocab_get_add_eos(v), ll.llama_vocab_get_add_sep(v)
    tokens = [vocab.bos] if vocab.add_bos else []
    tokens += vocab.tokenize(query, add_special=False)
    tokens += ([eos] if add_eos else []) + ([ll.llama_vocab_sep(v)] if add_sep else [])
    tokens += vocab.tokenize(document, add_special=False)
    return tokens + ([eos] if add_eos else [])


def embed(model: Model, prompts: Prompts, rid: int, inputs: list[Any], query: str | None = None) -> ipc.Embeddings:
    """The vectors of ``inputs`` (each a text or token ids), or for a reranker (``query`` set)
    each document's score against the query, as a one-number vector (llama.cpp's rank pooling:
    the classifier's first output; a probability for Qwen3-style rerankers, a logit for
    BERT-style ones). Raises ``Refused``. It clears the context's memory: what the slots had
    cached is gone."""
    ll, n_ctx = model.ll, model.n_ctx
    vectors, total = [], 0
    param = "input" if query is None else "documents"
    for i, item in enumerate(inputs):
        if query is not None:
            tokens = rerank_tokens(model, prompts, query, item)
        else:
            source = ipc.PromptRequest(prompt=item) if isinstance(item, str) else \
                ipc.PromptRequest(prompt_tokens=item)
            tokens = prompts.tokens(source, param="input").tokens
        if not tokens:
            raise Refused(400, f"{param} {i} is empty", param)
        if len(tokens) > n_ctx:
            raise Refused(400, f"{param} {i} has {len(tokens)} tokens; this model reads at most {n_ctx}",
                          param, "context_length_exceeded")
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
        if query is not None:
            vectors.append([float(ptr[0])])
            continue
        vec = [float(ptr[j]) for j in range(model.n_embd)]
        norm = math.sqrt(sum(x * x for x in vec)) or 1.0
        vectors.append([x / norm for x in vec])
    return ipc.Embeddings(rid, vectors, total)
