"""The slots' KV caches kept in host memory while the model is loaded (``PromptCache``,
``prompt_cache_bytes``, llama-server's ``--cache-ram``).

When a slot is taken for another conversation, its sequence's state (``llama_state_seq_get_data``)
and tokens are kept here first; a request whose prompt shares a longer prefix with a kept state
than with any slot has that state loaded into its slot (``llama_state_seq_set_data``) before the
rest of its prompt is read (``slots.choose`` decides). The states together stay under the bound,
the least recently used dropped first (``evict``, which also bounds the slots saved on disk:
``savedslots``). A state whose check sum no longer matches, or that llama.cpp refuses or loads
with other positions than its tokens, leaves the slot empty: the prompt is read whole, never
answered from a wrong cache.

A sliding-window model's state holds only the window before its last token (llama.cpp writes no
cell the window masks, ``swa_full`` or not), so a prompt that comes back can go on only from its
end: a slot is cut where its last prompt ended before it is kept or saved (``cut``: what it
generated after is what a returning prompt most often differs in), and ``SlotMemory`` goes on
from a checkpoint, or reads a prompt whole, where a loaded state lacks part of the window it
needs.

Only the worker imports this module (it calls llama.cpp through ``model.ll``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
import zlib
from typing import Protocol, TypeVar

from .checkpoints import Checkpoint


class Weighed(Protocol):
    """What ``evict`` weighs: a state in memory (``Entry``), a saved slot on disk (``savedslots.Saved``)."""

    @property
    def size(self) -> int: ...

    @property
    def used(self) -> float: ...


K = TypeVar("K", bound=Weighed)


def evict(saved: list[K], max_bytes: int) -> list[K]:
    """Which saved caches to remove so that the rest fit in ``max_bytes``: the least recently
    used first."""
    total = sum(s.size for s in saved)
    out: list[K] = []
    for s in sorted(saved, key=lambda s: s.used):
        if total <= max_bytes:
            break
        out.append(s)
        total -= s.size
    return out


@dataclasses.dataclass(eq=False)
class Entry:
    """One slot's cache kept in memory: its sequence state and the tokens it holds."""

    tokens: list[int]
    scope: str  # the cache scope of the slot it came from (``Slot.scope``)
    data: bytearray  # llama_state_seq_get_data's bytes
    check: int  # their CRC-32, taken when they were copied
    used: float  # when it was kept (time.monotonic())
    origin: str = "ram"  # "disk": read back from the on-disk save at load (``restore``)
    # its slot's checkpoints (``worker/checkpoints``): a sliding-window model's state holds only
    # the window before its last token; a prompt that differs before its end goes on from one of these
    checkpoints: list[Checkpoint] = dataclasses.field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.data) + TOKEN_BYTES * len(self.tokens) + sum(c.size for c in self.checkpoints)


TOKEN_BYTES = 4  # a kept token's share of the bound (an int32 in llama.cpp's own files)


