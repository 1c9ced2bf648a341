"""The upstreams the configuration names, as one table (``Upstreams``): each one's health (kept
across loads and unloads of its model), the probe loop that watches them (``watch``, run by
the app: a down upstream is probed when its back-off ends, the others every
``server.upstream_check_seconds``), and the models the ``upstream_discover`` ones list, each a
spec named by the entry's prefix and the listed id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import aiohttp

from ..models.config import ModelSpec, normalize_name
from . import upstream_wire as wire
from .untrusted import shown
from .upstream import FAILING_STATUS, RemoteBackend, client_session, compressed, read_body, reason
from .upstream_health import Health, UpstreamHealth

log = logging.getLogger(__name__)


class Upstreams:
    """Every upstream's health (kept across loads and unloads of its model), the probe loop
    that watches them, and the models the ``upstream_discover`` ones list."""

    def __init__(self, backoff: tuple[float, float] = (2.0, 60.0), check_seconds: float = 30.0):
        self.backoff = backoff
        self.check_seconds = check_seconds  # how often an upstream that is not down is probed; 0: never
        self._health: dict[str, UpstreamHealth] = {}
        # a discovered model's normalized name -> its spec and its upstream's health, made anew
        # when a list comes in or a reload changes the upstreams (``_relist``), not per lookup
        self._found: dict[str, tuple[ModelSpec, UpstreamHealth]] = {}
        self._probing: dict[str, asyncio.Task[None]] = {}

    def health(self, spec: ModelSpec) -> UpstreamHealth:
        """The health of the upstream ``spec`` runs on (a discovered model shares its entry's)."""
        assert spec.upstream is not None
        if (found := self._found.get(normalize_name(spec.name))) is not None and spec.name not in self._health:
            return found[1]
        h = self._health.get(spec.name)
        if h is None or h.upstream != spec.upstream:
            h = self._health[spec.name] = UpstreamHealth(spec.name, spec.upstream, self.backoff, spec=spec)
        return h

    def known(self) -> list[UpstreamHealth]:
        return list(self._health.values())

    def backend(self, spec: ModelSpec) -> RemoteBackend:
        return RemoteBackend(spec, self.health(spec))

    def sync(self, specs: list[ModelSpec]) -> None:
        """Watch exactly the upstreams of ``specs`` (at start and after a reload)."""
        wanted = {m.name: m for s in specs for m in s.members if m.upstream is not None}
        for name in [n for n in self._health if n not in wanted]:
            del self._health[name]
        for member in wanted.values():
            self.health(member)
        self._relist()

    def listed(self, h: UpstreamHealth, models: list[str]) -> None:
        """The model ids upstream ``h`` lists now (its /models); the table is made anew only
        when they changed (a probe comes every few seconds, the list seldom changes)."""
        if models != h.models:
            h.models = models
            self._relist()

    def _relist(self) -> None:
        """A spec per model a ``upstream_discover`` upstream listed, named prefix + its id, with the
        entry's settings (reasoning, defaults, keep_alive...); the first upstream to list a name has it."""
        found: dict[str, tuple[ModelSpec, UpstreamHealth]] = {}
        for h in self._health.values():
            if h.upstream.discover and h.models:
                parent = h.spec or ModelSpec(name=h.name, upstream=h.upstream)
                for mid in h.models:
                    spec = replace(parent, name=h.upstream.prefix + mid, aliases=(), source="upstream",
                                   upstream=replace(h.upstream, model=mid, discover=False))
                    found.setdefault(normalize_name(spec.name), (spec, h))
        self._found = found

    def discovered(self) -> list[ModelSpec]:
        return [spec for spec, _ in self._found.values()]

    def resolve(self, key: str) -> ModelSpec | None:
        """The discovered model named ``key`` (normalized), if any."""
        found = self._found.get(key)
        return found[0] if found is not None else None

    async def probe(self, h: UpstreamHealth) -> None:
        """GET the upstream's /models: up (and the model ids ``wire.listing`` takes) or down. A
        list that cannot be taken (too large, not JSON, behind a redirect) leaves it up, listing
        nothing."""
        h.checked_at = time.monotonic()
        up = h.upstream
        timeout = aiohttp.ClientTimeout(total=up.connect_timeout + min(up.first_byte_timeout, 30.0),
                                        connect=up.connect_timeout)
        body, problem = None, None
        try:
            async with client_session(up, timeout) as session, \
                    session.get(up.url + "/models", allow_redirects=False) as resp:
                if resp.status in FAILING_STATUS:
                    raise OSError(f"HTTP {resp.status}")
                if 300 <= resp.status < 400:
                    problem = f"it is behind a redirect (HTTP {resp.status}), which is not followed"
                elif resp.status == 200 and (encoding := compressed(resp)) is not None:
                    problem = f"it came compressed ({shown(encoding, 40)}) although it was asked not to"
                elif resp.status == 200:
                    body = await read_body(resp, wire.MAX_LIST_BYTES, "a model list")
            found = wire.listing(body) if body is not None else None
        except wire.MalformedStream as e:
            found, problem = None, e.message
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            h.failed(reason(e))
            return
        h.succeeded()
        if found is not None:
            if (found.refused or found.left_out) and found.ids != h.models:
                log.warning("upstream %r lists %d model ids that cannot be names (the first: %s) and %d past the %d "
                            "taken", h.name, found.refused, found.why, found.left_out, wire.MAX_LISTED)
            self.listed(h, found.ids)
        elif problem is not None:
            if h.models != []:
                log.warning("upstream %r: its model list is not taken: %s", h.name, problem)
            self.listed(h, [])

    def _due(self, h: UpstreamHealth, now: float) -> bool:
        if h.state is Health.DOWN:
            return now >= h.retry_at
        if h.upstream.discover and h.models is None and h.checked_at < 0:  # its list, once, whatever the interval
            return True
        return bool(self.check_seconds) and now - h.checked_at >= self.check_seconds

    async def refresh(self, discover_only: bool = False) -> None:
        """Probe every upstream that is due now (or, ``discover_only``, every discovering one)."""
        now = time.monotonic()
        due = [h for h in self._health.values()
               if (h.upstream.discover if discover_only else self._due(h, now)) and h.name not in self._probing]
        for h in due:
            self._probing[h.name] = asyncio.ensure_future(self.probe(h))
        tasks = [self._probing[h.name] for h in due]
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for h in due:
                self._probing.pop(h.name, None)

    async def watch(self) -> None:
        """Probe upstreams as they fall due, until cancelled."""
        while True:
            await self.refresh()
            await asyncio.sleep(1.0)

