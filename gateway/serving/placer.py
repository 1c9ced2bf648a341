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
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
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

# a swap's reasons (``gguf_gateway_swaps_total{reason}``): the loaded model was idle past its hold,
# or a request waited server.max_swap_wait for it
IDLE, MAX_SWAP_WAIT = "idle", "max_swap_wait"
WAIT_POLL = 0.5  # seconds between two looks while a load waits for room, whatever it waits for


class Placer:
    def __init__(self, info: Callable[[ModelSpec], GGUFInfo | None],
                 projector: Callable[[ModelSpec], GGUFInfo | None] = lambda spec: None,
                 adapters: Callable[[ModelSpec], list[GGUFInfo]] = lambda spec: []):
        self.info = info  # a local model's GGUF header (the catalog's), for its estimate
        self.projector = projector  # and its projector's (``mmproj``)
        self.adapters = adapters  # and its LoRA adapters' (``lora``, ``loras``)
        self.devices = devices.Inventory()  # the GPUs llama.cpp sees, for placement by memory
        self._change: asyncio.Future[None] | None = None  # done at the next change a load waiting for room waits for
        self._pending: dict[int, tuple[ModelSupervisor, float]] = {}  # loads waiting for room, since when
        self.on_swap: Callable[[str], None] | None = None  # told each swap's reason (the metrics)
        # the waiting load that unloaded a model for itself: the place it made is its own alone
        self._swapper: ModelSupervisor | None = None

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
        cannot fit at all. The GPUs are read once, before the first decision.

        Where only an unloading makes room (a swap), the models waiting for one take turns
        (``placement.next_load``), and the one whose turn it is unloads the loaded model when
        ``placement.swap`` says: once idle ``server.swap_hold_seconds``, or, once its oldest
        request has waited ``server.max_swap_wait``, at once (closing a busy one to new requests
        and waiting for it to drain). Each swap is logged with its reason and counted (``on_swap``)."""
        if not any(m.local for m in model.spec.members):  # another machine's memory
            return
        began = time.monotonic()
        self._pending[id(model)] = (model, began)
        closed: list[ModelSupervisor] = []
        try:
            await self._make_room(model, server, supervisors, began, closed)
        finally:
            del self._pending[id(model)]
            if self._swapper is model:
                self._swapper = None
            for victim in closed:  # a swap that did not happen (its load failed or gave up) reopens it
                victim.door.open()
            self._changed()

    async def _make_room(self, model: ModelSupervisor, server: ServerConfig, supervisors: Supervisors,
                         began: float, closed: list[ModelSupervisor]) -> None:
        limit = server.max_loaded_models
        deadline = began + max(server.load_timeout, 60.0)
        reading: devices.Reading | None = None
        asked = len(model.waits) > 0  # a load for requests (not a preload, not an admin's)
        while True:
            change = self._next_change()  # taken before deciding: a change meanwhile is not missed
            others = self._others(model, supervisors)
            if reading is None:  # recent where the model puts layers on a GPU; the first reading tells
                on_gpu = model.spec.n_gpu_layers != 0 and not model.spec.rpc and model.spec.devices != ()
                reading = await self.devices.read(functools.partial(self.held_by_pool, list(others.values())),
                                                  devices.GPU_READING_MAX_AGE if on_gpu else None)
            gpus = reading.gpus
            need = devices.with_unified(self.need(model.spec), gpus)
            residents = self._residents(others, gpus)
            capacity = await self.capacity(server, sum(r.memory.get(sysmem.RAM, 0) + r.cache for r in residents),
                                           reading)
            # read again after the awaits, and decided on with none between: a load that left its
            # wait for room meanwhile counts now (its last decision and its leaving are one step)
            others = self._others(model, supervisors)
            residents = self._residents(others, gpus)
            bounds = {pool: n for pool, (n, _) in capacity.items()}
            room, name = placement.make_room(residents, limit, need, bounds)
            now = time.monotonic()
            turn = self._turn(now, server.max_swap_wait) is model
            # room made by a swap for another waiting model is its to take: out of turn, a load
            # goes on only where it fits beside the other waiting loads too
            if room is placement.Room.FITS and self._swapper in (None, model) and (turn or placement.make_room(
                    residents + self._residents(self._waiting_loads(model), gpus), limit, need, bounds)[0]
                    is placement.Room.FITS):
                return
            if room is placement.Room.TRIM:
                keep = placement.cache_trims(residents, need, bounds)
                await self._trim(others, keep, model.spec.name, limit, deadline)
                continue
            if room is placement.Room.TOO_LARGE:
                raise too_large(model.spec.name, need, capacity)
            if room is placement.Room.NEVER:
                raise never_fits(model.spec.name, limit)
            if asked and not model.waits:  # every request it was for has left: no swap for nobody
                log.info("swap: none for %r: its requests left while it waited for room", model.spec.name)
                raise abandoned(model.spec.name)
            waited = now - min(model.waits.oldest() or began, began)
            if room is placement.Room.FITS or not turn:
                after = WAIT_POLL  # another waiting model's turn to swap, or the place it made
            elif room is placement.Room.EVICT and name is not None:
                victim = others[name]
                decision, after = placement.swap(now - victim.last_used, waited, server.swap_hold_seconds,
                                                 server.max_swap_wait)
                if decision is placement.Swap.GO:
                    reason = MAX_SWAP_WAIT if waited >= server.max_swap_wait else IDLE
                    log.info("swap: unloading %r to load %r (%s: %d request(s) waited up to %.1f s)",
                             victim.spec.name, model.spec.name, reason, len(model.waits), waited)
                    if self.on_swap is not None:
                        self.on_swap(reason)
                    self._swapper = model
                    await victim.unload()
                    continue
            else:
                decision, after = placement.swap(None, waited, server.swap_hold_seconds, server.max_swap_wait)
                if decision is placement.Swap.CLOSE:
                    drain = placement.busy_victim(residents, need, bounds)
                    if drain is not None and not others[drain].door.closed:
                        log.info("swap: %r takes no new request until it is unloaded for %r (its requests "
                                 "waited %.1f s: server.max_swap_wait)", others[drain].spec.name, model.spec.name,
                                 waited)
                        others[drain].door.close()
                        closed.append(others[drain])
                    after = WAIT_POLL
            if not await self._wait_for_change(change, min(after, WAIT_POLL), deadline):
                raise all_busy(model.spec.name, limit)

    def _others(self, model: ModelSupervisor, supervisors: Supervisors) -> dict[str, ModelSupervisor]:
        """The local models ``model`` makes room beside, by key: not those still waiting for room
        themselves (loading, but holding nothing yet: counted, two waiting loads would each wait
        for the other's room, and neither would ever load)."""
        return {str(id(m)): m for m in supervisors()
                if m is not model and id(m) not in self._pending and any(s.local for s in m.spec.members)}

    def _waiting_loads(self, model: ModelSupervisor) -> dict[str, ModelSupervisor]:
        """The other local models waiting for room, by key."""
        return {str(key): m for key, (m, _) in self._pending.items()
                if m is not model and any(s.local for s in m.spec.members)}

    def _residents(self, others: Mapping[str, ModelSupervisor],
                   gpus: Sequence[devices.Device]) -> list[placement.Resident]:
        return [replace(m.resident(key), memory=devices.with_unified(self.held(m), gpus), cache=self.cached(m))
                for key, m in others.items()]

    def _turn(self, now: float, max_wait: float) -> ModelSupervisor | None:
        """The waiting model whose turn it is to unload another (``placement.next_load``)."""
        pending = [placement.Pending(str(key), min(m.waits.oldest() or began, began), len(m.waits))
                   for key, (m, began) in self._pending.items()]
        chosen = placement.next_load(pending, now, max_wait)
        return self._pending[int(chosen)][0] if chosen is not None else None

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

    def _next_change(self) -> asyncio.Future[None]:
        if self._change is None or self._change.done():
            self._change = asyncio.get_running_loop().create_future()
        return self._change

    def _changed(self) -> None:
        if self._change is not None and not self._change.done():
            self._change.set_result(None)

    async def _wait_for_change(self, change: asyncio.Future[None], seconds: float, deadline: float) -> bool:
        """Wait until ``change`` (a model went idle or loaded, a waiting load ended), ``seconds`` or
        ``deadline``; False once the deadline has passed."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(change), max(0.0, min(seconds, left)))
        return True

    def went_idle(self) -> None:
        """A model has nothing in flight now: a load waiting for room may go on."""
        self._changed()

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


def abandoned(name: str) -> ApiError:
    """A load that waited for a swap gave up: every request it was for left before room was made
    (the closed model reopens; a request that comes later starts a load of its own)."""
    return ApiError(f"the requests for {name!r} left while it waited for room; nothing was unloaded for it",
                    status=503, param="model", code="model_loading", headers={"Retry-After": "1"})


def all_busy(name: str, limit: int) -> ApiError:
    """Every model that could make room stayed busy until the wait ran out."""
    return ApiError(f"all loaded models are busy and {name!r} does not fit beside them "
                    f"(server.max_loaded_models: {limit}, memory); retry shortly",
                    status=503, param="model", code="model_capacity", headers={"Retry-After": "5"})
