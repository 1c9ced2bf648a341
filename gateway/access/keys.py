"""The running configuration's API keys as a table by digest (``KeyTable``), and whose a key's
requests' leftovers are (``owner_of``)."""

from __future__ import annotations

import hashlib

from ..models.config import KeySpec
from ..models.config.keys import digest_of


def owner_of(key: str) -> str:
    """Who owns what a key's requests leave behind (stored responses, cached prompts, saved KV
    caches): the key itself, by a digest of it, so neither a key's name (unnamed keys are named
    ``key1``, ``key2``, ... by their place in the list, and two sources may give one name twice)
    nor its place hands one key's to another. Truncated, and apart from the comparison's digest:
    it is written into saved caches' notes, and must say nothing usable of the key. Pure."""
    return "key-" + hashlib.sha256(b"gguf-gateway owner\0" + key.encode()).hexdigest()[:32]


class KeyTable:
    """Keys by their SHA-256: a request's key is hashed and looked up, so the time a lookup takes
    depends on the digest only, never on how much of a key matched; a key given twice is its
    first entry's."""

    def __init__(self, specs: tuple[KeySpec, ...] = ()):
        self.specs = specs
        self._by_digest: dict[bytes, KeySpec] = {}
        for spec in specs:
            self._by_digest.setdefault(spec.digest, spec)

    def __bool__(self) -> bool:
        return bool(self.specs)

    def find(self, given: str) -> KeySpec | None:
        return self._by_digest.get(digest_of(given)) if given else None

    def names(self) -> set[str]:
        return {spec.name for spec in self.specs}

    def first_secret(self) -> str | None:
        """A key the configuration gives as itself, an admin's first: what a command on this
        machine calls the gateway with when told no key."""
        for spec in sorted(self.specs, key=lambda s: s.role != "admin"):
            if spec.secret is not None:
                return spec.secret
        return None
