"""What the dashboard draws, from the gateway's own requests (no Prometheus needed): per-model
counts in short intervals over the last minutes, and the last inference events.

``Live.record`` takes each inference event as ``events.Observation.event`` makes it, with who
owns it (the observe middleware calls it once per request); ``series`` and ``recent`` are what
the page's live stream sends. Plain data in, plain data out: tests call it with events and a clock.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

# Requests about the gateway itself, not a model's work: not drawn, not listed.
NOT_INFERENCE = frozenset({"/models", "/models/load", "/models/unload", "/captures", "/captures/{id}",
                           "/captures/{id}/replay", "/lora-adapters", "/v1/load_lora_adapter",
                           "/v1/unload_lora_adapter"})


class Live:
    def __init__(self, interval: float = 5.0, points: int = 120, recent: int = 50):
        self.interval = interval  # seconds one point covers
        self.points: deque[tuple[float, dict[str, dict[str, float]]]] = deque(maxlen=points)  # oldest first
        # newest last, each with its owner (``events.OWNER``: a digest of the key that asked)
        self.events: deque[tuple[str | None, dict[str, Any]]] = deque(maxlen=recent)

    def record(self, event: dict[str, Any], owner: str | None = None) -> None:
        """One inference event (``time`` in epoch seconds), asked for by ``owner`` (None: no key)."""
        if event.get("endpoint") in NOT_INFERENCE:
            return
        self.events.append((owner, event))
        start = math.floor(event["time"] / self.interval) * self.interval
        if not self.points or self.points[-1][0] < start:
            self.points.append((start, {}))
        # an event that ends after a later one began (a long answer) counts in the newest point
        models = self.points[-1][1]
        row = models.setdefault(event["model"], {"requests": 0, "errors": 0, "tokens": 0, "ttft_sum": 0.0,
                                                 "ttft_count": 0})
        row["requests"] += 1
        if event["status"] >= 400 or event.get("finish_reason") == "error":
            row["errors"] += 1
        row["tokens"] += event.get("completion_tokens") or 0
        if event.get("time_to_first_token_s") is not None:
            row["ttft_sum"] += event["time_to_first_token_s"]
            row["ttft_count"] += 1

    def series(self, now: float) -> dict[str, Any]:
        """The points still inside the window that ends at ``now``, oldest first."""
        since = now - self.interval * (self.points.maxlen or 0)
        return {"interval_s": self.interval,
                "points": [{"t": t, "models": models} for t, models in self.points if t >= since]}

    def recent(self, *, owner: str | None = None, everyone: bool = False) -> list[dict[str, Any]]:
        """The last inference events, newest first: those ``owner`` asked for, or with
        ``everyone`` all of them (a gateway without keys). The owner itself is not in them."""
        return [event for who, event in reversed(self.events) if everyone or (owner is not None and who == owner)]
