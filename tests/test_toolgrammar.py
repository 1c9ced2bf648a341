"""Each format's call grammar, run by llama.cpp's own grammar sampler over a real tokenizer
(Qwen2's vocabulary): a well-formed call in the model's format is accepted token by token and
may end there; a call that breaks its tool's schema is stopped at the token that breaks it;
free text before a lazy grammar's trigger is never constrained."""

import ctypes
import math

import llama_cpp as L
import pytest
from helpers import vocab_only

from gateway.text.grammar import MAX_GRAMMAR_CHARS, MAX_MADE_GRAMMAR_CHARS, grammar_problem
from gateway.worker import toolgrammar

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now"}}
TOOLS = [WEATHER, NOW]

CALLS = {  # a call as each format writes it, and the same call with "days" not an integer
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
    "plain": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    "llama3": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
    "harmony": 'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 2}',
    "deepseek": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 2}'
                '<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "minimax": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
               '<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>',
    "minimax_m3": ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="get_weather">]<]minimax[>[<city>Paris'
                  ']<]minimax[>[</city>]<]minimax[>[<days>2]<]minimax[>[</days>]<]minimax[>[</invoke>\n'
                  ']<]minimax[>[</tool_call>',
    "kimi": '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
            '{"city": "Paris", "days": 2}<|tool_call_end|><|tool_calls_section_end|>',
    "kimi_k3": '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" '
               'type="string"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key="days" type="integer"<|sep|>2'
               '<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>',
    "glm": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
           "<arg_value>2</arg_value>\n</tool_call>",
    "deepseek_dsml": '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
                     'string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2'
                     '</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
    "command_r": '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris", '
                 '"days": 2}}\n]<|END_ACTION|>',
}
XML_VALUES = ("qwen3_coder", "minimax", "minimax_m3", "kimi_k3", "glm", "deepseek_dsml")  # values written as text, not JSON
VARIANTS = {  # the other spellings a format's grammar allows
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
    "deepseek": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
                '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "llama3": '{"name": "now", "parameters": {}}',
}


@pytest.fixture(scope="module")
def vocab():
    with vocab_only("qwen2") as v:
        yield v


def tokens(vocab, text: str) -> list[int]:
    data = text.encode()
    buf = (L.llama_token * (len(data) + 8))()
    n = L.llama_tokenize(vocab, data, len(data), buf, len(buf), False, True)
    assert n >= 0
    return list(buf[:n])


def sampler(vocab, grammar: toolgrammar.ToolGrammar):
    if not grammar.lazy:
        return L.llama_sampler_init_grammar(vocab, grammar.gbnf.encode(), b"root")
    patterns = (ctypes.c_char_p * len(grammar.triggers))(*[t.encode() for t in grammar.triggers])
    return L.llama_sampler_init_grammar_lazy_patterns(vocab, grammar.gbnf.encode(), b"root", patterns,
                                                      len(grammar.triggers), None, 0)


def allowed(smpl, token: int) -> bool:
    data = (L.llama_token_data * 1)(L.llama_token_data(token, 0.0, 0.0))
    arr = L.llama_token_data_array(data, 1, -1, False)
    L.llama_sampler_apply(smpl, ctypes.byref(arr))
    return data[0].logit != -math.inf


def run(vocab, grammar, text: str) -> tuple[bool, bool]:
    """(every token of ``text`` allowed, the answer may end after it)."""
    smpl = sampler(vocab, grammar)
    assert smpl, grammar.gbnf
    try:
        for t in tokens(vocab, text):
            if not allowed(smpl, t):
                return False, False
            L.llama_sampler_accept(smpl, t)
        return True, allowed(smpl, L.llama_vocab_eos(vocab))
    finally:
        L.llama_sampler_free(smpl)


@pytest.mark.parametrize("fmt", sorted(CALLS))
def test_a_call_in_the_format_is_accepted_and_may_end(vocab, fmt):
    grammar = toolgrammar.build(fmt, TOOLS, required=False)
    assert grammar.lazy and grammar.triggers
    assert run(vocab, grammar, "Let me check the weather first. " + CALLS[fmt]) == (True, True)
    if fmt in VARIANTS:
        assert run(vocab, grammar, VARIANTS[fmt]) == (True, True)
    required = toolgrammar.build(fmt, TOOLS, required=True)
    # a required harmony call follows the prompt's "<|start|>assistant": the recipient comes first
    call = " " + CALLS[fmt] if fmt == "harmony" else CALLS[fmt]
    assert not required.lazy and run(vocab, required, call) == (True, True)


@pytest.mark.parametrize("fmt", sorted(CALLS))
def test_a_call_that_breaks_the_schema_is_stopped(vocab, fmt):
    grammar = toolgrammar.build(fmt, TOOLS, required=False)
    bad = CALLS[fmt].replace("2", "soon") if fmt in XML_VALUES else CALLS[fmt].replace('"days": 2', '"days": "2"')
    assert run(vocab, grammar, "Sure. " + bad)[0] is False
    unknown = CALLS[fmt].replace("get_weather", "get_wether")
    assert run(vocab, grammar, unknown)[0] is False


def test_free_text_stays_free_until_the_trigger(vocab):
    grammar = toolgrammar.build("hermes", TOOLS, required=False)
    assert run(vocab, grammar, 'Any text {"name": at all}, no call.') == (True, True)


def test_a_required_call_allows_no_text_first_and_a_named_one_only_that_tool(vocab):
    required = toolgrammar.build("hermes", TOOLS, required=True)
    assert run(vocab, required, "Sure. " + CALLS["hermes"])[0] is False
    named = toolgrammar.build("hermes", TOOLS, required=True, names=("now",))
    assert run(vocab, named, CALLS["hermes"])[0] is False
    assert run(vocab, named, '<tool_call>{"name": "now", "arguments": {}}</tool_call>') == (True, True)


def test_parallel_calls_only_when_allowed(vocab):
    two = CALLS["hermes"] + "\n" + CALLS["hermes"]
    assert run(vocab, toolgrammar.build("hermes", TOOLS, required=True), two) == (True, True)
    single = toolgrammar.build("hermes", TOOLS, required=True, parallel=False)
    assert run(vocab, single, CALLS["hermes"]) == (True, True)
    assert run(vocab, single, two)[0] is False


def test_a_required_call_may_follow_the_models_thinking(vocab):
    thought = "<think>\nThe user wants the weather.\n</think>\n\n"
    assert run(vocab, toolgrammar.build("hermes", TOOLS, required=True), thought + CALLS["hermes"])[0] is False
    optional = toolgrammar.build("hermes", TOOLS, required=True, think="optional")
    assert run(vocab, optional, thought + CALLS["hermes"]) == (True, True)
    assert run(vocab, optional, CALLS["hermes"]) == (True, True)
    assert run(vocab, optional, thought + "It is sunny.")[0] is False  # thinking, then no call: refused
    opened = toolgrammar.build("hermes", TOOLS, required=True, think="open")  # the prompt opened <think>
    assert run(vocab, opened, thought.removeprefix("<think>") + CALLS["hermes"]) == (True, True)
    analysis = "<|channel|>analysis<|message|>Weather, then.<|end|><|start|>assistant<|channel|>commentary "
    harmony = toolgrammar.build("harmony", TOOLS, required=True)
    assert run(vocab, harmony, analysis + CALLS["harmony"]) == (True, True)
    assert run(vocab, harmony, "<|channel|>final<|message|>Sunny.")[0] is False


def test_integer_bounds_hold_in_a_calls_arguments(vocab):
    bounded = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
    grammar = toolgrammar.build("hermes", [bounded], required=True)
    call = '<tool_call>{"name": "get_weather", "arguments": {"days": %s}}</tool_call>'
    assert run(vocab, grammar, call % "7") == (True, True)
    for bad in ("0", "8", "12", "-1"):
        assert run(vocab, grammar, call % bad)[0] is False, bad


def call_with(args: str) -> str:
    return '<tool_call>{"name": "f", "arguments": ' + args + "}</tool_call>"


def tool(params: dict, name: str = "f") -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", **params}}}


def test_lengths_and_item_counts_hold_in_a_calls_arguments(vocab):
    grammar = toolgrammar.build("hermes", [tool({"properties": {
        "code": {"type": "string", "minLength": 2, "maxLength": 5},
        "tags": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}},
        "required": ["code", "tags"]})], required=True)
    for args in ('{"code": "ab", "tags": [1]}', '{"code": "abcde", "tags": [1, 2]}'):
        assert run(vocab, grammar, call_with(args)) == (True, True), args
    for args in ('{"code": "a", "tags": [1]}', '{"code": "abcdef", "tags": [1]}', '{"code": "ab", "tags": []}',
                 '{"code": "ab", "tags": [1, 2, 3]}'):
        assert run(vocab, grammar, call_with(args))[0] is False, args


