"""What a model will take in memory before it loads: a pure estimate from its GGUF header, its
models.yaml settings and the devices llama.cpp sees, the way llama.cpp lays a model out.

Memory is counted by pool: ``RAM`` (system memory) and one pool per GPU, named as ggml names the
device, lowercased (``cuda0``, ``mtl0``, ``vulkan1``). ``layer_devices`` places the layers as
llama.cpp's ``load_tensors`` does: the input layer (token embeddings) on the CPU; the last
``n_gpu_layers`` of the repeating layers and the output layer on the GPUs, spread by
``tensor_split`` or else by each GPU's free memory; with ``split_mode: none`` all on
``main_gpu``.

- weights: the tensors' bytes where their layer goes; a tied output head (no ``output.weight``)
  is the token embeddings, on the CPU.
- KV cache: for every layer, ``head_count_kv x (key_length + value_length)`` values per cell
  in the cache types, on the layer's device; cells are ``n_ctx`` per slot times ``parallel``
  (one pool of ``n_ctx`` with ``kv_unified``), rounded up to llama.cpp's 256. A sliding-window
  layer (``swa_layers``) without ``swa_full`` holds only its window and a micro-batch per slot,
  as llama.cpp sizes it.
- LoRA adapters (``lora``, ``loras``: every adapter a load opens): each adapter tensor's bytes in
  the pool of the model tensor it adapts (llama.cpp allocates it in that tensor's buffer type, a
  repacked CPU type falling back to the CPU's: ``llama_adapter_lora_init``), each padded to its
  buffer's alignment (``LORA_ALIGNMENT``); ``*_norm.weight`` tensors llama.cpp does not load.
- checkpoints: a sliding-window model's context checkpoints without ``swa_full``, in RAM
  (``ctx_checkpoints`` per slot, each one window of those layers): the worker's copies, beside
  llama.cpp's buffers.
- compute: llama.cpp's output buffer (the logits of a batch, in RAM) and a graph buffer on each
  device that runs part of the graph: one micro-batch's (``n_ubatch``) activations where layers
  run, and without flash attention their score matrix; its logits where the output head runs;
  a GPU also holds its runtime's context (``GPU_CONTEXT``).

``tests/test_memory.py`` compares the estimate with what a loaded worker holds and states the
error it sees on the CPU; ``tests/test_devices.py`` checks the layer placement against
llama.cpp's rule; ``scripts/bench.py --memory`` sets each estimate beside llama.cpp's
allocation on whatever devices the machine has (docs/performance.md gives figures on the CPU, on an
NVIDIA H100 and on llama.cpp's Vulkan backend over Mesa's software device).
Where a model's layers go to other machines (``rpc``), what goes there is counted in the pool
``RPC``, which no capacity bounds: their memory is theirs to count.

A header's numbers are a stranger's (``ggufmeta``): the estimate runs on the event loop (for
``/models``, ``/metrics``, the page's stream and placement) and loops over the layers, so it
takes only numbers within ``ggufmeta.SHAPE_BOUNDS`` (``shape_problem``; the reader refuses a
file past them), and has no estimate for any other.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..hardware.sysmem import RAM
from ..protocol.settings import CACHE_TYPES, DEFAULT_N_CTX
from ..protocol.topology import HOST_KINDS, Device
from . import tensorplaces
from .config import ModelSpec
from .ggufmeta import GGUFInfo, shape_problem

COMPUTE_OVERHEAD = 4 * 2**20  # llama.cpp's graph buffers beyond the rows counted (seen on the tiny models)
# What a process's GPU runtime holds beside llama.cpp's buffers (a CUDA context, cuBLAS's
# workspace): Ollama counts about this much per GPU, and a worker with a tiny model on an H100
# showed about this much in nvidia-smi.
GPU_CONTEXT = 512 * 2**20
RPC = "rpc"
# What ggml pads each tensor of a buffer to (``ggml_backend_alloc_ctx_tensors_from_buft``): the
# buffer type's alignment, 32 bytes for the CPU's (TENSOR_ALIGNMENT); a GPU's is its backend's
# (128 for CUDA, the largest of ggml's GPU backends), which is taken for every other pool.
LORA_ALIGNMENT = {RAM: 32}
GPU_ALIGNMENT = 128


# llama.cpp's sliding-window layer pattern by architecture (``load_swa_pattern`` in each of its
# model sources): (n, dense_first): every n-th layer attends to everything, the last of each n
# (the first, where dense_first); used where the header gives no pattern of its own
SWA_PATTERNS = {"gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False), "gemma-embedding": (6, False),
                "cohere2": (4, False), "exaone4": (4, False), "llama4": (4, False), "olmo2": (4, False),
                "gpt-oss": (2, False), "plamo3": (8, False), "afmoe": (4, False), "mellum": (4, False),
                "smallthinker": (4, True)}


def swa_layers(info: GGUFInfo, n_layer: int) -> tuple[int, list[bool]]:
    """The attention window and which layers use it, as llama.cpp reads them (pure): a window
    from ``attention.sliding_window`` and a pattern from ``attention.sliding_window_pattern`` (a
    number; an array is not read) or ``SWA_PATTERNS``; (0, none) for an architecture llama.cpp
    gives no window."""
    window = info.shape.get("attention.sliding_window")
    pattern = info.shape.get("attention.sliding_window_pattern")
    known = SWA_PATTERNS.get(info.architecture or "")
    if not isinstance(window, int) or window <= 0 or known is None:
        return 0, [False] * n_layer
    n, dense_first = (pattern, known[1]) if isinstance(pattern, int) and not isinstance(pattern, bool) else known
    if dense_first:
        return window, [n == 0 or il % n != 0 for il in range(n_layer)]
    return window, [n == 0 or il % n < n - 1 for il in range(n_layer)]


@dataclass(frozen=True)
class Estimate:
    weights: int
    kv: int
    compute: int
    devices: dict[str, int] = field(default_factory=dict)  # the total by pool; {RAM: total} on the CPU
    checkpoints: int = 0  # context checkpoints in RAM (the worker's, beside llama.cpp's buffers)
    projector: int = 0  # a multimodal projector's weights and its encoder's buffers (``projector_bytes``)
    draft: int = 0  # a speculative decoding draft model's whole estimate (``with_draft``)
    lora: int = 0  # the LoRA adapters' tensors (``lora_bytes``), where the tensors they adapt lie

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.checkpoints + self.projector + self.draft + self.lora

    def describe(self) -> dict[str, Any]:
        return {"weights": self.weights, "kv_cache": self.kv, "compute": self.compute,
                "checkpoints": self.checkpoints, "projector": self.projector, "draft": self.draft,
                "lora": self.lora, "total": self.total, "devices": dict(self.devices)}

    def with_draft(self, draft: Estimate) -> Estimate:
        """This estimate and a draft model's (loaded beside the model, a sequence per slot)."""
        devices = dict(self.devices)
        for pool, n in draft.devices.items():
            devices[pool] = devices.get(pool, 0) + n
        return replace(self, devices=devices, draft=draft.total)


