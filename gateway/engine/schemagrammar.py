"""JSON schemas to GBNF: llama-cpp-python's converter, with integer bounds enforced.

The converter writes any integer for ``{"type": "integer", "minimum": 1, "maximum": 12}``, so
a model sampled under it can break the schema it was given. ``Converter`` writes bounded
integers as digit ranges instead: ``int_range(lo, hi)`` matches exactly the decimal spellings
of lo..hi (no leading zeros, no "-0"). A schema with only ``minimum >= 0`` gets unsigned
integers; other one-sided bounds are left as the converter writes them. Imported by the worker
only: it loads llama_cpp.
"""

from __future__ import annotations

import json
import math
from typing import Any

from llama_cpp import llama_grammar


def _same_length(a: str, b: str) -> str:
    """Decimal strings of one length from ``a`` to ``b`` (a <= b), as a GBNF expression."""
    if a == b:
        return json.dumps(a)
    i = 0
    while a[i] == b[i]:
        i += 1
    prefix = json.dumps(a[:i]) + " " if i else ""
    x, y, rest = a[i], b[i], len(a) - i - 1
    if rest == 0:
        return f"{prefix}[{x}-{y}]"
    alts = [f'"{x}" ({_same_length(a[i + 1:], "9" * rest)})']
    if int(y) - int(x) > 1:
        alts.append(f"[{int(x) + 1}-{int(y) - 1}] [0-9]{{{rest}}}")
    alts.append(f'"{y}" ({_same_length("0" * rest, b[i + 1:])})')
    return f"{prefix}({' | '.join(alts)})"


def _unsigned(lo: int, hi: int) -> list[str]:
    out = []
    for digits in range(len(str(lo)), len(str(hi)) + 1):
        a, b = max(lo, 10 ** (digits - 1) if digits > 1 else 0), min(hi, 10 ** digits - 1)
        if a <= b:
            out.append(_same_length(str(a), str(b)))
    return out


def int_range(lo: int, hi: int) -> str:
    """GBNF for the integers lo..hi (lo <= hi)."""
    alts = []
    if lo < 0:
        alts.append(f'"-" ({" | ".join(_unsigned(max(1, -hi), -lo))})')
    if hi >= 0:
        alts += _unsigned(max(lo, 0), hi)
    return " | ".join(f"({alt})" for alt in alts)


def _bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    def num(key: str) -> float | None:
        v = schema.get(key)
        return v if isinstance(v, int | float) and not isinstance(v, bool) else None

    lo, hi = num("minimum"), num("maximum")
    ex_lo, ex_hi = num("exclusiveMinimum"), num("exclusiveMaximum")
    low = max([math.ceil(v) for v in (lo,) if v is not None] + [math.floor(v) + 1 for v in (ex_lo,) if v is not None],
              default=None)
    high = min([math.floor(v) for v in (hi,) if v is not None] + [math.ceil(v) - 1 for v in (ex_hi,) if v is not None],
               default=None)
    return low, high


class Converter(llama_grammar.SchemaConverter):
    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def visit(self, schema: Any, name: str) -> str:
        if isinstance(schema, dict) and schema.get("type") == "integer":
            low, high = _bounds(schema)
            name = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
            if low is not None and high is not None:
                if low > high:
                    raise ValueError(f"no integer is between {low} and {high}")
                return self._add_rule(name, f"({int_range(low, high)}) space")
            if low is not None and low >= 0 and high is None:
                body = int_range(low, 10 ** len(str(low)) - 1) + " | [1-9] [0-9]{" + f"{len(str(low))},15}}"
                return self._add_rule(name, f"({body}) space")
        return super().visit(schema, name)


def schema_grammar(schema: dict[str, Any]) -> str:
    """The GBNF of a whole JSON schema (``response_format``'s)."""
    conv = Converter()
    conv.visit(conv.resolve_refs(schema, "input"), "")
    return conv.format_grammar()
