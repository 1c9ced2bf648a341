"""What a model will take in memory before it loads: a pure estimate from its GGUF header and
its models.yaml settings, the way llama.cpp lays a model out.

- weights: the tensors' bytes. With a GPU, the layers up to ``n_gpu_layers`` and the output go
  to it; the input embeddings stay on the CPU, as llama.cpp keeps them.
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

from .config import ModelSpec
from .ggufmeta import GGUFInfo

DEFAULT_N_CTX = 4096  # engine.model's, for a model with no n_ctx of its own
COMPUTE_OVERHEAD = 4 * 2**20  # llama.cpp's graph buffers beyond the rows counted (seen on the tiny models)
CACHE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
               "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}


@dataclass(frozen=True)
class Estimate:
    weights: int
    kv: int
    compute: int
    on_gpu: int = 0  # of the total, what goes to the GPU (0 on a CPU-only build)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    def describe(self) -> dict[str, int]:
        return {"weights": self.weights, "kv_cache": self.kv, "compute": self.compute, "total": self.total,
                "gpu": self.on_gpu}


def _pad(n: int, to: int = 256) -> int:
    return -(-n // to) * to


def estimate(info: GGUFInfo, spec: ModelSpec, gpu: bool = False) -> Estimate | None:
    """The estimate for ``spec`` as llama.cpp would load it; None where the header does not say
    enough (no layer count or embedding size)."""
    shape = info.shape
    n_layer = int(shape.get("block_count") or len(info.weights.layers))
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
    per_cell = n_layer * n_head_kv * (head_k * CACHE_BYTES[spec.cache_type_k] + head_v * CACHE_BYTES[spec.cache_type_v])
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

    weights = info.weights.total
    on_gpu = 0
    if gpu and spec.n_gpu_layers != 0:
        layers = info.weights.layers
        offloaded = len(layers) if spec.n_gpu_layers < 0 else min(spec.n_gpu_layers, len(layers))
        on_gpu = sum(layers[len(layers) - offloaded:]) + (info.weights.rest if offloaded == len(layers) else 0)
        on_gpu += kv * offloaded // max(1, n_layer) + activations
    return Estimate(weights, kv, compute, on_gpu)


