"""llama-server's ``GET /props``: a model's context size, slots, chat template, modalities and
default generation settings, so llama.cpp-aware clients (llama.vscode, llama.vim, its web UI)
configure themselves. The shape is ``get_res_props`` in llama.cpp's
tools/server/server-context.cpp; without ``?model=`` and several models, its router's answer
(``get_router_props`` in server-models.cpp).

A GET loads nothing (a page on any site can make a browser send one: ``app.cross_site`` lets
reads through): a loaded model's props are what its backend reported at load (``model``); a
model that is not loaded answers what its spec and GGUF header say it will be (``expected``),
with ``is_sleeping`` true, as llama-server answers /props while it sleeps with its model
unloaded. llama-server's router loads a model for ``/props?model=`` unless ``autoload=false``
(which llama.cpp's web UI sends); here no GET ever does."""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

from ..models.config import ModelSpec
from ..models.ggufmeta import GGUFInfo
from ..protocol import GenerationRequest
from ..protocol.settings import DEFAULT_N_CTX
from .fim import generation_settings
from .media import MARKER
from .params import Parsed, apply_defaults


def defaults(spec: ModelSpec) -> GenerationRequest:
    """A request with nothing set but the model's models.yaml defaults."""
    parsed = Parsed(spec.name, GenerationRequest())
    apply_defaults(parsed, spec.defaults)
    return parsed.request


def model(spec: ModelSpec, info: dict[str, Any], ftype: str | None, loaded: bool = True) -> dict[str, Any]:
    """One model's props, from what its backend reported at load (``info``), or for one not
    loaded (``loaded`` false) what ``expected`` makes of its spec and header: its modalities
    are what its projector encodes (``mmproj``), and prompts mark media as llama-server's do."""
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
        "is_sleeping": not loaded,  # llama-server's word for a model unloaded until its next request
        "infill": bool(info.get("fim")),  # this gateway's own: /infill works with this model
    }


def expected(spec: ModelSpec, header: GGUFInfo | None, media: list[str]) -> dict[str, Any]:
    """What a model that is not loaded will report once it loads (in ``info``'s keys), as far as
    its spec and GGUF header (``header``; None for an upstream's) say, and ``media``, what its
    projector encodes: its context as the worker sets it (``n_ctx``, else the trained one up to
    ``DEFAULT_N_CTX``), its slots, its chat template, whether it fills in the middle (as far as
    the header names FIM tokens by their ids: llama.cpp also finds them by their texts once
    loaded), the llama.cpp its worker will run. Its special tokens' texts are not known before
    it loads (""); nor is anything of an upstream's but its name. Pure but for the installed
    package's version."""
    trained = header.context_length if header is not None else None
    n_ctx = (spec.n_ctx or min(trained or DEFAULT_N_CTX, DEFAULT_N_CTX)) if spec.local else 0
    return {"n_ctx": n_ctx, "parallel": 1 if spec.embeddings or spec.reranker else spec.parallel,
            "chat_template": spec.chat_template or (header.chat_template if header is not None else None) or "",
            "vision": "image" in media, "audio": "audio" in media,
            "fim": bool(header is not None and header.fim), "build_info": _build_info() if spec.local else ""}


@functools.cache
def _build_info() -> str:
    """What a local worker reports as its build (``worker/model.info``), read from the installed
    package's metadata: this process does not import llama.cpp."""
    try:
        return f"llama-cpp-python {metadata.version('llama-cpp-python')}"
    except metadata.PackageNotFoundError:
        return ""


def router(n_models: int) -> dict[str, Any]:
    """llama-server's router answer to /props without ``?model=`` (its "dummy response to make
    sure the UI doesn't break"): name a model for its own props."""
    return {"role": "router", "max_instances": n_models, "models_autoload": True, "model_alias": "llama-server",
            "model_path": "none", "default_generation_settings": {"params": {}, "n_ctx": 0}}