def _pad(n: int, to: int = 256) -> int:
    return -(-n // to) * to


def model_devices(devices: Sequence[Device], split_mode: str = "layer", main_gpu: int = 0,
                  names: Sequence[str] | None = None) -> list[Device]:
    """The devices llama.cpp gives a model's layers to (``llama_prepare_model_devices``): those
    ``names`` lists (models.yaml ``devices``), in its order; else the discrete GPUs, or the
    integrated ones where there is none; with ``split_mode: none`` only the ``main_gpu``-th of
    them (none if it is negative or past the end)."""
    if names is not None:
        by_name = {d.name.lower(): d for d in devices if d.kind not in HOST_KINDS}
        gpus = [by_name[n.lower()] for n in names if n.lower() in by_name]
    else:
        gpus = [d for d in devices if d.kind == "gpu"] or [d for d in devices if d.kind == "igpu"]
    if split_mode == "none":
        return [gpus[main_gpu]] if 0 <= main_gpu < len(gpus) else []
    return gpus


def layer_devices(n_layer: int, n_gpu_layers: int, gpus: Sequence[Device],
                  tensor_split: Sequence[float] = ()) -> list[str]:
    """The pool of each of the ``n_layer`` repeating layers and, last, of the output layer, as
    llama.cpp's ``load_tensors`` assigns them to ``gpus`` (``model_devices``)."""
    n_gpu_layers = 2**31 - 1 if n_gpu_layers < 0 else n_gpu_layers
    shares = [float(x) for x in tensor_split[:len(gpus)]] + [0.0] * (len(gpus) - len(tensor_split))
    if not any(shares):  # llama.cpp's default: by free memory (a device that reports none: one share)
        shares = [float(d.free or 1) for d in gpus]
    bounds = list(itertools.accumulate(shares))
    bounds = [b / bounds[-1] for b in bounds] if bounds else []
    start = max(n_layer + 1 - n_gpu_layers, 0)
    active = min(n_gpu_layers, n_layer + 1) if gpus else 0
    pools = []
    for il in range(n_layer + 1):
        if il < start or il - start >= active:
            pools.append(RAM)
        else:
            at = bisect.bisect_right(bounds, (il - start) / active)
            pools.append(gpus[min(at, len(gpus) - 1)].pool)
    return pools


def projector_bytes(info: GGUFInfo) -> int:
    """What a projector takes loaded (libmtmd reads it whole into its device's memory): its
    weights, and its encoder's compute buffer for one picture, sized as a layer's activations
    and attention scores over the picture's patches (the header's vision sizes; a sound's
    encoder, whose sizes it does not give so, gets the overhead alone)."""
    shape = info.shape
    if shape_problem(shape) is not None:  # numbers no real projector has: its weights alone
        return info.weight_bytes + COMPUTE_OVERHEAD
    patch = int(shape.get("vision.patch_size") or 0)
    patches = (int(shape.get("vision.image_size") or 0) // patch) ** 2 if patch else 0
    n_embd = int(shape.get("vision.embedding_length") or 0)
    n_ff = int(shape.get("vision.feed_forward_length") or 4 * n_embd)
    heads = int(shape.get("vision.attention.head_count") or 1)
    compute = 4 * patches * (2 * n_ff + 4 * n_embd) + 4 * heads * patches * patches
    return info.weight_bytes + compute + COMPUTE_OVERHEAD


def lora_bytes(adapter: GGUFInfo, pools: Sequence[str]) -> dict[str, int]:
    """What a LoRA adapter takes loaded, by pool (pure): each of its ``lora_a`` / ``lora_b``
    tensors (``GGUFInfo.tensors``) in the pool of the model tensor it adapts: a repeating layer's
    ``pools[N]``, the input layer's RAM, the output layer's ``pools[-1]`` (``layer_devices``'
    list), padded as its buffer pads it (``LORA_ALIGNMENT``)."""
    out: dict[str, int] = {}
    n_layer = len(pools) - 1
    for name, _, nbytes in adapter.tensors:
        if not name.endswith((".lora_a", ".lora_b")):
            continue  # llama.cpp loads no other (it skips *_norm.weight)
        target = name[:-len(".lora_a")].encode()
        layer = tensorplaces.layer(target)
        if layer is not None:
            pool = pools[layer] if layer < n_layer else pools[-1]  # past the model's layers: refused at load
        else:
            pool = RAM if tensorplaces.is_input(target) else pools[-1]
        out[pool] = out.get(pool, 0) + _pad(nbytes, LORA_ALIGNMENT.get(pool, GPU_ALIGNMENT))
    return out


def estimate(info: GGUFInfo, spec: ModelSpec, devices: Sequence[Device] = (),
             projector: GGUFInfo | None = None, adapters: Sequence[GGUFInfo] = ()) -> Estimate | None:
    """The estimate for ``spec`` as llama.cpp would load it on ``devices`` (``gateway.hardware.devices``;
    none: everything in RAM), with its ``projector``'s header where it has one and its LoRA
    ``adapters``' (``lora`` and ``loras``: ``ModelCatalog.adapters``); None where the header does
    not say enough (no layer count or embedding size) or says what no real model does
    (``shape_problem``: a layer count, a width past its bound)."""
    shape = info.shape
    if shape_problem(shape) is not None:
        return None
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
    per_cell = n_head_kv * (head_k * CACHE_TYPES[spec.cache_type_k].bytes
                            + head_v * CACHE_TYPES[spec.cache_type_v].bytes)

    n_batch = cells if embeddings else max(min(spec.n_batch, n_ctx), slots)
    n_ubatch = min(n_batch, spec.n_ubatch or n_batch)
    window, swa = swa_layers(info, n_layer)
    swa_cells = cells  # llama-kv-cache-iswa.cpp: per stream, the window (each slot's, in one pool) and a micro-batch
    if window and not spec.swa_full:
        streams = 1 if spec.kv_unified else slots
        swa_cells = streams * _pad(min(cells // streams, window * (slots if spec.kv_unified else 1) + n_ubatch))
    layer_kv = [(swa_cells if is_swa else cells) * per_cell for is_swa in swa]
    # context checkpoints, in RAM, each the window of the sliding-window layers: a slot's own where
    # only the window is kept (with every position kept, only a state in the prompt cache has
    # some, within its bound)
    checkpoints = 0 if embeddings or spec.swa_full else int(slots * spec.ctx_checkpoints * window * per_cell * sum(swa))
    outputs = n_batch if embeddings else slots  # rows of logits kept per batch
    logits = 4 * outputs * (n_embd if embeddings else info.n_vocab)  # llama.cpp's output buffer
    # where each layer goes: the model's layers on other machines (rpc) are counted as RPC's
    gpus = model_devices(devices, spec.split_mode, spec.main_gpu, spec.devices)
    if spec.rpc:
        gpus = [Device(RPC.upper(), "rpc-servers", "gpu", 0, 0)]
    pools = layer_devices(n_layer, spec.n_gpu_layers, gpus, spec.tensor_split)
    # The output head runs where it lies: a tied one is the token embeddings, which llama.cpp
    # keeps with the input layer on the CPU (one copy, whatever n_gpu_layers says).
    head = RAM if info.tied_output else pools[n_layer]

    # A compute buffer on each device that runs part of the graph, sized for one micro-batch:
    # where layers run, their feed-forward and residual activations (and without flash
    # attention the scores); where the head runs, every token's logits (which a decoder used for
    # embeddings computes too, twice over); where neither, the input rows. With a GPU that runs no
    # layer (n_gpu_layers: 0) llama.cpp still sends a large batch's products there (op offload),
    # the head's among them: that GPU gets the layers' share, the logits, and a copy of the
    # weights it multiplies from host memory, the head's being the largest (seen on a CUDA GPU:
    # ``scripts/bench.py --memory``).
    row = info.n_vocab * (2 if embeddings and not info.pooling else 1) if info.n_vocab else n_embd
    scores = n_head * n_ctx if spec.flash_attn is False else 0  # unset: on, where llama.cpp can
    offload_to = gpus[0].pool if gpus and not spec.rpc else None
    runs_layers = set(pools[:n_layer]) | ({offload_to} if offload_to else set())
    head_copy = 0
    if offload_to and pools[n_layer] == RAM:
        head, head_copy = offload_to, info.input_bytes if info.tied_output else info.output_bytes

    def compute_in(pool: str) -> int:
        widest = max(row if pool == head else 0, scores if pool in runs_layers else 0)
        rows = 2 * n_ff + 4 * n_embd if pool in runs_layers else n_embd
        return 4 * n_ubatch * (widest + rows) + COMPUTE_OVERHEAD + (head_copy if pool == head else 0)

    by_pool: dict[str, float] = {RAM: info.input_bytes + logits + checkpoints}  # llama.cpp's output buffer is in RAM
    layer_bytes = info.layer_bytes
    for il, pool in enumerate(pools[:n_layer]):
        by_pool[pool] = by_pool.get(pool, 0) + (layer_bytes[il] if il < len(layer_bytes) else 0) + layer_kv[il]
    by_pool[pools[n_layer]] = by_pool.get(pools[n_layer], 0) + info.output_bytes
    for pool in {RAM, head, *runs_layers}:
        by_pool[pool] = by_pool.get(pool, 0) + compute_in(pool) + gpu_context(pool)
    # the projector runs on the first GPU where the model's layers go to GPUs (``Model``), else the CPU
    mm = projector_bytes(projector) if projector is not None and not embeddings else 0
    if mm:
        on = gpus[0].pool if gpus and spec.n_gpu_layers != 0 and not spec.rpc else RAM
        by_pool[on] = by_pool.get(on, 0) + mm
    lora = 0
    for adapter in adapters:
        for pool, n in lora_bytes(adapter, pools).items():
            by_pool[pool] = by_pool.get(pool, 0) + n
            lora += n
    kv = int(sum(layer_kv))
    devices_total = {pool: int(n) for pool, n in by_pool.items()}
    compute = sum(devices_total.values()) - info.weight_bytes - kv - checkpoints - mm - lora
    return Estimate(info.weight_bytes, kv, compute, devices_total, checkpoints, mm, lora=lora)


def gpu_context(pool: str) -> int:
    """What a pool holds for a process beside llama.cpp's buffers: ``GPU_CONTEXT`` on a GPU of
    this machine, nothing in RAM or on other machines' (``RPC``)."""
    return 0 if pool in (RAM, RPC) else GPU_CONTEXT


def pool_of(buffer_device: str) -> str:
    """The pool of one of llama.cpp's buffers by its (lowercased) device prefix: a GPU's own
    (``cuda0``, ``mtl0``: a name that ends in its number), ``RPC`` for a remote one, else RAM
    (``cpu``, and a GPU runtime's host buffers: ``cuda`` from ``CUDA_Host``)."""
    if buffer_device.startswith(RPC):
        return RPC
    if buffer_device[-1:].isdigit() and not buffer_device.startswith("cpu"):
        return buffer_device
    return RAM


def allocated(buffers: Any) -> dict[str, Any] | None:
    """What llama.cpp reported it allocated (a worker's ``info["buffers"]``: by kind, then by
    device) summed by kind (model, kv, compute, output, projector, lora: every kind it holds,
    so a kind the worker reports is counted without a change here), in all, and by pool
    (``devices``); None where it said nothing."""
    if not isinstance(buffers, dict) or not buffers:
        return None
    kinds = {kind: per_device for kind, per_device in buffers.items() if isinstance(per_device, dict)}
    out: dict[str, Any] = {kind.lower(): sum(per_device.values()) for kind, per_device in kinds.items()}
    devices: dict[str, int] = {}
    for per_device in kinds.values():
        for device, n in per_device.items():
            devices[pool_of(device)] = devices.get(pool_of(device), 0) + n
    return {**out, "total": sum(out.values()), "devices": devices}
