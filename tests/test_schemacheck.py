"""What a JSON schema may ask of a grammar, checked where a request is parsed (``schemacheck``),
and the bounds on GBNF itself (``grammar.grammar_problem``): pure checks, no llama.cpp."""

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.base.errors import InvalidRequest
from gateway.text.grammar import MAX_REPEAT, MAX_UNROLLED, grammar_problem
from gateway.text.schemacheck import schema_problem
from gateway.wire import anthropic, ollama, openai, responses

STRING = {"type": "string"}


def problem_at(schema) -> tuple:
    found = schema_problem(schema)
    return found.path if found else None


@pytest.mark.parametrize("schema, path", [
    ({"type": "string", "minLength": MAX_REPEAT + 1}, ("minLength",)),
    ({"type": "array", "items": STRING, "minItems": 3e7}, ("minItems",)),
    ({"type": "object", "maxProperties": "many"}, ("maxProperties",)),
    ({"type": "string", "maxLength": -1}, ("maxLength",)),
    ({"type": "string", "maxLength": 1.5}, ("maxLength",)),
    ({"type": "string", "maxLength": "10"}, ("maxLength",)),
    ({"type": "string", "maxLength": True}, ("maxLength",)),
    ({"type": "string", "maxLength": float("inf")}, ("maxLength",)),
    ({"type": "integer", "minimum": 1e30}, ("minimum",)),
    ({"type": "integer", "exclusiveMaximum": -(10**20)}, ("exclusiveMaximum",)),
    ({"type": "integer", "maximum": float("inf")}, ("maximum",)),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "maxLength": -9}}}},
     ("properties", "a", "items", "maxLength")),
    ({"anyOf": [STRING, {"type": "array", "minItems": 9999}]}, ("anyOf", 1, "minItems")),
    ({"$ref": "#/elsewhere", "elsewhere": {"minLength": 1e9}}, ("elsewhere", "minLength")),  # what a $ref reaches
])
def test_absurd_numbers_are_found_with_their_path(schema, path):
    assert problem_at(schema) == path


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 30000},  # served: past llama.cpp's repetition limit it is no most
    {"type": "string", "minLength": MAX_REPEAT, "maxLength": 2**31 - 1},  # "any", as generators write it
    {"type": "string", "maxLength": 1e8},  # nothing is built from a most: served as no most
    {"type": "object", "maxProperties": 10**400},
    {"type": "array", "items": STRING, "minItems": 2.0, "maxItems": 1e3},  # integral floats are integers
    {"type": "integer", "minimum": -1e300, "maximum": 10**22},  # far bounds: no bound that side
    {"type": "integer", "minimum": 10**20 - 1},
    {"type": "number", "minimum": 1e300},  # only integers are written by their bounds
    {"type": "object", "properties": {"maxLength": {"type": "string"}, "minItems": STRING}},  # names, not keywords
    {"enum": [{"maxLength": 1e9}], "const": {"minItems": -1}},  # values, not schemas
])
def test_reasonable_schemas_pass(schema):
    assert schema_problem(schema) is None


NODE = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}


@pytest.mark.parametrize("schema, path, words", [
    ({"$ref": "#"}, ("$ref",), "leads back to itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, ("$defs", "a", "$ref"), "leads back to itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"oneOf": [STRING, {"$ref": "#/$defs/a"}]}},
      "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}, ("$defs", "b", "oneOf", 1, "$ref"), "itself"),
    ({"$ref": "https://example.com/schema.json"}, ("$ref",), "must point into this schema"),
    ({"$ref": "other.json#/a"}, ("$ref",), "must point into this schema"),
    ({"$ref": 5}, ("$ref",), "must point into this schema"),
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, ("properties", "a", "$ref"), "points at no schema"),
])
def test_references_that_no_grammar_follows_are_found(schema, path, words):
    found = schema_problem(schema)
    assert found is not None and found.path == path and words in found.message, found


def test_recursion_inside_properties_or_items_is_fine():
    assert schema_problem({"$defs": {"node": NODE}, "$ref": "#/$defs/node"}) is None
    assert schema_problem({"type": "object", "properties": {"v": STRING, "next": {"$ref": "#"}}}) is None


def test_a_long_chain_of_references_is_checked_in_linear_time():
    n = 20_000
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string", "minLength": 1e9}
    started = time.perf_counter()
    assert problem_at({"$defs": defs, "$ref": "#/$defs/d0"}) == ("$defs", f"d{n}", "minLength")
    defs[f"d{n}"] = {"$ref": "#/$defs/d0"}  # and around again: left recursion
    assert problem_at({"$defs": defs, "$ref": "#/$defs/d0"})[-1] == "$ref"
    assert time.perf_counter() - started < 30  # a hang guard: walking each path anew took hours


