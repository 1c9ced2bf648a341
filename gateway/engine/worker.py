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
import os
import queue
import sys
import threading
import time
from collections import deque
from typing import Any

from .. import chat_template
from ..reasoning import MARKER_TOKENS
from ..textstream import StopMatcher, Utf8Stream
from . import protocol

DEFAULT_N_CTX = 4096
PROMPT_TAIL = 256


class Refused(Exception):
    """A request the worker will not run: reported to the caller as an error event."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.event = {"ev": "error", "status": status, "message": message, "param": param, "code": code}


def _silence_llama_logs(llama_cpp) -> None:
    """Keep llama.cpp's per-load chatter out of the gateway log; errors still reach stderr."""

    ggml_log_level_error = 4  # enum ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT

    @llama_cpp.llama_log_callback
    def log(level, text, _user_data):
        if level == ggml_log_level_error:
            sys.stderr.write(text.decode("utf-8", "replace"))

    _silence_llama_logs.keep = log  # the callback must outlive this function
    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))


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
        self.model = ll.llama_model_load_from_file(params.path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {params.path} (unsupported or damaged file, "
                               "or not enough memory)")
        self.vocab = ll.llama_model_get_vocab(self.model)
        n_ctx_train = ll.llama_model_n_ctx_train(self.model)
        cp = ll.llama_context_default_params()
        cp.n_ctx = params.n_ctx or min(n_ctx_train or DEFAULT_N_CTX, DEFAULT_N_CTX)
        cp.n_batch = cp.n_ubatch = min(params.n_batch, cp.n_ctx)
        cp.n_seq_max = 1
        threads = params.n_threads or protocol.default_threads()
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = {None: ll.LLAMA_FLASH_ATTN_TYPE_AUTO, True: ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                              False: ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}[params.flash_attn]
        cp.no_perf = True
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
        self.mem = ll.llama_get_memory(self.ctx)
        self.n_ctx = ll.llama_n_ctx(self.ctx)
        self.n_batch = cp.n_batch
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.bos = ll.llama_vocab_bos(self.vocab)
        self.eos = ll.llama_vocab_eos(self.vocab)
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self._pieces: dict[int, bytes] = {}
        self._eog: list[int] | None = None
        self._piece_buf = ctypes.create_string_buffer(256)
        self.cached: list[int] = []  # tokens whose keys and values are in the context now
        tmpl = ll.llama_model_chat_template(self.model, None)
        self.model_template = tmpl.decode("utf-8", "replace") if tmpl else None
        self.template = params.chat_template or self.model_template or chat_template.CHATML
        self.threads = threads
        self.gpu_offload = bool(ll.llama_supports_gpu_offload()) and params.n_gpu_layers != 0

    def set_threads(self, n: int) -> None:
        """Use ``n`` CPU threads from the next decode on (never more than configured)."""
        n = max(1, min(n, self.threads))
        self.ll.llama_set_n_threads(self.ctx, n, n)

    def info(self) -> dict[str, Any]:
        return {
            "n_ctx": self.n_ctx, "n_vocab": self.n_vocab, "n_threads": self.threads,
            "n_ctx_train": self.ll.llama_model_n_ctx_train(self.model),
            "chat_template": self.template, "has_model_template": self.model_template is not None,
            "gpu_offload": self.gpu_offload, "pid": os.getpid(),
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
            n = self.ll.llama_token_to_piece(self.vocab, token, self._piece_buf, len(self._piece_buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self.ll.llama_token_to_piece(self.vocab, token, buf, -n, 0, True)
                p = buf.raw[:n]
            else:
                p = self._piece_buf.raw[:n]
            self._pieces[token] = p
        return p

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

    def prompt_tokens(self, req: dict[str, Any]) -> tuple[list[int], str]:
        """The prompt as tokens, and the end of its text (where a chat template may have opened
        a thinking block for the answer)."""
        if req.get("prompt_tokens") is not None:
            tokens = list(req["prompt_tokens"])
            bad = next((t for t in tokens if not isinstance(t, int) or not 0 <= t < self.n_vocab), None)
            if bad is not None:
                raise Refused(400, f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})", "prompt")
            return tokens, ""
        if req.get("messages") is not None:
            try:
                text = chat_template.render(
                    self.template, req["messages"],
                    bos_token=self.piece(self.bos).decode("utf-8", "replace") if self.bos >= 0 else "",
                    eos_token=self.piece(self.eos).decode("utf-8", "replace") if self.eos >= 0 else "",
                    extra=req.get("chat_template_kwargs") or {},
                )
            except chat_template.TemplateInputError as e:
                raise Refused(400, f"the model's chat template refused these messages: {e}", "messages") from None
            except chat_template.TemplateBroken as e:
                raise Refused(500, f"model {self.params.name!r}: {e}", None, "chat_template_error") from None
        else:
            text = req.get("prompt") or ""
        return self.tokenize(text, add_special=req.get("add_special", True)), text[-PROMPT_TAIL:]

    def answer(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A quick question that needs no decoding: tokenize or detokenize."""
        rid = msg["id"]
        try:
            if msg["op"] == "tokenize":
                tokens, _ = self.prompt_tokens(msg["request"])
                out: dict[str, Any] = {"ev": "tokens", "id": rid, "tokens": tokens}
                if msg.get("with_pieces"):
                    out["pieces"] = [self.piece(t).decode("utf-8", "replace") for t in tokens]
                return out
            tokens = msg["tokens"]
            bad = next((t for t in tokens if not isinstance(t, int) or not 0 <= t < self.n_vocab), None)
            if bad is not None:
                raise Refused(400, f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})", "tokens")
            return {"ev": "detokenized", "id": rid, "text": self.detokenize(tokens)}
        except Refused as r:
            return {**r.event, "id": rid}

    def embed(self, rid: int, inputs: list[Any], out: "Worker") -> None:
        """One L2-normalized, pooled vector per input (text or token ids)."""
        import math

        ll = self.ll
        vectors, total = [], 0
        for i, item in enumerate(inputs):
            tokens = self.tokenize(item, add_special=True) if isinstance(item, str) else \
                self.prompt_tokens({"prompt_tokens": item})[0]
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
        self.cached = []
        out.send({"ev": "embeddings", "id": rid, "data": vectors, "prompt_tokens": total})

    def eog_tokens(self) -> list[int]:
        if self._eog is None:
            self._eog = [t for t in range(self.n_vocab) if self.ll.llama_vocab_is_eog(self.vocab, t)]
        return self._eog

    # --- decoding ---
    def _decode(self, tokens: list[int]) -> None:
        arr = (self.ll.llama_token * len(tokens))(*tokens)
        rc = self.ll.llama_decode(self.ctx, self.ll.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise Refused(500, f"llama_decode failed with status {rc}", None, "decode_failed")
        self.cached.extend(tokens)

    def _sampler(self, req: dict[str, Any]):
        ll = self.ll
        grammar = None
        if req.get("grammar"):
            grammar = ll.llama_sampler_init_grammar(self.vocab, req["grammar"].encode(), b"root")
            if not grammar:
                raise Refused(400, "the grammar does not parse (GBNF, with a `root` rule)", "grammar")
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = lambda s: ll.llama_sampler_chain_add(chain, s)  # noqa: E731
        if grammar:
            add(grammar)  # first, as llama.cpp's own samplers do: the rest choose among allowed tokens
        if req.get("ignore_eos"):
            eog = self.eog_tokens()
            bias = (ll.llama_logit_bias * len(eog))(*((t, float("-inf")) for t in eog))
            add(ll.llama_sampler_init_logit_bias(self.n_vocab, len(eog), bias))
        if req["repeat_penalty"] != 1.0 or req["frequency_penalty"] or req["presence_penalty"]:
            add(ll.llama_sampler_init_penalties(self.n_vocab, 64, req["repeat_penalty"],
                                                req["frequency_penalty"], req["presence_penalty"]))
        if req["temperature"] <= 0:
            add(ll.llama_sampler_init_greedy())
            return chain
        if req["top_k"] > 0:
            add(ll.llama_sampler_init_top_k(req["top_k"]))
        if req["top_p"] < 1.0:
            add(ll.llama_sampler_init_top_p(req["top_p"], 1))
        if req["min_p"] > 0:
            add(ll.llama_sampler_init_min_p(req["min_p"], 1))
        add(ll.llama_sampler_init_temp(req["temperature"]))
        seed = ll.LLAMA_DEFAULT_SEED if req.get("seed") is None else req["seed"] & 0xFFFFFFFF
        add(ll.llama_sampler_init_dist(seed))
        return chain

    def generate(self, rid: int, req: dict[str, Any], out: "Worker") -> None:
        tokens, prompt_tail = self.prompt_tokens(req)
        n_prompt = len(tokens)
        if n_prompt == 0:
            raise Refused(400, "the prompt is empty", "prompt")
        max_tokens = req.get("max_tokens")
        room = self.n_ctx - n_prompt
        if room < 1 or (max_tokens is not None and max_tokens > room):
            want = n_prompt + (max_tokens or 0)
            raise Refused(
                400,
                f"This model's maximum context length is {self.n_ctx} tokens. However, you requested "
                f"{want} tokens ({n_prompt} in the prompt, {max_tokens or 0} for the completion). "
                "Please reduce the prompt or max_tokens.",
                "messages" if req.get("messages") is not None else "prompt", "context_length_exceeded")
        limit = max_tokens if max_tokens is not None else room

        # Reuse the longest cached prefix; at least one prompt token is decoded for fresh logits.
        common = 0
        for a, b in zip(self.cached, tokens):
            if a != b:
                break
            common += 1
        common = min(common, n_prompt - 1)
        if not self.ll.llama_memory_seq_rm(self.mem, 0, common, -1):
            # recurrent and hybrid models cannot cut a sequence in the middle: start afresh
            self.ll.llama_memory_clear(self.mem, True)
            common = 0
        del self.cached[common:]
        sampler = self._sampler(req)  # before "start": a grammar that does not parse is a plain 400
        try:
            self._run(rid, req, tokens, common, prompt_tail, sampler, limit, out)
        finally:
            self.ll.llama_sampler_free(sampler)

    def _run(self, rid: int, req: dict[str, Any], tokens: list[int], common: int, prompt_tail: str,
             sampler, limit: int, out: "Worker") -> None:
        n_prompt = len(tokens)
        start = {"ev": "start", "id": rid, "prompt_tokens": n_prompt, "cached_tokens": common,
                 "prompt_tail": prompt_tail}
        if req.get("echo"):
            start["prompt_text"] = req["prompt"] if req.get("prompt") is not None else self.detokenize(tokens)
        out.send(start)
        for i in range(common, n_prompt, self.n_batch):
            if out.cancelled(rid):
                return out.done(rid, "cancelled", None, n_prompt, 0)
            if req.get("deadline") is not None and time.time() >= req["deadline"]:
                return out.done(rid, "length", None, n_prompt, 0)
            self._decode(tokens[i:i + self.n_batch])

        top_n = req.get("logprobs")  # None: no log-probabilities; N: the chosen token's and N alternatives
        deadline = req.get("deadline")
        utf8, stops = Utf8Stream(), StopMatcher(req.get("stop") or [])
        n_gen, finish, matched, probs = 0, "length", None, []
        while True:
            tok = self.ll.llama_sampler_sample(sampler, self.ctx, -1)
            if self.ll.llama_vocab_is_eog(self.vocab, tok):
                finish = "stop"
                break
            n_gen += 1
            if top_n is not None:
                probs.append(self._logprobs(tok, top_n))
            text, matched = stops.feed(utf8.feed(self.piece(tok)))
            if text:
                event = {"ev": "text", "id": rid, "text": text, "tokens": n_gen}
                if probs:
                    event["logprobs"], probs = probs, []
                out.send(event)
            if matched is not None:
                finish = "stop"
                break
            if n_gen >= limit or (deadline is not None and time.time() >= deadline):
                break  # "length": max_tokens, the context, or server.request_timeout ran out
            if out.cancelled(rid):
                finish = "cancelled"
                break
            self._decode([tok])
        if matched is None and finish != "cancelled":
            tail, matched = stops.feed(utf8.flush())
            tail += stops.flush()
            if tail:
                event = {"ev": "text", "id": rid, "text": tail, "tokens": n_gen}
                if probs:
                    event["logprobs"] = probs
                out.send(event)
            if matched is not None:
                finish = "stop"
        out.done(rid, finish, matched, n_prompt, n_gen)

    def _logprobs(self, token: int, top_n: int) -> dict[str, Any]:
        """The model's log-probability of ``token`` and of its ``top_n`` likeliest alternatives, read
        from the logits in place (a numpy view, no copy) only when a request asks for them."""
        import numpy as np

        logits = np.ctypeslib.as_array(self.ll.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
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


class Worker:
    """The process's main loop: commands arrive on a reader thread, work runs here."""

    def __init__(self, cmd_fd: int, ev_fd: int):
        self.cmd_fd, self.ev_fd = cmd_fd, ev_fd
        self.inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.pending: deque[dict[str, Any]] = deque()
        self.cancel_ids: set[int] = set()
        self.current: int | None = None
        self.model: Model | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = protocol.read_frame_blocking(self.cmd_fd)
            except OSError:
                msg = None
            self.inbox.put(msg)
            if msg is None:
                return

    def send(self, msg: dict[str, Any]) -> None:
        try:
            protocol.write_frame_blocking(self.ev_fd, msg)
        except (BrokenPipeError, OSError):
            os._exit(0)  # the gateway is gone

    def done(self, rid: int, finish: str, stop: str | None, n_prompt: int, n_gen: int) -> None:
        self.cancel_ids.discard(rid)
        self.send({"ev": "done", "id": rid, "finish_reason": finish, "stop": stop,
                   "prompt_tokens": n_prompt, "completion_tokens": n_gen})

    def _take(self, msg: dict[str, Any] | None) -> None:
        if msg is None or msg.get("op") == "exit":
            os._exit(0)
        if msg["op"] in ("generate", "embed"):
            self.pending.append(msg)
        elif msg["op"] == "cancel":
            rid = msg["id"]
            if rid == self.current:
                self.cancel_ids.add(rid)
            else:
                self.pending = deque(m for m in self.pending if m["id"] != rid)
        elif msg["op"] == "threads" and self.model is not None:
            self.model.set_threads(msg["n"])
        elif msg["op"] in ("tokenize", "detokenize") and self.model is not None:
            self.send(self.model.answer(msg))  # answered at once, between two tokens if need be

    def cancelled(self, rid: int) -> bool:
        while True:
            try:
                self._take(self.inbox.get_nowait())
            except queue.Empty:
                return rid in self.cancel_ids

    def run(self) -> None:
        first = self.inbox.get()
        if first is None or first.get("op") != "load":
            os._exit(0)
        try:
            model = self.model = Model(protocol.LoadParams(**first["model"]))
        except Exception as e:  # report, then leave: a failed load has nothing to serve
            self.send({"ev": "load_failed", "error": str(e)})
            os._exit(0)
        self.send({"ev": "ready", "info": model.info()})
        while True:
            if not self.pending:
                self._take(self.inbox.get())
                continue
            msg = self.pending.popleft()
            rid = self.current = msg["id"]
            try:
                if msg["op"] == "embed":
                    model.embed(rid, msg["inputs"], self)
                else:
                    model.generate(rid, msg["request"], self)
            except Refused as r:
                self.send({**r.event, "id": rid})
            except Exception as e:  # a bug here must fail one request, not the worker
                self.send({"ev": "error", "id": rid, "status": 500, "message": f"{type(e).__name__}: {e}",
                           "param": None, "code": "worker_error"})
            self.cancel_ids.discard(rid)
            self.current = None


def main(argv: list[str]) -> None:
    Worker(int(argv[1]), int(argv[2])).run()


if __name__ == "__main__":
    main(sys.argv)
