"""llama-server's ``GET /props``: a model's context size, slots, chat template, modalities and
default generation settings, so llama.cpp-aware clients (llama.vscode, llama.vim, its web UI)
configure themselves. The shape is ``get_res_props`` in llama.cpp's
tools/server/server-context.cpp; without ``?model=`` and several models, its router's answer
(``get_router_props`` in server-models.cpp)."""

from __future__ import annotations

from typing import Any

from ..engine.ipc import GenerationRequest
from ..models.config import ModelSpec
from .fim import generation_settings
from .media import MARKER
from .params import Parsed, apply_defaults


def defaults(spec: ModelSpec) -> GenerationRequest:
    """A request with nothing set but the model's models.yaml defaults."""
    parsed = Parsed(spec.name, GenerationRequest())
    apply_defaults(parsed, spec.defaults)
    return parsed.request


def model(spec: ModelSpec, info: dict[str, Any], ftype: str | None) -> dict[str, Any]:
    """One model's props, from what its backend reported at load (``info``): its modalities are
    what its projector encodes (``mmproj``), and prompts mark media as llama-server's do."""
    media = bool(info.get("vision") or info.get("audio"))
    return {
        "default_generation_settings": {"params": generation_settings(defaults(spec)),
                                        "n_ctx": info.get("n_ctx", 0)},
        "total_slots": info.get("parallel", 1),
        "model_alias": spec.name,
        "model_ftype": ftype or "",
        "model_path": str(spec.path) if spec.path is not None else spec.name,
        "modalities": {"vision": bool(info.get("vision")), "video": False, "audio": bool(info.get("audio"))},
        "media_marker": MARKER if media else "",
        "endpoint_slots": False,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "chat_template": info.get("chat_template") or "",
        "chat_template_caps": {},
        "bos_token": info.get("bos_token", ""),
        "eos_token": info.get("eos_token", ""),
        "build_info": info.get("build_info", ""),
        "is_sleeping": False,
        "infill": bool(info.get("fim")),  # this gateway's own: /infill works with this model
    }


def router(n_models: int) -> dict[str, Any]:
    """llama-server's router answer to /props without ``?model=`` (its "dummy response to make
    sure the UI doesn't break"): name a model for its own props."""
    return {"role": "router", "max_instances": n_models, "models_autoload": True, "model_alias": "llama-server",
            "model_path": "none", "default_generation_settings": {"params": {}, "n_ctx": 0}}
