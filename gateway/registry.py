"""Name -> ModelSpec: models.yaml entries first, then models found on disk.

Names are trimmed and compared case-insensitively. A name is only ever a key into this
table, never joined to a path. When nothing is configured or found, the registry can
fall back to the built-in demo model so a fresh install answers at once.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from . import discovery, testmodels
from .config import Config, ModelSpec, normalize_name
from .engine.client import LoadFailed, WorkerProcess
from .engine.protocol import LoadParams
from .errors import ApiError, ModelNotFound
from .ggufmeta import ModelFileError, read_info

log = logging.getLogger(__name__)

DEMO_NAME = "demo"


class Registry:
    def __init__(self, config: Config, *, demo_dir: Path | None = None, allow_demo: bool = False):
        self.config = config
        self._by_name: dict[str, ModelSpec] = {}
        self._specs: list[ModelSpec] = []
        self._demo_dir = demo_dir
        self._allow_demo = allow_demo
        self._workers: dict[str, WorkerProcess] = {}
        self._loads: dict[str, asyncio.Task[WorkerProcess]] = {}
        self.worker_failures = 0  # workers that exited without being asked to
        self.refresh()

    def refresh(self) -> None:
        specs = list(self.config.models)
        taken = {normalize_name(n) for s in specs for n in s.names}
        for f in discovery.scan(self.config.server.models_dirs):
            if f.name not in taken:
                specs.append(ModelSpec(name=f.name, path=f.path, source="discovered"))
                taken.add(f.name)
        if not specs and self._allow_demo:
            specs.append(ensure_demo_model(self._demo_dir))
        self._specs = specs
        self._by_name = {normalize_name(n): s for s in specs for n in s.names}

    def resolve(self, name: str) -> ModelSpec | None:
        return self._by_name.get(normalize_name(name)) if isinstance(name, str) else None

    def specs(self) -> list[ModelSpec]:
        return list(self._specs)

    def loaded(self) -> dict[str, WorkerProcess]:
        return {name: w for name, w in self._workers.items() if w.alive}

    async def acquire(self, name: str) -> tuple[ModelSpec, WorkerProcess]:
        """The model's running worker, loading it first if needed (one load per model at a time)."""
        spec = self.resolve(name)
        if spec is None:
            raise ModelNotFound(name if isinstance(name, str) else repr(name))
        worker = self._workers.get(spec.name)
        if worker is not None and worker.alive:
            return spec, worker
        task = self._loads.get(spec.name)
        if task is None:
            task = asyncio.ensure_future(self._load(spec))
            self._loads[spec.name] = task
            task.add_done_callback(lambda _t, n=spec.name: self._loads.pop(n, None))
        # shield: a caller that goes away must not abort a load others may be waiting on
        return spec, await asyncio.shield(task)

    async def _load(self, spec: ModelSpec) -> WorkerProcess:
        try:
            await asyncio.to_thread(read_info, spec.path)  # a bad file fails here, before any spawn
        except ModelFileError as e:
            raise _load_failed(spec, str(e)) from None
        worker = WorkerProcess(LoadParams(
            name=spec.name, path=str(spec.path), n_ctx=spec.n_ctx, n_gpu_layers=spec.n_gpu_layers,
            n_threads=spec.n_threads, n_batch=spec.n_batch, flash_attn=spec.flash_attn,
            use_mmap=spec.use_mmap, chat_template=spec.chat_template,
        ), on_exit=self._worker_exited)
        try:
            await worker.start()
        except LoadFailed as e:
            raise _load_failed(spec, str(e)) from None
        self._workers[spec.name] = worker
        return worker

    def _worker_exited(self, worker: WorkerProcess, expected: bool) -> None:
        if not expected:
            self.worker_failures += 1
        if self._workers.get(worker.params.name) is worker:
            del self._workers[worker.params.name]

    async def close(self) -> None:
        """Stop every worker (at shutdown)."""
        for task in list(self._loads.values()):
            task.cancel()
        await asyncio.gather(*(w.stop() for w in list(self._workers.values())), return_exceptions=True)
        self._workers.clear()


def _load_failed(spec: ModelSpec, reason: str) -> ApiError:
    return ApiError(f"model {spec.name!r} failed to load: {reason}", status=503, param="model",
                    code="model_load_failed")


def ensure_demo_model(directory: Path | None = None) -> ModelSpec:
    directory = directory or testmodels.data_dir()
    path = directory / "demo.gguf"
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        testmodels.demo(tmp)
        tmp.replace(path)
    log.info("no models configured or found: serving the built-in demo model as %r (%s)", DEMO_NAME, path)
    return ModelSpec(name=DEMO_NAME, path=path, source="demo")
