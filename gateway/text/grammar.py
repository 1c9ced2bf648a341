"""Bounds on GBNF grammars, checked before llama.cpp parses one. Used for a caller's ``grammar``
and for the grammars the worker makes from JSON schemas and tools.

What llama.cpp's parser does with a grammar, and so what is bounded here:
- it recurses once per nested group (20,000 levels overflowed the worker's stack);
- it unrolls a repetition ``x{m,n}`` into flat rules, one per allowed repetition, each holding
  a copy of ``x``: a few hundred bytes each, so a short grammar can ask for gigabytes, and a
  least count above the most (``x{5,3}``) makes it allocate until it fails;
- it refuses a least count past ``MAX_REPEAT`` and reads a most count past it as no most.
"""

from __future__ import annotations

import re

MAX_GRAMMAR_CHARS = 256 * 1024  # a caller's own grammar
# a grammar made from a request's schemas (response_format, tools), whose size follows theirs: a
# long tool list makes hundreds of kB, which llama.cpp parses in milliseconds
MAX_MADE_GRAMMAR_CHARS = 4 * 1024 * 1024
MAX_GRAMMAR_DEPTH = 256
# llama.cpp's MAX_REPETITION_THRESHOLD: the most a repetition's count may be (past it, a least
# count is an error and a most count means no most)
MAX_REPEAT = 2000
# the symbols llama.cpp's parser may write out for all of one grammar's {m,n} repetitions (each
# copy of a repeated item costs about its length in symbols, plus a rule's overhead)
MAX_UNROLLED = 200_000

_TOKENS = re.compile(
    r'(?P<item>"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\])'  # literals and classes: opaque, repeated as a whole
    r"|#[^\n]*"  # comments
    r"|(?P<rep>\{[^}]*\}?)"
    r"|(?P<group>[()])"
    r"|(?P<name>[A-Za-z0-9_-]+|\.)"
    r"|[^\s]")
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")


def _count(digits: str) -> int:
    return int(digits) if len(digits) <= 9 else 10**9  # (Python refuses to read thousands of digits)


def grammar_problem(grammar: str, max_chars: int = MAX_GRAMMAR_CHARS) -> str | None:
    """Why llama.cpp should not be handed ``grammar``, or None (parentheses inside literals,
    character classes and comments do not count as groups). A repetition must be written
    ``{m}``, ``{m,}`` or ``{m,n}``, with m <= n and m at most ``MAX_REPEAT``."""
    if len(grammar) > max_chars:
        return f"may be at most {max_chars} characters, got {len(grammar)}"
    depth = deepest = unrolled = 0
    item = 1  # symbols in the item a repetition would copy
    for token in _TOKENS.finditer(grammar):
        kind, text = token.lastgroup, token.group()
        if kind == "group":
            depth += 1 if text == "(" else -1
            deepest = max(deepest, depth)
            item = 1  # a group is one rule: its copies are references to it
        elif kind == "item":
            item = max(1, len(text) - 2)
        elif kind == "name":
            item = 1
        elif kind == "rep":
            if (m := _REPEAT.fullmatch(text)) is None:
                return f"has a repetition llama.cpp cannot read: {text[:40]!r} (write {{m}}, {{m,}} or {{m,n}})"
            least = _count(m.group(1))
            most = least if m.group(2) is None else _count(m.group(3)) if m.group(3) else None  # None: no most
            if least > MAX_REPEAT:
                return f"repeats an item at least {least} times ({text}); llama.cpp takes at most {MAX_REPEAT}"
            if most is not None and most < least:
                return f"asks for at least {least} and at most {most} of an item ({text})"
            unrolled += item * (most if most is not None and most <= MAX_REPEAT else max(least, 1))
    if deepest > MAX_GRAMMAR_DEPTH:
        return f"nests groups {deepest} deep; at most {MAX_GRAMMAR_DEPTH}"
    if unrolled > MAX_UNROLLED:
        return (f"repeats items {unrolled} times in all (counting each repeated symbol); at most {MAX_UNROLLED}: "
                "lower its counts")
    return None
