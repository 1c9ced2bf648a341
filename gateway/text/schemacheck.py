"""What a JSON schema may ask of a grammar: checked where a request is parsed, before the worker
builds anything from it. Pure (no llama_cpp): the HTTP process runs it on each structured-output
field and each tool's parameters, and the worker's converter (``worker/schemagrammar.py``) shares
its rules for integer bounds and references.

The numbers in a schema size what is built from it. A count (``maxLength``, ``minItems``, ...)
becomes a repetition that llama.cpp unrolls into one rule per allowed repetition, and an
integer bound becomes digit rules. ``schema_problem`` refuses:

- a count that is not a non-negative integer; a least count (``minLength``, ``minItems``) past
  ``grammar.MAX_REPEAT``, as llama.cpp cannot write that many of an item. A most count past it
  is served as no most (llama.cpp reads it so, and ``max_tokens`` ends any answer): generators
  write ``maxLength: 2147483647`` for "any", and nothing is built from the number;
- on an integer, a bound that is not finite, or one that asks for integers of more than
  ``MAX_INT_DIGITS`` digits (a bound farther out on the other side is served as no bound:
  the grammar writes integers of at most that many digits, all of them inside it);
- a ``$ref`` that is not local (``#`` or ``#/...``), points at nothing, or leads back to itself
  before any JSON is written (a schema may recur inside an object's properties or an array's
  items: that grammar is fine).

A schema that names no type and nothing that shapes a value (``{}``, ``true``, one with only a
``description``) allows any JSON value (``allows_any``), and the grammar writes any there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from .grammar import MAX_REPEAT

MAX_INT_DIGITS = 20  # every 64-bit integer, signed or not
LARGEST_INT = 10**MAX_INT_DIGITS - 1

COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
WRITTEN_OUT = ("minLength", "minItems")  # a grammar writes each of these out
LOW, HIGH = ("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")

# the keywords whose values are schemas, lists of schemas, or maps of names to schemas
_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames",
        "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

Path = tuple[str | int, ...]

# what the converter builds a value from when a schema names no ``type`` (``worker/schemagrammar``)
_SHAPING = ("$ref", "oneOf", "anyOf", "allOf", "const", "enum", "properties", "items", "prefixItems", "pattern")


def allows_any(schema: Any) -> bool:
    """Whether ``schema`` allows any JSON value, as JSON Schema reads it: ``true``, ``{}``, or a
    schema with no ``type`` and nothing that shapes a value (only annotations such as
    ``description``, or keywords of a type it does not name, like ``format`` or ``minLength``).
    Claude Code's tools have such parameters (``{"description": "Optional input value..."}``)."""
    if schema is True:
        return True
    if not isinstance(schema, dict) or "type" in schema:
        return False
    return not any(k in schema for k in _SHAPING) and schema.get("additionalProperties", True) is True


@dataclass(frozen=True)
class Problem:
    path: Path  # from the schema's root to the keyword at fault
    message: str


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: int | float) -> bool:
    return not isinstance(value, float) or math.isfinite(value)  # (an int may be too large for a float)


def _shown(value: Any) -> str:
    if _number(value) and isinstance(value, int) and abs(value).bit_length() > 128:
        return f"an integer of about {int(abs(value).bit_length() * math.log10(2)) + 1} digits"  # str() may refuse it
    return str(value)[:40]


def integer_bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    """The least and most integer an integer schema allows (None: no bound that side), from
    ``minimum``, ``maximum`` and their exclusive forms; values that are not finite numbers are
    no bound."""
    def ints(keys: tuple[str, str], inclusive, exclusive) -> list[int]:
        values = [(k, schema.get(k)) for k in keys]
        return [(inclusive if k == keys[0] else exclusive)(v) for k, v in values if _number(v) and _finite(v)]

    lows = ints(LOW, math.ceil, lambda v: math.floor(v) + 1)
    highs = ints(HIGH, math.floor, lambda v: math.ceil(v) - 1)
    return max(lows, default=None), min(highs, default=None)


def ref_parts(ref: str) -> list[str] | None:
    """The keys a local ``$ref`` follows from the root (``#/$defs/a``: ``["$defs", "a"]``), or None
    for one that is not local. As llama-cpp-python's converter reads them: no ``~`` escapes."""
    if ref == "#":
        return []
    if ref.startswith("#/"):
        return ref[2:].split("/")
    return None


def resolve(root: Any, ref: str) -> Any:
    """What a local ``$ref`` points at in ``root``, or None."""
    parts = ref_parts(ref)
    if parts is None:
        return None
    node = root
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, dict) else None


