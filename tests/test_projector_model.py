"""The random projectors (``testprojector``) under libmtmd itself, through llama-cpp-python's
ctypes bindings, beside a random-weight language model on llama.cpp's Qwen2 vocabulary (the
tests' shared one, ``helpers.tiny_random_model``, written once into the repository's cache: reading
that vocabulary to write a model takes many seconds): each
loads, says what it takes, turns media bytes made here (PNG, JPEG, WAV; an MP3 of llama.cpp's
own) into chunks of tokens, and evaluates them into the language model, whose last logits then
depend on the picture or sound and on nothing else; bytes that are no medium give no bitmap.

It also pins down the call sequence the engine relies on (how the buffer, the chunks and
``mtmd_input_text`` are passed, what a chunk's id is, what ``eval_chunk_single`` expects of its
out-parameter)."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
from collections.abc import Sequence
from pathlib import Path

import llama_cpp as L
import numpy as np
import pytest
from helpers import REPO, noise_picture, tiny_random_model, tone_wav
from llama_cpp import mtmd_cpp as M

from gateway.models import testmodels as tm
from gateway.models import testprojector as tp

N_EMBD = 64  # tiny_random_model's
# One thread: ggml's workers wait for each other at every op, so on a busy machine a second one
# makes these tiny graphs wait for the scheduler (a quarter of a second a picture, not 0.1 ms)
THREADS = 1
# fewer than a sound's tokens (its embeddings go in several batches); the context reserves logits
# for a whole batch of the vocabulary's 152k tokens
N_BATCH = 128
TEXT, IMAGE, AUDIO = M.MTMD_INPUT_CHUNK_TYPE_TEXT, M.MTMD_INPUT_CHUNK_TYPE_IMAGE, M.MTMD_INPUT_CHUNK_TYPE_AUDIO
MARKER = M.mtmd_default_marker().decode()


noise, tone = noise_picture, tone_wav


@pytest.fixture(scope="module")
def language_model() -> Path:
    return tiny_random_model("qwen2", seed=1)


class Session:
    """A language model, a context on it and libmtmd's context for a projector, freed in turn."""

    kind = ""  # the session fixture's: "vision" or "audio"

    def __init__(self, model_path: Path, projector: Path, n_ctx: int = 2048):
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(str(model_path).encode(), L.llama_model_default_params())
        assert self.model
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, N_BATCH, N_BATCH
        cp.n_threads = cp.n_threads_batch = THREADS
        self.ctx = L.llama_init_from_model(self.model, cp)
        assert self.ctx
        mp = M.mtmd_context_params_default()
        mp.use_gpu, mp.n_threads, mp.print_timings = False, THREADS, False
        # libmtmd checks the projector's output against the model's n_embd here (NULL if they differ)
        self.mtmd = M.mtmd_init_from_file(str(projector).encode(), self.model, mp)
        assert self.mtmd

    def close(self) -> None:
        M.mtmd_free(self.mtmd)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def bitmap(self, data: bytes):
        """``mtmd_helper_bitmap_init_from_buf``: a picture (stb_image) or a sound (miniaudio:
        WAV, MP3, FLAC, by their magic bytes), or None. It copies the bytes."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return M.mtmd_helper_bitmap_init_from_buf(self.mtmd, buf, len(data), False)

    @contextlib.contextmanager
    def chunks(self, prompt: str, media: Sequence[bytes] = (), ids: Sequence[bytes | None] = ()):
        """``prompt`` (one marker a medium) tokenized with its media into chunks (freed after)."""
        bitmaps = [self.bitmap(m) for m in media]
        assert all(bitmaps)
        chunks = M.mtmd_input_chunks_init()
        try:
            for bitmap, id_ in zip(bitmaps, ids):
                M.mtmd_bitmap_set_id(bitmap, id_)
            text = prompt.encode()
            inp = M.mtmd_input_text(text=text, text_len=len(text), add_special=True, parse_special=True)
            array = (M.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)  # const mtmd_bitmap **
            assert M.mtmd_tokenize(self.mtmd, chunks, ctypes.byref(inp), array, len(bitmaps)) == 0
            yield chunks
        finally:
            M.mtmd_input_chunks_free(chunks)  # the bitmaps may go once tokenized: the chunks hold copies
            for bitmap in bitmaps:
                M.mtmd_bitmap_free(bitmap)

    def logits(self, prompt: str, media: Sequence[bytes] = (), *, per_chunk: bool = False) -> np.ndarray:
        """The last position's logits after reading ``prompt`` and ``media`` from an empty cache."""
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        with self.chunks(prompt, media) as chunks:
            n_past = L.llama_pos(0)
            if per_chunk:
                n = M.mtmd_input_chunks_size(chunks)
                for i in range(n):
                    # its out-parameter must hold n_past on the way in: a text chunk adds to it
                    assert M.mtmd_helper_eval_chunk_single(self.mtmd, self.ctx, M.mtmd_input_chunks_get(chunks, i),
                                                           n_past.value, 0, N_BATCH, i == n - 1,
                                                           ctypes.byref(n_past)) == 0
            else:
                assert M.mtmd_helper_eval_chunks(self.mtmd, self.ctx, chunks, 0, 0, N_BATCH, True,
                                                 ctypes.byref(n_past)) == 0
            assert n_past.value == M.mtmd_helper_get_n_pos(chunks)
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).copy()


def listing(chunks) -> list[tuple[int, int, int, bytes | None]]:
    """(type, n_tokens, n_pos, id) of each chunk."""
    out = []
    for i in range(M.mtmd_input_chunks_size(chunks)):
        c = M.mtmd_input_chunks_get(chunks, i)
        out.append((M.mtmd_input_chunk_get_type(c), M.mtmd_input_chunk_get_n_tokens(c),
                    M.mtmd_input_chunk_get_n_pos(c), M.mtmd_input_chunk_get_id(c)))
    return out


