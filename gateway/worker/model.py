"""A loaded model: llama.cpp's weights and one context for them, made from ``LoadParams``.

The context holds one cache stream per sequence slot (``parallel`` of them) of ``n_ctx`` cells
each, so that every request may use the whole context. This module knows how the model was
loaded (sizes, threads, device, chat template) and reports it (``info``, the ready event);
reading prompts, sampling and decoding are other modules' jobs (``prompts``, ``sampling``,
``decoding``).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from .. import protocol
from ..protocol.settings import CACHE_TYPES, DEFAULT_N_CTX, embed_seqs
from ..protocol.topology import default_threads
from ..text import chat_template
from ..text.reasoning import MARKER_TOKENS
from ..text.toolformats import MARKER_TOKENS as CALL_MARKERS
from . import device_probe, ggml, rpc
from .adapters import Adapters
from .drafting import Drafter, draft_params
from .media import Projector
from .vocab import Vocab

MAX_SLOTS = 64

_LOG_CALLBACKS: list[Any] = []


def _device(ll) -> str:
    """The accelerator llama.cpp was built for, from its system info ("CPU : ... | CUDA : ARCHS =
    ..." lists one backend per "NAME : ..." part): cuda, metal, vulkan, ...; cpu if none."""
    info = ll.llama_print_system_info().decode("utf-8", "replace")
    names = [part.split(" : ", 1)[0].strip().lower() for part in info.split("|") if " : " in part]
    return next((n for n in names if n and n != "cpu"), "cpu")


# What llama.cpp reports it allocated ("CPU KV buffer size = 288.00 MiB"), by kind (model, KV,
# compute, output) and device, in bytes: the measured side of ``memory.estimate``.
BUFFERS: dict[str, dict[str, int]] = {}
_BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|compute|output|LoRA) buffer size =\s+([\d.]+) MiB")
# llama.cpp's latest error lines: where a call fails it often says why only in its log (a LoRA
# adapter made for another model)
ERRORS: list[str] = []
MAX_ERRORS = 64
_PROJECTOR_LINE = re.compile(r"CLIP using (?P<backend>\S+) backend|model size:\s+(?P<mib>[\d.]+) MiB"
                             r"|(?P<device>\S+) compute buffer size =\s+(?P<cmib>[\d.]+) MiB")


