"""The model worker: a child process that owns one llama.cpp model and context.

Run as ``python -m gateway.engine.worker CMD_FD EVENT_FD``. It loads the model named by
the first message, then serves generate/cancel messages (see ``protocol.py``) until told
to exit or its command pipe closes. llama.cpp may abort the process on some faults; that
takes down this model only, and the parent sees the pipe close.

The decode loop uses llama.cpp's low-level API: prompt tokens go through ``llama_decode``
in ``n_batch`` chunks, each new token is chosen by a native ``llama_sampler`` chain reading
the logits in place (no copy of the logits into Python), and pieces are rendered with
special tokens shown, so control-token markers such as ``<|channel|>`` reach the text.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import queue
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import chat_template
from ..grammar import grammar_problem
from ..reasoning import MARKER_TOKENS
from ..textstream import StopMatcher, Utf8Stream
from . import protocol

DEFAULT_N_CTX = 4096
PROMPT_TAIL = 256
MAX_SLOTS = 64


def _common_prefix(a: list[int], b: list[int]) -> int:
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
        self.seq: Sequence | None = None
        self.last_used = 0.0


def _slot_score(slot: Slot, tokens: list[int]) -> tuple[float, float, int]:
    """How good a free slot is for a prompt: the prompt tokens its cache saves, less half of the
    cached tokens it would throw away (another conversation's history is not traded for a
    shared opening line); then the least recently used; then the lowest id."""
    common = _common_prefix(slot.cached, tokens)
    return common - (len(slot.cached) - common) / 2, -slot.last_used, -slot.id


class Sequence:
    """One generation in a slot: its prompt, sampler chain, stop state and progress."""

    _order = 0

    def __init__(self, rid: int, req: protocol.GenerationRequest, tokens: list[int], slot: Slot, common: int,
                 prompt_tail: str, sampler, limit: int):
        Sequence._order += 1
        self.order = Sequence._order  # admission order: the oldest prompt is prefilled first
        self.rid, self.req, self.tokens, self.slot = rid, req, tokens, slot
        self.common, self.next, self.prompt_tail = common, common, prompt_tail
        self.sampler, self.limit = sampler, limit
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

    def text_event(self, text: str) -> protocol.Text:
        event = protocol.Text(self.rid, text, self.n_gen, self.probs or None)
        self.probs = []
        return event

    def send_text(self, text: str, out: Worker) -> None:
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


class Refused(Exception):
    """A request the worker will not run: reported to the caller as an error event."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def event(self, rid: int) -> protocol.Error:
        return protocol.Error(rid, self.status, self.message, self.param, self.code)


def structured_grammar(kind: str, schema: dict[str, Any] | None) -> str:
    """The GBNF for a ``response_format``: llama-cpp-python's JSON grammar, or its converter's
    output for a JSON schema. Raises ``Refused`` for a schema it cannot follow."""
    from llama_cpp import llama_grammar

    if kind == "json_object":
        return llama_grammar.JSON_GBNF
    try:
        grammar = llama_grammar.json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # the converter asserts, raises KeyError, ValueError, RecursionError, ...
        raise Refused(400, f"`response_format.json_schema.schema` is not a schema this server can follow: {e}",
                      "response_format") from None
    if (problem := grammar_problem(grammar)) is not None:
        raise Refused(400, f"the grammar made from `response_format.json_schema.schema` {problem}",
                      "response_format")
    return grammar


def failure(rid: int, e: Exception) -> protocol.Error:
    """A bug met while serving request ``rid``: it fails that request alone."""
    return protocol.Error(rid, 500, f"{type(e).__name__}: {e}", None, "worker_error")


_LOG_CALLBACKS: list[Any] = []


def _device(ll) -> str:
    """The accelerator llama.cpp was built for, from its system info ("CPU : ... | CUDA : ARCHS =
    ..." lists one backend per "NAME : ..." part): cuda, metal, vulkan, ...; cpu if none."""
    info = ll.llama_print_system_info().decode("utf-8", "replace")
    names = [part.split(" : ", 1)[0].strip().lower() for part in info.split("|") if " : " in part]
    return next((n for n in names if n and n != "cpu"), "cpu")


def _silence_llama_logs(llama_cpp) -> None:
    """Keep llama.cpp's per-load chatter out of the gateway log; errors still reach stderr."""

    ggml_log_level_error = 4  # enum ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT

    @llama_cpp.llama_log_callback
    def log(level, text, _user_data):
        if level == ggml_log_level_error:
            sys.stderr.write(text.decode("utf-8", "replace"))

    _LOG_CALLBACKS.append(log)  # the callback must outlive this function
    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))


def _address_of_logits(ll):
    """``llama_get_logits`` returning a plain address. llama-cpp-python's binding returns a float
    pointer object, and making it and casting it cost more than the argmax that follows; its
    library handle is private, so an unknown binding gets the cast."""
    lib = getattr(getattr(ll, "llama_cpp", None), "_lib", None)
    if isinstance(lib, ctypes.CDLL):
        return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("llama_get_logits", lib))
    return lambda ctx: ctypes.cast(ll.llama_get_logits(ctx), ctypes.c_void_p).value


