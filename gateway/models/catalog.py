"""Names -> model specs: models.yaml's entries, what discovery finds in the model stores, and
the built-in demo model when there is nothing else. Names are trimmed and compared
case-insensitively, and are only ever keys into these tables, never joined to a path. An alias
in models.yaml may be a glob pattern (``claude-*``, ``gpt-*``): it answers for names that match
it once no model has the name itself (``match``), so a client that asks for its vendor's model
names reaches a local one.

Which loaded model a name means first is the registry's business (``Registry.resolve``); the
catalog answers for everything that can be loaded.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from . import discovery, testmodels
from .config import Config, ModelSpec, normalize_name
from .ggufmeta import GGUFInfo, ModelFileError

log = logging.getLogger(__name__)

DEMO_NAME = "demo"


class ModelCatalog:
    def __init__(self, config: Config, *, demo_dir: Path | None = None, allow_demo: bool = False,
                 rescan_seconds: float = 5.0):
        self.config = config
        self.rescan_seconds = rescan_seconds  # a miss rescans the stores at most this often
        self._demo_dir = demo_dir
        self._allow_demo = allow_demo
        self._specs: list[ModelSpec] = []
        self._configured: dict[str, ModelSpec] = {}
        self._discovered: dict[str, ModelSpec] = {}
        self._patterns: list[tuple[str, ModelSpec]] = []  # models.yaml's glob aliases, in file order
        self.table = discovery.Catalog([], {}, {})  # discovery's names and their conflicts
        self.found: dict[str, discovery.Found] = {}  # spec name -> discovery record
        self._scanned_at = -math.inf
        self.refresh()

    def refresh(self) -> None:
        """Re-read the stores (blocking I/O: call it off the event loop when serving)."""
        cfg = self.config
        models = [_as_its_header_says(s) for s in cfg.models]
        configured = {normalize_name(n): s for s in models for n in s.names if not is_pattern(n)}
        patterns = [(normalize_name(n), s) for s in models for n in s.aliases if is_pattern(n)]
        configured_paths = {os.path.realpath(s.path): s for s in models if s.path is not None}
        found = discovery.scan(discovery.roots_for(cfg.server.models_dirs, cfg.server.discover_default_stores))
        same_file = [f for f in found if os.path.realpath(f.path) in configured_paths]
        table = discovery.Catalog.build([f for f in found if f not in same_file], set(configured))
        discovered: dict[str, ModelSpec] = {}
        self.found = {}
        for f in table.models:
            won = [n for n in [*f.names, *f.fallback] if table.names.get(normalize_name(n)) is f]
            won = list(dict.fromkeys(won))
            spec = ModelSpec(name=won[0], path=f.path, aliases=tuple(won[1:]), source=f.source, mmproj=f.mmproj,
                             embeddings=bool(f.info and f.info.pooling and not f.info.reranker),
                             reranker=bool(f.info and f.info.reranker), loras=tuple(f.loras))
            self.found[spec.name] = f
            for n in won:
                discovered[normalize_name(n)] = spec
        for f in same_file:  # a configured file found on disk too: its store names reach the entry
            for n in f.names:
                discovered.setdefault(normalize_name(n), configured_paths[os.path.realpath(f.path)])
        specs = models + [s for s in _unique(discovered.values()) if all(s is not c for c in models)]
        if not specs and self._allow_demo:
            demo = ensure_demo_model(self._demo_dir)
            if [s.source for s in self._specs] != ["demo"]:
                log.info("no models configured or found: serving the built-in demo model as %r (%s)",
                         DEMO_NAME, demo.path)
            specs, configured = [demo], {DEMO_NAME: demo}
        self._specs, self._configured, self._discovered = specs, configured, discovered
        self._patterns = patterns
        self.table = table
        self._scanned_at = time.monotonic()
        self._resolve_drafts()

    def _resolve_drafts(self) -> None:
        """A ``draft:`` given as a model's name becomes that model's file (a local model this
        catalog resolves); one it cannot resolve is left as it is, and the load says so."""
        named = {id(s): s for s in self._specs if s.draft is not None and not s.draft.is_absolute()}
        new: dict[int, ModelSpec] = {}
        for key, spec in named.items():
            target = self.resolve(str(spec.draft))
            if target is not None and target.path is not None:
                new[key] = dataclasses.replace(spec, draft=target.path)
        if not new:
            return
        def swap(s: ModelSpec) -> ModelSpec:
            return new.get(id(s), s)

        self._specs = [swap(s) for s in self._specs]
        self._configured = {k: swap(s) for k, s in self._configured.items()}
        self._discovered = {k: swap(s) for k, s in self._discovered.items()}
        self._patterns = [(p, swap(s)) for p, s in self._patterns]

    def stale(self) -> bool:
        """Whether a miss may rescan the stores now."""
        return time.monotonic() - self._scanned_at >= self.rescan_seconds

    @staticmethod
    def keys(name: object) -> list[str]:
        """The normalized keys ``name`` is looked up by, in order: itself, then for a
        ``name:tag`` the name without its tag."""
        if not isinstance(name, str):
            return []
        key = normalize_name(name)
        if not key:
            return []
        return [key, key.split(":", 1)[0]] if ":" in key else [key]

    def get(self, key: str) -> ModelSpec | None:
        """models.yaml's entry for a normalized key, else discovery's."""
        return self._configured.get(key) or self._discovered.get(key)

    def match(self, key: str, within: Callable[[ModelSpec], bool] = lambda _spec: True) -> ModelSpec | None:
        """The first models.yaml entry (in file order) with a glob alias (``claude-*``) that a
        normalized key matches, of those ``within`` takes (a request's scope: the others are
        passed over as if they were not there): asked only after every exact name, so a pattern
        never takes a name a model has."""
        for pattern, spec in self._patterns:
            if fnmatch.fnmatchcase(key, pattern) and within(spec):
                return spec
        return None

    def resolve(self, name: object) -> ModelSpec | None:
        keys = self.keys(name)
        for key in keys:
            if (spec := self.get(key)) is not None:
                return spec
        for key in keys:
            if (spec := self.match(key)) is not None:
                return spec
        return None

    def specs(self) -> list[ModelSpec]:
        return list(self._specs)

    @classmethod
    def adapters(cls, spec: ModelSpec) -> list[GGUFInfo]:
        """The headers of the LoRA adapters a local model loads with (``lora``, then ``loras``), for
        its memory estimate; one that cannot be read is left out (its load says why)."""
        paths = [path for path, _ in spec.lora] + [a.path for a in spec.loras]
        return [info for info in map(cls.header, paths) if info is not None]

    def names_of(self, spec: ModelSpec) -> list[str]:
        """Every name that resolves to ``spec``, its own name first (glob aliases not included)."""
        names = [n for n in spec.names if not is_pattern(n)]
        names += [k for k, s in {**self._discovered, **self._configured}.items() if s is spec]
        return list(dict.fromkeys(normalize_name(n) for n in names))

    def conflicts_won(self, spec: ModelSpec) -> dict[str, list[Path]]:
        """Names ``spec`` won over other files: name -> the files that lost it."""
        found = self.found.get(spec.name)
        return {name: [f.path for f in claimants[1:]] for name, claimants in self.table.conflicts.items()
                if found is not None and claimants[0] is found}

    @staticmethod
    def header(path: Path | None) -> GGUFInfo | None:
        """A GGUF file's header (None for no file, or a bad one: ``INFO_CACHE`` says which)."""
        if path is None:
            return None
        try:
            return discovery.INFO_CACHE.get(path)
        except ModelFileError:
            return None

    @classmethod
    def info(cls, spec: ModelSpec) -> GGUFInfo | None:
        """The GGUF header of a local model (None for one served elsewhere, or a bad file)."""
        return cls.header(spec.path)

    @classmethod
    def projector(cls, spec: ModelSpec) -> GGUFInfo | None:
        """The GGUF header of a local model's projector (None without one, or a bad file)."""
        return cls.header(spec.mmproj)

    @classmethod
    def media(cls, spec: ModelSpec) -> list[str]:
        """What a local model's projector encodes, by its header: "image", "audio"."""
        found = cls.projector(spec)
        return list(found.media) if found is not None else []


def is_pattern(name: str) -> bool:
    """Whether a models.yaml alias is a glob pattern (``*``, ``?``, ``[...]``) rather than a name."""
    return any(c in name for c in "*?[")


def _as_its_header_says(spec: ModelSpec) -> ModelSpec:
    """A configured model whose GGUF header asks for llama.cpp's rank pooling is a reranker,
    said in models.yaml or not (it can do nothing else)."""
    if spec.path is None or spec.reranker:
        return spec
    try:
        info = discovery.INFO_CACHE.get(spec.path)
    except (ModelFileError, OSError):
        return spec
    return dataclasses.replace(spec, reranker=True) if info.reranker else spec


def _unique(specs) -> list[ModelSpec]:
    out: list[ModelSpec] = []
    for s in specs:
        if all(s is not o for o in out):
            out.append(s)
    return out


def ensure_demo_model(directory: Path | None = None) -> ModelSpec:
    directory = directory or testmodels.data_dir()
    path = directory / "demo.gguf"
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        testmodels.demo(tmp)
        tmp.replace(path)
    return ModelSpec(name=DEMO_NAME, path=path, source="demo")