@pytest.fixture(params=["vision", "audio"])
def session(request, language_model, tmp_path):
    projector = tp.write_random_projector(tmp_path / f"mmproj-{request.param}.gguf", N_EMBD,
                                          audio=request.param == "audio")
    s = Session(language_model, projector)
    s.kind = request.param
    yield s
    s.close()


def media(kind: str) -> tuple[bytes, bytes]:
    """Two different media of the kind: a PNG and a JPEG, or two tones."""
    return (noise(1), noise(2, "JPEG")) if kind == "vision" else (tone(440), tone(660))


def test_the_projector_says_what_it_takes(session):
    vision = session.kind == "vision"
    assert M.mtmd_support_vision(session.mtmd) is vision
    assert M.mtmd_support_audio(session.mtmd) is not vision
    assert M.mtmd_get_audio_sample_rate(session.mtmd) == (-1 if vision else 16000)
    assert not M.mtmd_decode_use_mrope(session.mtmd)
    assert not M.mtmd_decode_use_non_causal(session.mtmd, None)  # its tokens may go in any batches


def test_a_medium_becomes_one_chunk_of_its_tokens_between_the_texts(session):
    one, _ = media(session.kind)
    with session.chunks(f"Look: {MARKER} What is it?", [one]) as chunks:
        rows = listing(chunks)
    kind, n = (IMAGE, tp.IMAGE_TOKENS) if session.kind == "vision" else (AUDIO, tp.AUDIO_TOKENS)
    assert [r[0] for r in rows] == [TEXT, kind, TEXT]
    assert rows[1][1:] == (n, n, hashlib.sha256(one).hexdigest().encode())  # the helper's id: the bytes' hash
    assert all(t > 0 and t == p for _, t, p, _ in rows)  # one position a token (no M-RoPE)
    assert rows[0][3] is None and rows[2][3] is None  # a text chunk has no id


def test_the_logits_depend_on_the_medium_and_only_on_it(session):
    one, other = media(session.kind)
    prompt = f"Look: {MARKER} What is it?"
    first = session.logits(prompt, [one])
    assert np.isfinite(first).all()
    assert np.array_equal(session.logits(prompt, [one]), first)  # the same bytes, the same logits
    assert not np.allclose(session.logits(prompt, [other]), first, atol=1e-4)
    assert not np.allclose(session.logits("Look:  What is it?", []), first, atol=1e-4)
    assert np.array_equal(session.logits(prompt, [one], per_chunk=True), first)


def test_bytes_that_are_no_medium_give_no_bitmap(session):
    png = noise(3)
    for bad in (png[: len(png) // 2], png[:40], b"not a picture at all" * 20, b"", tone(440)[:30]):
        assert not session.bitmap(bad)
    if session.kind == "vision":
        assert not session.bitmap(tone(440))  # a sound needs an audio projector to be read at all
    else:  # a picture is read, and refused by the tokenizer
        bitmap = session.bitmap(noise(3))
        assert bitmap
        chunks = M.mtmd_input_chunks_init()
        inp = M.mtmd_input_text(text=MARKER.encode(), text_len=len(MARKER), add_special=False, parse_special=True)
        assert M.mtmd_tokenize(session.mtmd, chunks, ctypes.byref(inp), (M.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) != 0
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bitmap)


def test_an_id_set_on_the_bitmap_is_the_chunks(language_model, tmp_path):
    s = Session(language_model, tp.write_random_projector(tmp_path / "v.gguf", N_EMBD))
    try:  # (None clears it: the chunk's id is then empty, not NULL)
        with s.chunks(f"{MARKER}{MARKER}", [noise(1), noise(1)], ids=[b"mine", None]) as chunks:
            assert [r[3] for r in listing(chunks) if r[0] == IMAGE] == [b"mine", b""]
    finally:
        s.close()


def test_every_picture_is_the_same_grid_of_tokens(language_model, tmp_path):
    s = Session(language_model, tp.write_random_projector(tmp_path / "v.gguf", N_EMBD))
    try:
        for picture in (noise(1, size=(7, 5)), noise(2, "JPEG", (300, 20)), noise(3, "GIF", (64, 64))):
            with s.chunks(MARKER, [picture]) as chunks:
                assert [r[:2] for r in listing(chunks) if r[0] != TEXT] == [(IMAGE, tp.IMAGE_TOKENS)]
    finally:
        s.close()


def test_a_sound_is_a_chunk_a_started_half_minute_and_mp3_is_read(language_model, tmp_path):
    s = Session(language_model, tp.write_random_projector(tmp_path / "a.gguf", N_EMBD, audio=True), n_ctx=4096)
    mp3 = tm.llama_cpp_source_file("tools/mtmd/test-2.mp3", REPO / ".cache" / "media")  # llama.cpp's own sample
    try:
        for sound, windows in ((tone(440, 0.05), 1), (tone(440, 31), 2), (tone(440, 1, rate=44100), 1),
                               (mp3.read_bytes(), 1)):
            with s.chunks(MARKER, [sound]) as chunks:
                rows = [r for r in listing(chunks) if r[0] != TEXT]
            assert [r[:2] for r in rows] == [(AUDIO, tp.AUDIO_TOKENS)] * windows
            assert {r[3] for r in rows} == {hashlib.sha256(sound).hexdigest().encode()}  # each window: the sound's id
        assert np.isfinite(s.logits(MARKER, [mp3.read_bytes()])).all()
    finally:
        s.close()
