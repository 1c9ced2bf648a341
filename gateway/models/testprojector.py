"""Multimodal projectors (llama.cpp's ``mmproj`` GGUFs, loaded by libmtmd) with small random
weights, for tests that run llama.cpp's real preprocessing and encoder graphs on the CPU in a
fraction of a second.

``write_random_projector(path, n_embd)`` writes a vision projector of libmtmd's ``mlp`` type
(LLaVA 1.5's: a ViT over the picture's patches, then a two-layer MLP into the language model's
embeddings). libmtmd resizes every picture to the encoder's square input first, so any picture
stb_image reads (PNG, JPEG, GIF, BMP ...), whatever its size, becomes the same number of tokens
(``IMAGE_TOKENS``), and those tokens depend on its pixels.

``audio=True`` writes an audio projector of libmtmd's ``qwen2a`` type (Qwen2-Audio's: a Whisper
encoder, two 1-D convolutions over the log-mel spectrogram and its layers, average-pooled in
pairs, then one linear layer). libmtmd reads WAV, MP3 and FLAC (miniaudio), resamples them to
16 kHz mono, and cuts the sound into 30-second windows, the last one padded with silence: every
window started is ``AUDIO_TOKENS`` tokens, however little of it the sound fills.

The language model to pair either with is any whose embedding length is ``n_embd``
(``testmodels.write_random_model``): libmtmd refuses a projector whose output differs from it.
The two projectors read nothing of the language model's vocabulary (neither needs special
tokens: Qwen2-Audio's ``<|audio_bos|>`` / ``<|audio_eos|>`` markers are read as plain text where
the vocabulary lacks them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .ggufwriter import finish

IMAGE_SIZE, PATCH = 32, 8  # the encoder's input and patch sides, in pixels
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # the MLP keeps one token a patch
N_MEL = 128  # mel bands, as Qwen2-Audio's (Whisper large-v3's) encoder reads
# Whisper reads a 30-second window as 3000 mel frames; its second convolution halves them, and
# Qwen2-Audio's pooling halves them again
AUDIO_POSITIONS = 3000 // 2
AUDIO_TOKENS = AUDIO_POSITIONS // 2

Rand = Callable[..., np.ndarray]


def write_random_projector(path: str | os.PathLike, n_embd: int, *, audio: bool = False, seed: int = 0) -> Path:
    """A projector of random weights (the same for the same ``seed``) for a language model of
    embedding length ``n_embd``: a picture projector, or with ``audio`` a sound projector."""
    import gguf

    w = gguf.GGUFWriter(str(path), "clip")  # libmtmd reads no architecture: "clip" is the converters'
    w.add_type("mmproj")
    w.add_name("random audio projector" if audio else "random vision projector")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_bool("clip.has_vision_encoder", not audio)
    w.add_bool("clip.has_audio_encoder", audio)
    rand = _random(seed)
    if audio:
        _audio(w, rand, n_embd)
    else:
        _vision(w, rand, n_embd)
    finish(w)
    return Path(path)


def _random(seed: int) -> Rand:
    """``rand(*shape, scale=, half=)``: normal weights, F16 (matrices) or F32 (biases, norms)."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.2, half: bool = True) -> np.ndarray:
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        return values.astype(np.float16) if half else values

    return rand


def _hparams(w, modality: str, width: int, n_ff: int, n_layer: int, n_head: int, n_out: int) -> None:
    for key, value in (("embedding_length", width), ("feed_forward_length", n_ff), ("block_count", n_layer),
                       ("attention.head_count", n_head), ("projection_dim", n_out)):
        w.add_uint32(f"clip.{modality}.{key}", value)
    w.add_float32(f"clip.{modality}.attention.layer_norm_epsilon", 1e-5)


