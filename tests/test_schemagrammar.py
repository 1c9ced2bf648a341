"""Integer bounds in grammars made from JSON schemas: ``int_range`` matches exactly the
spellings of the integers in its range, and a schema's bounds hold in the grammars llama.cpp
samples under (response_format and tool arguments)."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.engine.schemagrammar import int_range, schema_grammar


def as_regex(expr: str) -> re.Pattern:
    """The GBNF expression as a regular expression: its literals hold only digits and "-"."""
    return re.compile(expr.replace('"', "").replace(" ", ""))


@pytest.mark.parametrize("lo, hi", [(0, 0), (0, 9), (1, 12), (7, 7), (5, 123), (-15, 15), (-100, -3), (99, 1000),
                                    (0, 100000), (-1, 0), (10, 19)])
def test_a_range_matches_exactly_its_integers(lo, hi):
    rx = as_regex(int_range(lo, hi))
    for n in range(min(lo, 0) - 30, hi + 30):
        assert bool(rx.fullmatch(str(n))) == (lo <= n <= hi), n
    for spelled in ("-0", "007", "01", "+1", ""):
        assert not rx.fullmatch(spelled)


@given(st.integers(-10**6, 10**6), st.integers(0, 10**6), st.integers(-10**7, 10**7))
def test_any_range_and_any_integer(lo, width, n):
    hi = lo + width
    assert bool(as_regex(int_range(lo, hi)).fullmatch(str(n))) == (lo <= n <= hi)


def test_schemas_bounds_reach_the_grammar():
    grammar = schema_grammar({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 12}},
                              "required": ["n"]})
    assert "[1-9]" in grammar and "integral-part" not in grammar.split("root ::=")[0]
    exclusive = schema_grammar({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3})
    assert as_regex(exclusive.split("root ::= (")[1].rsplit(") space", 1)[0]).fullmatch("2")
    with pytest.raises(ValueError):
        schema_grammar({"type": "integer", "minimum": 5, "maximum": 1})