def _silence_llama_logs(llama_cpp) -> None:
    """Keep llama.cpp's per-load chatter out of the gateway log (errors still reach stderr),
    noting the buffer sizes it reports (``BUFFERS``)."""

    ggml_log_level_error = 4  # enum ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT

    @llama_cpp.llama_log_callback
    def log(level, text, _user_data):
        line = text.decode("utf-8", "replace")
        if level == ggml_log_level_error:
            sys.stderr.write(line)
            ERRORS.append(line[:1000])
            del ERRORS[:-MAX_ERRORS]
        elif "buffer size" in line and (m := _BUFFER_LINE.search(line)):
            device, kind = m.group(1).split("_")[0].lower(), m.group(2).lower()
            per_kind = BUFFERS.setdefault(kind, {})
            per_kind[device] = per_kind.get(device, 0) + int(float(m.group(3)) * 2**20)

    _LOG_CALLBACKS.append(log)  # the callback must outlive this function
    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))
    device = ["cpu"]  # where the projector runs ("CLIP using CUDA0 backend")

    @llama_cpp.llama_log_callback
    def mtmd_log(level, text, _user_data):
        """libmtmd's: errors to stderr, the projector's weights and compute buffers noted as
        ``BUFFERS["projector"]``, by device."""
        line = text.decode("utf-8", "replace")
        if level == ggml_log_level_error:
            sys.stderr.write(line)
        elif m := _PROJECTOR_LINE.search(line):
            if m.group("backend"):
                device[0] = m.group("backend").lower()
                return
            where = (m.group("device") or device[0]).split("_")[0].lower()
            per_device = BUFFERS.setdefault("projector", {})
            mib = float(m.group("mib") or m.group("cmib"))
            per_device[where] = per_device.get(where, 0) + int(mib * 2**20)

    _LOG_CALLBACKS.append(mtmd_log)
    from llama_cpp import mtmd_cpp

    mtmd_cpp.mtmd_log_set(mtmd_log, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(mtmd_log, ctypes.c_void_p(0))


def prepare() -> None:
    """Import llama.cpp and initialise its backends, ahead of any model (``Model`` calls it
    too): the part of a worker's start that does not depend on the model."""
    import llama_cpp

    if not _LOG_CALLBACKS:  # once per process
        _silence_llama_logs(llama_cpp)
        llama_cpp.llama_backend_init()


def existing(path: str | os.PathLike, what: str) -> None:
    """Raise where ``path`` is no file: llama.cpp's own failure would not say so."""
    if not os.path.isfile(path):
        raise RuntimeError(f"{what} {path} does not exist")


def load_weights(ll, params: protocol.LoadParams, on_progress: Callable[[float], None] | None) -> tuple[Any, list[Any]]:
    """The weights read from the model's file onto its devices: llama.cpp's model handle, and the
    arrays its parameters pointed into (``_place_weights``: kept while the model lives)."""
    mp = ll.llama_model_default_params()
    mp.n_gpu_layers = 999 if params.n_gpu_layers < 0 else params.n_gpu_layers
    if not params.use_mmap:  # read the file into memory (llama.cpp's default maps it where it can)
        mp.load_mode = ll.LLAMA_LOAD_MODE_NONE
    # Off by default: with repacked weights a matrix kernel takes rows in groups, so a token's
    # logits change with the batch it shares (a greedy answer then depends on the load).
    mp.use_extra_bufts = params.repack
    if params.use_mlock:
        mp.load_mode = ll.LLAMA_LOAD_MODE_MLOCK if not params.use_mmap else ll.LLAMA_LOAD_MODE_MMAP_MLOCK
    held = _place_weights(ll, params, mp)
    if on_progress is not None:
        @ll.llama_progress_callback
        def progress(fraction, _user_data):
            on_progress(float(fraction))
            return True  # go on loading

        mp.progress_callback = progress  # referenced by ``progress`` until the load returns
    existing(params.path, "the model file")
    handle = ll.llama_model_load_from_file(params.path.encode(), mp)
    if not handle:
        raise RuntimeError(f"llama.cpp could not load {params.path} (unsupported or damaged file, "
                           "or not enough memory)")
    return handle, held


def _place_weights(ll, params: protocol.LoadParams, mp: Any) -> list[Any]:
    """Which devices the weights go to, and how they are split among them; the arrays ``mp`` now
    points into."""
    held: list[Any] = []
    mp.main_gpu = params.main_gpu
    if params.devices is not None:  # only these (llama-server's --device); the list must outlive the load
        try:
            devices = device_probe.offload_list(ll, params.devices)
        except (ValueError, ggml.Missing) as e:
            raise RuntimeError(str(e)) from None
        held.append(devices)
        mp.devices = ctypes.cast(devices, ctypes.c_void_p)
    mp.split_mode = {"none": ll.LLAMA_SPLIT_MODE_NONE, "layer": ll.LLAMA_SPLIT_MODE_LAYER,
                     "row": ll.LLAMA_SPLIT_MODE_ROW}[params.split_mode]
    if params.tensor_split:
        # llama.cpp reads one share per device it knows; the array must outlive the load
        held.append(split := (ctypes.c_float * 128)(*params.tensor_split))
        mp.tensor_split = split
    return held


def make_context(ll, handle: Any, cp: Any, params: protocol.LoadParams) -> Any:
    """The context, made from ``cp`` (its pooling settled for a reranker or an embedding model)."""
    ctx = ll.llama_init_from_model(handle, cp)
    if params.reranker and ctx and ll.llama_pooling_type(ctx) != ll.LLAMA_POOLING_TYPE_RANK:
        ll.llama_free(ctx)  # configured as a reranker: llama.cpp's rank pooling, whatever the header says
        cp.pooling_type = ll.LLAMA_POOLING_TYPE_RANK
        ctx = ll.llama_init_from_model(handle, cp)
    elif ctx and params.embeddings and ll.llama_pooling_type(ctx) == ll.LLAMA_POOLING_TYPE_NONE:
        ll.llama_free(ctx)  # a decoder with no pooling of its own: average its token states
        cp.pooling_type = ll.LLAMA_POOLING_TYPE_MEAN
        ctx = ll.llama_init_from_model(handle, cp)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create a context of {cp.n_ctx} tokens for {params.path} "
                           "(not enough memory?)")
    return ctx


