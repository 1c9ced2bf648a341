"""Pictures and sounds in prompts, through llama.cpp's multimodal library (libmtmd, bound as
``llama_cpp.mtmd_cpp``), as llama-server reads them.

A model loaded with a projector (``mmproj``) has a ``Projector``. ``Projector.tokenize`` (on a
prep thread) reads a prompt's text, where each picture or sound stands as the marker, into the
prompt's tokens: text as the vocabulary's tokens, each medium as a ``Run`` of positions, encoded
by the projector there and then (the decode loop only evaluates what was encoded). A run's
positions hold stand-in tokens below zero, drawn from the medium's digest and the position, so
that the slots' and the prompt cache's prefix matching (plain token lists) reuses a cached
picture exactly where the same bytes come at the same place, and never a part of one
(``floor``: a prefix ending inside a run goes back to its start). A run of an M-RoPE model
spans its ``n_pos`` positions (fewer than its embeddings), so that a slot's token count stays
its next position.

``Projector.decode`` (the decode loop's) evaluates a run's embeddings into a slot's sequence,
in batches of ``n_batch`` (with the non-causal attention a projector may ask for)."""

from __future__ import annotations

import base64
import ctypes
import functools
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from . import ipc
from .refusals import Refused

EMBEDDINGS_KEPT = 16  # the encoded media kept for prompts that come back with them (least recently used goes)


@dataclass(eq=False)
class Run:
    """One picture or sound in a prompt: where it starts, the positions and embeddings it takes."""

    start: int
    n_pos: int
    n_tokens: int
    kind: str  # image | audio
    key: bytes  # the digest of its bytes
    chunk: Any  # its mtmd_input_chunk (a copy this run owns)
    embd: Any = field(default=None, repr=False)  # its n_tokens x n_embd encoded floats (ctypes array)

    @functools.cached_property
    def tokens(self) -> list[int]:
        """The stand-ins of its positions (made once: the prompt and its reading both take them)."""
        return stand_ins(self.key, self.n_pos)


def stand_ins(key: bytes, n: int) -> list[int]:
    """The tokens that stand for a medium's ``n`` positions: each below zero (no vocabulary's
    id), from its digest and the position, so two media share a run only with the same bytes."""
    out = []
    for i in range(n):
        h = hashlib.blake2b(key + i.to_bytes(4, "little"), digest_size=4).digest()
        out.append(-1 - (int.from_bytes(h, "little") & 0x7FFFFFFF))
    return out


def floor(runs: dict[int, Run], pos: int) -> int:
    """``pos``, or the start of the run it falls inside: a cached prefix is kept to a whole medium."""
    for start, run in runs.items():
        if start < pos < start + run.n_pos:
            return start
    return pos


def next_start(runs: dict[int, Run], pos: int, end: int) -> int:
    """Where the first run at or after ``pos`` starts (``end`` where none does)."""
    return min((s for s in runs if s >= pos), default=end)


