"""A model's LoRA adapters as the gateway keeps them across its loads (``ModelAdapters``), and
every model's, with the model names that pick one (``Adapters``, the registry's ``adapters``).

A model's adapters are, in this order (an adapter's id is its place, as llama-server's
``/lora-adapters`` numbers them, and as the worker's ``worker.adapters`` table is built):
``lora:``'s (applied to every request at their scales), ``loras:``' named ones (models.yaml's
and discovery's, applied where a request names one), then those loaded at run time (vLLM's
``load_lora_adapter``). The run-time ones and the default scales an operator set (POST
``/lora-adapters``) are kept here, on the model's supervisor, so a model unloaded when idle
loads with them again; they last until the gateway restarts or the model's entry changes. What
the worker is given at a load is ``for_load``'s spec; a change while it runs is also sent to it
(``api/lora.py``).

A request's model name picks an adapter as ``BASE:ADAPTER``, or by an adapter's own name where
one model has it (``Adapters.picked``, by ``models/adapternames``), within the request's scope as
every name is (``Registry.resolve``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..access import scope
from ..base.errors import ApiError
from ..models import adapternames
from ..models.adapternames import qualified
from ..models.config import AdapterSpec, ModelSpec


@dataclass
class ModelAdapters:
    runtime: list[AdapterSpec] = field(default_factory=list)  # loaded at run time, in their order
    defaults: dict[str, float] = field(default_factory=dict)  # default scales an operator set, by adapter name

    def table(self, spec: ModelSpec) -> list[dict[str, Any]]:
        """llama-server's GET /lora-adapters entries (id, path, scale: what every request gets),
        with each adapter's name, the scale a request naming it gets, the model name that picks
        it and where it came from."""
        rows = []
        for path, scale in spec.lora:
            name = Path(path).stem
            rows.append({"name": name, "path": str(path), "scale": self.defaults.get(name, scale),
                         "named_scale": scale, "model": None, "source": "lora"})
        for a in (*spec.loras, *self.runtime):
            rows.append({"name": a.name, "path": str(a.path), "scale": self.defaults.get(a.name, 0.0),
                         "named_scale": a.scale, "model": qualified(spec.name, a.name), "source": a.source})
        return [{"id": i, **row} for i, row in enumerate(rows)]

    def named(self, spec: ModelSpec) -> list[AdapterSpec]:
        """The adapters a model name can pick (``BASE:ADAPTER``): the named and the run-time ones."""
        return [*spec.loras, *self.runtime]

    def for_load(self, spec: ModelSpec) -> ModelSpec:
        """``spec`` as its worker loads it: the run-time adapters after the named ones, and the
        default scales set (``AdapterSpec.default``; ``lora:``'s own scale is its default)."""
        if not self.runtime and not self.defaults:
            return spec
        lora = tuple((path, self.defaults.get(Path(path).stem, scale)) for path, scale in spec.lora)
        loras = tuple(replace(a, default=self.defaults.get(a.name, 0.0)) for a in (*spec.loras, *self.runtime))
        return replace(spec, lora=lora, loras=loras)

    def set_defaults(self, spec: ModelSpec, scales: dict[int, float]) -> None:
        """POST /lora-adapters: each adapter's default scale, those ``scales`` gives by id, the
        rest 0 (llama-server's rule)."""
        self.defaults = {row["name"]: scales.get(row["id"], 0.0) for row in self.table(spec)}


class Adapters:
    """Every model's LoRA adapters, each model's kept on its supervisor, and the names that pick
    them. The registry gives it its supervisors' ``ModelAdapters`` (``held``: the model's now,
    nothing made for it; ``keep``: made and kept) and its names (``resolve``, ``specs``)."""

    def __init__(self, held: Callable[[ModelSpec], ModelAdapters], keep: Callable[[ModelSpec], ModelAdapters],
                 resolve: Callable[..., ModelSpec | None], specs: Callable[[], list[ModelSpec]]):
        self._held, self._keep, self._resolve, self._specs = held, keep, resolve, specs

    def named(self, spec: ModelSpec) -> list[AdapterSpec]:
        """The LoRA adapters a model name can pick on ``spec``: its named ones, then those loaded at run time."""
        return self._held(spec).named(spec)

    def kept(self, spec: ModelSpec) -> ModelAdapters:
        """What is kept of a model's adapters across its loads (its supervisor's, made and kept)."""
        return self._keep(spec)

    def picked(self, name: object) -> tuple[ModelSpec, str] | None:
        """The base model and the adapter a name picks (``BASE:ADAPTER``, or an adapter's own name
        where one model has it); None where the name is a model's own (a ``name:tag`` included).
        A ``BASE:TAG`` naming no adapter of a base that has some is a 404, ``:latest`` excepted: the
        tag fallback would run the base for a mistyped adapter. Within the request's scope, as
        every name is (``Registry.resolve``): a model outside it, its adapters and its name are
        not there, so nothing here tells a key of them."""
        if not isinstance(name, str) or self._resolve(name, tag_fallback=False) is not None:
            return None
        exact = functools.partial(self._resolve, tag_fallback=False)
        picked = adapternames.resolve(name, exact, lambda spec: [a.name for a in self.named(spec)],
                                      scope.visible(self._specs()))
        base, _, tag = name.rpartition(":")
        if picked is None and base and tag.lower() != "latest" and (spec := exact(base)) is not None:
            if names := [a.name for a in self.named(spec)]:
                raise ApiError(f"{spec.name!r} has no LoRA adapter {tag!r} (it has {', '.join(names)})",
                               status=404, param="model", code="model_not_found")
        return picked