def test_a_length_past_llama_cpps_repetition_limit_is_served_as_no_limit(vocab):
    """maxLength 30000 once became 30000 nested groups, and llama.cpp's parser crashed the worker."""
    grammar = toolgrammar.build("hermes", [tool({"properties": {"text": {"type": "string", "maxLength": 30000}}})],
                                required=True)
    assert run(vocab, grammar, call_with(f'{{"text": "{"ab " * 1000}"}}')) == (True, True)


def test_each_tools_references_are_its_own(vocab):
    """Two tools' ``#/$defs/item`` once shared the first tool's rule."""
    def with_item(name: str, item: dict) -> dict:
        return tool({"$defs": {"item": item}, "properties": {"x": {"$ref": "#/$defs/item"}}, "required": ["x"]}, name)

    grammar = toolgrammar.build("hermes", [with_item("f", {"type": "integer"}), with_item("g", {"type": "boolean"})],
                                required=True)
    assert run(vocab, grammar, call_with('{"x": 5}')) == (True, True)
    assert run(vocab, grammar, call_with('{"x": 5}').replace('"f"', '"g"'))[0] is False
    assert run(vocab, grammar, call_with('{"x": true}').replace('"f"', '"g"')) == (True, True)


def test_the_grammar_of_a_long_tool_list_is_within_the_bounds_on_made_grammars():
    """The bound on a caller's own grammar would refuse it: a made grammar's size follows its tools'."""
    params = {f"parameter_{j}": [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": 1000},
                                 {"enum": ["alpha", "beta"]}][j % 3] for j in range(20)}
    tools = [tool({"properties": params, "required": ["parameter_0"]}, f"tool_number_{i}") for i in range(128)]
    gbnf = toolgrammar.build("hermes", tools, required=False).gbnf
    assert len(gbnf) > MAX_GRAMMAR_CHARS and grammar_problem(gbnf, MAX_MADE_GRAMMAR_CHARS) is None