class Projector:
    """A model's projector (libmtmd's context): what it takes, its prompts, its evaluation."""

    def __init__(self, ll: Any, model: Any, path: str, n_threads: int, use_gpu: bool):
        from llama_cpp import mtmd_cpp

        self.ll, self.mt = ll, mtmd_cpp
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu, params.n_threads, params.print_timings = use_gpu, n_threads, False
        params.warmup = True
        self.ctx = mtmd_cpp.mtmd_init_from_file(path.encode(), model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not load the projector {path} (not an mmproj GGUF, or made for "
                               "another model: its output size must be the model's embedding size)")
        self.vision = bool(mtmd_cpp.mtmd_support_vision(self.ctx))
        self.audio = bool(mtmd_cpp.mtmd_support_audio(self.ctx))
        self.n_embd = ll.llama_model_n_embd_inp(model) if hasattr(ll, "llama_model_n_embd_inp") \
            else ll.llama_model_n_embd(model)
        # one prompt read at a time (the prep threads share the context: its preprocessors and its
        # one output buffer); the decode loop only reads what a read left (``decode``)
        self.lock = threading.RLock()
        self.kept: OrderedDict[bytes, Any] = OrderedDict()  # digest -> encoded embeddings

    def tokenize(self, text: str, media: list[ipc.Media], add_special: bool,
                 encode: bool = True) -> tuple[list[int], dict[int, Run]]:
        """The prompt's tokens (stand-ins for each medium's positions) and its runs by start,
        each encoded where ``encode``. Raises ``Refused``: a 400 naming the part llama.cpp
        cannot decode, or a prompt whose markers do not match its media."""
        with self.lock:
            return self._tokenize(text, media, add_special, encode)

    def _tokenize(self, text: str, media: list[ipc.Media], add_special: bool,
                  encode: bool) -> tuple[list[int], dict[int, Run]]:
        mt = self.mt
        bitmaps, keys = [], []
        try:
            for m in media:
                data = base64.b64decode(m.data)
                key = hashlib.blake2b(data, digest_size=16).digest()
                buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
                bitmap = mt.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False)
                if not bitmap:
                    what = "a picture" if m.kind == "image" else "audio"
                    raise Refused(400, f"`{m.param}` could not be decoded as {what} (truncated or damaged?)",
                                  m.param, "invalid_media")
                bitmaps.append(bitmap)
                keys.append(key)
                if mt.mtmd_bitmap_is_audio(bitmap) != (m.kind == "audio"):
                    raise Refused(400, f"`{m.param}` is not {'audio' if m.kind == 'audio' else 'a picture'}",
                                  m.param, "invalid_media")
                mt.mtmd_bitmap_set_id(bitmap, key.hex().encode())
            return self._chunks(text, media, bitmaps, keys, add_special, encode)
        finally:
            for bitmap in bitmaps:
                mt.mtmd_bitmap_free(bitmap)

    def _chunks(self, text: str, media: list[ipc.Media], bitmaps: list[Any], keys: list[bytes],
                add_special: bool, encode: bool) -> tuple[list[int], dict[int, Run]]:
        mt = self.mt
        data = text.encode("utf-8")
        given = mt.mtmd_input_text(data, len(data), add_special, True)
        array = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        marks = text.count(mt.mtmd_default_marker().decode())
        if marks != len(media):
            raise Refused(400, f"the prompt holds {marks} media markers for {len(media)} pictures and sounds (a "
                               "marker written in a text, or a chat template that left a message out)",
                          media[0].param, "invalid_media")
        chunks = mt.mtmd_input_chunks_init()
        try:
            rc = mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(given), array, len(bitmaps))
            if rc != 0:
                raise Refused(400, f"llama.cpp could not read the media of this prompt (mtmd_tokenize: {rc})",
                              media[0].param, "invalid_media")
            tokens: list[int] = []
            runs: dict[int, Run] = {}
            parts = {key.hex().encode(): (key, m.param) for key, m in zip(keys, media)}
            seen: dict[bytes, int] = {}  # a medium's chunks so far (some projectors cut a picture in slices)
            for i in range(mt.mtmd_input_chunks_size(chunks)):
                chunk = mt.mtmd_input_chunks_get(chunks, i)
                kind = mt.mtmd_input_chunk_get_type(chunk)
                if kind == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t(0)
                    ids = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    tokens.extend(ids[:n.value])
                    continue
                key, param = parts[mt.mtmd_input_chunk_get_id(chunk) or b""]
                nth = seen[key] = seen.get(key, -1) + 1
                run = Run(len(tokens), mt.mtmd_input_chunk_get_n_pos(chunk), mt.mtmd_input_chunk_get_n_tokens(chunk),
                          "audio" if kind == mt.MTMD_INPUT_CHUNK_TYPE_AUDIO else "image",
                          key if not nth else hashlib.blake2b(key + bytes([nth % 256]), digest_size=16).digest(),
                          mt.mtmd_input_chunk_copy(chunk))
                runs[run.start] = run
                try:
                    if encode:
                        self._encode(run, param)
                except BaseException:
                    self.free(runs)
                    raise
                tokens.extend(run.tokens)
            return tokens, runs
        finally:
            mt.mtmd_input_chunks_free(chunks)

    def _encode(self, run: Run, param: str) -> None:
        """The run's embeddings: kept ones where the same medium was encoded lately, else the
        projector's (a 500 where it fails)."""
        with self.lock:
            embd = self.kept.get(run.key)
            if embd is not None and len(embd) == run.n_tokens * self.n_embd:
                self.kept.move_to_end(run.key)
                run.embd = embd
                return
            if self.mt.mtmd_encode_chunk(self.ctx, run.chunk) != 0:
                raise Refused(500, f"the projector failed to encode `{param}`", param, "encode_failed")
            size = run.n_tokens * self.n_embd
            embd = (ctypes.c_float * size)()
            ctypes.memmove(embd, self.mt.mtmd_get_output_embd(self.ctx), size * ctypes.sizeof(ctypes.c_float))
            run.embd = self.kept[run.key] = embd
            while len(self.kept) > EMBEDDINGS_KEPT:
                self.kept.popitem(last=False)

    def decode(self, lctx: Any, run: Run, seq_id: int, n_past: int, n_batch: int) -> int:
        """Evaluate ``run``'s embeddings into sequence ``seq_id`` from position ``n_past``:
        llama_decode's status (0: done)."""
        new_n_past = self.ll.llama_pos(0)
        return self.mt.mtmd_helper_decode_image_chunk(
            self.ctx, lctx, run.chunk, run.embd, n_past, seq_id, n_batch, ctypes.byref(new_n_past),
            self.mt.mtmd_helper_post_decode_callback(), None)

    def free(self, runs: dict[int, Run]) -> None:
        """Let go of the chunks a finished prompt's runs own."""
        for run in runs.values():
            if run.chunk:
                self.mt.mtmd_input_chunk_free(run.chunk)
                run.chunk = None
