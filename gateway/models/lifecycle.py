"""A model's lifecycle: its states and the moves between them, in one place.

    unloaded --request--> loading --worker ready--> ready --keep_alive idle / evicted / unload--> unloaded
                          loading --load failed--> failed --back-off passed, request--> loading
                          loading --unloaded or shut down meanwhile--> unloaded (waiters: 503)
                          ready --worker died--> unloaded (the next request reloads it)
"""

from __future__ import annotations

from enum import Enum


class ModelState(str, Enum):  # a str: it is what /models, metrics and logs show
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


MOVES: dict[ModelState, frozenset[ModelState]] = {
    ModelState.UNLOADED: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset({ModelState.READY, ModelState.FAILED, ModelState.UNLOADED}),
    ModelState.READY: frozenset({ModelState.UNLOADED}),
    ModelState.FAILED: frozenset({ModelState.LOADING}),
}


def move(current: ModelState, new: ModelState) -> ModelState:
    """``new`` if the lifecycle allows going there from ``current``; raises ``ValueError`` otherwise
    (a bug in the caller: a state never changes any other way)."""
    if new is not current and new not in MOVES[current]:
        raise ValueError(f"a model cannot go from {current.value} to {new.value}")
    return new
