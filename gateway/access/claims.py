"""A request's claim on a busy model (``Claim``): whose share it is, what that share weighs, its
priority, and whether it may have a model loaded. The access middleware sets it for the
request's task (``CLAIM``, a context variable, as ``scope.SCOPE``), from the key; a request's
own ``priority`` field (or OpenAI's ``service_tier``) may lower it (``asking``), never raise it.

Shares: a key's requests are one share, by the key's name (two keys given one name share, as
their limits do); without keys each client address is its own share. A claim holds the key's
name, not its terms alone: where a reload changes a key's weight or priority, the requests
already waiting are ordered by the new terms (``Terms`` read again through the registry)."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any

from ..base.errors import InvalidRequest
from ..models.config import KeySpec
from ..models.config.specs import PRIORITIES


class Priority(IntEnum):
    """First to last: a smaller value goes first."""

    INTERACTIVE = 0
    NORMAL = 1
    BATCH = 2

    @property
    def label(self) -> str:
        return PRIORITIES[self.value]

    @classmethod
    def of(cls, name: str) -> Priority:
        return cls(PRIORITIES.index(name))


# OpenAI's service_tier, where it says something a local gateway can honour: flex is its cheaper,
# slower tier (batch work), priority its faster one; auto, default and scale say nothing here
SERVICE_TIERS = {"flex": Priority.BATCH, "priority": Priority.INTERACTIVE}


@dataclass(frozen=True)
class Terms:
    """What a key's entry says of its requests' place: ``KeySpec.weight``, ``priority``, ``may_load``."""

    weight: float = 1.0
    priority: Priority = Priority.NORMAL
    may_load: bool = True

    @classmethod
    def of(cls, key: KeySpec) -> Terms:
        return cls(key.weight, Priority.of(key.priority), key.may_load)


OPEN = Terms()  # a gateway without keys: everyone's share weighs the same, and anyone may load


@dataclass(frozen=True)
class Claim:
    """One request's claim. ``share``: whose (a key's name, or ``addr:`` and the client's
    address); ``key``: the key's name where it has one (its terms are looked up by it);
    ``terms``: the key's as the request was admitted; ``asked``: the request's own priority."""

    share: str
    key: str | None = None
    terms: Terms = OPEN
    asked: Priority | None = None
    named: bool = True  # the key was named by the operator (metrics label others as ``other``)

    def priority(self, terms: Terms | None = None) -> Priority:
        """The priority it waits at under ``terms`` (its own where None): the key's, or the lower
        one it asked; without a key, what it asked (everyone is an admin there), else normal."""
        terms = terms or self.terms
        if self.key is None:
            return self.asked if self.asked is not None else Priority.NORMAL
        return max(terms.priority, self.asked) if self.asked is not None else terms.priority

    def asking(self, asked: Priority) -> Claim:
        return replace(self, asked=asked if self.asked is None else max(self.asked, asked))

    @property
    def label(self) -> str:
        """Its share as a metric label: a key's name, or ``anonymous`` (addresses are unbounded)."""
        return self.key if self.key is not None else "anonymous"


NOBODY = Claim("anonymous")  # a request the access middleware did not see (a preload, a test's own call)
CLAIM: ContextVar[Claim] = ContextVar("gguf_gateway_claim", default=NOBODY)  # noqa: B039 (frozen: immutable)


def claim_of(key: KeySpec | None, address: str | None) -> Claim:
    if key is not None:
        return Claim(key.name, key.name, Terms.of(key), named=key.named)
    return Claim(f"addr:{address or '-'}")


def asked(body: Mapping[str, Any]) -> Priority | None:
    """The priority a request's body asks for: ``priority`` (one of ``PRIORITIES``; 400 naming
    it otherwise), else OpenAI's ``service_tier`` where it maps (``SERVICE_TIERS``), else None."""
    value = body.get("priority")
    if value is not None:
        if not isinstance(value, str) or value not in PRIORITIES:
            raise InvalidRequest(f"priority must be one of {', '.join(PRIORITIES)}", param="priority")
        return Priority.of(value)
    tier = body.get("service_tier")
    return SERVICE_TIERS.get(tier) if isinstance(tier, str) else None


def ask(body: Any) -> None:
    """Lower this request's claim to what its body asks (``asked``), for the rest of its task."""
    if isinstance(body, Mapping) and (p := asked(body)) is not None:
        CLAIM.set(CLAIM.get().asking(p))
