"""How a store shared out by owner makes room (the capture store's and the Responses store's
policy): past its bound, the owner holding the most gives up its oldest entry. So an owner that
holds no more than its share of the bound (the bound divided among the owners holding anything)
is never pushed out by another's entries, and an owner that floods the store pushes out its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Owner = TypeVar("Owner")


def giver(held: Mapping[Owner, int], newcomer: Owner) -> Owner:
    """The owner whose oldest entry goes next: the one whose ``held`` (its bytes, or its entries)
    is the most; on a tie, ``newcomer``'s (the owner of the entry just added, so that it does not
    push out another's as large). ``held`` is not empty. Pure."""
    return max(held, key=lambda owner: (held[owner], owner == newcomer))
