"""Grammars made from JSON schemas: ``int_range`` matches exactly the spellings of the
integers in its range, in rules linear in their digits, and a schema's bounds hold in the
grammars llama.cpp samples under (response_format and tool arguments); lengths and item counts
are GBNF repetitions, whatever their size; references are followed within the schema."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.text.grammar import MAX_GRAMMAR_DEPTH, MAX_REPEAT, grammar_problem
from gateway.text.schemacheck import LARGEST_INT
from gateway.worker.schemagrammar import int_range, repetition, schema_grammar


def as_regex(expr: str) -> re.Pattern:
    """The GBNF expression as a regular expression: its literals hold only digits and "-"."""
    return re.compile(expr.replace('"', "").replace(" ", "").replace("(", "(?:"))


def root_regex(grammar: str) -> re.Pattern:
    """The root rule of an integer schema's grammar, as a regular expression."""
    return as_regex(grammar.split("root ::= (")[1].rsplit(") space", 1)[0])


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


@given(st.integers(-10**30, 10**30), st.integers(0, 10**30), st.integers(-10**31, 10**31), st.integers(-3, 3))
def test_any_range_of_long_integers_and_integers_near_its_ends(lo, width, n, near):
    hi = lo + width
    rx = as_regex(int_range(lo, hi))
    for k in (n, lo + near, hi + near):
        assert bool(rx.fullmatch(str(k))) == (lo <= k <= hi), k


def test_a_range_grows_linearly_with_its_digits():
    """Each digit adds one level of the bound's rules, never a doubling (which took seconds at
    22 digits and never finished at 31)."""
    sizes = {}
    for digits in (25, 50, 100, 300):
        lo, hi = -(10**digits) + 12345, 10**digits - 98765  # digits that are neither 0 nor 9 near the ends
        sizes[digits] = len(int_range(lo, hi))
    per_digit = [size / digits for digits, size in sizes.items()]
    assert max(per_digit) < 1.2 * min(per_digit), sizes
    rx = as_regex(int_range(-(10**300), 10**22))
    assert rx.fullmatch("-" + "9" * 300) and rx.fullmatch("1" + "0" * 22) and not rx.fullmatch("1" + "0" * 23)


@pytest.mark.parametrize("schema, inside, outside", [
    ({"type": "integer", "maximum": 5}, ["5", "-7", "-" + "9" * 20], ["6", "10", "-1" + "0" * 20]),
    ({"type": "integer", "minimum": -3}, ["-3", "0", "9" * 20], ["-4", "1" + "0" * 20]),
    ({"type": "integer", "maximum": 10**22}, ["0", "9" * 20], ["1" + "0" * 20, "1" + "0" * 22]),
    ({"type": "integer", "minimum": -1e300, "maximum": 1e30}, ["-" + "9" * 20, "0", "9" * 20], ["-1" + "0" * 20]),
    ({"type": "integer", "exclusiveMinimum": 0.5, "maximum": 2.5}, ["1", "2"], ["0", "3"]),
])
def test_every_integer_bound_holds_and_integers_have_at_most_twenty_digits(schema, inside, outside):
    """One-sided bounds hold too; a bound past twenty digits is no bound on that side (every
    integer of twenty digits meets it)."""
    rx = root_regex(schema_grammar(schema))
    assert len(str(LARGEST_INT)) == 20
    for n in inside:
        assert rx.fullmatch(n), n
    for n in outside:
        assert not rx.fullmatch(n), n


def test_bounds_no_integer_of_twenty_digits_meets_are_refused():
    with pytest.raises(ValueError, match="at most 20 digits"):
        schema_grammar({"type": "integer", "minimum": 1e25})


@pytest.mark.parametrize("least, most, written", [
    (0, None, "x*"), (1, None, "x+"), (3, None, "x{3,}"), (0, 1, "x?"), (0, 0, ""), (1, 1, "x"), (4, 4, "x{4}"),
    (2, 9, "x{2,9}"), (0, MAX_REPEAT, f"x{{0,{MAX_REPEAT}}}"), (0, MAX_REPEAT + 1, "x*"), (5, 10**8, "x{5,}"),
])
def test_repetitions_are_written_with_gbnfs_own_counts(least, most, written):
    """A most past llama.cpp's limit is no most (llama.cpp would read it so)."""
    assert repetition("x", least, most) == written


@pytest.mark.parametrize("least, most", [(MAX_REPEAT + 1, None), (5, 3)])
def test_repetitions_llama_cpp_cannot_take_are_refused(least, most):
    with pytest.raises(ValueError):
        repetition("x", least, most)


@pytest.mark.parametrize("schema, fragment", [
    ({"type": "string", "maxLength": 30000}, 'root ::= "\\"" char* "\\"" space'),
    ({"type": "string", "minLength": 2, "maxLength": 300}, "char{2,300}"),
    ({"type": "array", "items": {"type": "boolean"}, "maxItems": 10**6}, "items ::= boolean more*"),
    ({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 5}, "items ::= boolean more{1,4}"),
    ({"type": "string", "pattern": "^a{0,30000}b{3}$"}, '"a"* "b"{3}'),
])
def test_lengths_and_counts_do_not_nest(schema, fragment):
    """maxLength 30000 once made 30000 nested groups, which crashed llama.cpp's parser."""
    grammar = schema_grammar(schema)
    assert fragment in grammar, grammar
    assert grammar_problem(grammar) is None and grammar.count("(") < MAX_GRAMMAR_DEPTH


def test_a_recursive_schema_with_its_definitions_beside_a_top_level_ref():
    """As Pydantic writes a recursive model: the converter once failed on it with a KeyError."""
    node = {"type": "object", "properties": {"name": {"type": "string"},
                                             "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
    grammar = schema_grammar({"$defs": {"Node": node}, "$ref": "#/$defs/Node"})
    assert "root ::= input-Node" in grammar and "input-Node-kids-item ::= input-Node" in grammar
    with pytest.raises(ValueError, match="points at no schema"):
        schema_grammar({"$ref": "#/$defs/Missing"})


def test_the_converters_own_repetitions_are_written_with_counts_too():
    """Patterns reach the converter's ``_build_repetition``, replaced by ours; its separated form
    (which the converter no longer uses) keeps its meaning."""
    from llama_cpp import llama_grammar

    assert llama_grammar._build_repetition("x", 0, 30000) == "x*"
    assert llama_grammar._build_repetition("x", 2, 5, separator_rule='","') == 'x ("," x){1,4}'
    assert llama_grammar._build_repetition("x", 0, 3, separator_rule='","') == '(x ("," x){0,2})?'
