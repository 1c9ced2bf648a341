"""Context checkpoints (llama-server's ``--ctx-checkpoints``): copies of the part of a slot's cache
that cannot be cut back, taken near the end of each prompt, so that a prompt that comes back
differing a little before where the last one ended is read on from a checkpoint instead of whole.

A sliding-window layer keeps only the window before a sequence's newest token (``swa_full:
false``), and a state loaded back holds only that window whatever ``swa_full`` says: cut back
into it, the cache lacks positions the next token attends to. A checkpoint is that window as it
was after the prompt's first ``n_tokens`` tokens (``llama_state_seq_get_data_ext`` with
``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: the sliding-window layers' cells only; the full-attention
layers keep every position and are cut as before). Loading one (``restore``) and cutting the
rest of the cache at ``n_tokens`` gives the cache a cold read of those tokens would have.

``marks`` (pure) says where a prompt's checkpoints are taken: ``n_ubatch + 4`` and ``4`` tokens
before its end, as llama-server does (the prompt's last few tokens read apart from the rest),
so that a prompt that returns with its end rewritten (a chat template's closing turn, an answer
the client sends back otherwise) goes on from one. ``pick`` (pure) chooses the one to load.

A slot keeps at most ``ctx_checkpoints`` (the latest); those past where its cache is cut go with
the cut (``slots.Slot.keep``). A kept state in the prompt cache carries its slot's checkpoints;
one kept from a slot holding every position (``swa_full``) also one each window before its end
(``SlotMemory.checkpoints_behind``), so that it holds, as the slot did, every position.
Only the worker's main loop calls this (it copies cells in and out of the context).
"""

from __future__ import annotations

import ctypes
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (llama.h): the sliding-window or recurrent part
TAIL = 4  # the prompt's last tokens read apart, so that a checkpoint precedes them


@dataclass(eq=False)
class Checkpoint:
    n_tokens: int  # the slot's cached tokens when it was taken: it holds the window before them
    data: bytearray
    check: int  # CRC-32 of ``data``

    @property
    def size(self) -> int:
        return len(self.data)


def marks(start: int, n_prompt: int, n_ubatch: int) -> list[int]:
    """Where a prompt read from ``start`` stops for a checkpoint (pure): ``n_ubatch + TAIL`` and
    ``TAIL`` tokens before its end, past ``start``, ascending."""
    return sorted({m for m in (n_prompt - TAIL - n_ubatch, n_prompt - TAIL) if start < m < n_prompt})


def pick(checkpoints: Sequence[Checkpoint], upto: int) -> Checkpoint | None:
    """The checkpoint to load for a prompt whose first ``upto`` tokens the slot holds (pure): the
    latest taken at or before them."""
    fit = [c for c in checkpoints if 0 < c.n_tokens <= upto]
    return max(fit, key=lambda c: c.n_tokens, default=None)


def _fns(ll):
    lib = ll.llama_cpp._lib  # not bound by llama-cpp-python: the library's own symbols
    get_size, get = lib.llama_state_seq_get_size_ext, lib.llama_state_seq_get_data_ext
    put = lib.llama_state_seq_set_data_ext
    if getattr(get, "restype", None) is not ctypes.c_size_t:
        get_size.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32]
        get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_uint32]
        put.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_uint32]
        for f in (get_size, get, put):
            f.restype = ctypes.c_size_t
    return get_size, get, put


def take(ll, ctx, seq_id: int, n_tokens: int) -> Checkpoint | None:
    """A checkpoint of sequence ``seq_id`` holding ``n_tokens`` tokens, or None where llama.cpp
    writes nothing."""
    get_size, get, _ = _fns(ll)
    size = get_size(ctx, seq_id, PARTIAL_ONLY)
    if not size:
        return None
    data = bytearray(size)
    view = (ctypes.c_uint8 * size).from_buffer(data)
    n = get(ctx, view, size, seq_id, PARTIAL_ONLY)
    del view  # the buffer may be resized once no ctypes array points into it
    if not n:
        return None
    del data[n:]
    return Checkpoint(n_tokens, data, zlib.crc32(data))


def restore(ll, ctx, seq_id: int, cp: Checkpoint) -> bool:
    """Load ``cp`` into sequence ``seq_id`` in place of its partial cells; False where its bytes
    changed since they were taken or llama.cpp refuses them (the caller reads the prompt whole)."""
    _, _, put = _fns(ll)
    size = len(cp.data)
    if not size or zlib.crc32(cp.data) != cp.check:
        return False
    view = (ctypes.c_uint8 * size).from_buffer(cp.data)
    n = put(ctx, view, size, seq_id, PARTIAL_ONLY)
    del view
    return n == size
