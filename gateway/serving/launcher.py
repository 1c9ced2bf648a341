"""Starting a model's backend, by its spec: ``Launcher``.

- a local model: a worker through the ``BackendFactory`` (``backend.LocalWorkers``, from a
  spare process where configured, unless the registry is given another factory);
- ``upstream:``: a ``RemoteBackend`` sharing its upstream's health (``upstream_table``);
- ``replicas:``: a ``ReplicaSet`` whose members are started the same way.

A backend that exits without being asked to is a crash: its supervisor is told (the next
request starts it again) and ``on_crash`` counts it, a replica's crash as its model's.
"""

from __future__ import annotations

from collections.abc import Callable

from ..backends.local import Backend, BackendFactory, LocalWorkers
from ..backends.replicas import ReplicaSet
from ..backends.upstream_table import Upstreams
from ..models.config import ModelSpec, ServerConfig
from .supervisor import ModelSupervisor

Exited = Callable[[Backend, bool], None]  # a backend went away; expected: it was asked to


class Launcher:
    def __init__(self, factory: BackendFactory, upstreams: Upstreams, backoff: tuple[float, float],
                 server: Callable[[], ServerConfig], on_busy: Callable[[], None],
                 on_crash: Callable[[ModelSupervisor], None]):
        self.factory, self.upstreams, self.backoff = factory, upstreams, backoff
        self.server = server  # the running configuration's (a reload replaces it)
        self.on_busy = on_busy  # a backend became busy or idle (the CPUs are shared anew)
        self.on_crash = on_crash

    async def start(self, model: ModelSupervisor) -> Backend:
        """A running backend for ``model.spec``; raises ``StartFailed``."""
        def on_exit(backend: Backend, expected: bool) -> None:
            if not expected and not model.spec.replicas:
                self.on_crash(model)
            model.backend_exited(backend)

        if model.spec.replicas:
            return await ReplicaSet.start(model.spec, lambda spec, exited: self._one(spec, exited, model),
                                          on_exit, self.backoff)
        return await self._one(model.spec, on_exit, model)

    async def _one(self, spec: ModelSpec, on_exit: Exited, model: ModelSupervisor) -> Backend:
        """One backend: an upstream's, or a local worker through the factory."""
        if spec.upstream is not None:
            return self.upstreams.backend(spec)

        def counted(backend: Backend, expected: bool) -> None:  # a replica's crash is counted as the model's
            if not expected:
                self.on_crash(model)
            on_exit(backend, expected)

        if not model.spec.replicas:
            spec = model.adapters.for_load(spec)  # with the adapters loaded at run time
        return await self.factory(spec, self.server(), on_exit=counted if model.spec.replicas else on_exit,
                                  on_busy=self.on_busy, on_progress=model.loaded_part)

    async def close(self) -> None:
        """Stop what the factory keeps (a spare worker) at shutdown."""
        if isinstance(self.factory, LocalWorkers):
            await self.factory.close()
