"""llama.cpp's load settings, each declared once: ``LlamaSettings``.

Each field is one setting: its name is its models.yaml key, its annotation its type, its default
the default, and its metadata the check models.yaml's value must pass (``gateway.base.checks``).
``config.ModelSpec`` derives from it (models.yaml's local keys are its fields), and so does the
worker's ``LoadParams`` (``protocol.commands``), built from a spec by the fields
(``settings_of``) and decoded from JSON by their types. A new setting is one field here; the
worker then reads it from ``LoadParams`` (``worker.model``).

Also here, the values some settings name: KV cache types, split modes, a slot's default context.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from ..base import checks
from ..base.checks import INVALID, POSITIVE_INTEGER, Check, Report, show

# an embedding context's sequences: inputs decoded together (``embedding``). A sequence there lasts
# one decode and holds no cells of its own after it, so this is a floor under ``parallel``,
# not its default: short inputs (a RAG chunk, a rerank pair) fill a batch by their number
EMBED_SEQS = 64
LLAMA_MAX_SEQ = 256  # llama.cpp's bound on a context's sequences


def embed_seqs(parallel: int) -> int:
    """The inputs an embedding model decodes together, for its ``parallel`` setting."""
    return min(LLAMA_MAX_SEQ, max(parallel, EMBED_SEQS))


DEFAULT_N_CTX = 4096  # a slot's context for a model with no n_ctx of its own (at most its trained one)
DEFAULT_PROMPT_CACHE_BYTES = 8 * 2**30  # llama-server's --cache-ram default


@dataclass(frozen=True)
class CacheType:
    """A KV cache type models.yaml may name (llama-server's --cache-type-k/-v)."""

    ggml: int  # enum ggml_type
    bytes: float  # per value, block overhead included
    quantized: bool  # a quantized V cache needs flash attention


CACHE_TYPES = {"f32": CacheType(0, 4.0, False), "f16": CacheType(1, 2.0, False), "bf16": CacheType(30, 2.0, False),
               "q8_0": CacheType(8, 34 / 32, True), "q4_0": CacheType(2, 18 / 32, True),
               "q4_1": CacheType(3, 20 / 32, True), "iq4_nl": CacheType(20, 18 / 32, True),
               "q5_0": CacheType(6, 22 / 32, True), "q5_1": CacheType(7, 24 / 32, True)}

SPLIT_MODES = ("none", "layer", "row")


# --- checks of the settings that need more than a type -------------------------------------------

_PORT_TEXT = "0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"


@checks.accepts({"type": "string", "pattern": f"^.+:{_PORT_TEXT}$"})
def _rpc_server(r: Report, where: str, v: Any) -> Any:
    """``host:port`` of a llama.cpp ``rpc-server``."""
    host, _, port = v.rpartition(":") if isinstance(v, str) else ("", "", "")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        r.error(where, f"must be host:port of an rpc-server, got {show(v)}")
        return INVALID
    return f"{host.strip()}:{int(port)}"


@checks.accepts({"type": "array", "minItems": 1, "maxItems": 16, "items": {"type": "number", "minimum": 0},
                 "contains": {"exclusiveMinimum": 0}})
def _tensor_split(r: Report, where: str, v: Any) -> Any:
    """Each GPU's share, as llama-server's --tensor-split: numbers >= 0, not all 0."""
    if not isinstance(v, list) or not v or len(v) > 16 or any(
            isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < float("inf") for x in v) \
            or not any(v):
        r.error(where, f"must be a list of each GPU's share (numbers >= 0, not all 0; at most 16), got {show(v)}")
        return INVALID
    return tuple(float(x) for x in v)


_NONE = "^\\s*[nN][oO][nN][eE]\\s*$"


@checks.accepts({"anyOf": [{"type": "string", "pattern": _NONE}, {
    "type": "array", "minItems": 1, "maxItems": 16, "uniqueItems": True,
    "items": {"type": "string", "pattern": checks.S, "not": {"pattern": _NONE}}}]})
def _device_names(r: Report, where: str, v: Any) -> Any:
    """llama-server's --device: ``none``, or a list of llama.cpp's device names (CUDA0,
    Vulkan1, ...: ``gguf-gateway devices`` lists them), checked against llama.cpp at load."""
    if isinstance(v, str) and v.strip().lower() == "none":
        return ()
    if not isinstance(v, list) or not v or len(v) > 16 or any(
            not isinstance(x, str) or not x.strip() or x.strip().lower() == "none" for x in v) \
            or len({x.strip().lower() for x in v}) != len(v):
        r.error(where, f"must be none or a list of distinct device names (CUDA0, Vulkan1, ...: see "
                       f"gguf-gateway devices), got {show(v)}")
        return INVALID
    return tuple(x.strip() for x in v)


@checks.accepts({"anyOf": [checks.PATH_SCHEMA, {
    "type": "object", "required": ["path"], "additionalProperties": False,
    "properties": {"path": checks.PATH_SCHEMA, "scale": checks.schema_of(checks.number)}}]})
def _lora_adapter(r: Report, where: str, v: Any) -> Any:
    """A LoRA adapter: its GGUF path, or ``{path: ..., scale: 1.0}``."""
    raw = {"path": v} if isinstance(v, str) else v
    if not isinstance(raw, dict):
        r.error(where, f"must be a path or {{path: FILE, scale: NUMBER}}, got {show(v)}")
        return INVALID
    parsed = checks.mapping(r, where, raw, {"path": checks.path, "scale": checks.number})
    if "path" not in parsed:
        if "path" not in raw:
            r.error(f"{where}.path", "is required")
        return INVALID
    return (parsed["path"], parsed.get("scale", 1.0))


T = TypeVar("T")


@checks.accepts(checks.PATH_SCHEMA)
def _file_or_model(r: Report, where: str, v: Any) -> Any:
    """A GGUF file (relative to models.yaml), or the name of a model this gateway serves (no
    path separator, no ``.gguf``, no ``~`` or ``$``): kept as a relative path, which the catalog
    replaces by that model's file (``ModelCatalog``)."""
    if isinstance(v, str) and v.strip() and not any(c in v for c in "/\\~$") and \
            not v.strip().lower().endswith(".gguf"):
        return Path(v.strip())
    return checks.path(r, where, v)


def setting(default: T, check: Check, doc: str, *, flag: str = "", ollama: str = "") -> T:
    """A field of ``LlamaSettings``: its default, the check of its models.yaml value, its line in
    the reference (``doc``), and the llama-server ``flag`` and Ollama option it mirrors."""
    return field(default=default, metadata={"check": check, "doc": doc, "flag": flag, "ollama": ollama})


# --- the settings ----------------------------------------------------------------------------------

_GPU_LAYERS = checks.integer(minimum=-1, what="an integer >= -1 (-1: all layers)")


def _upto(low: int, high: int) -> Check:
    return checks.integer(minimum=low, maximum=high, what=f"an integer from {low} to {high}")


@dataclass(frozen=True, kw_only=True)
class LlamaSettings:
    """How llama.cpp loads a model (llama-server's flags, passed as they are). Keyword-only, so
    that a class deriving from it keeps its own positional fields."""

    n_ctx: int | None = setting(None, POSITIVE_INTEGER, (
        "context of each slot in tokens; unset: the model's trained context, at most 4096"),
        flag="-c, --ctx-size", ollama="num_ctx")
    n_gpu_layers: int = setting(-1, _GPU_LAYERS, "layers on the GPU; -1: all, 0: CPU only",
                                flag="-ngl, --n-gpu-layers", ollama="num_gpu")
    n_threads: int | None = setting(None, POSITIVE_INTEGER, (
        "CPU threads; unset: the physical cores this process may use, at most 16"),
        flag="-t, --threads", ollama="num_thread")
    n_batch: int = setting(512, POSITIVE_INTEGER, "tokens per llama_decode call (prompt chunks and streams together)",
                           flag="-b, --batch-size", ollama="num_batch")
    # sequence slots decoded together (continuous batching), each holding n_ctx tokens; for an
    # embedding model, the inputs a decode may hold (``embed_seqs``: at least EMBED_SEQS)
    parallel: int = setting(4, _upto(1, 64), (
        "requests decoded together, each slot holding n_ctx tokens; an embedding model: inputs per decode "
        "(at least 64)"), flag="-np, --parallel", ollama="OLLAMA_NUM_PARALLEL")
    flash_attn: bool | None = setting(None, checks.boolean, "flash attention on or off; unset: llama.cpp decides",
                                      flag="-fa, --flash-attn", ollama="OLLAMA_FLASH_ATTENTION")
    # llama.cpp's repacked CPU weight layouts (use_extra_bufts): faster kernels on some CPUs, but a
    # token's logits then depend on how many other tokens share its batch (greedy answers change
    # under load)
    repack: bool = setting(False, checks.boolean, (
        "llama.cpp's repacked CPU weight layouts: faster on some CPUs, but answers then depend on the load"),
        flag="--repack / --no-repack")
    # sliding-window layers keep every position (llama.cpp's C default): a prefix is reused however
    # far back a prompt leaves it, and answers do not depend on how a prompt was split; false
    # keeps only the window (llama-server's default), far less memory
    swa_full: bool = setting(True, checks.boolean, (
        "sliding-window layers keep every position (any prefix reused); false: only the window, far less memory"),
        flag="--swa-full")
    use_mmap: bool = setting(True, checks.boolean, "map the file instead of reading it into memory",
                             flag="--no-mmap (false)", ollama="use_mmap")
    chat_template: str | None = setting(None, checks.string, "Jinja chat template overriding the GGUF's own",
                                        flag="--chat-template-file", ollama="TEMPLATE")
    # llama.cpp RPC servers (host:port) that hold part of the layers
    rpc: tuple[str, ...] = setting((), checks.list_of(_rpc_server), (
        "llama.cpp rpc-servers (host:port) that hold part of the layers"), flag="--rpc")
    reranker: bool = setting(False, checks.boolean, "serve /v1/rerank with this model (llama.cpp's rank pooling)",
                             flag="--reranking")
    cache_type_k: str = setting("f16", checks.one_of(tuple(CACHE_TYPES)), "the KV cache's K type",
                                flag="-ctk, --cache-type-k", ollama="OLLAMA_KV_CACHE_TYPE")
    cache_type_v: str = setting("f16", checks.one_of(tuple(CACHE_TYPES)), (
        "the KV cache's V type (a quantized one needs flash attention)"),
        flag="-ctv, --cache-type-v", ollama="OLLAMA_KV_CACHE_TYPE")
    n_ubatch: int | None = setting(None, POSITIVE_INTEGER, "physical batch, at most n_batch; unset: n_batch",
                                   flag="-ub, --ubatch-size")
    n_threads_batch: int | None = setting(None, POSITIVE_INTEGER, "threads reading prompts; unset: n_threads",
                                          flag="-tb, --threads-batch")
    main_gpu: int = setting(0, checks.integer(minimum=0, what="a GPU index >= 0"),
                            "the GPU of a model that is not split (split_mode: none)",
                            flag="-mg, --main-gpu", ollama="main_gpu")
    split_mode: str = setting("layer", checks.one_of(SPLIT_MODES), "how a model spreads over several GPUs",
                              flag="-sm, --split-mode")
    tensor_split: tuple[float, ...] = setting((), _tensor_split, (
        "each GPU's share of the model; empty: llama.cpp's split by free memory"), flag="-ts, --tensor-split")
    # the devices llama.cpp may offload to, by name (llama-server's --device): None: every GPU;
    # (): none (``devices: none``), the model stays on the CPU and touches no GPU
    devices: tuple[str, ...] | None = setting(None, _device_names, (
        "the devices to offload to (gguf-gateway devices lists them); none: no GPU; unset: every GPU"),
        flag="-dev, --device")
    use_mlock: bool = setting(False, checks.boolean, "lock the weights in RAM (never swapped out)",
                              flag="--mlock", ollama="use_mlock")
    rope_freq_base: float | None = setting(None, checks.positive_number, "RoPE base frequency; unset: the model's",
                                           flag="--rope-freq-base", ollama="rope_frequency_base")
    rope_freq_scale: float | None = setting(None, checks.positive_number, "RoPE frequency scaling; unset: the model's",
                                            flag="--rope-freq-scale", ollama="rope_frequency_scale")
    # the slots share one pool of n_ctx cells (llama-server's default) instead of n_ctx each
    kv_unified: bool = setting(False, checks.boolean, "the slots share one pool of n_ctx cells instead of n_ctx each",
                               flag="--kv-unified")
    lora: tuple[tuple[Path, float], ...] = setting((), checks.list_of(_lora_adapter), (
        "LoRA adapters applied to every request: a file, or {path: FILE, scale: NUMBER}"),
        flag="--lora, --lora-scaled", ollama="ADAPTER")
    # fill in the middle suffix first (llama-server's --spm-infill), for models trained that way
    spm_infill: bool = setting(False, checks.boolean, "fill in the middle suffix first, for models trained that way",
                               flag="--spm-infill")
    # host memory that keeps the caches of slots taken for other conversations, to be restored
    # when they come back (``worker/promptcache.PromptCache``); 0: none; None: ``server.prompt_cache_bytes``
    prompt_cache_bytes: int | None = setting(None, checks.byte_size, (
        "host memory keeping other conversations' caches (a size; 0: off); unset: server.prompt_cache_bytes"),
        flag="--cache-ram")
    # reuse chunks of at least this many cached tokens past the first difference, their cells
    # moved to their new positions (``slots.reuse_plan``). Only where llama.cpp can shift the
    # cache (not a recurrent or hybrid model, not a sliding-window one without swa_full):
    # elsewhere it is off and the load says so
    cache_reuse: int = setting(0, checks.integer(minimum=0, what="a number of tokens >= 0 (0: off)"), (
        "reuse cached chunks of at least this many tokens past the first difference; 0: off"),
        flag="--cache-reuse")
    # context checkpoints kept per slot of a sliding-window model (``worker/checkpoints``): each a
    # copy of the window, taken near the end of each prompt; 0: none
    ctx_checkpoints: int = setting(2, _upto(0, 64), "context checkpoints kept per slot of a sliding-window model",
                                   flag="--ctx-checkpoints")
    # the model's multimodal projector: pictures and sounds are encoded by it (llama.cpp's
    # libmtmd, ``worker/media``) into the prompt; None: text alone
    mmproj: Path | None = setting(None, checks.path, "the multimodal projector that reads pictures and sounds",
                                  flag="--mmproj")
    # speculative decoding (``worker/speculation``): "ngram" (llama-server's --spec-type
    # ngram-simple) proposes the tokens that followed the latest earlier occurrence of the last
    # spec_ngram_size_n tokens, at most spec_ngram_size_m a step, and keeps those the model agrees with;
    # each sequence risks only what its proposals earned (``speculation.draft_length``), so one whose
    # answer does not copy its context proposes little. On by default: where answers copy their
    # context it is a multiple of the speed, and the benchmark's ordinary chat, non-copying edit and
    # four batched streams lose no more than noise (docs/performance.md, ``scripts/bench.py --speculation``)
    spec_type: str = setting("ngram", checks.one_of(("none", "ngram")), (
        "speculative decoding by prompt lookup (ngram) or none"), flag="--spec-type")
    spec_ngram_size_n: int = setting(4, _upto(1, 1024), "tokens of context an ngram proposal is looked up by",
                                     flag="--spec-ngram-size-n")
    spec_ngram_size_m: int = setting(16, _upto(1, 1024), "at most this many tokens proposed a step by ngram",
                                     flag="--spec-ngram-size-m")
    # a draft model (``worker/drafting``): a smaller model of the same vocabulary proposes up to
    # draft_max tokens a step, greedily, stopping where its own top probability is under
    # draft_p_min, nothing where under draft_min came
    draft: Path | None = setting(None, _file_or_model, (
        "a draft model of the same vocabulary: a GGUF file, or a served model's name"), flag="-md, --model-draft")
    draft_n_gpu_layers: int = setting(-1, _GPU_LAYERS, "the draft model's layers on the GPU; -1: all",
                                      flag="-ngld, --gpu-layers-draft")
    draft_n_ctx: int | None = setting(None, POSITIVE_INTEGER, "the draft model's context; unset: n_ctx",
                                      flag="-cd, --ctx-size-draft")
    draft_max: int = setting(3, _upto(1, 256), "at most this many tokens drafted a step", flag="--draft-max")
    draft_min: int = setting(0, _upto(0, 256), "fewer drafted tokens than this are not proposed",
                             flag="--draft-min")
    draft_p_min: float = setting(0.0, checks.fraction, "drafting stops where its top probability is under this",
                                 flag="--draft-p-min")


SETTINGS = tuple(fields(LlamaSettings))
CHECKS: dict[str, Check] = {f.name: f.metadata["check"] for f in SETTINGS}  # models.yaml's checks, by key


def settings_of(source: LlamaSettings) -> dict[str, Any]:
    """Every llama.cpp setting of ``source`` (a spec or load parameters), by name."""
    return {f.name: getattr(source, f.name) for f in SETTINGS}


def conflict(given: dict[str, Any]) -> tuple[str, str] | None:
    """The first pair of checked settings that cannot go together: (key, problem), or None."""
    if CACHE_TYPES[given.get("cache_type_v", "f16")].quantized and given.get("flash_attn") is False:
        return "cache_type_v", ("a quantized V cache needs flash attention: "
                                "leave flash_attn unset (llama.cpp decides) or true")
    n_batch = given.get("n_batch", LlamaSettings.n_batch)
    if given.get("n_ubatch", 0) > n_batch:
        return "n_ubatch", f"must be at most n_batch ({n_batch})"
    return None
