"""The registry's supervisors, one per model by name (``Supervisors``).

A model's supervisor is made the first time a request, a load or a setting needs one kept
(``kept``), and kept while its spec stays the same. One whose spec changed, or that a reload
dropped, is retired (it unloads once idle) and still counted (``all``: placement, requests in
flight, shutdown) while it holds a backend or a stop. A model only looked at gets a fresh
supervisor that is not kept (``of``): nothing is made for it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..backends.replicas import ReplicaSet
from ..models.config import ModelSpec
from .supervisor import ModelSupervisor


class Supervisors:
    def __init__(self, make: Callable[[ModelSpec], ModelSupervisor]):
        self._make = make  # a model's supervisor, not kept yet (the registry is their Host)
        self.by_name: dict[str, ModelSupervisor] = {}
        self._retired: list[ModelSupervisor] = []  # replaced by a reload, still holding something

    def kept(self, spec: ModelSpec) -> ModelSupervisor:
        """The model's supervisor, made on first use and kept; a spec that changed retires the old one."""
        model = self.by_name.get(spec.name)
        if model is None or (model.spec is not spec and model.spec != spec):  # the same spec: no field compared
            if model is not None:
                self.retire(model)
            model = self.by_name[spec.name] = self._make(spec)
        return model

    def of(self, spec: ModelSpec) -> ModelSupervisor:
        """The model's supervisor, to read its state: the one kept, or a fresh (unloaded) one
        that is not kept (nothing is made for a model only looked at)."""
        return self.by_name.get(spec.name) or self._make(spec)

    def all(self) -> list[ModelSupervisor]:
        """The kept supervisors and the retired ones that still hold something."""
        self._retired = [m for m in self._retired if m.holds or m.stopping]  # shutdown waits for their stops
        return [*self.by_name.values(), *self._retired]

    def retire(self, model: ModelSupervisor) -> None:
        model.retire()
        if model.holds:
            self._retired.append(model)

    def drop(self, name: str) -> None:
        """A model a reload changed or removed: no longer kept by its name, and retired."""
        self.retire(self.by_name.pop(name))

    def keep_alive(self, spec: ModelSpec, seconds: float | None, *, shorten: bool = True) -> None:
        """A request's keep_alive (Ollama's): how long the model stays loaded once idle, from now on
        (None: as it is). Without ``shorten`` (a user key's request: the model is everyone's), never
        less than the configuration's keep_alive: a user may keep a model loaded longer, and only an
        admin may unload it sooner. A pinned model stays loaded whatever a request asks."""
        if seconds is None or spec.pin:
            return
        model = self.kept(spec)
        model.keep_for(seconds if shorten else max(seconds, model.timing.keep_alive))

    def replica_rows(self) -> list[tuple[str, str, bool, int, int]]:
        """(model, replica, up, requests, failovers) for every running model with replicas."""
        return [(m.spec.name, *row) for m in self.all() if isinstance(m.backend, ReplicaSet)
                for row in m.backend.rows()]
