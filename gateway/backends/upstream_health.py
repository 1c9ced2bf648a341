"""Each upstream's health: a small state machine (``Health``; ``UpstreamHealth.move`` is the one
place it changes). Unknown until the upstream is first reached, up after an answer or a probe,
down after a connection failure, a timeout or a 502/503/504. Down, it is not tried again until
its back-off has passed (the first wait, doubling up to the cap): requests get 503
``upstream_unavailable`` with ``Retry-After`` at once, and the probe loop
(``upstream_table.Upstreams.watch``) tries it when the back-off ends, so it comes back without
a request paying for it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .. import protocol
from ..models import placement
from ..models.config import ModelSpec, Upstream
from .untrusted import shown

log = logging.getLogger(__name__)


class Health(Enum):
    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"


@dataclass
class UpstreamHealth:
    """One upstream's health and back-off. ``name``: the models.yaml entry (or replica) it
    serves, the label it is shown and counted by (never its URL or key)."""

    name: str
    upstream: Upstream
    backoff: tuple[float, float] = (2.0, 60.0)  # the first wait after a failure, and the cap
    state: Health = Health.UNKNOWN
    failures: int = 0  # in a row
    retry_at: float = 0.0  # time.monotonic() before which a down upstream is not tried
    error: str | None = None
    checked_at: float = -1e18  # last probe
    models: list[str] | None = None  # the ids its /models listed at the last probe
    spec: ModelSpec | None = None  # the entry it serves: what its discovered models inherit

    def move(self, new: Health) -> None:
        """The one place the state changes (every move is allowed: health is what was last seen)."""
        if new is not self.state:
            log.log(logging.WARNING if new is Health.DOWN else logging.INFO, "upstream %r is %s%s", self.name,
                    new.value, f": {self.error}" if new is Health.DOWN else "")
        self.state = new

    def succeeded(self) -> None:
        self.failures, self.error = 0, None
        self.move(Health.UP)

    def failed(self, why: str) -> None:
        self.failures += 1
        self.retry_at = time.monotonic() + placement.backoff(self.failures, *self.backoff)
        self.error = shown(why, 300)  # it may quote the upstream: logged and shown as it is
        self.move(Health.DOWN)

    @property
    def wait(self) -> float:
        """Seconds until a down upstream may be tried again (0: now)."""
        return max(0.0, self.retry_at - time.monotonic()) if self.state is Health.DOWN else 0.0

    def unavailable(self, why: str | None = None) -> protocol.Error:
        return protocol.Error(0, 503, f"the upstream server for {self.name!r} is unavailable: "
                                      f"{why or self.error or 'not reachable'}", "model", "upstream_unavailable",
                              max(self.wait, 1.0))

    def describe(self) -> dict[str, Any]:
        return {"state": self.state.value, "error": self.error,
                "retry_after": round(self.wait, 1) if self.wait else None}
