"""The registry's side of its models' queues: what a model's slots ask of the gateway
(``KeyQueues``: the keys' terms in force, ``server.priority_max_wait``, the metrics), who may
have a model loaded (``may_not_load``), and the queues as the page and ``/admin/queues`` show
them (``rows``; to a user key, its own and the rest folded: ``folded``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..access import scope
from ..access.claims import CLAIM, Claim, Terms
from ..base.errors import ApiError
from ..models.config import ModelSpec, ServerConfig
from ..models.lifecycle import ModelState
from ..server.metrics import Metrics
from .slots import Slot, in_force
from .supervisor import ModelSupervisor, Refuse

LIVE = (ModelState.LOADING, ModelState.READY)


class KeyQueues:
    """``slots.Keys`` for every model of a registry: ``terms`` asks ``key_terms`` (the app's gate
    sets it; without keys, none), the policy reads the running configuration, the metrics are told
    where an app serves the registry."""

    def __init__(self, server: Callable[[], ServerConfig], metrics: Callable[[], Metrics | None]):
        self._server, self._metrics = server, metrics
        self.key_terms: Callable[[str], Terms | None] = lambda name: None

    def terms(self, key: str) -> Terms | None:
        return self.key_terms(key)

    def may_load(self, claim: Claim) -> bool:
        """Whether the request may have a model loaded (its key's ``may_load``, as in force now)."""
        return in_force(self, claim).may_load

    def max_wait(self) -> float:
        return self._server().priority_max_wait

    def waited(self, model: str, slot: Slot) -> None:
        if (metrics := self._metrics()) is not None:
            key = metrics.key_label(slot.label, slot.named)
            metrics.queue_wait.labels(model, key, slot.priority.label).observe(slot.waited)

    def served(self, model: str, slot: Slot, seconds: float) -> None:
        if (metrics := self._metrics()) is not None:
            metrics.slot_seconds.labels(model, metrics.key_label(slot.label, slot.named)).inc(seconds)


def may_not_load(spec: ModelSpec, claim: Claim, keys: KeyQueues, loaded: Iterable[ModelSupervisor]) -> ApiError | None:
    """The 503 for a request whose key may not have a model loaded (``may_load: false``, as the keys
    in force say) where its model is not loaded or loading, nor pinned; None where it may go on.
    Another server's model loads nothing here. The message names the loaded models the key may use."""
    if keys.may_load(claim) or spec.pin or not any(m.local for m in spec.members):
        return None
    live = [m for m in loaded if m.state in LIVE]
    if any(m.spec == spec for m in live):
        return None
    names = sorted(m.spec.name for m in live if scope.allowed(m.spec))
    now = f"; loaded now: {', '.join(names)}" if names else ""
    return ApiError(f"model {spec.name!r} is not loaded, and key {claim.key!r} may not have a model loaded "
                    f"(may_load: false); retry once it is loaded, or use a loaded model{now}", status=503,
                    param="model", code="model_not_loaded", headers={"Retry-After": "30"})


def refuser(spec: ModelSpec, keys: KeyQueues, loaded: Callable[[], Iterable[ModelSupervisor]]) -> Refuse:
    """``may_not_load`` for the request of this task (its claim read now), asked by the supervisor
    where this request would begin the model's load: not only before it queues, since a model
    loaded then may be unloaded while it waits (a swap drains it: its door), and a request at its
    door, or behind its busy slots, would load it again."""
    claim = CLAIM.get()
    return lambda: may_not_load(spec, claim, keys, loaded())


def rows(models: Iterable[ModelSupervisor]) -> list[dict[str, Any]]:
    """Each model with requests running or waiting: its slots, and who waits, by key (a share's
    label: a key's name, or ``anonymous``) and priority, with the longest wait of each."""
    out = []
    for model in models:
        waiting = model.slots.waiting()
        if not waiting and not model.in_flight and not model.waits:
            continue
        groups: dict[tuple[str, str], list[float]] = {}
        for label, priority, waited in waiting:
            groups.setdefault((label, priority), []).append(waited)
        out.append({"model": model.spec.name, "state": model.state.value, "slots": model.slots.slots,
                    "running": model.running(), "waiting": len(model.waits) + model.slots.queued,
                    "closed": model.door.closed,
                    "queue": [{"key": k, "priority": p, "waiting": len(w), "longest_wait_s": round(max(w), 3)}
                              for (k, p), w in sorted(groups.items())]})
    return out


OTHERS = "other keys"  # the one row a user key sees for every other key's requests in a queue


def folded(rows_: list[dict[str, Any]], own: str) -> list[dict[str, Any]]:
    """``rows`` as a user key may see them: its own key's rows (by its name) as they are, and
    every other share's folded into one row per priority named ``OTHERS`` (how many, the longest
    wait): another key's name, and how much it asks for, are not its to see."""
    out = []
    for row in rows_:
        groups: dict[tuple[str, str], tuple[int, float]] = {}
        for q in row["queue"]:
            name = q["key"] if q["key"] == own else OTHERS
            count, longest = groups.get((name, q["priority"]), (0, 0.0))
            groups[(name, q["priority"])] = (count + q["waiting"], max(longest, q["longest_wait_s"]))
        out.append({**row, "queue": [{"key": k, "priority": p, "waiting": n, "longest_wait_s": w}
                                     for (k, p), (n, w) in sorted(groups.items())]})
    return out
