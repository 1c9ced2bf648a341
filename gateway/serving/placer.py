"""Placement carried out: ``Placer`` gathers the state ``placement.py``'s pure policies decide
on and does what they decide.

- Room for one more model (``make_room``): each model's memory by pool (for a loaded model,
  what llama.cpp reported it allocated; else its estimate), each pool's capacity (free memory
  plus what the models hold, less ``memory_reserve``, at most ``memory_budget``), the GPUs as
  last read (``devices.Inventory``); then ``placement.make_room``'s answer: load, trim the
  loaded models' prompt caches (``placement.cache_trims``: each local worker's cache, as it last
  reported it, counts in its model's RAM and is trimmed before any model is unloaded for RAM),
  evict the named model, wait for one to go idle, or refuse (``too_large``, ``never_fits``,
  ``all_busy``: pure, the refusal's wording in one place each).
- The CPUs split among the backends busy now (``share_cpus``, by ``placement.cpu_shares``).

The placer keeps no list of models: its caller (the registry) hands it the supervisors each
time, since a reload or an unload changes them while a load waits for room.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..backends.local import CacheHolder
from ..base.errors import ApiError
from ..hardware import devices, sysmem
from ..models import memory, placement
from ..models.config import ModelSpec, ServerConfig
from ..models.ggufmeta import GGUFInfo
from ..models.lifecycle import ModelState
from ..protocol import topology
from .supervisor import ModelSupervisor

log = logging.getLogger(__name__)

Supervisors = Callable[[], list[ModelSupervisor]]  # every model that may hold something, now


class Placer:
    def __init__(self, info: Callable[[ModelSpec], GGUFInfo | None],
                 projector: Callable[[ModelSpec], GGUFInfo | None] = lambda spec: None,
                 adapters: Callable[[ModelSpec], list[GGUFInfo]] = lambda spec: []):
        self.info = info  # a local model's GGUF header (the catalog's), for its estimate
        self.projector = projector  # and its projector's (``mmproj``)
        self.adapters = adapters  # and its LoRA adapters' (``lora``, ``loras``)
        self.devices = devices.Inventory()  # the GPUs llama.cpp sees, for placement by memory
        self._released: asyncio.Event | None = None  # set when a model goes idle

    # --- what models take ----------------------------------------------------------------------
    def estimate(self, spec: ModelSpec) -> dict[str, Any] | None:
        """What a local model should take once loaded (``memory.estimate``), from its header, on
        the GPUs as last read (none before the first load)."""
        info = self.info(spec) if spec.path is not None else None
        if info is None:
            return None
        found = memory.estimate(info, spec, self.devices.gpus, self.projector(spec), self.adapters(spec))
        if found is not None and spec.draft is not None:  # the draft model, loaded beside it
            draft = dataclasses.replace(spec, path=spec.draft, draft=None, mmproj=None, prompt_cache_bytes=0,
                                        n_gpu_layers=spec.draft_n_gpu_layers, n_ctx=spec.draft_n_ctx or spec.n_ctx)
            draft_info = self.info(draft)
            extra = memory.estimate(draft_info, draft, self.devices.gpus) if draft_info is not None else None
            found = found.with_draft(extra) if extra is not None else found
        return found.describe() if found is not None else None

    def need(self, spec: ModelSpec) -> dict[str, int]:
        """What a model should take, by pool."""
        found = self.estimate(spec)
        return dict(found["devices"]) if found else {}

    def held(self, model: ModelSupervisor) -> dict[str, int]:
        """What a model holds by pool: what llama.cpp allocated for it (and, on each GPU, its
        runtime's context, which no buffer shows), else (loading) its estimate."""
        if model.state not in (ModelState.LOADING, ModelState.READY) or model.spec.path is None:
            return {}
        backend = model.backend
        held = memory.allocated(backend.info.get("buffers")) if backend is not None and backend.alive else None
        if not held:
            return self.need(model.spec)
        return {pool: n + memory.gpu_context(pool) for pool, n in held["devices"].items()}

    @staticmethod
    def cached(model: ModelSupervisor) -> int:
        """What a loaded model's prompt cache holds in RAM besides ``held``, as its worker last
        reported (0 for a backend without one here)."""
        backend = model.backend
        if model.state not in (ModelState.LOADING, ModelState.READY) or not isinstance(backend, CacheHolder):
            return 0
        return backend.cache_bytes if backend.alive else 0

    def held_by_pool(self, models: Iterable[ModelSupervisor]) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in models:
            for pool, n in self.held(m).items():
                out[pool] = out.get(pool, 0) + n
        return out

    async def capacity(self, server: ServerConfig, held_ram: int,
                       reading: devices.Reading) -> dict[str, tuple[int, str]]:
        """The bytes the models may hold in each pool, and why that much (``devices.capacities``)."""
        ram = await asyncio.to_thread(sysmem.read)
        return devices.capacities(ram, held_ram, reading, server.memory_budget, server.memory_reserve)

    def loaded(self, model: ModelSupervisor, supervisors: Supervisors) -> None:
        """A model finished loading: the worker's reading of the devices, with its model loaded,
        becomes the GPUs' (of its own devices only, where models.yaml names them)."""
        found = model.backend.info.get("devices") if model.backend is not None else None
        if isinstance(found, list) and found:
            self.devices.take(found, lambda: self.held_by_pool(supervisors()), partial=model.spec.devices is not None)

    # --- room for one more model -----------------------------------------------------------------
    async def make_room(self, model: ModelSupervisor, server: ServerConfig, supervisors: Supervisors) -> None:
        """Carry out ``placement.make_room`` until the model fits (in number and in the memory of
        each device), waiting while every loaded model is busy (503 ``model_capacity`` after the
        load timeout, and at least a minute); 503 ``model_too_large`` at once for one that
        cannot fit at all. The GPUs are read once, before the first decision."""
        limit = server.max_loaded_models
        if not any(m.local for m in model.spec.members):  # another machine's memory
            return
        deadline = time.monotonic() + max(server.load_timeout, 60.0)
        reading: devices.Reading | None = None
        while True:
            others = {str(id(m)): m for m in supervisors()
                      if m is not model and any(s.local for s in m.spec.members)}
            if reading is None:  # recent where the model puts layers on a GPU; the first reading tells
                on_gpu = model.spec.n_gpu_layers != 0 and not model.spec.rpc and model.spec.devices != ()
                reading = await self.devices.read(functools.partial(self.held_by_pool, list(others.values())),
                                                  devices.GPU_READING_MAX_AGE if on_gpu else None)
            gpus = reading.gpus
            need = devices.with_unified(self.need(model.spec), gpus)
            residents = [replace(m.resident(key), memory=devices.with_unified(self.held(m), gpus),
                                 cache=self.cached(m)) for key, m in others.items()]
            capacity = await self.capacity(server, sum(r.memory.get(sysmem.RAM, 0) + r.cache for r in residents),
                                           reading)
            bounds = {pool: n for pool, (n, _) in capacity.items()}
            room, name = placement.make_room(residents, limit, need, bounds)
            if room is placement.Room.FITS:
                return
            if room is placement.Room.TRIM:
                keep = placement.cache_trims(residents, need, bounds)
                await self._trim(others, keep, model.spec.name, limit, deadline)
                continue
            if room is placement.Room.TOO_LARGE:
                raise too_large(model.spec.name, need, capacity)
            if room is placement.Room.NEVER:
                raise never_fits(model.spec.name, limit)
            if room is placement.Room.EVICT and name is not None:
                victim = others[name]
                log.info("unloading %r (least recently used) to make room for %r", victim.spec.name, model.spec.name)
                await victim.unload()
                continue
            if not await self._wait_for_idle(deadline):
                raise all_busy(model.spec.name, limit)

    async def _trim(self, others: Mapping[str, ModelSupervisor], keep: Mapping[str, int], name: str, limit: int,
                    deadline: float) -> None:
        """Trim each named model's prompt cache to what ``keep`` leaves it (``placement.cache_trims``),
        one after another; each answers between two of its decode steps, at the latest by
        ``deadline`` (else 503 ``model_capacity``, as a wait for room that ran out)."""
        for key, most in keep.items():
            victim = others[key]
            backend = victim.backend
            if not isinstance(backend, CacheHolder):
                continue
            was = backend.cache_bytes
            try:
                now = await asyncio.wait_for(backend.trim_cache(most), max(1.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise all_busy(name, limit) from None
            log.info("trimmed %r's prompt cache from %s to %s to make room for %r", victim.spec.name,
                     devices.gib(was), devices.gib(now), name)

    async def _wait_for_idle(self, deadline: float) -> bool:
        """Wait until some model goes idle (``went_idle``) or ``deadline``; whether one did."""
        if self._released is None:
            self._released = asyncio.Event()
        self._released.clear()
        try:
            await asyncio.wait_for(self._released.wait(), deadline - time.monotonic())
        except asyncio.TimeoutError:
            return False
        return True

    def went_idle(self) -> None:
        """A model has nothing in flight now: a load waiting for room may go on."""
        if self._released is not None:
            self._released.set()

    # --- the CPUs --------------------------------------------------------------------------------
    def share_cpus(self, supervisors: Iterable[ModelSupervisor]) -> None:
        """Split the CPUs among the backends busy right now (``placement.cpu_shares``)."""
        busy = {str(id(m)): m for m in supervisors if m.backend is not None and m.backend.busy and m.backend.alive}
        shares = placement.cpu_shares([(key, m.spec.n_threads) for key, m in busy.items()],
                                      topology.default_threads())
        for key, threads in shares.items():
            backend = busy[key].backend
            if backend is not None:
                backend.set_threads(threads)


# --- refusals (pure: what the caller is told, from what the placer gathered) -------------------
def too_large(name: str, need: Mapping[str, int], capacity: Mapping[str, tuple[int, str]]) -> ApiError:
    """The model needs more than its models may hold in some pool even with every other model
    unloaded; the message names the first such pool (RAM where none is known to be short)."""
    pool = next((p for p, n in need.items() if p in capacity and n > capacity[p][0]),
                next((p for p in need if p in capacity), sysmem.RAM))
    where = "" if pool == sysmem.RAM else f" on {pool}"
    room_there, why = capacity.get(pool, (0, "memory is not known"))
    return ApiError(f"model {name!r} needs about {devices.gib(need.get(pool, 0))}{where} "
                    f"(weights, KV cache and compute: see memory_estimate in /models), more than the "
                    f"{devices.gib(room_there)} its models may hold there ({why}); give it a smaller "
                    "n_ctx or parallel, a smaller quantization, fewer n_gpu_layers, or more memory",
                    status=503, param="model", code="model_too_large")


def never_fits(name: str, limit: int) -> ApiError:
    """Pinned models alone fill ``max_loaded_models``: nothing will ever make room."""
    return ApiError(f"pinned models fill all {limit} places (server.max_loaded_models); {name!r} "
                    "cannot load beside them: raise the limit or unpin one", status=503, param="model",
                    code="model_capacity")


def all_busy(name: str, limit: int) -> ApiError:
    """Every model that could make room stayed busy until the wait ran out."""
    return ApiError(f"all loaded models are busy and {name!r} does not fit beside them "
                    f"(server.max_loaded_models: {limit}, memory); retry shortly",
                    status=503, param="model", code="model_capacity", headers={"Retry-After": "5"})
