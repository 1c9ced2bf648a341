"""Responses kept for ``previous_response_id`` and ``GET`` / ``DELETE /v1/responses/{id}``
(OpenAI's ``store``): in memory, at most ``server.responses_store`` of them and ``max_bytes`` of
their JSON together (a count alone would let large requests hold any amount of memory), the
least recently used dropped first. Nothing is written to disk."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class Stored:
    body: dict[str, Any]  # the response object as it was answered
    messages: list[dict[str, Any]]  # the conversation through it (input and output), without instructions


MAX_BYTES = 256 * 2**20


class ResponseStore:
    def __init__(self, limit: int, max_bytes: int = MAX_BYTES):
        self.limit = limit  # 0: nothing is kept
        self.max_bytes = max_bytes
        self.bytes = 0  # the JSON size of what is kept
        self._items: OrderedDict[str, tuple[Stored, int]] = OrderedDict()

    def put(self, response_id: str, stored: Stored) -> None:
        size = len(json.dumps(stored.body)) + len(json.dumps(stored.messages))
        if not self.limit or size > self.max_bytes:
            return
        self.delete(response_id)
        self._items[response_id] = (stored, size)
        self.bytes += size
        while len(self._items) > self.limit or self.bytes > self.max_bytes:
            self.bytes -= self._items.popitem(last=False)[1][1]

    def get(self, response_id: str) -> Stored | None:
        item = self._items.get(response_id)
        if item is None:
            return None
        self._items.move_to_end(response_id)
        return item[0]

    def delete(self, response_id: str) -> bool:
        item = self._items.pop(response_id, None)
        if item is not None:
            self.bytes -= item[1]
        return item is not None
