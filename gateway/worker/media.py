"""Pictures and sounds in prompts, through llama.cpp's multimodal library (libmtmd, bound as
``llama_cpp.mtmd_cpp``), as llama-server reads them.

A model loaded with a projector (``mmproj``) has a ``Projector``. ``Projector.tokenize`` (on a
prep thread) reads a prompt's text, where each picture or sound stands as the marker, into the
prompt's tokens: text as the vocabulary's tokens, each medium as a ``Run`` of positions. A
picture is counted from the size the gateway read in its header (``protocol.Media.size``): libmtmd
tokenizes a placeholder of that size, nothing decoded; a sound is decoded there (its tokens
depend on its samples), within the length its header gave. So a prompt too long for the
context is refused before any picture is decoded or any medium encoded.

``Projector.encode`` (on the prep thread, once the prompt fits) gives each run its embeddings:
kept ones where the same medium came lately within the same cache scope, else the projector's,
one medium at a time: a picture is decoded (and checked to be the size it was counted at),
tokenized alone and encoded, and its bitmap freed before the next is decoded, so at most one
decoded picture is alive in the worker. A sound's run lets go of its samples once encoded.

A run's positions hold stand-in tokens below zero, drawn from the medium's digest and the
position, so that the slots' and the prompt cache's prefix matching (plain token lists) reuses
a cached picture exactly where the same bytes come at the same place, and never a part of one
(``floor``: a prefix ending inside a run goes back to its start). A run of an M-RoPE model spans
its ``n_pos`` positions (fewer than its embeddings), so that a slot's token count stays its next
position.

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

from .. import protocol
from .refusals import Refused

# The encoded media kept for prompts that come back with them, all cache scopes together; the
# least recently used go first, and one larger than this is not kept
EMBEDDINGS_KEPT_BYTES = 256 * 2**20
# libmtmd hands bytes stb_image cannot read to ffmpeg as a video, at whatever size it finds
# there: the helper is pointed at a directory that cannot hold ffmpeg, so nothing but stb_image
# and miniaudio ever decodes (the gateway sized what they will make, never what ffmpeg would)
NO_FFMPEG = b"/dev/null/"


@dataclass(eq=False)
class Run:
    """One picture or sound in a prompt (or one of its parts, where libmtmd cuts it): where it
    starts, the positions and embeddings it takes."""

    start: int
    n_pos: int
    n_tokens: int
    kind: str  # image | audio
    key: bytes  # the digest of its bytes (and of its part's place in them)
    chunk: Any  # its mtmd_input_chunk (a copy this run owns; a placeholder once nothing needs its data)
    embd: Any = field(default=None, repr=False)  # its n_tokens x n_embd encoded floats (ctypes array)
    medium: int = 0  # which of the prompt's media it is

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


def resampled(frames: int, rate: int, target: int) -> int:
    """``ma_calculate_frame_count_after_resampling``: the samples miniaudio makes (and allocates
    for) of ``frames`` at ``rate`` for a projector taking ``target`` a second."""
    if not rate or not target or not frames:
        return 0
    if rate == target:
        return frames
    wrap = (1 << 64) - 1  # its uint64 arithmetic
    out = (frames * target & wrap) // rate
    back = ((out * (rate % target) & wrap) + (out * (rate // target) & wrap) // target) & wrap
    return out + 1 if back <= frames else out


class EmbeddingCache:
    """Encoded media by (cache scope, digest), bounded by their bytes (least recently used go
    first): a prompt's picture is reused only within its own scope (``cache_scope``), so an
    encode's timing cannot tell one API key another's picture."""

    def __init__(self, max_bytes: int = EMBEDDINGS_KEPT_BYTES):
        self.max_bytes, self.bytes = max_bytes, 0
        self.entries: OrderedDict[tuple[str, bytes], Any] = OrderedDict()

    def get(self, scope: str, key: bytes, size: int) -> Any:
        embd = self.entries.get((scope, key))
        if embd is None or len(embd) != size:
            return None
        self.entries.move_to_end((scope, key))
        return embd

    def put(self, scope: str, key: bytes, embd: Any) -> None:
        size = ctypes.sizeof(embd)
        if size > self.max_bytes:
            return
        old = self.entries.pop((scope, key), None)
        self.bytes += size - (ctypes.sizeof(old) if old is not None else 0)
        self.entries[scope, key] = embd
        while self.bytes > self.max_bytes:
            _, gone = self.entries.popitem(last=False)
            self.bytes -= ctypes.sizeof(gone)


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
        self.sample_rate = mtmd_cpp.mtmd_get_audio_sample_rate(self.ctx)
        self.n_embd = ll.llama_model_n_embd_inp(model) if hasattr(ll, "llama_model_n_embd_inp") \
            else ll.llama_model_n_embd(model)
        self.opt = mtmd_cpp.mtmd_helper_init_opt_default()
        self.opt.video_params.ffmpeg_bin_dir = NO_FFMPEG
        # one medium read at a time (the prep threads share the context: its preprocessors and its
        # one output buffer); the decode loop only reads what a read left (``decode``)
        self.lock = threading.RLock()
        self.kept = EmbeddingCache()

    def tokenize(self, text: str, media: list[protocol.Media], add_special: bool) -> tuple[list[int], dict[int, Run]]:
        """The prompt's tokens (stand-ins for each medium's positions) and its runs by start,
        not yet encoded (``encode``). Raises ``Refused``: a 400 naming the part llama.cpp cannot
        decode, or a prompt whose markers do not match its media."""
        marks = text.count(self.mt.mtmd_default_marker().decode())
        if marks != len(media):
            raise Refused(400, f"the prompt holds {marks} media markers for {len(media)} pictures and sounds (a "
                               "marker written in a text, or a chat template that left a message out)",
                          media[0].param, "invalid_media")
        with self.lock:
            bitmaps: list[Any] = []
            try:
                for i, m in enumerate(media):
                    bitmaps.append(self._counted(m, i))
                return self._chunks(text, media, bitmaps, add_special)
            finally:
                for bitmap in bitmaps:
                    self.mt.mtmd_bitmap_free(bitmap)

    def _counted(self, m: protocol.Media, index: int) -> Any:
        """What libmtmd counts the ``index``-th medium's tokens from: a placeholder of a
        picture's size (decoded only where the gateway gave none), a sound's samples."""
        mt = self.mt
        if m.kind == "image" and all(m.size):
            bitmap = mt.mtmd_bitmap_init(m.size[0], m.size[1], None)
        else:
            bitmap = self._decoded(m, base64.b64decode(m.data), placeholder=m.kind == "image")
            if m.kind == "image":
                m.size = (mt.mtmd_bitmap_get_nx(bitmap), mt.mtmd_bitmap_get_ny(bitmap))
        mt.mtmd_bitmap_set_id(bitmap, str(index).encode())
        return bitmap

    def _decoded(self, m: protocol.Media, data: bytes, placeholder: bool = False) -> Any:
        """``m``'s bitmap, decoded by stb_image or miniaudio alone (a placeholder keeps only its
        size); a sound no longer than its header said. Raises ``Refused``."""
        mt = self.mt
        what = "a picture" if m.kind == "image" else "audio"
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        made = mt.mtmd_helper_bitmap_init_from_buf_wrapper(self.ctx, buf, len(data), placeholder, self.opt)
        bitmap = made.bitmap
        if made.video_ctx:  # (never, with no ffmpeg to run)
            if bitmap:
                mt.mtmd_bitmap_free(bitmap)
            mt.mtmd_helper_video_free(made.video_ctx)
            bitmap = None
        if not bitmap:
            raise Refused(400, f"`{m.param}` could not be decoded as {what} (truncated or damaged?)",
                          m.param, "invalid_media")
        if mt.mtmd_bitmap_is_audio(bitmap) != (m.kind == "audio"):
            mt.mtmd_bitmap_free(bitmap)
            raise Refused(400, f"`{m.param}` is not {what}", m.param, "invalid_media")
        if m.kind == "audio" and all(m.size):
            samples, most = mt.mtmd_bitmap_get_nx(bitmap), resampled(m.size[0], m.size[1], self.sample_rate)
            if samples > most:
                mt.mtmd_bitmap_free(bitmap)
                raise Refused(400, f"`{m.param}` decodes to {samples} samples, more than its header says "
                                   f"({m.size[0]} frames at {m.size[1]} Hz)", m.param, "invalid_media")
        return bitmap

    def _chunks(self, text: str, media: list[protocol.Media], bitmaps: list[Any],
                add_special: bool) -> tuple[list[int], dict[int, Run]]:
        mt = self.mt
        data = text.encode("utf-8")
        given = mt.mtmd_input_text(data, len(data), add_special, True)
        array = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        chunks = mt.mtmd_input_chunks_init()
        try:
            rc = mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(given), array, len(bitmaps))
            if rc != 0:
                raise Refused(400, f"llama.cpp could not read the media of this prompt (mtmd_tokenize: {rc})",
                              media[0].param, "invalid_media")
            tokens: list[int] = []
            runs: dict[int, Run] = {}
            digests = [hashlib.blake2b(base64.b64decode(m.data), digest_size=16).digest() for m in media]
            parts = [0] * len(media)  # a medium's chunks so far (some projectors cut one in parts)
            for i in range(mt.mtmd_input_chunks_size(chunks)):
                chunk = mt.mtmd_input_chunks_get(chunks, i)
                kind = mt.mtmd_input_chunk_get_type(chunk)
                if kind == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t(0)
                    ids = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    tokens.extend(ids[:n.value])
                    continue
                medium = int(mt.mtmd_input_chunk_get_id(chunk))
                nth, parts[medium] = parts[medium], parts[medium] + 1
                key = digests[medium] if not nth else hashlib.blake2b(digests[medium] + nth.to_bytes(4, "little"),
                                                                      digest_size=16).digest()
                run = Run(len(tokens), mt.mtmd_input_chunk_get_n_pos(chunk), mt.mtmd_input_chunk_get_n_tokens(chunk),
                          "audio" if kind == mt.MTMD_INPUT_CHUNK_TYPE_AUDIO else "image", key,
                          mt.mtmd_input_chunk_copy(chunk), medium=medium)
                runs[run.start] = run
                tokens.extend(run.tokens)
            return tokens, runs
        finally:
            mt.mtmd_input_chunks_free(chunks)

    def encode(self, runs: dict[int, Run], media: list[protocol.Media], scope: str = "") -> None:
        """Each run's embeddings: kept ones where the same medium was encoded lately in
        ``scope``, else the projector's, one medium at a time. Raises ``Refused`` (a 400 for a
        picture that does not decode to the size it was counted at, a 500 where the projector
        fails)."""
        by_medium: dict[int, list[Run]] = {}
        for run in runs.values():
            by_medium.setdefault(run.medium, []).append(run)
        for medium, parts in by_medium.items():
            with self.lock:
                missing = [r for r in parts if not self._reuse(r, scope)]
                if not missing:
                    continue
                m = media[medium]
                if m.kind == "audio":  # its runs hold its samples already
                    for run in missing:
                        self._encode(run, run.chunk, m.param, scope)
                else:
                    self._encode_picture(m, parts, missing, scope)

    def _reuse(self, run: Run, scope: str) -> bool:
        run.embd = self.kept.get(scope, run.key, run.n_tokens * self.n_embd)
        return run.embd is not None

    def _encode_picture(self, m: protocol.Media, parts: list[Run], missing: list[Run], scope: str) -> None:
        """A picture decoded, checked, tokenized alone and encoded, its bitmap freed first."""
        mt = self.mt
        bitmap = self._decoded(m, base64.b64decode(m.data))
        chunks = mt.mtmd_input_chunks_init()
        try:
            size = (mt.mtmd_bitmap_get_nx(bitmap), mt.mtmd_bitmap_get_ny(bitmap))
            marker = mt.mtmd_default_marker()
            given = mt.mtmd_input_text(marker, len(marker), False, True)
            rc = mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(given), (mt.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
            mt.mtmd_bitmap_free(bitmap)
            bitmap = None
            own = [c for i in range(mt.mtmd_input_chunks_size(chunks))
                   if mt.mtmd_input_chunk_get_type(c := mt.mtmd_input_chunks_get(chunks, i))
                   != mt.MTMD_INPUT_CHUNK_TYPE_TEXT]
            if rc != 0:
                raise Refused(400, f"llama.cpp could not read `{m.param}` (mtmd_tokenize: {rc})", m.param,
                              "invalid_media")
            if size != tuple(m.size) or [mt.mtmd_input_chunk_get_n_tokens(c) for c in own] != \
                    [r.n_tokens for r in parts]:
                w, h = m.size
                raise Refused(400, f"`{m.param}` decodes to {size[0]}x{size[1]} pixels, not the {w}x{h} its header "
                                   "says", m.param, "invalid_media")
            for run, chunk in zip(parts, own):
                if run in missing:
                    self._encode(run, chunk, m.param, scope)
        finally:
            if bitmap is not None:
                mt.mtmd_bitmap_free(bitmap)
            mt.mtmd_input_chunks_free(chunks)

    def _encode(self, run: Run, chunk: Any, param: str, scope: str) -> None:
        """The projector's embeddings of ``chunk`` as ``run``'s (a 500 where it fails), kept;
        the run's own chunk let go of its data."""
        if self.mt.mtmd_encode_chunk(self.ctx, chunk) != 0:
            raise Refused(500, f"the projector failed to encode `{param}`", param, "encode_failed")
        size = run.n_tokens * self.n_embd
        embd = (ctypes.c_float * size)()
        ctypes.memmove(embd, self.mt.mtmd_get_output_embd(self.ctx), size * ctypes.sizeof(ctypes.c_float))
        run.embd = embd
        self.kept.put(scope, run.key, embd)
        if run.kind == "audio":  # its mel spectrogram: the decode needs only the chunk's shape
            placeholder = self.mt.mtmd_input_chunk_get_placeholder(run.chunk)
            if placeholder:
                self.mt.mtmd_input_chunk_free(run.chunk)
                run.chunk = placeholder

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
