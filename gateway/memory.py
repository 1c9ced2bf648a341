"""What a model will take in memory before it loads: a pure estimate from its GGUF header and
its models.yaml settings, the way llama.cpp lays a model out.

- weights: the tensors' bytes. Everything is counted in one pool, system memory: the split
  between devices (the layers ``n_gpu_layers`` sends to a GPU) is not built.
- KV cache: for every layer, ``head_count_kv x (key_length + value_length)`` values per cell
  in the cache types; cells are ``n_ctx`` per slot times ``parallel`` (one pool of ``n_ctx``
  with ``kv_unified``), rounded up to llama.cpp's 256.
- compute: llama.cpp's graph buffer and output buffer: the logits of a batch and the
  activations of one micro-batch (``n_ubatch``), and without flash attention its score
  matrix.

``tests/test_memory.py`` compares the estimate with what a loaded worker holds and states the
error it sees. The placement that would use it (loading by memory, not by count) is not built:
``/models`` shows the estimate beside the measured resident memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import ModelSpec
from .engine.protocol import CACHE_TYPES, DEFAULT_N_CTX
from .ggufmeta import GGUFInfo

COMPUTE_OVERHEAD = 4 * 2**20  # llama.cpp's graph buffers beyond the rows counted (seen on the tiny models)


@dataclass(frozen=True)
class Estimate:
    weights: int
    kv: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    def describe(self) -> dict[str, int]:
        return {"weights": self.weights, "kv_cache": self.kv, "compute": self.compute, "total": self.total}


def _pad(n: int, to: int = 256) -> int:
    return -(-n // to) * to


def estimate(info: GGUFInfo, spec: ModelSpec) -> Estimate | None:
    """The estimate for ``spec`` as llama.cpp would load it; None where the header does not say
    enough (no layer count or embedding size)."""
    shape = info.shape
    n_layer = int(shape.get("block_count") or 0)
    n_embd = int(shape.get("embedding_length") or 0)
    if not n_layer or not n_embd:
        return None
    n_head = int(shape.get("attention.head_count") or 1)
    n_head_kv = int(shape.get("attention.head_count_kv") or n_head)
    head_k = int(shape.get("attention.key_length") or n_embd // n_head)
    head_v = int(shape.get("attention.value_length") or n_embd // n_head)
    n_ff = int(shape.get("feed_forward_length") or 4 * n_embd)
    trained = int(shape.get("context_length") or DEFAULT_N_CTX)

    embeddings = spec.embeddings or spec.reranker
    slots = 1 if embeddings else spec.parallel
    n_ctx = _pad(spec.n_ctx or min(trained, DEFAULT_N_CTX))
    cells = n_ctx if spec.kv_unified else n_ctx * slots
    per_cell = n_layer * n_head_kv * (head_k * CACHE_TYPES[spec.cache_type_k].bytes
                                      + head_v * CACHE_TYPES[spec.cache_type_v].bytes)
    kv = int(cells * per_cell)

    n_batch = cells if embeddings else max(min(spec.n_batch, n_ctx), slots)
    n_ubatch = min(n_batch, spec.n_ubatch or n_batch)
    outputs = n_batch if embeddings else slots  # rows of logits kept per batch
    logits = 4 * outputs * (n_embd if embeddings else info.n_vocab)  # llama.cpp's output buffer
    # its compute buffer, one micro-batch's: the widest rows (every token's logits, which a decoder
    # used for embeddings computes too, twice over; without flash attention the scores, in the
    # same space), the feed-forward and residual activations, and a fixed overhead
    row = info.n_vocab * (2 if embeddings and not info.pooling else 1) if info.n_vocab else n_embd
    scores = n_head * n_ctx if spec.flash_attn is False else 0  # unset: on, where llama.cpp can
    activations = 4 * n_ubatch * (max(row, scores) + 2 * n_ff + 4 * n_embd)
    compute = logits + activations + COMPUTE_OVERHEAD

    return Estimate(info.weight_bytes, kv, compute)




def allocated(buffers: Any) -> dict[str, int] | None:
    """What llama.cpp reported it allocated (a worker's ``info["buffers"]``: by kind, then by
    device) summed by kind (model, kv, compute, output) and in all; None where it said nothing."""
    if not isinstance(buffers, dict) or not buffers:
        return None
    out = {kind.lower(): sum(per_device.values()) for kind, per_device in buffers.items()
           if isinstance(per_device, dict)}
    return {**out, "total": sum(out.values())}