KEYS = st.sampled_from(["type", "properties", "items", "anyOf", "oneOf", "$ref", "$defs", "maxLength", "minItems",
                        "minimum", "exclusiveMaximum", "a", "integer"])
JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats() | KEYS
                    | st.sampled_from(["#", "#/$defs/a", "#/properties/a", "#/a"]),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5), max_leaves=40)


@given(JSON)
def test_any_json_is_checked_without_an_exception(value):
    found = schema_problem(value)
    assert found is None or (isinstance(found.path, tuple) and found.message)


# --- on the wire: the caller's own field, and the path within it ---------------------------------

BAD = {"type": "object", "properties": {"x": {"type": "string", "minLength": 1e8}}}


@pytest.mark.parametrize("parse, body, param", [
    (openai.parse_chat, {"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD}}]},
     "tools[0].function.parameters.properties.x.minLength"),
    (openai.parse_chat, {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": BAD}}},
     "response_format.json_schema.schema.properties.x.minLength"),
    (openai.parse_completion, {"prompt": "x", "response_format": {"type": "json_schema",
                                                                 "json_schema": {"schema": BAD}}},
     "response_format.json_schema.schema.properties.x.minLength"),
    (anthropic.parse, {"max_tokens": 5, "tools": [{"name": "f", "input_schema": BAD}]},
     "tools.0.input_schema.properties.x.minLength"),
    (ollama.parse_chat, {"format": BAD}, "format.properties.x.minLength"),
    (ollama.parse_generate, {"prompt": "x", "format": BAD}, "format.properties.x.minLength"),
    (ollama.parse_chat, {"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD}}]},
     "tools[0].function.parameters.properties.x.minLength"),
    (responses.parse, {"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": BAD}}},
     "text.format.schema.properties.x.minLength"),
    (responses.parse, {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": BAD}]},
     "tools[0].parameters.properties.x.minLength"),
    (openai.parse_chat, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"anyOf": [STRING, {"$ref": "#/properties/a"}]}}}}}]},
     "tools[0].function.parameters.properties.a.anyOf[1].$ref"),
])
def test_every_wire_refuses_a_schema_naming_the_keywords_path_in_the_callers_field(parse, body, param):
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidRequest) as caught:
        parse({**base, **body})
    assert caught.value.param == param, caught.value.message
    assert param in caught.value.message


def test_structured_output_names_the_callers_field_for_the_worker():
    hi = [{"role": "user", "content": "hi"}]
    assert openai.parse_chat({"model": "m", "messages": hi, "response_format": {"type": "json_object"}}
                             ).request.format_param == "response_format"
    assert ollama.parse_chat({"model": "m", "messages": hi, "format": {"type": "object"}}
                             ).request.format_param == "format"
    assert responses.parse({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}
                           ).request.format_param == "text.format"


# --- GBNF: what llama.cpp's parser would unroll --------------------------------------------------

@pytest.mark.parametrize("grammar, words", [
    ('root ::= "x"{5,3}', "at least 5 and at most 3"),  # llama.cpp allocated until it failed
    (f'root ::= "x"{{{MAX_REPEAT + 1}}}', f"at least {MAX_REPEAT + 1}"),
    ('root ::= "x"{99999999999999999999}', "at least"),
    ('root ::= "x"{ 1, }', None),
    ('root ::= "x"{1 2}', "cannot read"),
    ("root ::= " + " | ".join(f"r{i}" for i in range(101)) + "\n"
     + "".join(f"r{i} ::= [a-z]{{0,{MAX_REPEAT}}}\n" for i in range(101)), "in all"),  # 2 GB at 5000 of them
    ('root ::= "' + "y" * 200 + f'"{{{MAX_REPEAT}}}', "in all"),  # each copy holds the literal
    (f'root ::= x{{0,{10**8}}}\nx ::= "a"', None),  # no most: nothing unrolled
    (f'root ::= "{{0,5000}}" [{{]{{3}} # x{{0,{10**8}}}', None),  # braces in literals, classes, comments
])
def test_repetitions_llama_cpp_would_choke_on(grammar, words):
    problem = grammar_problem(grammar)
    assert (problem is None) if words is None else (problem is not None and words in problem), problem


def test_the_bound_on_unrolled_repetitions_leaves_room_for_a_hundred_strings_of_the_longest_bounded_length():
    assert MAX_UNROLLED >= 100 * MAX_REPEAT