class Model:
    def __init__(self, params: protocol.LoadParams):
        import llama_cpp

        self.ll = ll = llama_cpp
        self.params = params
        _silence_llama_logs(ll)
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = 999 if params.n_gpu_layers < 0 else params.n_gpu_layers
        mp.use_mmap = params.use_mmap
        # Off by default: with repacked weights a matrix kernel takes rows in groups, so a token's
        # logits change with the batch it shares (a greedy answer then depends on the load).
        mp.use_extra_bufts = params.repack
        self.model = ll.llama_model_load_from_file(params.path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {params.path} (unsupported or damaged file, "
                               "or not enough memory)")
        self.vocab = ll.llama_model_get_vocab(self.model)
        n_ctx_train = ll.llama_model_n_ctx_train(self.model)
        cp = ll.llama_context_default_params()
        n_ctx = params.n_ctx or min(n_ctx_train or DEFAULT_N_CTX, DEFAULT_N_CTX)
        # One cache stream of n_ctx cells per slot (llama-server's --parallel without --kv-unified):
        # every request may use the whole context, and a batch attends only to its own cells.
        n_slots = 1 if params.embeddings else max(1, min(params.parallel, MAX_SLOTS))
        cp.n_seq_max = n_slots
        cp.kv_unified = False
        cp.n_ctx = n_ctx * n_slots
        cp.n_batch = cp.n_ubatch = max(min(params.n_batch, n_ctx), n_slots)
        threads = params.n_threads or protocol.default_threads()
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = {None: ll.LLAMA_FLASH_ATTN_TYPE_AUTO, True: ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                              False: ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}[params.flash_attn]
        cp.no_perf = True
        # By default every position of a sliding-window layer is kept (llama.cpp's C default);
        # llama-server's default keeps the window and a batch: far less memory, but a prompt that
        # leaves the cached one early must be read again (``_holds_window``), and the cache's cells
        # wrap, so sums run in another order than a cold read's.
        cp.swa_full = params.swa_full
        if params.embeddings:
            # a pooled embedding needs its whole input in one micro-batch
            cp.embeddings = True
            cp.n_batch = cp.n_ubatch = cp.n_ctx
        self.ctx = ll.llama_init_from_model(self.model, cp)
        if self.ctx and params.embeddings and ll.llama_pooling_type(self.ctx) == ll.LLAMA_POOLING_TYPE_NONE:
            ll.llama_free(self.ctx)  # a decoder with no pooling of its own: average its token states
            cp.pooling_type = ll.LLAMA_POOLING_TYPE_MEAN
            self.ctx = ll.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {cp.n_ctx} tokens for {params.path} "
                               "(not enough memory?)")
        self.n_embd = ll.llama_model_n_embd(self.model)
        self.n_swa = 0 if params.swa_full else ll.llama_model_n_swa(self.model)
        self.mem = ll.llama_get_memory(self.ctx)
        self.n_ctx = ll.llama_n_ctx_seq(self.ctx)  # per slot
        self.n_batch = cp.n_batch
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.bos = ll.llama_vocab_bos(self.vocab)
        self.eos = ll.llama_vocab_eos(self.vocab)
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self._pieces: dict[int, bytes] = {}
        self._is_eog: dict[int, bool] = {}
        self._eog: list[int] | None = None
        self._longest_piece: int | None = None  # bytes; found on the first prompt that needs it
        self._scan_lock = threading.Lock()
        self.slots = [Slot(i) for i in range(n_slots)]
        self.batch = Batch(ll, cp.n_batch, n_slots)
        self._views: dict[int, Any] = {}
        # the sampler chains' candidates: made on the first sampled token
        self._cand: Any = None
        self._cand_ids: Any = None
        self._cand_arr: Any = None
        self._cand_ptr: Any = None
        self._logits_base: int | None = None
        self._get_logits = _address_of_logits(ll)
        self.last_step = 0.0  # seconds the last decode step took, sampling included
        tmpl = ll.llama_model_chat_template(self.model, None)
        self.model_template = tmpl.decode("utf-8", "replace") if tmpl else None
        self.template = params.chat_template or self.model_template or chat_template.CHATML
        self.threads = threads
        self.gpu_offload = bool(ll.llama_supports_gpu_offload()) and params.n_gpu_layers != 0
        self.device = _device(ll) if self.gpu_offload else "cpu"

    def set_threads(self, n: int) -> None:
        """Use ``n`` CPU threads from the next decode on (never more than configured)."""
        n = max(1, min(n, self.threads))
        self.ll.llama_set_n_threads(self.ctx, n, n)

    def info(self) -> dict[str, Any]:
        return {
            "n_ctx": self.n_ctx, "n_vocab": self.n_vocab, "n_threads": self.threads, "parallel": len(self.slots),
            "n_ctx_train": self.ll.llama_model_n_ctx_train(self.model),
            "chat_template": self.template, "has_model_template": self.model_template is not None,
            "gpu_offload": self.gpu_offload, "device": self.device, "pid": os.getpid(),
            "special_tokens": [m for m in MARKER_TOKENS if self._single_token(m)],
            "n_embd": self.n_embd, "embeddings": self.params.embeddings,
        }

    def _single_token(self, text: str) -> bool:
        tokens = self.tokenize(text, add_special=False)
        return len(tokens) == 1 and self.piece(tokens[0]) == text.encode()

    # --- tokens and text ---
    def piece(self, token: int) -> bytes:
        p = self._pieces.get(token)
        if p is None:
            p = self._pieces[token] = self._render_piece(token, ctypes.create_string_buffer(256))
        return p

    def _render_piece(self, token: int, buf) -> bytes:
        """A token's text, special tokens shown (``buf``: the caller's, as threads call this)."""
        n = self.ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.ll.llama_token_to_piece(self.vocab, token, buf, -n, 0, True)
        return buf.raw[:n]

    def longest_piece(self) -> int:
        """The most bytes any one token stands for: a text of more than ``n_ctx`` times this
        cannot fit in the context, whatever it tokenizes to."""
        with self._scan_lock:
            if self._longest_piece is None:
                buf = ctypes.create_string_buffer(256)
                self._longest_piece = max(1, max((len(self._render_piece(t, buf)) for t in range(self.n_vocab)),
                                                 default=1))
            return self._longest_piece

    def check_fits(self, text: str, param: str) -> None:
        """Refuse, before tokenizing it, a text that cannot fit in a slot's context (tokenizing
        costs time that grows faster than the text on some vocabularies)."""
        size = len(text.encode("utf-8", "replace"))
        if size <= self.n_ctx:  # fits whatever the vocabulary (no scan for it)
            return
        longest = self.longest_piece()
        if size > self.n_ctx * longest:
            least = -(-size // longest)
            raise Refused(400, f"This model's maximum context length is {self.n_ctx} tokens. However, the "
                               f"{param} is {size} bytes long, at least {least} tokens (no token of this model "
                               f"stands for more than {longest} bytes). Please reduce the {param}.",
                          param, "context_length_exceeded")

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (self.ll.llama_token * cap)()
        n = self.ll.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, True)
        if n < 0:
            cap = -n
            arr = (self.ll.llama_token * cap)()
            n = self.ll.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, True)
        tokens = list(arr[:n])
        if len(tokens) > 1 and tokens[0] == tokens[1] == self.bos and self.add_bos:
            tokens.pop(0)  # the template wrote bos_token and the tokenizer added one too
        return tokens

    def detokenize(self, tokens: list[int]) -> str:
        """llama.cpp's own inverse of tokenize (drops the space SentencePiece adds in front)."""
        arr = (self.ll.llama_token * max(1, len(tokens)))(*tokens)
        cap = 16 * len(tokens) + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = self.ll.llama_detokenize(self.vocab, arr, len(tokens), buf, cap, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            cap = -n
        raise Refused(500, "llama_detokenize failed", None, "detokenize_failed")

    def prompt_tokens(self, req: protocol.GenerationRequest | protocol.PromptRequest, add_special: bool = True,
                      param: str | None = None) -> tuple[list[int], str]:
        """The prompt as tokens, and the end of its text (where a chat template may have opened
        a thinking block for the answer). Thread-safe: prep threads call it. A text that cannot
        fit is refused untokenized; ``param`` names the field in the refusal."""
        param = param or ("messages" if req.messages is not None else "prompt")
        if req.prompt_tokens is not None:
            return self.known_ids(req.prompt_tokens, param), ""
        text = self.render(req) if req.messages is not None else req.prompt or ""
        self.check_fits(text, param)
        return self.tokenize(text, add_special=add_special), text[-PROMPT_TAIL:]

    def known_ids(self, tokens: list[Any], param: str) -> list[int]:
        """``tokens`` as a list, if every one is an id of this vocabulary; else a 400 naming ``param``."""
        bad = next((t for t in tokens if not isinstance(t, int) or not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise Refused(400, f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})", param)
        return list(tokens)

    def prepare(self, req: protocol.GenerationRequest) -> tuple[list[int], str]:
        """What admission needs, worked out off the decode loop (in a prep thread): the grammar
        of a ``response_format``, and the prompt's tokens and text tail, checked against the
        context. Raises ``Refused``."""
        if req.response_format:
            req.grammar = structured_grammar(req.response_format, req.json_schema)
        tokens, prompt_tail = self.prompt_tokens(req)
        n_prompt = len(tokens)
        if n_prompt == 0:
            raise Refused(400, "the prompt is empty", "prompt")
        max_tokens = req.max_tokens
        room = self.n_ctx - n_prompt
        if room < 1 or (max_tokens is not None and max_tokens > room):
            want = n_prompt + (max_tokens or 0)
            raise Refused(
                400,
                f"This model's maximum context length is {self.n_ctx} tokens. However, you requested "
                f"{want} tokens ({n_prompt} in the prompt, {max_tokens or 0} for the completion). "
                "Please reduce the prompt or max_tokens.",
                "messages" if req.messages is not None else "prompt", "context_length_exceeded")
        return tokens, prompt_tail

    def render(self, req: protocol.GenerationRequest | protocol.PromptRequest) -> str:
        """The request's messages through the model's chat template, as the prompt's text. A
        template that fails only with the caller's ``chat_template_kwargs`` is the caller's
        mistake (400); one that fails without them is the model's (500)."""
        extra = req.chat_template_kwargs or {}

        def run(variables: dict[str, Any]) -> str:
            return chat_template.render(
                self.template, req.messages or [],
                bos_token=self.piece(self.bos).decode("utf-8", "replace") if self.bos >= 0 else "",
                eos_token=self.piece(self.eos).decode("utf-8", "replace") if self.eos >= 0 else "",
                extra=variables)

        try:
            return run(extra)
        except chat_template.TemplateInputError as e:
            raise Refused(400, f"the model's chat template refused these messages: {e}", "messages") from None
        except chat_template.TemplateBroken as e:
            if extra:
                try:
                    run({})
                except (chat_template.TemplateInputError, chat_template.TemplateBroken):
                    pass
                else:
                    raise Refused(400, f"the model's chat template failed with these chat_template_kwargs: {e}",
                                  "chat_template_kwargs") from None
            raise Refused(500, f"model {self.params.name!r}: {e}", None, "chat_template_error") from None

    def answer(self, question: Question) -> protocol.Event:
        """A question that needs no decoding: tokenize, detokenize or apply a chat template (on a
        prep thread)."""
        rid = question.id
        try:
            match question:
                case protocol.ApplyTemplate(request=req):
                    return protocol.Prompt(rid, self.render(req))
                case protocol.Tokenize(request=req, with_pieces=with_pieces):
                    tokens, _ = self.prompt_tokens(req, req.add_special, req.param)
                    pieces = [self.piece(t).decode("utf-8", "replace") for t in tokens] if with_pieces else None
                    return protocol.Tokens(rid, tokens, pieces)
                case protocol.Detokenize(tokens=tokens):
                    return protocol.Detokenized(rid, self.detokenize(self.known_ids(tokens, "tokens")))
        except Refused as r:
            return r.event(rid)
        except Exception as e:  # a bug here must fail one question, not leave it unanswered
            return failure(rid, e)

    def embed(self, rid: int, inputs: list[Any], out: Worker) -> None:
        """One L2-normalized, pooled vector per input (text or token ids)."""
        ll = self.ll
        vectors, total = [], 0
        for i, item in enumerate(inputs):
            source = protocol.PromptRequest(prompt=item) if isinstance(item, str) else \
                protocol.PromptRequest(prompt_tokens=item)
            tokens, _ = self.prompt_tokens(source, param="input")
            if not tokens:
                raise Refused(400, f"input {i} is empty", "input")
            if len(tokens) > self.n_ctx:
                raise Refused(400, f"input {i} has {len(tokens)} tokens; this model embeds at most {self.n_ctx}",
                              "input", "context_length_exceeded")
            total += len(tokens)
            if self.mem:
                ll.llama_memory_clear(self.mem, True)
            batch = ll.llama_batch_init(len(tokens), 0, 1)
            try:
                for pos, tok in enumerate(tokens):
                    batch.token[pos], batch.pos[pos], batch.n_seq_id[pos] = tok, pos, 1
                    batch.seq_id[pos][0], batch.logits[pos] = 0, True
                batch.n_tokens = len(tokens)
                if ll.llama_decode(self.ctx, batch) != 0:
                    raise Refused(500, "llama_decode failed while embedding", None, "decode_failed")
            finally:
                ll.llama_batch_free(batch)
            ptr = ll.llama_get_embeddings_seq(self.ctx, 0)
            vec = [float(ptr[j]) for j in range(self.n_embd)]
            norm = math.sqrt(sum(x * x for x in vec)) or 1.0
            vectors.append([x / norm for x in vec])
        for slot in self.slots:
            slot.cached = []
        out.send(protocol.Embeddings(rid, vectors, total))

    def is_eog(self, token: int) -> bool:
        eog = self._is_eog.get(token)
        if eog is None:
            eog = self._is_eog[token] = bool(self.ll.llama_vocab_is_eog(self.vocab, token))
        return eog

    def eog_tokens(self) -> list[int]:
        if self._eog is None:
            self._eog = [t for t in range(self.n_vocab) if self.ll.llama_vocab_is_eog(self.vocab, t)]
        return self._eog

    # --- decoding: slots, sequences, one llama_decode per step ---
    def _sampler(self, req: protocol.GenerationRequest):
        """The request's native sampler chain; None for plain greedy decoding, which ``_next_token``
        does as an argmax over the logits in place (llama.cpp's chain first copies all n_vocab
        candidates: ~0.2 ms a token with a 152k vocabulary)."""
        ll = self.ll
        if (req.temperature <= 0 and not req.grammar and req.repeat_penalty == 1.0
                and not req.frequency_penalty and not req.presence_penalty):
            return None
        grammar = None
        if req.grammar:
            grammar = ll.llama_sampler_init_grammar(self.vocab, req.grammar.encode(), b"root")
            if not grammar:
                raise Refused(400, "the grammar does not parse (GBNF, with a `root` rule)", "grammar")
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = lambda s: ll.llama_sampler_chain_add(chain, s)  # noqa: E731
        if grammar:
            add(grammar)  # first, as llama.cpp's own samplers do: the rest choose among allowed tokens
        if req.ignore_eos:
            eog = self.eog_tokens()
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

    def admit(self, rid: int, req: protocol.GenerationRequest, tokens: list[int], prompt_tail: str) -> Sequence:
        """Give a prepared request (``prepare``) the free slot whose cache shares the longest
        prefix with its prompt, and drop the rest of that slot's cache. Raises ``Refused``."""
        n_prompt = len(tokens)
        max_tokens = req.max_tokens
        room = self.n_ctx - n_prompt
        sampler = self._sampler(req)  # before "start": a grammar that does not parse is a plain 400
        slot = max(self.free_slots(), key=lambda s: _slot_score(s, tokens))
        # At least one prompt token is decoded, for fresh logits.
        common = min(_common_prefix(slot.cached, tokens), n_prompt - 1)
        if not self.ll.llama_memory_seq_rm(self.mem, slot.id, common, -1) or not self._holds_window(slot, common):
            # recurrent and hybrid models cannot cut a sequence in the middle, and a sliding-window
            # cache may have dropped positions the next token attends to: start it afresh
            self.ll.llama_memory_seq_rm(self.mem, slot.id, -1, -1)
            common = 0
        del slot.cached[common:]
        seq = slot.seq = Sequence(rid, req, tokens, slot, common, prompt_tail, sampler,
                                  max_tokens if max_tokens is not None else room)
        return seq

    def _holds_window(self, slot: Slot, common: int) -> bool:
        """Whether the slot's cache still holds every position that a token at ``common`` attends
        to. A sliding-window layer's cache (without ``swa_full``) overwrites positions that fell
        out of the window of the sequence's newest token; cutting the sequence back to ``common``
        moves the window back onto them. llama-server's test: the oldest position still held is at
        most ``common - n_swa``."""
        if not self.n_swa or common == 0:
            return True
        return self.ll.llama_memory_seq_pos_min(self.mem, slot.id) <= max(0, common - self.n_swa)

    def free_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.seq is None]

    def active(self) -> list[Sequence]:
        return [s.seq for s in self.slots if s.seq is not None]

    def step(self, out: Worker) -> None:
        """Advance every active sequence: one llama_decode for the token each generating sequence
        sampled last, then prompt chunks of the prefilling ones (oldest first) while the step's
        budget of ``n_batch`` tokens lasts, so a long prompt never stops the streams running.

        Each prompt chunk is its own llama_decode of ``n_batch`` tokens from where the sequence
        stands, exactly as when the request runs alone: llama.cpp splits a batch over several
        sequences into micro-batches of equal counts per sequence, and a token's logits depend
        (in the last bits) on the shape of the micro-batch it was read in. Decoded this way a
        greedy answer does not change with the load (with the kernels of ``repack: false``)."""
        now = time.time()
        running = []
        for seq in self.active():
            if seq.cancelled:
                self.finish(seq, "cancelled", out)
            elif seq.deadline is not None and now >= seq.deadline:
                self.finish(seq, "length", out)  # server.request_timeout
            else:
                running.append(seq)
        if not running:
            return
        t0 = time.monotonic()
        generating = [(seq, [seq.pending], True) for seq in running if seq.pending is not None]
        prefilling = sorted((s for s in running if s.pending is None), key=lambda s: s.order)
        if out.holding and prefilling:
            out.flush()  # a prompt chunk makes this step long: held text goes out first
        budget = self.n_batch
        if generating:
            # llama.cpp splits a batch over separate per-sequence caches into runs of consecutive
            # sequence ids: ordered by slot, neighbours share one pass over the weights.
            self._decode(sorted(generating, key=lambda c: c[0].slot.id), out)
            budget -= len(generating)
        for seq in prefilling:
            if budget <= 0:  # never before the first: a prefilling slot leaves budget
                break
            part = seq.tokens[seq.next:seq.next + self.n_batch]
            self._decode([(seq, part, seq.next + len(part) == len(seq.tokens))], out)
            budget -= len(part)
        self.last_step = time.monotonic() - t0

    def _decode(self, chunks: list[tuple[Sequence, list[int], bool]], out: Worker) -> None:
        """One llama_decode of ``chunks`` (sequence, tokens, whether its last token's logits are
        wanted), then the next token of each sequence whose logits came back."""
        batch = self.batch
        batch.clear()
        row = 0
        for seq, part, want in chunks:
            seq.logit_index = batch.add(part, len(seq.slot.cached), seq.slot.id, want)
            seq.logit_row, row = row, row + want  # outputs are stored in batch order
        rc = self.ll.llama_decode(self.ctx, batch.struct)
        self._logits_base = None
        if rc != 0:
            for seq, _, _ in chunks:
                self.ll.llama_memory_seq_rm(self.mem, seq.slot.id, -1, -1)
                seq.slot.cached = []
                self.drop(seq)
                out.send(protocol.Error(seq.rid, 500, f"llama_decode failed with status {rc}", None, "decode_failed"))
            return
        for seq, part, want in chunks:
            seq.slot.cached.extend(part)
            if seq.pending is None:
                seq.next += len(part)
            if want:
                try:
                    self._next_token(seq, out)
                except Exception as e:  # a bug here must fail one request, not the others
                    seq.slot.cached = []
                    self.ll.llama_memory_seq_rm(self.mem, seq.slot.id, -1, -1)
                    self.drop(seq)
                    out.send(failure(seq.rid, e))

    def _sample(self, seq: Sequence) -> int | None:
        """``llama_sampler_sample``, except that a token the chain left at -inf is never accepted:
        that is what a grammar leaves when it is complete and the end of generation is banned
        (``ignore_eos``), or when no token can continue it, and llama.cpp's grammar throws (and
        the throw aborts the process) on accepting it. None then: the answer ends there."""
        ll = self.ll
        if self._cand is None:
            np = self.batch.np
            self._cand = np.zeros(self.n_vocab, np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
            self._cand_ids = np.arange(self.n_vocab, dtype=np.int32)
            self._cand_arr = ll.llama_token_data_array()
            self._cand_ptr = self._cand.ctypes.data_as(ctypes.POINTER(ll.llama_token_data))
        cand, arr = self._cand, self._cand_arr
        cand["id"] = self._cand_ids  # a sampler may have sorted the last call's candidates
        cand["logit"] = self._logits(seq.logit_row)  # (p: every sampler that reads it sets it first)
        arr.data, arr.size, arr.selected, arr.sorted = self._cand_ptr, self.n_vocab, -1, False
        ll.llama_sampler_apply(seq.sampler, ctypes.byref(arr))
        if not 0 <= arr.selected < arr.size:
            return None
        chosen = arr.data[arr.selected]
        if chosen.logit == float("-inf"):
            return None
        if not self.is_eog(chosen.id):  # the answer ends at an end-of-generation token: nothing to accept
            ll.llama_sampler_accept(seq.sampler, chosen.id)
        return chosen.id

    def _next_token(self, seq: Sequence, out: Worker) -> None:
        if seq.sampler is not None:
            tok = self._sample(seq)
            if tok is None:
                return self.finish(seq, "stop", out)
        else:
            logits = self._logits(seq.logit_row)
            tok = int(logits.argmax())  # the first of equal maxima, as llama.cpp's greedy sampler
            if seq.req.ignore_eos and self.is_eog(tok):
                logits = logits.copy()
                logits[self.eog_tokens()] = float("-inf")
                tok = int(logits.argmax())
        if self.is_eog(tok):
            return self.finish(seq, "stop", out)
        seq.n_gen += 1
        if seq.top_n is not None:
            seq.probs.append(self._logprobs(tok, seq.top_n, seq.logit_row))
        text, matched = seq.stops.feed(seq.utf8.feed(self.piece(tok)))
        if text:
            seq.send_text(text, out)
        if matched is not None:
            seq.matched = matched
            return self.finish(seq, "stop", out)
        if seq.n_gen >= seq.limit or (seq.deadline is not None and time.time() >= seq.deadline):
            return self.finish(seq, "length", out)  # max_tokens, the context, or server.request_timeout
        seq.pending = tok

    def finish(self, seq: Sequence, finish: str, out: Worker) -> None:
        if seq.matched is None and finish != "cancelled":
            tail, matched = seq.stops.feed(seq.utf8.flush())
            tail += seq.stops.flush()
            if tail:
                out.send(seq.text_event(tail))  # with the done event that follows
            if matched is not None:
                seq.matched, finish = matched, "stop"
        self.drop(seq)
        out.done(seq.rid, finish, seq.matched, len(seq.tokens), seq.n_gen, seq.common)

    def drop(self, seq: Sequence) -> None:
        """Free the sequence's slot; its cache stays for the next request to reuse."""
        if seq.slot.seq is seq:
            seq.slot.seq = None
            seq.slot.last_used = time.monotonic()
            if seq.sampler is not None:
                self.ll.llama_sampler_free(seq.sampler)

    def _logits(self, row: int):
        """The logits of the step's output ``row`` (outputs are stored in batch order): a numpy
        view of llama.cpp's buffer, no copy. Views are kept by address (making one costs more
        than the argmax over it)."""
        if self._logits_base is None:
            self._logits_base = self._get_logits(self.ctx)
        addr = self._logits_base + row * self.n_vocab * 4
        view = self._views.get(addr)
        if view is None:
            if len(self._views) > 4 * len(self.slots) + 16:
                self._views.clear()
            view = self._views[addr] = self.batch.np.ctypeslib.as_array(
                (ctypes.c_float * self.n_vocab).from_address(addr))
        return view

    def _logprobs(self, token: int, top_n: int, row: int) -> dict[str, Any]:
        """The model's log-probability of ``token`` and of its ``top_n`` likeliest alternatives, read
        from the logits in place (a numpy view, no copy) only when a request asks for them."""
        import numpy as np

        logits = self._logits(row)
        peak = float(logits.max())
        lse = peak + float(np.log(np.exp(logits - peak).sum()))
        def info(t: int) -> dict[str, Any]:
            piece = self.piece(t)
            return {"token": piece.decode("utf-8", "replace"), "bytes": list(piece),
                    "logprob": float(logits[t]) - lse}

        entry = info(token)
        entry["top_logprobs"] = []
        if top_n:
            best = np.argpartition(-logits, top_n)[:top_n]
            entry["top_logprobs"] = [info(int(t)) for t in best[np.argsort(-logits[best])]]
        return entry


PREP_THREADS = 2  # one long prompt being read does not hold up a short one behind it
INLINE_PREP_CHARS = 4096  # a prompt this short is read in the loop itself when nothing else runs

Question = protocol.Tokenize | protocol.Detokenize | protocol.ApplyTemplate  # answered on a prep thread


@dataclass(eq=False)
class Queued:
    """A generate or embed command waiting for a slot (``Worker.pending``, in arrival order)."""

    command: protocol.Generate | protocol.Embed
    prepared: tuple[list[int], str] | None = None  # a generate's prompt once read: tokens, text tail
    cancelled: bool = False  # dropped from the queue by a cancel


@dataclass(slots=True)
class Prepared:
    """Inbox message: a queued request's prompt has been read (``result``: the tokens and text
    tail, or its refusal; None for a request cancelled before it was read)."""

    job: Queued
    result: tuple[list[int], str] | protocol.Error | None
    threaded: bool  # read on a prep thread (not in the loop)


@dataclass(slots=True)
class Reply:
    """Inbox message: the answer to a question, worked out on a prep thread."""

    event: protocol.Event


class Worker:
    """The process's main loop: commands arrive on a reader thread; admission, decoding and
    every event sent happen here, between two steps of the batch. Reading a prompt (chat
    template, tokenizer) and answering tokenize/detokenize/apply_template happen on prep
    threads, so a long prompt never stalls the decoding of the others (llama.cpp's tokenizer
    only reads the vocabulary, and llama-server tokenizes on its HTTP threads too); their
    results come back through the inbox as ``Prepared`` / ``Reply`` messages."""

    def __init__(self, cmd_fd: int, ev_fd: int):
        self.cmd_fd, self.ev_fd = cmd_fd, ev_fd
        self.inbox: queue.Queue[protocol.Command | Prepared | Reply | None] = queue.Queue()
        self.pending: deque[Queued] = deque()  # generate and embed commands in arrival order
        self.prep = ThreadPoolExecutor(PREP_THREADS, thread_name_prefix="prep")
        self.asking: dict[int, bool] = {}  # questions on the prep threads -> whether their asker left
        self.preparing = 0  # prompts being read on the prep threads
        self.model: Model | None = None
        self._out: list[bytes] = []
        self._urgent = False  # an event that goes out at the end of this step is queued
        self._held_since = 0.0  # when the oldest held text event was queued
        self.holding = False  # a held text event is queued
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = protocol.read_command_blocking(self.cmd_fd)
            except OSError:
                msg = None
            self.inbox.put(msg)
            if msg is None:
                return

    def send(self, event: protocol.Event, hold: bool = False) -> None:
        """Queue an event; ``flush`` writes the queued events in one write. A ``hold`` event (an
        answer's text after its first) may wait for later steps' events, up to the model's
        ``stream_interval`` (see ``run``); any other event goes out at the end of this step."""
        self.put(protocol.encode_event(event), hold)

    def put(self, frame: bytes, hold: bool = False) -> None:
        """``send`` for an event already framed."""
        if hold:
            if not self.holding:
                self._held_since, self.holding = time.monotonic(), True
        else:
            self._urgent = True
        self._out.append(frame)

    def flush(self) -> None:
        if not self._out:
            return
        data, self._out, self._urgent, self.holding = b"".join(self._out), [], False, False
        try:
            protocol.write_all_blocking(self.ev_fd, data)
        except (BrokenPipeError, OSError):
            os._exit(0)  # the gateway is gone

    def done(self, rid: int, finish: str, stop: str | None, n_prompt: int, n_gen: int, n_cached: int) -> None:
        self.send(protocol.Done(rid, finish, stop, n_prompt, n_gen, n_cached))

    def _take(self, msg: protocol.Command | Prepared | Reply | None) -> None:
        match msg:
            case None | protocol.Exit():
                self.flush()
                os._exit(0)
            case protocol.Generate() | protocol.Embed():
                job = Queued(msg)
                self.pending.append(job)
                if isinstance(msg, protocol.Generate):
                    if self._quick(msg.request):
                        self._prepare(job)  # its result is the next message this loop takes
                    else:
                        self.preparing += 1
                        self.prep.submit(self._prepare, job)
            case Prepared(job=job, result=result, threaded=threaded):
                if threaded:
                    self.preparing -= 1
                if job.cancelled:
                    pass  # dropped from pending by its cancel; nothing is sent for it
                elif isinstance(result, protocol.Error):
                    self.pending.remove(job)
                    self.send(result)
                else:
                    job.prepared = result
            case Reply(event=event):
                self.send(event)
            case protocol.Cancel(id=rid):
                if rid in self.asking:
                    self.asking[rid] = True  # not started yet: skipped; started: its answer is dropped
                for job in self.pending:
                    if job.command.id == rid:
                        job.cancelled = True
                self.pending = deque(job for job in self.pending if job.command.id != rid)
                for seq in self.model.active() if self.model else ():
                    if seq.rid == rid:
                        seq.cancelled = True
            case protocol.Threads(n=n) if self.model is not None:
                self.model.set_threads(n)
            case protocol.Tokenize() | protocol.Detokenize() | protocol.ApplyTemplate() if self.model is not None:
                self.asking[msg.id] = False
                self.prep.submit(self._answer, msg)

    def _answer(self, question: Question) -> None:
        """On a prep thread: a question's answer, unless its asker left before it began."""
        if not self.asking.get(question.id) and self.model is not None:
            event = self.model.answer(question)
            if not self.asking.get(question.id):
                self.inbox.put(Reply(event))
        self.asking.pop(question.id, None)

    def _quick(self, req: protocol.GenerationRequest) -> bool:
        """Whether to read this prompt in the loop itself: only a short one, and only while the
        model decodes nothing and no prompt is being read (the hand-off to a prep thread and back
        costs about a tenth of a millisecond, a short prompt less)."""
        if self.model is None or self.preparing or self.model.active():
            return False
        if req.prompt_tokens is not None:
            return True
        if req.messages is not None:
            size = sum(len(m.get("content") or "") for m in req.messages if isinstance(m, dict))
            return size <= INLINE_PREP_CHARS and len(req.messages) <= 64
        return len(req.prompt or "") <= INLINE_PREP_CHARS

    def _prepare(self, job: Queued) -> None:
        """Read a generate request's prompt (on a prep thread, or in the loop for ``_quick``
        ones); the result goes to the inbox."""
        threaded = threading.current_thread() is not threading.main_thread()
        if job.cancelled:
            if threaded:
                self.inbox.put(Prepared(job, None, True))
            return
        command = job.command
        assert isinstance(command, protocol.Generate)
        result: tuple[list[int], str] | protocol.Error
        try:
            assert self.model is not None  # generate commands are taken only once it is loaded
            result = self.model.prepare(command.request)
        except Refused as r:
            result = r.event(command.id)
        except Exception as e:  # a bug here must fail one request, not the worker
            result = failure(command.id, e)
        self.inbox.put(Prepared(job, result, threaded))

    def _admissible(self) -> bool:
        """A waiting request could start now, or waits only for a slot to free."""
        return any(isinstance(job.command, protocol.Embed) or job.prepared is not None for job in self.pending)

    def _poll(self, block: bool) -> None:
        if block:
            self._take(self.inbox.get())
        while True:
            try:
                self._take(self.inbox.get_nowait())
            except queue.Empty:
                return

    def _admit(self, model: Model) -> None:
        """Start waiting requests in free slots, in arrival order; one whose prompt is still
        being read lets those behind it go first. An embedding request runs alone."""
        for job in list(self.pending):
            command = job.command
            if isinstance(command, protocol.Embed):
                if model.active():
                    return
                self.pending.remove(job)
                self._guard(command.id, model.embed, command.id, command.inputs, self)
                continue
            if job.prepared is None:
                continue
            if not model.free_slots():
                return
            self.pending.remove(job)
            self._guard(command.id, self._start, model, command.id, command.request, *job.prepared)

    def _start(self, model: Model, rid: int, req: protocol.GenerationRequest, tokens: list[int],
               prompt_tail: str) -> None:
        seq = model.admit(rid, req, tokens, prompt_tail)
        echo = None
        if req.echo:
            echo = req.prompt if req.prompt is not None else model.detokenize(seq.tokens)
        self.send(protocol.Start(rid, len(seq.tokens), seq.common, seq.slot.id, seq.prompt_tail, echo))

    def _guard(self, rid: int, work, *args: Any) -> None:
        """``work(*args)``; a refusal or a bug there fails request ``rid`` alone."""
        try:
            work(*args)
        except Refused as r:
            self.send(r.event(rid))
        except Exception as e:  # a bug here must fail one request, not the worker
            self.send(failure(rid, e))

    def run(self) -> None:
        first = self.inbox.get()
        if not isinstance(first, protocol.Load):
            os._exit(0)
        try:
            model = self.model = Model(first.model)
        except Exception as e:  # report, then leave: a failed load has nothing to serve
            self.send(protocol.LoadFailed(str(e)))
            self.flush()
            os._exit(0)
        self.send(protocol.Ready(model.info()))
        self.flush()
        interval = model.params.stream_interval
        while True:
            self._poll(block=not model.active() and not self._admissible())
            self._admit(model)
            if model.active():
                model.step(self)
            # Held text goes out once waiting for the next step would hold it past the interval:
            # a model faster than that streams its tokens in twos or threes (each still its own
            # event), so the gateway process wakes fewer times. Its wake-ups cost CPU that, on a
            # machine whose cores all decode, comes out of llama.cpp's threads.
            if self._out and (self._urgent or not model.active()
                              or time.monotonic() - self._held_since + model.last_step >= interval):
                self.flush()


def main(argv: list[str]) -> None:
    Worker(int(argv[1]), int(argv[2])).run()


if __name__ == "__main__":
    main(sys.argv)