class PromptCache:
    """The model's slots' caches kept in host memory, at most ``max_bytes`` in all. Only the
    worker's main loop calls it (between two steps: it copies a sequence's state in and out of
    the context)."""

    def __init__(self, ll, ctx, max_bytes: int):
        self.ll, self.ctx, self.mem = ll, ctx, ll.llama_get_memory(ctx)
        self.max_bytes = max_bytes
        self.entries: list[Entry] = []

    @property
    def held(self) -> int:
        """Bytes kept, as the bound counts them."""
        return sum(e.size for e in self.entries)

    def save(self, slot, upto: int | None = None) -> bool:
        """Keep a copy of ``slot``'s cache (it is about to be overwritten); whether one is kept
        now. ``upto``: the slot's cache is first cut to that many tokens (a sliding-window model's
        state holds only the window before its last token, so a prompt that returns is read on
        from there or not at all: cut where the conversation's prompt ended, what it generated
        after is what a returning prompt most often differs in). A kept state that the slot's
        cache extends is dropped (the new one holds it), and none is made where a kept one
        already holds all of the slot's tokens. A state larger than the whole bound is not kept."""
        if upto is not None:
            cut(self.ll, self.mem, slot, upto)
        tokens = slot.cached
        if not tokens:
            return False
        for e in list(self.entries):
            if e.scope != slot.scope:
                continue
            if e.tokens[:len(tokens)] == tokens:
                e.used = time.monotonic()
                return False
            if tokens[:len(e.tokens)] == e.tokens:
                self.entries.remove(e)
        size = self.ll.llama_state_seq_get_size(self.ctx, slot.id)
        if not size or not self.room(size + TOKEN_BYTES * len(tokens) + sum(c.size for c in slot.checkpoints)):
            return False
        data = bytearray(size)
        view = (ctypes.c_uint8 * size).from_buffer(data)
        n = self.ll.llama_state_seq_get_data(self.ctx, view, size, slot.id)
        del view  # the buffer may be resized once no ctypes array points into it
        if not n:
            return False
        del data[n:]
        self.entries.append(Entry(list(tokens), slot.scope, data, zlib.crc32(data), time.monotonic(),
                                  checkpoints=list(slot.checkpoints)))
        return True

    def attach(self, checkpoints: list[Checkpoint]) -> None:
        """Give the state kept last its checkpoints (taken after it), the bound kept."""
        if self.entries and checkpoints:
            self.entries[-1].checkpoints = checkpoints
            self.room(0)

    def room(self, need: int) -> bool:
        """Make room for ``need`` more bytes, dropping the least recently used states first (before
        the new one is copied: the bound holds at every moment); False where it cannot fit."""
        if need > self.max_bytes:
            return False
        self.drop(evict(self.entries, self.max_bytes - need))
        return True

    def drop(self, entries: list[Entry]) -> None:
        for e in entries:
            self.entries.remove(e)

    def trim(self, max_bytes: int) -> int:
        """Drop the least recently used states until at most ``max_bytes`` are held (the gateway's
        placement reclaiming memory for another model; the bound stays); the bytes held then."""
        self.drop(evict(self.entries, max(0, max_bytes)))
        return self.held

    def take(self, entry: Entry) -> Entry:
        """Take a kept state out of the cache before it is restored (``restore``): the slot it
        goes into may first have its own cache kept, and making room for that must not drop the
        state about to be loaded (its bytes live on in ``entry`` until the restore)."""
        if entry in self.entries:
            self.entries.remove(entry)
        return entry

    def restore(self, entry: Entry, slot) -> bool:
        """Load a state ``take`` took out of the cache into ``slot`` in place of its cache (the
        slot holds it now; taken again, it is kept again). False, with the slot left empty,
        where the bytes changed since they were kept, llama.cpp refuses them (another model or
        context shape), or the positions they load do not match their tokens."""
        ll, mem = self.ll, self.mem
        ll.llama_memory_seq_rm(mem, slot.id, -1, -1)
        slot.keep(0)
        size = len(entry.data)
        if not size or zlib.crc32(entry.data) != entry.check:
            return False
        view = (ctypes.c_uint8 * size).from_buffer(entry.data)
        n = ll.llama_state_seq_set_data(self.ctx, view, size, slot.id)
        del view
        if n != size or ll.llama_memory_seq_pos_max(mem, slot.id) != len(entry.tokens) - 1:
            ll.llama_memory_seq_rm(mem, slot.id, -1, -1)  # nothing half-loaded stays
            return False
        slot.cached, slot.scope, slot.prompt_end = list(entry.tokens), entry.scope, len(entry.tokens)
        slot.checkpoints = entry.checkpoints
        return True


def cut(ll, mem, slot, upto: int) -> None:
    """Cut ``slot``'s cache to its first ``upto`` tokens, where its memory can be cut there."""
    if upto < len(slot.cached) and ll.llama_memory_seq_rm(mem, slot.id, upto, -1):
        slot.keep(upto)

