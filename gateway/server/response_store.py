"""Responses kept for ``previous_response_id`` and ``GET`` / ``DELETE /v1/responses/{id}``
(OpenAI's ``store``): in memory, at most ``server.responses_store`` of them and ``max_bytes``
together. Nothing is written to disk.

Each response is kept as its JSON text, not as live objects: a conversation of many small
messages held as Python dicts takes several times its JSON size, so a bound on JSON bytes would
not bound the memory. The store counts every byte it holds: an entry is its encoded bytes, its
id, and ``ENTRY_OVERHEAD`` for the objects and table slots that hold them.

A response belongs to the API key (principal) that made it: under another key it does not
exist (``get`` and ``delete`` answer as for an unknown id), so one key can neither read,
continue nor delete another's. The store is shared out by owner (the key's digest,
``events.OWNER``; every request of a server without keys is one owner, None): past either bound,
the owner holding the most (entries past the count, bytes past ``max_bytes``) gives up its least
recently used response (``shares.giver``). So one key's stores never push out a response of a
key that holds no more than its share, and a key that floods the store pushes out its own."""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from . import shares


@dataclass
class Stored:
    body: dict[str, Any]  # the response object as it was answered
    messages: list[dict[str, Any]]  # the conversation through it (input and output), without instructions


MAX_BYTES = 256 * 2**20
# the objects and slots that hold an entry besides its JSON and id: the bytes object's header,
# the id's str header, its slots in the id -> owner table and in its owner's ordered table
ENTRY_OVERHEAD = 384


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
        self._owner_of: dict[str, str | None] = {}  # id -> its owner
        # each owner's responses (id -> JSON), least recently used first, and the bytes they hold
        self._owned: dict[str | None, OrderedDict[str, bytes]] = {}
        self._owned_bytes: dict[str | None, int] = {}

    def __len__(self) -> int:
        return len(self._owner_of)

    @staticmethod
    def size(response_id: str, data: bytes) -> int:
        return len(data) + len(response_id) + ENTRY_OVERHEAD

    def held(self, owner: str | None = None) -> int:
        """The bytes ``owner``'s responses hold."""
        return self._owned_bytes.get(owner, 0)

    def put(self, response_id: str, stored: Stored, owner: str | None = None) -> None:
        """Keep ``stored`` for ``owner`` (the principal; None where the server has no keys)."""
        if not self.limit:
            return
        data = encode(stored)
        size = self.size(response_id, data)
        if size > self.max_bytes:
            return
        self._drop(response_id)
        if owner is not None:
            owner = sys.intern(owner)  # one copy of an owner's digest, however many entries name it
        self._owner_of[response_id] = owner
        self._owned.setdefault(owner, OrderedDict())[response_id] = data
        self._owned_bytes[owner] = self._owned_bytes.get(owner, 0) + size
        self.bytes += size
        while len(self._owner_of) > self.limit or self.bytes > self.max_bytes:
            held = {o: len(e) for o, e in self._owned.items()} if len(self._owner_of) > self.limit \
                else self._owned_bytes
            self._drop(next(iter(self._owned[shares.giver(held, owner)])))

    def get(self, response_id: str, owner: str | None = None) -> Stored | None:
        if response_id not in self._owner_of or self._owner_of[response_id] != owner:
            return None
        owned = self._owned[owner]
        owned.move_to_end(response_id)
        return decode(owned[response_id])

    def delete(self, response_id: str, owner: str | None = None) -> bool:
        if response_id not in self._owner_of or self._owner_of[response_id] != owner:
            return False
        return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        if response_id not in self._owner_of:
            return False
        owner = self._owner_of.pop(response_id)
        owned = self._owned[owner]
        size = self.size(response_id, owned.pop(response_id))
        self.bytes -= size
        if owned:
            self._owned_bytes[owner] -= size
        else:
            del self._owned[owner], self._owned_bytes[owner]
        return True
