"""Choosing each next token from the logits of a step, read in place in llama.cpp's buffer.

Plain greedy decoding is an argmax over a numpy view of the logits (the decode loop does it
itself: it is the per-token path). Anything else goes through a native ``llama_sampler`` chain
per request (``chain``), applied here to a candidate array made once (``sample``), which never
accepts a token the chain left at -inf. Log-probabilities are read from the same view, only
when a request asks for them. ``structured_grammar`` makes the GBNF of a structured-output field.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

from .. import protocol
from ..text.grammar import MAX_MADE_GRAMMAR_CHARS, grammar_problem
from .model import Model
from .refusals import Refused


def structured_grammar(kind: str, schema: dict[str, Any] | None, param: str) -> str:
    """The GBNF for a structured-output field (``param``, the caller's name for it):
    llama-cpp-python's JSON grammar, or its converter's output for a JSON schema. Raises
    ``Refused`` for a schema it cannot follow."""
    from llama_cpp import llama_grammar

    from .schemagrammar import schema_grammar

    if kind == "json_object":
        return llama_grammar.JSON_GBNF
    try:
        grammar = schema_grammar(json.loads(json.dumps(schema)))  # a copy: the converter writes into $refs
    except Exception as e:  # the converter asserts, raises KeyError, ValueError, RecursionError, ...
        raise Refused(400, f"the JSON schema in `{param}` is not one this server can follow: {e}", param) from None
    if (problem := grammar_problem(grammar, MAX_MADE_GRAMMAR_CHARS)) is not None:
        raise Refused(400, f"the grammar made from the JSON schema in `{param}` {problem}", param)
    return grammar


def grammar_param(req: protocol.GenerationRequest) -> str:
    """The caller's field a request's grammar came from: its tools, its structured-output field,
    or its own ``grammar``."""
    if req.tools and req.tool_format:
        return "tools"
    return req.format_param if req.response_format else "grammar"


def _address_of_logits(ll):
    """``llama_get_logits`` returning a plain address. llama-cpp-python's binding returns a float
    pointer object, and making it and casting it cost more than the argmax that follows; its
    library handle is private, so an unknown binding gets the cast."""
    lib = getattr(getattr(ll, "llama_cpp", None), "_lib", None)
    if isinstance(lib, ctypes.CDLL):
        return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("llama_get_logits", lib))
    return lambda ctx: ctypes.cast(ll.llama_get_logits(ctx), ctypes.c_void_p).value


class Sampling:
    def __init__(self, model: Model):
        import numpy as np

        self.np = np
        self.ll, self.ctx, self.vocab = model.ll, model.ctx, model.vocab
        self.n_vocab = model.vocab.n_vocab
        # The address of llama.cpp's logits buffer: each llama_decode may move it, so the decode
        # loop sets this to None after each, and ``logits`` reads it again on first use.
        self.logits_base: int | None = None
        self._get_logits = _address_of_logits(model.ll)
        self._views: dict[int, Any] = {}
        self._max_views = 4 * model.n_slots + 16
        # the sampler chains' candidates: made on the first sampled token
        self._cand: Any = None
        self._cand_ids: Any = None
        self._cand_arr: Any = None
        self._cand_ptr: Any = None

    def chain(self, req: protocol.GenerationRequest):
        """The request's native sampler chain; None for plain greedy decoding, which the decode
        loop does as an argmax over the logits in place (llama.cpp's chain first copies all
        n_vocab candidates: ~0.2 ms a token with a 152k vocabulary). Raises ``Refused`` for a
        grammar that does not parse."""
        ll = self.ll
        if (req.temperature <= 0 and not req.grammar and req.repeat_penalty == 1.0
                and not req.frequency_penalty and not req.presence_penalty):
            return None
        grammar = None
        if req.grammar and req.grammar_triggers:  # lazy: free text until a pattern matches what was written
            patterns = (ctypes.c_char_p * len(req.grammar_triggers))(*(t.encode() for t in req.grammar_triggers))
            grammar = ll.llama_sampler_init_grammar_lazy_patterns(
                self.vocab.handle, req.grammar.encode(), b"root", patterns, len(req.grammar_triggers), None, 0)
        elif req.grammar:
            grammar = ll.llama_sampler_init_grammar(self.vocab.handle, req.grammar.encode(), b"root")
        if req.grammar and not grammar:
            param = grammar_param(req)
            raise Refused(400, "the grammar does not parse (GBNF, with a `root` rule)" if param == "grammar" else
                          f"the grammar made from `{param}` does not parse", param)
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = lambda s: ll.llama_sampler_chain_add(chain, s)  # noqa: E731
        if grammar:
            add(grammar)  # first, as llama.cpp's own samplers do: the rest choose among allowed tokens
        if req.ignore_eos:
            eog = self.vocab.eog_tokens()
            bias = (ll.llama_logit_bias * len(eog))(*((t, float("-inf")) for t in eog))
            add(ll.llama_sampler_init_logit_bias(self.n_vocab, len(eog), bias))
        if req.repeat_penalty != 1.0 or req.frequency_penalty or req.presence_penalty:
            add(ll.llama_sampler_init_penalties(self.n_vocab, 64, req.repeat_penalty,
                                                req.frequency_penalty, req.presence_penalty))
        if req.temperature <= 0:
            add(ll.llama_sampler_init_greedy())
            return chain
        if req.top_k > 0:
            add(ll.llama_sampler_init_top_k(req.top_k))
        if req.top_p < 1.0:
            add(ll.llama_sampler_init_top_p(req.top_p, 1))
        if req.min_p > 0:
            add(ll.llama_sampler_init_min_p(req.min_p, 1))
        add(ll.llama_sampler_init_temp(req.temperature))
        seed = ll.LLAMA_DEFAULT_SEED if req.seed is None else req.seed & 0xFFFFFFFF
        add(ll.llama_sampler_init_dist(seed))
        return chain

    def free(self, chain) -> None:
        self.ll.llama_sampler_free(chain)

    def logits(self, row: int):
        """The logits of the step's output ``row`` (outputs are stored in batch order): a numpy
        view of llama.cpp's buffer, no copy. Views are kept by address (making one costs more
        than the argmax over it)."""
        if self.logits_base is None:
            self.logits_base = self._get_logits(self.ctx)
        addr = self.logits_base + row * self.n_vocab * 4
        view = self._views.get(addr)
        if view is None:
            if len(self._views) > self._max_views:
                self._views.clear()
            view = self._views[addr] = self.np.ctypeslib.as_array((ctypes.c_float * self.n_vocab).from_address(addr))
        return view

    def argmax_without_eog(self, logits) -> int:
        """Greedy decoding's token when the end of generation is banned (``ignore_eos``)."""
        logits = logits.copy()
        logits[self.vocab.eog_tokens()] = float("-inf")
        return int(logits.argmax())

    def sample(self, chain, row: int) -> int | None:
        """``llama_sampler_sample``, except that a token the chain left at -inf is never accepted:
        that is what a grammar leaves when it is complete and the end of generation is banned
        (``ignore_eos``), or when no token can continue it, and llama.cpp's grammar throws (and
        the throw aborts the process) on accepting it. None then: the answer ends there."""
        ll = self.ll
        if self._cand is None:
            np = self.np
            self._cand = np.zeros(self.n_vocab, np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
            self._cand_ids = np.arange(self.n_vocab, dtype=np.int32)
            self._cand_arr = ll.llama_token_data_array()
            self._cand_ptr = self._cand.ctypes.data_as(ctypes.POINTER(ll.llama_token_data))
        cand, arr = self._cand, self._cand_arr
        cand["id"] = self._cand_ids  # a sampler may have sorted the last call's candidates
        cand["logit"] = self.logits(row)  # (p: every sampler that reads it sets it first)
        arr.data, arr.size, arr.selected, arr.sorted = self._cand_ptr, self.n_vocab, -1, False
        ll.llama_sampler_apply(chain, ctypes.byref(arr))
        if not 0 <= arr.selected < arr.size:
            return None
        chosen = arr.data[arr.selected]
        if chosen.logit == float("-inf"):
            return None
        if not self.vocab.is_eog(chosen.id):  # the answer ends at an end-of-generation token: nothing to accept
            ll.llama_sampler_accept(chain, chosen.id)
        return chosen.id

    def logprobs(self, token: int, top_n: int, row: int) -> dict[str, Any]:
        """The model's log-probability of ``token`` and of its ``top_n`` likeliest alternatives, read
        from the logits in place (a numpy view, no copy) only when a request asks for them."""
        np = self.np
        logits = self.logits(row)
        peak = float(logits.max())
        lse = peak + float(np.log(np.exp(logits - peak).sum()))
        piece = self.vocab.piece

        def info(t: int) -> dict[str, Any]:
            p = piece(t)
            return {"token": p.decode("utf-8", "replace"), "bytes": list(p), "logprob": float(logits[t]) - lse}

        entry = info(token)
        entry["top_logprobs"] = []
        if top_n:
            best = np.argpartition(-logits, top_n)[:top_n]
            entry["top_logprobs"] = [info(int(t)) for t in best[np.argsort(-logits[best])]]
        return entry