def _vision(w, rand: Rand, n_out: int, width: int = 32, n_ff: int = 48, n_layer: int = 2, n_head: int = 2,
            hidden: int = 64) -> None:
    w.add_string("clip.projector_type", "mlp")
    _hparams(w, "vision", width, n_ff, n_layer, n_head, n_out)
    w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", PATCH)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_bool("clip.use_gelu", True)
    w.add_tensor("v.patch_embd.weight", rand(width, 3, PATCH, PATCH, scale=0.1))  # a conv2d kernel, stride PATCH
    w.add_tensor("v.patch_embd.bias", rand(width, half=False))
    w.add_tensor("v.position_embd.weight", rand(IMAGE_TOKENS, width))
    # LLaVA takes the second-to-last layer's output: the last layer is loaded, never run
    _layers(w, rand, "v", width, n_ff, n_layer)
    w.add_tensor("mm.0.weight", rand(hidden, width))  # LLaVA's projection: linear, GELU, linear
    w.add_tensor("mm.0.bias", rand(hidden, half=False))
    w.add_tensor("mm.2.weight", rand(n_out, hidden))
    w.add_tensor("mm.2.bias", rand(n_out, half=False))


def _audio(w, rand: Rand, n_out: int, width: int = 32, n_ff: int = 48, n_layer: int = 1, n_head: int = 2) -> None:
    w.add_string("clip.projector_type", "qwen2a")
    _hparams(w, "audio", width, n_ff, n_layer, n_head, n_out)
    w.add_uint32("clip.audio.num_mel_bins", N_MEL)
    # Whisper's stem: two kernel-3 convolutions (the second of stride 2), GELU after each; the
    # biases broadcast over the frames, hence their trailing axis of one (as the converter writes them)
    w.add_tensor("a.conv1d.1.weight", rand(width, N_MEL, 3, scale=0.05))
    w.add_tensor("a.conv1d.1.bias", rand(width, 1, half=False))
    w.add_tensor("a.conv1d.2.weight", rand(width, width, 3, scale=0.1))
    w.add_tensor("a.conv1d.2.bias", rand(width, 1, half=False))
    # F32: Whisper adds it to the frames (ggml's CPU add takes no F16 addend), where LLaVA gathers rows
    w.add_tensor("a.position_embd.weight", rand(AUDIO_POSITIONS, width, half=False))
    _layers(w, rand, "a", width, n_ff, n_layer, k_bias=False)  # Whisper's keys have no bias
    w.add_tensor("a.post_ln.weight", np.ones(width, np.float32))
    w.add_tensor("a.post_ln.bias", np.zeros(width, np.float32))
    w.add_tensor("mm.a.fc.weight", rand(n_out, width))
    w.add_tensor("mm.a.fc.bias", rand(n_out, half=False))


def _layers(w, rand: Rand, prefix: str, width: int, n_ff: int, n_layer: int, k_bias: bool = True) -> None:
    """Pre-norm transformer layers (layer norms with biases, a GELU feed-forward)."""
    for i in range(n_layer):
        blk = f"{prefix}.blk.{i}"
        for t in ("q", "k", "v", "out"):
            w.add_tensor(f"{blk}.attn_{t}.weight", rand(width, width))
            if t != "k" or k_bias:
                w.add_tensor(f"{blk}.attn_{t}.bias", rand(width, half=False))
        for norm in ("ln1", "ln2"):
            w.add_tensor(f"{blk}.{norm}.weight", np.ones(width, np.float32))
            w.add_tensor(f"{blk}.{norm}.bias", np.zeros(width, np.float32))
        # n_ff must differ from the width: where ffn_down's rows are as long as the width,
        # libmtmd takes the file for one of the old converters' that swapped up and down
        w.add_tensor(f"{blk}.ffn_up.weight", rand(n_ff, width))
        w.add_tensor(f"{blk}.ffn_up.bias", rand(n_ff, half=False))
        w.add_tensor(f"{blk}.ffn_down.weight", rand(width, n_ff))
        w.add_tensor(f"{blk}.ffn_down.bias", rand(width, half=False))
