"""Name -> ModelSpec: models.yaml entries first, then models found on disk.

Names are trimmed and compared case-insensitively. A name is only ever a key into this
table, never joined to a path. When nothing is configured or found, the registry can
fall back to the built-in demo model so a fresh install answers at once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from . import discovery, testmodels
from .config import Config, ModelSpec, normalize_name

log = logging.getLogger(__name__)

DEMO_NAME = "demo"


class Registry:
    def __init__(self, config: Config, *, demo_dir: Path | None = None, allow_demo: bool = False):
        self.config = config
        self._by_name: dict[str, ModelSpec] = {}
        self._specs: list[ModelSpec] = []
        self._demo_dir = demo_dir
        self._allow_demo = allow_demo
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
