"""Responses kept for ``previous_response_id`` and ``GET`` / ``DELETE /v1/responses/{id}``
(OpenAI's ``store``): in memory, at most ``server.responses_store`` of them and ``max_bytes``
together, the least recently used dropped first. Nothing is written to disk.

Each response is kept as its JSON text, not as live objects: a conversation of many small
messages held as Python dicts takes several times its JSON size, so a bound on JSON bytes would
not bound the memory. What an entry holds is its encoded bytes plus ``ENTRY_OVERHEAD``.

A response belongs to the API key (principal) that made it: under another key it does not
exist (``get`` and ``delete`` answer as for an unknown id), so one key can neither read,
continue nor delete another's."""

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
ENTRY_OVERHEAD = 256  # the table's own cost per entry: its key, the bytes object, the order links


def encode(stored: Stored) -> bytes:
    return json.dumps({"body": stored.body, "messages": stored.messages}, separators=(",", ":")).encode()


def decode(data: bytes) -> Stored:
    obj = json.loads(data)
    return Stored(obj["body"], obj["messages"])


class ResponseStore:
    def __init__(self, limit: int, max_bytes: int = MAX_BYTES):
        self.limit = limit  # 0: nothing is kept
        self.max_bytes = max_bytes
        self.bytes = 0  # what the kept entries hold
        self._items: OrderedDict[str, tuple[bytes, str | None]] = OrderedDict()  # id -> (JSON, owner)

    @staticmethod
    def size(data: bytes) -> int:
        return len(data) + ENTRY_OVERHEAD

    def put(self, response_id: str, stored: Stored, owner: str | None = None) -> None:
        """Keep ``stored`` for ``owner`` (the principal; None where the server has no keys)."""
        if not self.limit:
            return
        data = encode(stored)
        if self.size(data) > self.max_bytes:
            return
        self._drop(response_id)
        self._items[response_id] = (data, owner)
        self.bytes += self.size(data)
        while len(self._items) > self.limit or self.bytes > self.max_bytes:
            self.bytes -= self.size(self._items.popitem(last=False)[1][0])

    def get(self, response_id: str, owner: str | None = None) -> Stored | None:
        item = self._items.get(response_id)
        if item is None or item[1] != owner:
            return None
        self._items.move_to_end(response_id)
        return decode(item[0])

    def delete(self, response_id: str, owner: str | None = None) -> bool:
        item = self._items.get(response_id)
        if item is None or item[1] != owner:
            return False
        return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        item = self._items.pop(response_id, None)
        if item is not None:
            self.bytes -= self.size(item[0])
        return item is not None
