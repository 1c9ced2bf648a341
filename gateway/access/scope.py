"""Which models a request's key may use: the key's ``models`` globs, set for the request's task
by the access middleware (``SCOPE``, a context variable, so every lookup of a name made for the
request sees it however deep).

Scope is decided on the model, never on the name asked: a glob is matched against a model's own
names (its name and its aliases as models.yaml or discovery wrote them: ``permitted``), so a name
that reaches a model by a tag fallback (``secret:x-coder`` -> ``secret``), a glob alias, an
adapter's name or an upstream's listing is in scope only where that model is. The one place a
request's name becomes a model, ``Registry.resolve``, passes over every model outside the scope
at each of its steps, as if it were not there: a name outside the scope is the same 404, byte for
byte, as a name nothing has, so a key cannot probe what exists. Listings filter by ``visible``,
by the same rule. ``may_pull`` is the one check made on a name itself: whether a name no model
has may be pulled on demand for this request (what it then resolves to is checked again)."""

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
    """Whether a glob matches any of ``names``, case-insensitively, as the gateway's names are. Pure."""
    if globs is None:
        return True
    wanted = [normalize_name(n) for n in names]
    return any(fnmatch.fnmatchcase(n, normalize_name(g)) for g in globs for n in wanted)


def permitted(globs: tuple[str, ...] | None, spec: ModelSpec) -> bool:
    """Whether ``globs`` let a key use the model ``spec``: by the model's own names alone. Pure."""
    return permits(globs, spec.names)


def allowed(spec: ModelSpec) -> bool:
    """Whether this request may use the model ``spec`` (a name's model, once resolved)."""
    return permitted(SCOPE.get(), spec)


def may_pull(name: str) -> bool:
    """Whether this request may have ``name``, which no model has yet, pulled on demand: by the
    name itself, the only thing known of a model not there (once pulled, ``allowed`` decides)."""
    return permits(SCOPE.get(), [name])


def visible(specs: Iterable[S]) -> list[S]:
    """The models this request's key may use, of ``specs``."""
    globs = SCOPE.get()
    return [s for s in specs if permitted(globs, s)]
