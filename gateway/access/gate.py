"""The gateway's door: the keys in force (``KeyTable``, swapped whole by a reload), each key's
limits (``limits.Limiter``) and the usage store (``usage.UsageStore``), for the access
middleware to ask. Everything here runs on the event loop and none of it waits, except the
store's start and close.

Limits and usage go by a key's name (what the operator sees and revokes by): two keys given
one name share them. A gateway without keys records its requests as ``anonymous``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..models.config import KeySpec, ServerConfig, default_state_dir
from .claims import Terms
from .keys import KeyTable
from .limits import Limiter, Limits, Period, Refusal, Ticket, period_start
from .usage import Spend, UsageStore

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"  # the name a gateway without keys records its requests under
USAGE_FILE = "usage.db"


def usage_path(server: ServerConfig) -> Path:
    """``server.usage_db``, else usage.db in the state folder."""
    return server.usage_db or (server.state_dir or default_state_dir()) / USAGE_FILE


def limits_of(key: KeySpec) -> Limits:
    return Limits(rpm=key.rpm, tpm=key.tpm, max_parallel=key.max_parallel, budget=key.budget,
                  budget_period=Period(key.budget_period))


@dataclass
class Pass:
    """One admitted request that spends tokens: whose, its ticket, and how it is counted."""
    name: str
    named: bool
    ticket: Ticket | None


def _limits_by_name(specs: tuple[KeySpec, ...]) -> dict[str, Limits]:
    """The limits of each key that has any, by its name."""
    return {k.name: lim for k in specs if (lim := limits_of(k)).any}


def _terms_by_name(specs: tuple[KeySpec, ...]) -> dict[str, Terms]:
    """Each key's terms (weight, priority, may_load), by its name: the first key of a name's."""
    out: dict[str, Terms] = {}
    for k in specs:
        out.setdefault(k.name, Terms.of(k))
    return out


class Gate:
    def __init__(self, server: ServerConfig):
        self.keys = KeyTable(server.api_keys)
        self._limits = _limits_by_name(self.keys.specs)
        self._terms = _terms_by_name(self.keys.specs)
        self.limiter = Limiter()
        self.usage = UsageStore(usage_path(server), server.usage_days)
        # told each request's spending (the metrics): key label, wire, prompt and completion tokens
        self.on_spend: Callable[[str, bool, str, int, int], None] | None = None
        self.on_limited: Callable[[str, bool, str], None] | None = None  # a key's limit refused a request

    async def start(self) -> None:
        """Start the usage store, and charge each budget with what its period has spent so far."""
        self.usage.start()
        await self.usage.last_used()  # the store has opened its file (or said why not) before the first request
        await self._restore()

    async def _restore(self) -> None:
        now = time.time()
        budgets = {name: lim for name, lim in self._limits.items() if lim.budget is not None}
        if not budgets:
            return
        since = {name: period_start(lim.budget_period, now) for name, lim in budgets.items()}
        spent = await self.usage.spent_since(since)
        for name, lim in budgets.items():
            self.limiter.restore(name, spent.get(name, 0), lim.budget_period, since[name])

    async def close(self) -> None:
        await self.usage.close()

    def set_keys(self, specs: tuple[KeySpec, ...]) -> None:
        """The keys a reload read: in force for the next request; a request in flight keeps the
        key it was admitted with, and a revoked key's state goes once its requests are done."""
        old = self.keys.names()
        self.keys = KeyTable(specs)
        self._limits = _limits_by_name(specs)
        self._terms = _terms_by_name(specs)
        self.limiter.forget(self.keys.names())
        added, gone = self.keys.names() - old, old - self.keys.names()
        log.info("API keys reloaded: %d key(s)%s%s", len(specs), f", added {', '.join(sorted(added))}" if added else "",
                 f", revoked {', '.join(sorted(gone))}" if gone else "")

    def terms(self, name: str) -> Terms | None:
        """A key's terms as the keys in force have them, by its name; None for a key gone."""
        return self._terms.get(name)

    def admit(self, key: KeySpec | None) -> Pass | Refusal:
        """Let a request that spends tokens in, or say which of its key's limits it reached."""
        if key is None:
            return Pass(ANONYMOUS, False, None)
        lim = self._limits.get(key.name)
        if lim is None:
            return Pass(key.name, key.named, None)
        got = self.limiter.admit(key.name, lim, time.time())
        return got if isinstance(got, Refusal) else Pass(key.name, key.named, got)

    def done(self, passed: Pass, model: str, wire: str, prompt_tokens: int, completion_tokens: int) -> None:
        """A request that was let in ended: its tokens charged to its key's limits, recorded, told."""
        now = time.time()
        if passed.ticket is not None:
            self.limiter.release(passed.ticket, prompt_tokens + completion_tokens, now)
        if model == "-" and not prompt_tokens + completion_tokens:
            return  # refused before it named a model (a 400, a 404): counted by the rate limits only
        self.usage.record(Spend(passed.name, model, wire, prompt_tokens, completion_tokens, now))
        if self.on_spend is not None and passed.name != ANONYMOUS:  # series per key: none without keys
            self.on_spend(passed.name, passed.named, wire, prompt_tokens, completion_tokens)

    def state(self, name: str) -> dict | None:
        """A key's limits as they stand (for /usage), or None for a key without any."""
        lim = self._limits.get(name)
        return self.limiter.state(name, lim, time.time()) if lim is not None else None
