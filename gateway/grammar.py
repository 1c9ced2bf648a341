"""Bounds on GBNF grammars, checked before llama.cpp parses one: its parser recurses once per
nested group (20,000 levels overflowed the worker's stack), and a grammar's size is the
caller's to choose. Used for a caller's ``grammar`` and for grammars made from JSON schemas."""

from __future__ import annotations

import re

MAX_GRAMMAR_CHARS = 256 * 1024
MAX_GRAMMAR_DEPTH = 256
_OPAQUE = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*')  # literals, classes, comments


def grammar_problem(grammar: str) -> str | None:
    """Why llama.cpp should not be handed ``grammar``, or None (parentheses inside literals,
    character classes and comments do not count as groups)."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        return f"may be at most {MAX_GRAMMAR_CHARS} characters, got {len(grammar)}"
    depth = deepest = 0
    for match in re.finditer(r"[()]", _OPAQUE.sub("", grammar)):
        depth += 1 if match.group() == "(" else -1
        deepest = max(deepest, depth)
    if deepest > MAX_GRAMMAR_DEPTH:
        return f"nests groups {deepest} deep; at most {MAX_GRAMMAR_DEPTH}"
    return None
