"""Multimodal projectors (llama.cpp's ``mmproj`` GGUFs, loaded by libmtmd) with small random
weights, for tests that run llama.cpp's real encoder graphs on the CPU in a fraction of a second.

``write_random_projector(path, n_embd)`` writes a LLaVA-style vision projector (libmtmd's
``mlp`` type: a ViT over 8x8 patches of a 32x32 picture, then a two-layer MLP into the language
model's ``n_embd``): every picture, whatever its size, becomes a 4x4 grid of 16 tokens, which
depend on its pixels. The language model it goes with is any whose embedding length is
``n_embd`` (``testmodels.write_random_model``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .ggufwriter import finish

IMAGE_SIZE, PATCH = 32, 8  # 16 tokens a picture


def write_random_projector(path: str | os.PathLike, n_embd: int, *, audio: bool = False, seed: int = 0) -> Path:
    """A projector of random weights for a language model of embedding length ``n_embd``."""
    return (_audio if audio else _vision)(Path(path), n_embd, seed)


def _vision(path: Path, n_out: int, seed: int, width: int = 32, n_ff: int = 48, n_layer: int = 2, n_head: int = 2,
            hidden: int = 64) -> Path:
    import gguf

    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.2, half: bool = True) -> np.ndarray:
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        return values.astype(np.float16) if half else values

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.type", "mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_string("clip.projector_type", "mlp")
    for key, value in (("image_size", IMAGE_SIZE), ("patch_size", PATCH), ("embedding_length", width),
                       ("feed_forward_length", n_ff), ("projection_dim", n_out), ("block_count", n_layer),
                       ("attention.head_count", n_head)):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_bool("clip.use_gelu", True)
    w.add_tensor("v.patch_embd.weight", rand(width, 3, PATCH, PATCH, scale=0.1))  # a conv2d kernel
    w.add_tensor("v.patch_embd.bias", rand(width, half=False))
    w.add_tensor("v.position_embd.weight", rand((IMAGE_SIZE // PATCH) ** 2, width))
    for i in range(n_layer):
        blk = f"v.blk.{i}"
        for t in ("q", "k", "v", "out"):
            w.add_tensor(f"{blk}.attn_{t}.weight", rand(width, width))
            w.add_tensor(f"{blk}.attn_{t}.bias", rand(width, half=False))
        for norm in ("ln1", "ln2"):
            w.add_tensor(f"{blk}.{norm}.weight", np.ones(width, np.float32))
            w.add_tensor(f"{blk}.{norm}.bias", np.zeros(width, np.float32))
        # n_ff differs from the width: llama.cpp swaps up and down where down's rows are the width
        w.add_tensor(f"{blk}.ffn_up.weight", rand(n_ff, width))
        w.add_tensor(f"{blk}.ffn_up.bias", rand(n_ff, half=False))
        w.add_tensor(f"{blk}.ffn_down.weight", rand(width, n_ff))
        w.add_tensor(f"{blk}.ffn_down.bias", rand(width, half=False))
    w.add_tensor("mm.0.weight", rand(hidden, width))  # LLaVA's projection: linear, GELU, linear
    w.add_tensor("mm.0.bias", rand(hidden, half=False))
    w.add_tensor("mm.2.weight", rand(n_out, hidden))
    w.add_tensor("mm.2.bias", rand(n_out, half=False))
    finish(w)
    return path


def _audio(path: Path, n_out: int, seed: int, width: int = 32, n_ff: int = 48, n_layer: int = 1, n_head: int = 2,
           n_mel: int = 128) -> Path:
    import gguf

    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.2, half: bool = True) -> np.ndarray:
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        return values.astype(np.float16) if half else values

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.type", "mmproj")
    w.add_bool("clip.has_vision_encoder", False)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_string("clip.projector_type", "qwen2a")
    for key, value in (("num_mel_bins", n_mel), ("embedding_length", width), ("feed_forward_length", n_ff),
                       ("projection_dim", n_out), ("block_count", n_layer), ("attention.head_count", n_head)):
        w.add_uint32(f"clip.audio.{key}", value)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    w.add_tensor("a.conv1d.1.weight", rand(width, n_mel, 3, scale=0.05))
    w.add_tensor("a.conv1d.1.bias", rand(width, 1, half=False))
    w.add_tensor("a.conv1d.2.weight", rand(width, width, 3, scale=0.1))
    w.add_tensor("a.conv1d.2.bias", rand(width, 1, half=False))
    w.add_tensor("a.position_embd.weight", rand(1500, width, half=False))  # added as a view: f32
    for i in range(n_layer):
        blk = f"a.blk.{i}"
        for t in ("q", "k", "v", "out"):
            w.add_tensor(f"{blk}.attn_{t}.weight", rand(width, width))
            if t != "k":  # whisper's keys have no bias
                w.add_tensor(f"{blk}.attn_{t}.bias", rand(width, half=False))
        for norm in ("ln1", "ln2"):
            w.add_tensor(f"{blk}.{norm}.weight", np.ones(width, np.float32))
            w.add_tensor(f"{blk}.{norm}.bias", np.zeros(width, np.float32))
        w.add_tensor(f"{blk}.ffn_up.weight", rand(n_ff, width))
        w.add_tensor(f"{blk}.ffn_up.bias", rand(n_ff, half=False))
        w.add_tensor(f"{blk}.ffn_down.weight", rand(width, n_ff))
        w.add_tensor(f"{blk}.ffn_down.bias", rand(width, half=False))
    w.add_tensor("a.post_ln.weight", np.ones(width, np.float32))
    w.add_tensor("a.post_ln.bias", np.zeros(width, np.float32))
    w.add_tensor("mm.a.fc.weight", rand(n_out, width))
    w.add_tensor("mm.a.fc.bias", rand(n_out, half=False))
    finish(w)
    return path
