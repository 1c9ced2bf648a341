"""A model's LoRA adapters as the gateway keeps them across its loads (``ModelAdapters``).

A model's adapters are, in this order (an adapter's id is its place, as llama-server's
``/lora-adapters`` numbers them, and as the worker's ``worker.adapters`` table is built):
``lora:``'s (applied to every request at their scales), ``loras:``' named ones (models.yaml's
and discovery's, applied where a request names one), then those loaded at run time (vLLM's
``load_lora_adapter``). The run-time ones and the default scales an operator set (POST
``/lora-adapters``) are kept here, on the model's supervisor, so a model unloaded when idle
loads with them again; they last until the gateway restarts or the model's entry changes. What
the worker is given at a load is ``for_load``'s spec; a change while it runs is also sent to it
(``api/lora.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

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