ANY_VALUES = ('"text"', "3", "-2.5e3", '{"a": [1, null]}', "true", "null", "[]")


def test_a_parameter_schema_without_a_type_takes_any_json_value(vocab):
    """Claude Code's tools have one (``{"description": "Optional input value..."}``): JSON Schema's
    any value, which the converter refused; ``{}`` and ``true`` are the same."""
    params = {"properties": {"value": {"description": "Optional input value..."}, "empty": {}, "yes": True,
                             "n": {"type": "integer"}}}
    grammar = toolgrammar.build("hermes", [tool(params)], required=True)
    for key in ("value", "empty", "yes"):
        for value in ANY_VALUES:
            assert run(vocab, grammar, call_with(f'{{"{key}": {value}}}')) == (True, True), (key, value)
        assert run(vocab, grammar, call_with(f'{{"{key}": nope}}'))[0] is False
    assert run(vocab, grammar, call_with('{"n": "x"}'))[0] is False  # the typed one still holds
    untyped_args = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {}}}}}
    assert run(vocab, toolgrammar.build("hermes", [untyped_args], required=True), call_with("[1]"))[0] is False


def test_an_any_value_parameter_in_qwen3_coders_xml_is_raw_text(vocab):
    """The parser reads such a value as JSON where it parses, as a string otherwise."""
    params = {"properties": {"value": {"description": "any"}, "n": {"type": "integer"}}}
    grammar = toolgrammar.build("qwen3_coder", [tool(params)], required=True)
    for value in ("free text", '{"a": 1}', "3"):
        call = f"<tool_call>\n<function=f>\n<parameter=value>\n{value}\n</parameter>\n</function>\n</tool_call>"
        assert run(vocab, grammar, call) == (True, True), value
    bad = "<tool_call>\n<function=f>\n<parameter=n>\nmany\n</parameter>\n</function>\n</tool_call>"
    assert run(vocab, grammar, bad)[0] is False


@pytest.mark.parametrize("schema", [{}, True, {"description": "anything"}, {"title": "t", "minLength": 3}])
def test_a_structured_output_schema_without_a_type_takes_any_json_value(vocab, schema):
    """``response_format``'s and Ollama's ``format``'s grammar (``{}`` was an object only)."""
    from gateway.worker.schemagrammar import schema_grammar

    grammar = toolgrammar.ToolGrammar(schema_grammar(schema), (), False)
    for value in ANY_VALUES:
        assert run(vocab, grammar, value) == (True, True), value
    assert run(vocab, grammar, "nope")[0] is False


def test_the_schema_false_allows_nothing():
    from gateway.worker.schemagrammar import schema_grammar

    with pytest.raises(ValueError, match="allows no value"):
        schema_grammar({"type": "object", "properties": {"x": False}})


@pytest.mark.parametrize(("city", "ok"), [
    ("Paris", True), ("Par\\u00eds", True), ("\\ud83d\\ude00", True),  # a surrogate pair is a character
    ("\\udcad", False), ("\\ud83d", False), ("\\ud83dx", False),  # a lone one is not text: strictjson refuses it
    ("a\nb", False), ("a\tb", False),  # raw control characters are not JSON
])
def test_a_call_holds_only_strings_the_gateway_reads_back(vocab, city, ok):
    """The model's call is read by ``strictjson``: the grammar allows no string it would refuse
    (a random model wrote ``\\udcad`` under the library's own rule, and its call was lost)."""
    from gateway.base import strictjson

    call = CALLS["hermes"].replace("Paris", city)
    required = toolgrammar.build("hermes", TOOLS, required=True)
    assert run(vocab, required, call)[0] is ok
    if ok:
        strictjson.loads(call.split("<tool_call>")[1].split("</tool_call>")[0], "call")
