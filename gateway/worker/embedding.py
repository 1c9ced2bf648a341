"""Embeddings and reranking: one pooled vector (or score) per input, many inputs to a decode.

An embedding context (``LoadParams.embeddings``; ``Model``) has one pool of cells
(``kv_unified``) and ``Model.embed_seqs`` sequences. A decode holds whole inputs only, each its
own sequence from position 0 in a context cleared before it, as many as fit
``Model.embed_batch`` tokens and ``embed_seqs`` sequences; an input longer than
``embed_batch`` is decoded alone (up to n_ctx, the micro-batch's size). Every decode is one
micro-batch, as llama.cpp pools a sequence within the micro-batch it was read in, and no input
is split across two.

Inputs come from every request waiting (``Embedder``): a decode takes one input from each job in
turn, in arrival order, so a short request that arrives while a long one is being read gets
into the next decode rather than after the long one's last.

Batched and alone agree to a stated tolerance, not bit for bit: a sequence attends only to its
own cells (the others are masked), but llama.cpp's CPU kernels sum a row's dot products and a
pooling's mean in an order that depends on how many tokens share the micro-batch
(``tests/test_embedding_batch``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .. import protocol
from .model import Model
from .prompts import Prompts
from .refusals import Refused, decode_failed, failure


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


def read(model: Model, prompts: Prompts, command: protocol.Embed) -> list[list[int]]:
    """Each input of ``command`` as tokens (for a reranker, the query with each document), on a
    prep thread. Raises ``Refused`` for an empty input or one past the model's context."""
    out = []
    param = "input" if command.query is None else "documents"
    for i, item in enumerate(command.inputs):
        if command.query is not None:
            tokens = rerank_tokens(model, prompts, command.query, item)
        else:
            source = protocol.PromptRequest(prompt=item) if isinstance(item, str) else \
                protocol.PromptRequest(prompt_tokens=item)
            tokens = prompts.tokens(source, param="input").tokens
        if not tokens:
            raise Refused(400, f"{param} {i} is empty", param)
        if len(tokens) > model.n_ctx:
            raise Refused(400, f"{param} {i} has {len(tokens)} tokens; this model reads at most {model.n_ctx}",
                          param, "context_length_exceeded")
        out.append(tokens)
    return out


@dataclass(eq=False)
class Job:
    """One embed command's inputs as tokens, and its vectors as they are made."""

    rid: int
    inputs: list[list[int]]
    rank: bool  # a reranker's: a one-number vector, the score
    vectors: list[list[float] | None] = field(init=False)
    taken: int = 0  # inputs handed to a decode (in order)
    left: int = field(init=False)  # inputs whose vector is not made yet

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.inputs)
        self.left = len(self.inputs)

    def event(self) -> protocol.Embeddings:
        return protocol.Embeddings(self.rid, [v for v in self.vectors if v is not None],
                              sum(len(t) for t in self.inputs))


def pack(jobs: list[Job], budget: int, seqs: int) -> list[tuple[Job, int]]:
    """The inputs of the next decode, as (job, input index): one from each job in turn, each
    job's in order, while they fit ``budget`` tokens and ``seqs`` sequences; the first may be
    longer than ``budget`` and then goes alone. A job whose next input does not fit gives no
    more to this decode. Pure: it reads ``taken`` and does not advance it."""
    group: list[tuple[Job, int]] = []
    used = 0
    cursor = {id(job): job.taken for job in jobs}
    open_ = [job for job in jobs if job.taken < len(job.inputs)]
    while open_ and len(group) < seqs:
        still = []
        for job in open_:
            if len(group) >= seqs:
                break
            i = cursor[id(job)]
            n = len(job.inputs[i])
            if group and used + n > budget:
                continue  # this job is done for this decode
            group.append((job, i))
            used += n
            cursor[id(job)] = i + 1
            if used > budget:
                return group  # an input longer than the budget, alone
            if i + 1 < len(job.inputs):
                still.append(job)
        open_ = still
    return group


class Embedder:
    """Embed jobs in arrival order, read a decode at a time (``step``), so that the worker takes
    new commands between two decodes and their inputs join the next."""

    def __init__(self, model: Model):
        self.model = model
        self.jobs: deque[Job] = deque()
        self.batch = model.ll.llama_batch_init(model.n_batch, 0, 1)  # an embedding context's whole micro-batch

    @property
    def busy(self) -> bool:
        return bool(self.jobs)

    def add(self, rid: int, inputs: list[list[int]], rank: bool) -> None:
        self.jobs.append(Job(rid, inputs, rank))

    def cancel(self, rid: int) -> None:
        self.jobs = deque(job for job in self.jobs if job.rid != rid)

    def step(self) -> list[protocol.Embeddings | protocol.Error]:
        """Decode the next group of inputs; the events of the jobs it finished (or failed). A bug
        fails the jobs waiting here, not the worker."""
        try:
            return self._step()
        except Exception as e:
            failed: list[protocol.Embeddings | protocol.Error] = [failure(job.rid, e) for job in self.jobs]
            self.jobs.clear()
            return failed

    def _step(self) -> list[protocol.Embeddings | protocol.Error]:
        model, ll = self.model, self.model.ll
        group = pack(list(self.jobs), model.embed_batch, model.embed_seqs)
        if not group:
            return []
        if model.mem:
            # the cells' bookkeeping alone, as llama.cpp's own seq_rm (and the generating path's)
            # leaves a removed cell's data: a decode writes each cell it uses and masks the rest,
            # where clearing the data too writes zeros over the whole cache (every layer's n_ctx
            # cells) before every decode
            ll.llama_memory_clear(model.mem, False)
        batch, k = self.batch, 0
        for seq, (job, i) in enumerate(group):
            for pos, tok in enumerate(job.inputs[i]):
                batch.token[k], batch.pos[k], batch.n_seq_id[k] = tok, pos, 1
                batch.seq_id[k][0], batch.logits[k] = seq, True
                k += 1
            job.taken = i + 1
        batch.n_tokens = k
        rc = ll.llama_decode(model.ctx, batch)
        out: list[protocol.Embeddings | protocol.Error] = []
        if rc != 0:
            failed = {id(job): job for job, _ in group}
            for job in failed.values():
                out.append(decode_failed(job.rid, rc))
            self.jobs = deque(job for job in self.jobs if id(job) not in failed)
            return out
        n = model.n_embd
        for seq, (job, i) in enumerate(group):
            ptr = ll.llama_get_embeddings_seq(model.ctx, seq)
            job.vectors[i] = [float(ptr[0])] if job.rank else normalized(ptr[:n])
            job.left -= 1
            if not job.left:
                out.append(job.event())
        if out:
            self.jobs = deque(job for job in self.jobs if job.left)
        return out

    def close(self) -> None:
        self.model.ll.llama_batch_free(self.batch)


def normalized(vec: list[Any]) -> list[float]:
    """``vec`` scaled to unit length (L2; llama-server's default normalization); a zero vector as it is."""
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]
