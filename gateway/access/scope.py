"""Which models a request's key may use: the key's ``models`` globs, set for the request's task
by the access middleware (``SCOPE``, a context variable, so every lookup of a name made for the
request sees it however deep: ``Registry.lookup`` checks it, and a name outside it is the same
404 as a name nothing has, so a key cannot probe what exists). Listings filter by ``visible``."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from contextvars import ContextVar
from typing import TypeVar

from ..models.config import ModelSpec, normalize_name

# the request's key's globs; None: no key, or a key without a models list (every model)
SCOPE: ContextVar[tuple[str, ...] | None] = ContextVar("gguf_gateway_scope", default=None)

S = TypeVar("S", bound=ModelSpec)


def permits(globs: tuple[str, ...] | None, names: Iterable[str]) -> bool:
    """Whether a glob matches any of ``names`` (the name asked for, a model's name and aliases),
    case-insensitively, as the gateway's names are. Pure."""
    if globs is None:
        return True
    wanted = [normalize_name(n) for n in names]
    return any(fnmatch.fnmatchcase(n, normalize_name(g)) for g in globs for n in wanted)


def allowed(name: str, spec: ModelSpec | None = None) -> bool:
    """Whether this request may use the model ``name`` asks for (``spec``, once resolved)."""
    globs = SCOPE.get()
    return globs is None or permits(globs, [name, *(spec.names if spec is not None else ())])


def visible(specs: Iterable[S]) -> list[S]:
    """The models this request's key may use, of ``specs``."""
    globs = SCOPE.get()
    return list(specs) if globs is None else [s for s in specs if permits(globs, s.names)]