def _children(node: dict[str, Any], path: Path) -> list[tuple[Any, Path]]:
    out: list[tuple[Any, Path]] = []
    for key in _ONE:
        if isinstance(node.get(key), dict):
            out.append((node[key], (*path, key)))
    for key in _LISTS:
        if isinstance(node.get(key), list):
            out += [(s, (*path, key, i)) for i, s in enumerate(node[key])]
    for key in _MAPS:
        if isinstance(node.get(key), dict):
            out += [(s, (*path, key, name)) for name, s in node[key].items()]
    return out


def _count_problem(node: dict[str, Any], path: Path) -> Problem | None:
    for key in COUNTS:
        value = node.get(key)
        if value is None:
            continue
        if not _number(value) or not _finite(value) or value != int(value) or value < 0:
            return Problem((*path, key), f"must be a non-negative integer, got {_shown(value)}")
        if key in WRITTEN_OUT and value > MAX_REPEAT:
            return Problem((*path, key), f"may be at most {MAX_REPEAT} (llama.cpp's grammars repeat an item "
                                         f"at most that often), got {_shown(int(value))}")
    return None


def _bound_problem(node: dict[str, Any], path: Path) -> Problem | None:
    if node.get("type") != "integer":
        return None
    for key in (*LOW, *HIGH):
        value = node.get(key)
        if not _number(value):
            continue
        if not _finite(value):
            return Problem((*path, key), f"must be a finite number, got {value}")
        low, high = integer_bounds({key: value})
        if (low is not None and low > LARGEST_INT) or (high is not None and high < -LARGEST_INT):
            return Problem((*path, key), f"asks for integers of more than {MAX_INT_DIGITS} digits, "
                                         f"which this server does not write (got {_shown(value)})")
    return None


def schema_problem(schema: Any) -> Problem | None:
    """The first thing in ``schema`` (and in what its ``$ref``s point at) that no grammar should
    be built from, or None. Linear in the schema's size, whatever its references."""
    problem, refs = _walk(schema)
    return problem or _left_recursion(refs)


# a node holding a ``$ref`` (by its id): the node, what it points at, and the node's path
Refs = dict[int, tuple[dict[str, Any], Any, Path]]


def _walk(schema: Any) -> tuple[Problem | None, Refs]:
    """Every schema in ``schema``, each once (a reference's target at its own path): the first
    problem with its numbers or references, and the nodes holding a ``$ref``."""
    seen: set[int] = set()
    refs: Refs = {}
    stack: list[tuple[Any, Path]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        if problem := _count_problem(node, path) or _bound_problem(node, path):
            return problem, refs
        ref = node.get("$ref")
        if ref is not None:
            parts = ref_parts(ref) if isinstance(ref, str) else None
            if parts is None:
                return Problem((*path, "$ref"), f"must point into this schema (\"#/...\"), got {str(ref)[:60]!r}"), refs
            target = resolve(schema, ref)
            if target is None:
                return Problem((*path, "$ref"), f"points at no schema: {ref[:60]!r}"), refs
            refs[id(node)] = (node, target, path)
            stack.append((target, tuple(parts)))
        stack += reversed(_children(node, path))
    return None, refs


def _left_recursion(refs: Refs) -> Problem | None:
    """A ``$ref`` that leads back to where it is before any JSON is written: through ``$ref``s
    and ``anyOf`` / ``oneOf`` alternatives only (what the converter writes as a plain rule
    reference). Such a grammar is left-recursive, which llama.cpp refuses."""
    def steps(node: Any) -> list[Any]:
        if not isinstance(node, dict):
            return []
        if id(node) in refs:
            return [refs[id(node)][1]]
        alternatives = node.get("oneOf") or node.get("anyOf")  # as the converter picks them
        return [a for a in alternatives if isinstance(a, dict)] if isinstance(alternatives, list) else []

    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start, _, _ in refs.values():  # a cycle passes through a $ref
        if id(start) in state:
            continue
        stack = [(start, iter(steps(start)))]
        state[id(start)] = 1
        while stack:
            node, rest = stack[-1]
            nxt = next(rest, None)
            if nxt is None:
                state[id(node)] = 2
                stack.pop()
            elif state.get(id(nxt)) == 1:
                at = next(refs[id(n)][2] for n, _ in reversed(stack) if id(n) in refs)
                return Problem((*at, "$ref"), "leads back to itself before any JSON is written (a schema may "
                                              "recur only inside an object's properties or an array's items)")
            elif id(nxt) not in state:
                state[id(nxt)] = 1
                stack.append((nxt, iter(steps(nxt))))
    return None
