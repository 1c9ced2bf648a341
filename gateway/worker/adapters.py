"""A loaded model's LoRA adapters: loaded once, applied per request.

The table (``Adapters.table``) is the adapters ``lora`` names (applied to every request at their
scales, as llama-server's ``--lora``), then ``loras``' named ones (applied where a request names
one), then those loaded at run time; an adapter's id is its place in it, as llama-server's
``/lora-adapters`` numbers them. A request's set (``chosen``) is its scale for each adapter, from
llama-server's ``lora`` field (listed ids get theirs, the rest 0), else each adapter's default
plus the one its model name picked at that one's scale. Only adapters of non-zero scale are
applied: an adapter at scale 0 gives exactly the base's logits, as no adapter does.

llama.cpp applies adapters to a whole context (``llama_set_adapters_lora``), so a decode holds
the sequences of one set only (``decoding.Decoder.step`` takes the sets in turn), and a cache
computed under one set is never reused under another: ``scope`` folds the set into the cache
scope that the slots, the prompt cache and the saved states compare. An adapter dropped at run
time leaves the table at once and is freed once no sequence uses it (``collect``).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import protocol
from ..protocol.bounds import MAX_ADAPTERS, MAX_SCALE, is_scale
from .refusals import Refused


@dataclass(eq=False)
class Adapter:
    name: str
    path: str
    handle: Any  # llama.cpp's llama_adapter_lora*
    named: float  # its scale where a request names it
    default: float  # its scale in every request that lists none (POST /lora-adapters sets it)
    ident: str  # the file it came from, for cache scopes that outlive the process (saved states)
    alora: list[int] = field(default_factory=list)  # an activated LoRA's invocation tokens (``activated``)


AdapterSet = tuple[tuple[Adapter, float], ...]  # the adapters of non-zero scale, in table order


def _ident(path: str) -> str:
    """What names the adapter's weights across loads: its file, its size and its change time."""
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


def scale_of(value: Any, param: str) -> float:
    """A scale a request or an operator gave (``is_scale``); else ``Refused``."""
    if not is_scale(value):
        raise Refused(400, f"{param} must be a number between -{MAX_SCALE:g} and {MAX_SCALE:g}", param)
    return float(value)


