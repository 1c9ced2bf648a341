"""A model's vocabulary through llama.cpp: token ids to text and back, and which tokens end a
generation. Thread-safe: prep threads tokenize and render while the main loop decodes (llama.cpp's
tokenizer only reads the vocabulary; the caches here are filled idempotently)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .infill import FimTokens
from .refusals import Refused


class Vocab:
    def __init__(self, ll: Any, model: Any) -> None:
        self.ll = ll
        self.handle = ll.llama_model_get_vocab(model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.handle)
        self.bos = ll.llama_vocab_bos(self.handle)
        self.eos = ll.llama_vocab_eos(self.handle)
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.handle))
        self.fim = self._fim_tokens()
        self._pieces: dict[int, bytes] = {}
        self._is_eog: dict[int, bool] = {}
        self._eog: list[int] | None = None
        self._longest_piece: int | None = None  # bytes; found on the first prompt that needs it
        self._scan_lock = threading.Lock()

    def piece(self, token: int) -> bytes:
        """A token's text, special tokens shown (so control-token markers such as ``<|channel|>``
        reach the answer's text)."""
        p = self._pieces.get(token)
        if p is None:
            p = self._pieces[token] = self._render_piece(token, ctypes.create_string_buffer(256))
        return p

    def _render_piece(self, token: int, buf) -> bytes:
        """A token's text, special tokens shown (``buf``: the caller's, as threads call this)."""
        n = self.ll.llama_token_to_piece(self.handle, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.ll.llama_token_to_piece(self.handle, token, buf, -n, 0, True)
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

    def _fim_tokens(self) -> FimTokens:
        """The fill-in-the-middle tokens llama.cpp found: the GGUF's ``tokenizer.ggml.fim_*``
        ids, else the known token texts (llama-vocab.cpp); -1 (LLAMA_TOKEN_NULL) is none."""
        def get(name: str) -> int | None:
            tok = getattr(self.ll, f"llama_vocab_fim_{name}")(self.handle)
            return tok if 0 <= tok < self.n_vocab else None

        return FimTokens(*(get(n) for n in ("pre", "suf", "mid", "rep", "sep", "pad")))

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        """``parse_special``: special tokens written in the text are read as such (a chat
        template's markers); off for text a caller wrote as it is (fill-in-the-middle code)."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (self.ll.llama_token * cap)()
        n = self.ll.llama_tokenize(self.handle, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (self.ll.llama_token * cap)()
            n = self.ll.llama_tokenize(self.handle, data, len(data), arr, cap, add_special, parse_special)
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
            n = self.ll.llama_detokenize(self.handle, arr, len(tokens), buf, cap, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            cap = -n
        raise Refused(500, "llama_detokenize failed", None, "detokenize_failed")

    def known_ids(self, tokens: list[Any], param: str) -> list[int]:
        """``tokens`` as a list, if every one is an id of this vocabulary; else a 400 naming ``param``."""
        bad = next((t for t in tokens if not isinstance(t, int) or not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise Refused(400, f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})", param)
        return list(tokens)

    def single_token(self, text: str) -> bool:
        """Whether ``text`` is one token of this vocabulary, spelled exactly so."""
        tokens = self.tokenize(text, add_special=False)
        return len(tokens) == 1 and self.piece(tokens[0]) == text.encode()

    def is_eog(self, token: int) -> bool:
        eog = self._is_eog.get(token)
        if eog is None:
            eog = self._is_eog[token] = bool(self.ll.llama_vocab_is_eog(self.handle, token))
        return eog

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token (found on first use: it reads the whole vocabulary)."""
        if self._eog is None:
            self._eog = [t for t in range(self.n_vocab) if self.ll.llama_vocab_is_eog(self.handle, t)]
        return self._eog