class Model:
    def __init__(self, params: protocol.LoadParams, on_progress: Callable[[float], None] | None = None):
        """Load the model; ``on_progress(fraction)`` is called as the weights are read (on this
        thread, from inside llama.cpp: it must not raise). Each step reads what those before it set."""
        import llama_cpp

        self.ll = ll = llama_cpp
        self.params = params
        prepare()
        self.rpc_devices = rpc.add_servers(ll, params.rpc) if params.rpc else 0
        self.handle, self._held = load_weights(ll, params, on_progress)  # (what the load was given, kept)
        self.vocab = Vocab(ll, self.handle)
        self.cp = cp = self._context_params()
        self.ctx = make_context(ll, self.handle, cp, params)
        self.adapters = Adapters(ll, self.handle, self.ctx, params, ERRORS)
        self._read_cache()
        self._chat_template()
        self._where_it_runs()
        # speculative decoding's draft model (``drafting``): a model of its own, a sequence per slot
        self.drafter = Drafter(self, Model(draft_params(params, self.n_ctx, self.n_slots)), params) \
            if params.draft and not params.embeddings else None
        self.projector = self._projector()

    def _context_params(self) -> Any:
        """llama.cpp's context parameters: its cells and sequences, batches, threads, cache types
        and attention; sets the slots' layout (``_sequences``), ``embed_seqs``, ``embed_batch``
        and ``threads``."""
        ll, params = self.ll, self.params
        n_ctx_train = ll.llama_model_n_ctx_train(self.handle)
        cp = ll.llama_context_default_params()
        n_ctx = params.n_ctx or min(n_ctx_train or DEFAULT_N_CTX, DEFAULT_N_CTX)
        n_slots = self._sequences(cp)
        # kv_unified: llama-server's default, one pool of n_ctx cells that the slots share (a slot
        # may use what the others leave); else n_ctx cells each
        cp.kv_unified = params.kv_unified
        # an embedding decode: as many inputs as fit embed_batch tokens, each its own sequence
        self.embed_seqs = embed_seqs(params.parallel) if params.embeddings else 0
        self.embed_batch = max(1, min(params.n_batch, n_ctx))
        cp.n_ctx = n_ctx if params.kv_unified else n_ctx * n_slots
        cp.n_batch = max(min(params.n_batch, n_ctx), n_slots)
        cp.n_ubatch = min(cp.n_batch, max(params.n_ubatch or cp.n_batch, n_slots))
        self.threads = threads = params.n_threads or default_threads()
        cp.n_threads = threads
        cp.n_threads_batch = params.n_threads_batch or threads
        cp.type_k = CACHE_TYPES[params.cache_type_k].ggml
        cp.type_v = CACHE_TYPES[params.cache_type_v].ggml
        if params.rope_freq_base is not None:
            cp.rope_freq_base = params.rope_freq_base
        if params.rope_freq_scale is not None:
            cp.rope_freq_scale = params.rope_freq_scale
        cp.flash_attn_type = {None: ll.LLAMA_FLASH_ATTN_TYPE_AUTO, True: ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                              False: ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}[params.flash_attn]
        cp.no_perf = True
        # By default every position of a sliding-window layer is kept (llama.cpp's C default);
        # llama-server's default keeps the window and a batch: far less memory, but a prompt that
        # leaves the cached one early must be read again (``SlotMemory.holds_window``), and the
        # cache's cells wrap, so sums run in another order than a cold read's.
        cp.swa_full = params.swa_full
        if params.embeddings:
            # A pooled embedding needs its whole input in one micro-batch, and a decode of several
            # inputs is one micro-batch only where the cells are one stream (llama.cpp splits a
            # batch over several streams into equal parts per sequence): n_ctx cells, each input
            # up to n_ctx, several to a decode up to embed_batch (``embedding``).
            cp.embeddings = True
            cp.kv_unified = True
            cp.n_seq_max = self.embed_seqs
            cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        return cp

    def _sequences(self, cp: Any) -> int:
        """The slots and the sequence ids each holds (``n_slots``, ``splice``, ``pin``,
        ``pin_base``; ``cp.n_seq_max``); the number of slots."""
        ll, params = self.ll, self.params
        # One cache stream of n_ctx cells per slot (llama-server's --parallel without --kv-unified):
        # every request may use the whole context, and a batch attends only to its own cells.
        self.n_slots = n_slots = 1 if params.embeddings else max(1, min(params.parallel, MAX_SLOTS))
        # a unified pool that reuses chunks past a change parks them under a second id per slot
        # while the new tokens before them are read (``Decoder``'s splices)
        self.splice = bool(params.kv_unified and params.cache_reuse and not params.embeddings and not params.mmproj)
        # In a unified pool llama.cpp hands a sliding-window cell that the window masks to any
        # sequence that needs a cell, ``swa_full`` or not (a cell held by one sequence only is
        # free to take once masked): an idle slot, or one that generated past its prompt, then
        # lacks the positions a kept state's checkpoints or a chunk past a changed line need.
        # With ``swa_full`` every slot's cells are also held by a third id of its own
        # (``SlotMemory.pin``), so none is taken while the slot holds it.
        self.pin = bool(params.kv_unified and params.swa_full and ll.llama_model_n_swa(self.handle)
                        and not params.embeddings)
        cp.n_seq_max = (1 + self.splice + self.pin) * n_slots
        self.pin_base = (1 + self.splice) * n_slots  # slot i's pin id: pin_base + i
        return n_slots

    def _read_cache(self) -> None:
        """What the context's cache holds and allows: ``n_embd``, ``n_swa``, ``mem``,
        ``cache_reuse`` (and ``splice`` without it), ``n_ctx`` per slot and ``n_batch``."""
        ll, params = self.ll, self.params
        self.n_embd = ll.llama_model_n_embd(self.handle)
        # the attention window of its sliding-window layers (0: none), whatever ``swa_full`` says: a
        # state loaded back holds only the window, as llama.cpp writes no cell the window masks
        self.n_swa = ll.llama_model_n_swa(self.handle)
        self.mem = ll.llama_get_memory(self.ctx)
        # chunks are moved only where every layer's cache can shift (RoPE re-applied in place)
        # (not with a projector: a picture's cells are never moved, as in llama-server)
        self.cache_reuse = params.cache_reuse if ll.llama_memory_can_shift(self.mem) and not params.mmproj else 0
        if not self.cache_reuse:
            self.splice = False  # (the gateway logs a cache_reuse it asked for and did not get)
        self.n_ctx = ll.llama_n_ctx_seq(self.ctx)  # per slot
        self.n_batch = self.cp.n_batch

    def _chat_template(self) -> None:
        """The model's own chat template (``model_template``) and the one used (``template``)."""
        tmpl = self.ll.llama_model_chat_template(self.handle, None)
        self.model_template = tmpl.decode("utf-8", "replace") if tmpl else None
        self.template = self.params.chat_template or self.model_template or chat_template.CHATML

    def _where_it_runs(self) -> None:
        """``gpu_offload`` and the ``device`` the ready event names."""
        ll, params = self.ll, self.params
        self.gpu_offload = bool(ll.llama_supports_gpu_offload()) and params.n_gpu_layers != 0 and params.devices != ()
        self.device = _device(ll) if self.gpu_offload else "cpu"
        if self.rpc_devices:
            self.device += f"+rpc:{self.rpc_devices}"

    def _projector(self) -> Projector | None:
        """The model's projector (``mmproj``, for pictures and sounds: ``media``), where it has one,
        run where the model's layers are; None without one, or where an optional one fails."""
        params = self.params
        if not params.mmproj or params.embeddings:
            return None
        try:
            existing(params.mmproj, "the projector file (mmproj)")
            return Projector(self.ll, self.handle, str(params.mmproj), self.cp.n_threads_batch, self.gpu_offload)
        except RuntimeError as e:
            if not params.mmproj_optional:
                raise
            print(f"gguf-gateway worker: {e}; serving {params.name} without it", file=sys.stderr, flush=True)
            return None

    def set_threads(self, n: int) -> None:
        """Use ``n`` CPU threads from the next decode on (never more than configured)."""
        n = max(1, min(n, self.threads))
        self.ll.llama_set_n_threads(self.ctx, n, n)

    def info(self) -> dict[str, Any]:
        """What the ready event reports of the model."""
        return {
            "n_ctx": self.n_ctx, "n_vocab": self.vocab.n_vocab, "n_threads": self.threads, "parallel": self.n_slots,
            "n_ctx_train": self.ll.llama_model_n_ctx_train(self.handle),
            "chat_template": self.template, "has_model_template": self.model_template is not None,
            "gpu_offload": self.gpu_offload, "device": self.device, "pid": os.getpid(),
            "special_tokens": [m for m in (*MARKER_TOKENS, *CALL_MARKERS) if self.vocab.single_token(m)],
            "fim": not self.vocab.fim.missing(),  # fill-in-the-middle: prefix, suffix and middle tokens
            "bos_token": self._token_text(self.vocab.bos), "eos_token": self._token_text(self.vocab.eos),
            "build_info": f"llama-cpp-python {getattr(self.ll, '__version__', '?')}",
            "n_embd": self.n_embd, "embeddings": self.params.embeddings, "reranker": self.params.reranker,
            "embed_seqs": self.embed_seqs, "embed_batch": self.embed_batch if self.embed_seqs else None,
            "rpc": list(self.params.rpc),
            # what llama.cpp was given (docs/configuration.md: the llama-server flag of each)
            "cache_type_k": self.params.cache_type_k, "cache_type_v": self.params.cache_type_v,
            "n_batch": self.cp.n_batch, "n_ubatch": self.cp.n_ubatch, "n_threads_batch": self.cp.n_threads_batch,
            "kv_unified": bool(self.cp.kv_unified), "n_ctx_total": self.ll.llama_n_ctx(self.ctx),
            "rope_freq_base": self.cp.rope_freq_base or None, "rope_freq_scale": self.cp.rope_freq_scale or None,
            "lora": len(self.adapters.table), "adapters": self.adapters.describe(), "cache_reuse": self.cache_reuse,
            "draft": str(self.params.draft) if self.drafter is not None else None,
            # what its projector encodes (``mmproj``)
            "vision": bool(self.projector and self.projector.vision),
            "audio": bool(self.projector and self.projector.audio),
            "buffers": BUFFERS,  # llama.cpp's own allocations, by kind and device
            "devices": self.device_memory(),  # and what its devices have free with this model loaded
        }

    def _token_text(self, token: int) -> str:
        return self.vocab.piece(token).decode("utf-8", "replace") if token >= 0 else ""

    def device_memory(self) -> list[dict[str, Any]]:
        """The devices and their free memory now: every one, or where ``devices`` names some,
        only those and the CPU (asking another GPU would start its runtime in this process)."""
        named = None if self.params.devices is None else {n.lower() for n in self.params.devices}
        try:
            return [d.describe() for d in device_probe.query(self.ll, named)]
        except ggml.Missing:
            return []
