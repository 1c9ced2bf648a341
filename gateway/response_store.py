"""Responses kept for ``previous_response_id`` and ``GET`` / ``DELETE /v1/responses/{id}``
(OpenAI's ``store``): in memory, at most ``server.responses_store`` of them, the least recently
used dropped first. Nothing is written to disk."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class Stored:
    body: dict[str, Any]  # the response object as it was answered
    messages: list[dict[str, Any]]  # the conversation through it (input and output), without instructions


class ResponseStore:
    def __init__(self, limit: int):
        self.limit = limit  # 0: nothing is kept
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def put(self, response_id: str, stored: Stored) -> None:
        if not self.limit:
            return
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None
