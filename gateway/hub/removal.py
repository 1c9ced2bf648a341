"""Removing a pulled model: only from the stores pulls write (the Hugging Face cache, Ollama's
store), by each store's own rule; a model in a models folder, LM Studio's or models.yaml is the
user's file, never deleted by name.
"""

from __future__ import annotations

from pathlib import Path

from ..models.discovery import Found
from . import huggingface, ollama, transfer
from .names import BadName, OllamaName, parse
from .pulls import Stores


class NotPulled(transfer.PullError):
    STATUS, CODE = 409, "not_a_pulled_model"


def remove(asked: str, found: Found | None, stores: Stores, *, configured: bool = False) -> list[Path]:
    """Delete what ``asked`` names (``found``: the discovered model it resolves to, if any;
    ``configured``: it names a models.yaml entry); the paths removed (blocking)."""
    names: list[str] = [asked, *(found.names if found is not None and found.root.kind == "ollama" else [])]
    for name in names:
        try:
            candidates = parse(name)
        except BadName:
            continue
        for c in candidates:
            if isinstance(c, OllamaName) and stores.ollama is not None \
                    and ollama.manifest_path(stores.ollama, c).is_file():
                return ollama.remove(c, stores.ollama)
    if found is None and configured:
        raise NotPulled(f"{asked!r} is an entry of models.yaml: not a model the gateway pulled (edit the file)")
    if found is None:
        raise transfer.NotFound(f"no pulled model {asked!r}")
    cache = stores.huggingface
    if found.root.kind == "huggingface" and cache is not None and found.path.is_relative_to(cache):
        return huggingface.remove([found.path], cache)
    raise NotPulled(f"{asked!r} is {found.path}, in {found.root.path}: not a model the gateway pulled "
                    "(only the Hugging Face cache and Ollama's store are deleted by name)")
