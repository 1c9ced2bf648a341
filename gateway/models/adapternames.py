"""Which model and LoRA adapter a request's model name means (pure).

A request names an adapter as ``BASE:ADAPTER`` (``qualified``): the model BASE, run with the
adapter its spec has by that name (``ModelSpec.loras``, and those a caller adds at run time,
which is why ``adapters_of`` is given, not read here). Ollama's names have ``:`` tags of their
own (``llama3.2:3b``), so the name is split at its last ``:`` (``llama3.2:3b:pirate`` is
``llama3.2:3b`` with ``pirate``; an adapter's name never holds a ``:``, ``specs.adapter_name_problem``),
and only where the whole name is no model's: the caller asks ``resolve`` after its own lookup
failed, so a model named ``x:y`` is never taken for ``x`` with an adapter ``y``. A bare adapter
name answers too, where exactly one model has an adapter by that name; where several have,
the name is ambiguous and means nothing (the caller says so: a guess would run a model the
caller did not choose).

Names are compared as model names are (``normalize_name``: trimmed, without case), and the
adapter's name comes back as its spec spells it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from .config import MAX_ADAPTER_NAME, ModelSpec, adapter_name_problem, normalize_name

_NOT_IN_A_NAME = re.compile(r"[^\w.+-]+")


def qualified(base_name: str, adapter: str) -> str:
    """The name a request gives for ``adapter`` on the model ``base_name``: ``BASE:ADAPTER``."""
    return f"{base_name}:{adapter}"


def _among(names: Sequence[str], wanted: str) -> str | None:
    """The name in ``names`` that ``wanted`` (normalized) is, as ``names`` spells it."""
    return next((n for n in names if normalize_name(n) == wanted), None)


def resolve(name: str, lookup: Callable[[str], ModelSpec | None], adapters_of: Callable[[ModelSpec], Sequence[str]],
            specs: Iterable[ModelSpec]) -> tuple[ModelSpec, str] | None:
    """The model and the adapter ``name`` means, or None. Asked only where ``name`` itself is no
    model's (the caller's lookup failed). ``BASE:ADAPTER``: split at the last ``:``, the model
    ``lookup(BASE)`` finds, if ``adapters_of`` it holds ADAPTER; nothing else (an adapter's name
    has no ``:``). A bare name: the one model among ``specs`` whose ``adapters_of`` holds it; none
    where no model or several have it. Pure: what it knows comes through its arguments."""
    key = normalize_name(name) if isinstance(name, str) else ""
    if not key:
        return None
    if ":" in key:
        base, _, wanted = key.rpartition(":")
        spec = lookup(base) if base and wanted else None
        adapter = _among(adapters_of(spec), wanted) if spec is not None else None
        return (spec, adapter) if spec is not None and adapter is not None else None
    if adapter_name_problem(key) is not None:  # no adapter is called that: no model need be asked
        return None
    holders: list[tuple[ModelSpec, str]] = []
    for spec in specs:
        adapter = _among(adapters_of(spec), key)
        if adapter is not None and all(spec is not held for held, _ in holders):
            holders.append((spec, adapter))
            if len(holders) > 1:  # ambiguous: no guess
                return None
    return holders[0] if holders else None


def from_stem(stem: str) -> str | None:
    """An adapter's name from its file's stem, as discovery names one (``stem_name``: lowercase):
    each run of characters a name cannot hold becomes ``-``, cut to ``MAX_ADAPTER_NAME``; None
    where nothing is left."""
    name = _NOT_IN_A_NAME.sub("-", stem.strip().lower())[:MAX_ADAPTER_NAME].strip("-.")
    return name if adapter_name_problem(name) is None else None