class Adapters:
    def __init__(self, ll, model: Any, ctx: Any, params: protocol.LoadParams, errors: list[str]):
        """Load ``params.lora`` and ``params.loras`` (raises ``RuntimeError`` with llama.cpp's reason
        on one it refuses) and apply the defaults. ``errors``: llama.cpp's error lines, as its log
        callback appends them (its reason for a refused adapter is only logged)."""
        self.ll, self.model, self.ctx, self.errors = ll, model, ctx, errors
        self.table: list[Adapter] = []
        self.retired: list[Adapter] = []  # dropped, freed once no sequence uses them
        self.current: AdapterSet = ()
        try:
            for file, scale in params.lora:
                self.table.append(self._load(Path(file).stem, str(file), scale, scale))
            for name, where, named, default in params.loras:
                self.table.append(self._load(name, where, named, default))
        except Refused as r:
            raise RuntimeError(r.message) from None
        self.apply(self.chosen(None, None))

    def _load(self, name: str, path: str, named: float, default: float) -> Adapter:
        if len(self.table) >= MAX_ADAPTERS:
            raise Refused(400, f"the model has {MAX_ADAPTERS} LoRA adapters already; unload one first", "lora_path")
        if not os.path.isfile(path):
            raise Refused(400, f"the LoRA adapter {path} does not exist", "lora_path")
        seen = len(self.errors)
        handle = self.ll.llama_adapter_lora_init(self.model, path.encode())
        if not handle:
            said = "; ".join(line.split("failed to apply lora adapter: ")[-1].strip()  # (its function's name)
                             for line in self.errors[seen:] if line.strip())
            raise Refused(400, f"llama.cpp could not load the LoRA adapter {path}: "
                               f"{said or 'not a LoRA GGUF, or made for another model'}", "lora_path")
        n = self.ll.llama_adapter_get_alora_n_invocation_tokens(handle)
        tokens = self.ll.llama_adapter_get_alora_invocation_tokens(handle) if n else None
        return Adapter(name, path, handle, named, default, _ident(path),
                       [int(tokens[i]) for i in range(min(n, 4096))] if tokens else [])

    # --- what a request is decoded under ----------------------------------------------------------
    def chosen(self, adapter: str | None, lora: list[tuple[int, float]] | None) -> AdapterSet:
        """A request's set: llama-server's ``lora`` pairs (id, scale: listed ids theirs, the rest
        0; an empty list means the defaults, as in llama-server), else the defaults with
        ``adapter`` (a name) at its named scale. Raises ``Refused`` for an id or name the model
        does not have."""
        scales = [a.default for a in self.table]
        if lora:
            scales = [0.0] * len(self.table)
            for i, (aid, scale) in enumerate(lora):
                if not isinstance(aid, int) or isinstance(aid, bool) or not 0 <= aid < len(self.table):
                    raise Refused(400, f"the model has no LoRA adapter of id {aid!r} (it has {len(self.table)}: "
                                       "GET /lora-adapters lists them)", f"lora[{i}].id")
                scales[aid] = scale_of(scale, f"lora[{i}].scale")
        elif adapter is not None:
            index = next((i for i, a in enumerate(self.table) if a.name == adapter), None)
            if index is None:
                raise Refused(404, f"the model has no LoRA adapter named {adapter!r}", "model", "model_not_found")
            scales[index] = self.table[index].named
        return tuple((a, s) for a, s in zip(self.table, scales) if s != 0)

    @staticmethod
    def activated(chosen: AdapterSet, tokens: list[int]) -> tuple[AdapterSet, int]:
        """An activated LoRA (aLoRA: an adapter with invocation tokens) applies from its
        invocation's last occurrence in the prompt on, the prompt before it read as the base
        reads it (llama-server's rule, from the token before the invocation): ``chosen`` and where
        its adapters start. Not invoked: the base's set. Raises ``Refused`` for several aLoRAs
        at once, as llama-server does."""
        if not chosen or not all(a.alora for a, _ in chosen):
            return chosen, 0
        if len(chosen) > 1:
            raise Refused(400, "Cannot run multiple aLoRAs in a single request", "lora")
        inv = chosen[0][0].alora
        for start in range(len(tokens) - len(inv), -1, -1):
            if tokens[start:start + len(inv)] == inv:
                return chosen, max(start - 1, 0)
        return (), 0

    @staticmethod
    def scope(cache_scope: str, chosen: AdapterSet, start: int = 0) -> str:
        """The cache scope of a request of ``cache_scope`` decoded under ``chosen`` from position
        ``start`` on (before it, as the base: ``activated``): a cache made under one set, or one
        set from another position, is another's to read afresh (the base's: ``cache_scope``)."""
        if not chosen:
            return cache_scope
        return cache_scope + "\x00lora:" + "|".join(f"{a.ident}*{s!r}" for a, s in chosen) + f"@{start}"

    def apply(self, chosen: AdapterSet) -> None:
        """Set ``chosen`` on the context, unless it is what is set (llama.cpp then reserves its
        graph again on the next decode)."""
        if len(chosen) == len(self.current) and all(a is b and s == t for (a, s), (b, t) in zip(chosen, self.current)):
            return
        n = len(chosen)
        array = (self.ll.llama_adapter_lora_p_ctypes * max(n, 1))(*(a.handle for a, _ in chosen))
        scales = (ctypes.c_float * max(n, 1))(*(s for _, s in chosen))
        if self.ll.llama_set_adapters_lora(self.ctx, array, n, scales) != 0:
            raise RuntimeError("llama.cpp could not set the LoRA adapters on the context")
        self.current = chosen

    # --- run-time changes (``protocol.Adapt``) -----------------------------------------------------------
    def change(self, command: protocol.Adapt) -> list[dict[str, Any]]:
        """Carry out ``command``; the table as it now is (``describe``). Raises ``Refused``."""
        if command.action == "load":
            if any(a.name == command.name for a in self.table):
                raise Refused(400, f"the model has a LoRA adapter named {command.name!r} already", "lora_name")
            self.table.append(self._load(command.name, command.path, scale_of(command.scale, "scale"), 0.0))
        elif command.action == "unload":
            gone = [a for a in self.table if a.name == command.name]
            if not gone:
                raise Refused(404, f"the model has no LoRA adapter named {command.name!r}", "lora_name")
            self.table.remove(gone[0])
            self.retired.append(gone[0])
        elif command.action == "scales":
            given = dict(command.scales or [])
            for aid in given:
                if not isinstance(aid, int) or not 0 <= aid < len(self.table):
                    raise Refused(400, f"the model has no LoRA adapter of id {aid!r}", "id")
            for i, a in enumerate(self.table):
                a.default = scale_of(given.get(i, 0.0), f"[{i}].scale")
        elif command.action != "list":
            raise Refused(400, f"unknown adapter action {command.action!r}")
        return self.describe()

    def collect(self, in_use: Iterable[AdapterSet]) -> None:
        """Free the dropped adapters no running sequence uses (off the context first)."""
        if not self.retired:
            return
        used = {id(a) for chosen in in_use for a, _ in chosen}
        free = [a for a in self.retired if id(a) not in used]
        if not free:
            return
        if any(a is b for a in free for b, _ in self.current):
            self.apply(())
        for a in free:
            self.ll.llama_adapter_lora_free(a.handle)
        self.retired = [a for a in self.retired if id(a) in used]

    def describe(self) -> list[dict[str, Any]]:
        """llama-server's GET /lora-adapters entries, with each adapter's name."""
        return [{"id": i, "name": a.name, "path": a.path, "scale": a.default, "named_scale": a.named,
                 **({"alora_invocation_tokens": a.alora} if a.alora else {})}
                for i, a in enumerate(self.table)]
